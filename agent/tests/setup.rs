//! `kat-agent setup` on this host, for real (as root): the dry run changes nothing; setup
//! makes the user, its id ranges, directories, binaries, cluster.kat and (cgroup v1) cgroup
//! parents; a second run finds everything done; `--uninstall` leaves nothing behind.

use std::path::Path;
use std::process::Command;

const USER: &str = "kat-setup-test";
const CGROUP_PARENT: &str = "/kat-setup-test";

fn setup(dir: &Path, extra: &[&str]) -> String {
    let init = std::env::var("KAT_INIT")
        .expect("KAT_INIT: run `source <(scripts/test-fixtures.sh)` first");
    let out = Command::new(env!("CARGO_BIN_EXE_kat-agent"))
        .arg("setup")
        .args([
            "--user",
            USER,
            "--cgroup-parent",
            CGROUP_PARENT,
            "--init-binary",
            &init,
        ])
        .args(["--prefix", &dir.join("prefix").display().to_string()])
        .args(["--config-dir", &dir.join("etc").display().to_string()])
        .args(["--state-dir", &dir.join("home").display().to_string()])
        .args(extra)
        .output()
        .expect("run kat-agent setup");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "setup {extra:?} failed:\n{text}");
    text
}

fn user_exists() -> bool {
    Command::new("id")
        .arg(USER)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn subid_lines() -> usize {
    ["/etc/subuid", "/etc/subgid"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with(&format!("{USER}:")))
                .count()
        })
        .sum()
}

fn cgroup_dirs() -> Vec<String> {
    ["memory", "cpu", "pids"]
        .iter()
        .map(|c| format!("/sys/fs/cgroup/{c}{CGROUP_PARENT}"))
        .filter(|p| Path::new(p).exists())
        .collect()
}

#[test]
fn setup_is_idempotent_and_uninstall_leaves_nothing() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: kat-agent setup needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Leftovers of an interrupted earlier run.
    let _ = setup(d, &["--uninstall"]);

    let plan = setup(d, &["--dry-run"]);
    assert!(
        plan.contains("Host check:") && plan.contains("Enforced:"),
        "{plan}"
    );
    assert!(plan.contains(&format!("system user {USER}")), "{plan}");
    assert!(
        !user_exists() && subid_lines() == 0,
        "a dry run changes nothing"
    );
    assert!(!d.join("prefix").exists());

    let first = setup(d, &[]);
    assert!(user_exists(), "{first}");
    assert_eq!(subid_lines(), 2, "a subuid and a subgid range");
    for file in [
        "prefix/bin/kat-agent",
        "prefix/lib/kat/kat-init",
        "prefix/lib/kat/etcd",
        "etc/cluster.kat",
    ] {
        assert!(d.join(file).is_file(), "{file} installed:\n{first}");
    }
    let cluster = std::fs::read(d.join("etc/cluster.kat")).unwrap();
    kat_api::parse_cluster("cluster.kat", &cluster).expect("the written cluster.kat is valid");
    use std::os::unix::fs::MetadataExt;
    let home = std::fs::metadata(d.join("home")).unwrap();
    let uid: u32 = String::from_utf8(
        Command::new("id")
            .args(["-u", USER])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert_eq!(home.uid(), uid, "the home belongs to the agent user");
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        assert_eq!(
            cgroup_dirs().len(),
            3,
            "v1 cgroup parents for memory, cpu, pids"
        );
        for c in cgroup_dirs() {
            assert_eq!(
                std::fs::metadata(&c).unwrap().uid(),
                uid,
                "{c} given to the user"
            );
        }
    }

    let second = setup(d, &[]);
    let changed: Vec<&str> = second
        .lines()
        .filter(|l| l.trim_start().starts_with("done"))
        .collect();
    assert!(
        changed.is_empty(),
        "a second run changes nothing: {changed:?}"
    );

    let undo = setup(d, &["--uninstall"]);
    assert!(!user_exists(), "{undo}");
    assert_eq!(subid_lines(), 0);
    assert!(cgroup_dirs().is_empty(), "{:?}", cgroup_dirs());
    for path in ["prefix/bin/kat-agent", "prefix/lib/kat", "etc", "home"] {
        assert!(!d.join(path).exists(), "{path} left behind:\n{undo}");
    }
}
