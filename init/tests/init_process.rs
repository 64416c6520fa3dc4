//! kat-init as a real process: exit codes, signal forwarding, zombie reaping, logs and the
//! exit record.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INIT: &str = env!("CARGO_BIN_EXE_kat-init");

/// Runs kat-init with a log directory given by path, as the runtime does (inside the
/// container the path is the bind-mounted `/.kat/log`).
fn run_logged(dir: &std::path::Path, extra: &[&str], script: &str) -> std::process::Child {
    let mut cmd = Command::new(INIT);
    cmd.arg("--log-dir")
        .arg(dir)
        .args(extra)
        .args(["--", "/bin/sh", "-c", script]);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

fn records(dir: &std::path::Path) -> Vec<(String, String, String)> {
    fs::read_to_string(dir.join("stdio.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut parts = l.splitn(4, ' ');
            let ts = parts.next().unwrap().to_string();
            assert!(ts.ends_with('Z') && ts.len() == 30, "timestamp {ts:?}");
            let stream = parts.next().unwrap().to_string();
            let tag = parts.next().unwrap().to_string();
            let text = parts.next().unwrap_or("").to_string();
            (stream, tag, text)
        })
        .collect()
}

fn exit_record(dir: &std::path::Path) -> serde_like::Exit {
    serde_like::parse(&fs::read_to_string(dir.join("exit.json")).unwrap())
}

/// exit.json is tiny and flat; parse it by hand to keep kat-init's tests dependency-free.
mod serde_like {
    #[derive(Debug)]
    pub struct Exit {
        pub code: i32,
        pub signal: Option<i32>,
    }
    pub fn parse(s: &str) -> Exit {
        let field = |name: &str| -> String {
            let start = s.find(&format!("\"{name}\":")).unwrap() + name.len() + 3;
            s[start..].split([',', '}']).next().unwrap().to_string()
        };
        assert!(s.contains("\"finishedAt\":\"20"), "{s}");
        Exit {
            code: field("exitCode").parse().unwrap(),
            signal: field("signal").parse().ok(),
        }
    }
}

#[test]
fn exit_code_is_the_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let status = run_logged(dir.path(), &[], "exit 42").wait().unwrap();
    assert_eq!(status.code(), Some(42));
    let exit = exit_record(dir.path());
    assert_eq!((exit.code, exit.signal), (42, None));
}

/// The filter is on in kat-init and the workload: a new user namespace (the usual first
/// step out of a container) and a mount are refused, ordinary work goes on.
#[test]
fn seccomp_default_filters_the_workload() {
    let script = "grep '^Seccomp:' /proc/self/status; \
        unshare --user true 2>/dev/null; echo unshare=$?; \
        grep -c . /proc/self/status >/dev/null; echo work=$?";
    let out = Command::new(INIT)
        .args(["--seccomp", "default", "--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    assert!(!text.contains("unshare=0"), "{text}");
    assert!(text.contains("work=0"), "{text}");
    // Without the flag nothing is filtered (kat-init outside a container, as here).
    let out = Command::new(INIT)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "unshare --user true; echo unshare=$?",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("unshare=0"));
}

/// Rust ignores SIGPIPE in kat-init itself; the workload must not inherit that, or a pipeline
/// whose reader dies spins on EPIPE forever instead of ending.
#[test]
fn the_workload_starts_with_default_signal_dispositions() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_logged(
        dir.path(),
        &[],
        "grep -E '^Sig(Ign|Blk):' /proc/self/status; yes | head -c 1 >/dev/null; echo done",
    )
    .wait_with_output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let texts: Vec<String> = records(dir.path()).into_iter().map(|r| r.2).collect();
    assert!(
        texts.iter().any(|t| t == "SigIgn:\t0000000000000000"),
        "ignored signals inherited: {texts:?}"
    );
    assert!(
        texts.iter().any(|t| t == "SigBlk:\t0000000000000000"),
        "blocked signals inherited: {texts:?}"
    );
    // `yes` dies of SIGPIPE when head is done, so the pipeline ends.
    assert!(texts.iter().any(|t| t == "done"), "{texts:?}");
}

#[test]
fn missing_executable_exits_127_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(INIT)
        .args(["--", "/no/such/binary"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&status.stderr).contains("cannot execute /no/such/binary"));
    drop(dir);
}

#[test]
fn forwards_signals_and_reports_128_plus_signal() {
    let dir = tempfile::tempdir().unwrap();
    // The workload traps TERM, says so, and exits 0: proof the signal reached it.
    let mut child = run_logged(
        dir.path(),
        &[],
        "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
    );
    wait_for(|| records(dir.path()).iter().any(|r| r.2 == "ready"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(records(dir.path()).iter().any(|r| r.2 == "got-term"));

    // Untrapped, the workload dies of the signal and kat-init exits 128+15.
    let dir = tempfile::tempdir().unwrap();
    let mut child = run_logged(dir.path(), &[], "echo ready; exec sleep 30");
    wait_for(|| records(dir.path()).iter().any(|r| r.2 == "ready"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(143));
    let exit = exit_record(dir.path());
    assert_eq!((exit.code, exit.signal), (143, Some(15)));
}

#[test]
fn reaps_orphaned_zombies() {
    let dir = tempfile::tempdir().unwrap();
    // A grandchild is orphaned onto kat-init and exits; if kat-init did not reap it, it
    // would show as a zombie whose parent is kat-init.
    let script = "(sleep 0.1 &); sleep 0.8; \
        for s in /proc/[0-9]*/stat; do read -r line < $s 2>/dev/null || continue; \
        set -- ${line##*) }; [ \"$1\" = Z ] && [ \"$2\" = \"$PPID\" ] && echo zombie; done; echo done";
    let status = run_logged(dir.path(), &[], script).wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let texts: Vec<String> = records(dir.path()).into_iter().map(|r| r.2).collect();
    assert!(texts.contains(&"done".to_string()), "{texts:?}");
    assert!(!texts.contains(&"zombie".to_string()), "{texts:?}");
}

#[test]
fn logs_streams_partial_lines_and_rotates() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo out; echo err >&2; printf 'no-newline'";
    run_logged(dir.path(), &[], script).wait().unwrap();
    let recs = records(dir.path());
    assert!(
        recs.contains(&("stdout".into(), "F".into(), "out".into())),
        "{recs:?}"
    );
    assert!(
        recs.contains(&("stderr".into(), "F".into(), "err".into())),
        "{recs:?}"
    );
    assert!(
        recs.contains(&("stdout".into(), "P".into(), "no-newline".into())),
        "{recs:?}"
    );

    // 2,000 numbered lines through a 4 KiB limit and 3 files: rotation happened, the newest
    // lines survive in order, and nothing in the kept files is missing or duplicated.
    let dir = tempfile::tempdir().unwrap();
    let status = run_logged(
        dir.path(),
        &["--log-max-bytes", "4096", "--log-max-files", "3"],
        "i=0; while [ $i -lt 2000 ]; do echo line-$i; i=$((i+1)); done",
    )
    .wait()
    .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(dir.path().join("stdio.log.2").exists());
    assert!(!dir.path().join("stdio.log.3").exists());
    let mut numbers = Vec::new();
    for name in ["stdio.log.2", "stdio.log.1", "stdio.log"] {
        let text = fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(text.len() <= 4096, "{name} is {} bytes", text.len());
        for line in text.lines() {
            let n: u32 = line.rsplit("line-").next().unwrap().parse().unwrap();
            numbers.push(n);
        }
    }
    assert_eq!(*numbers.last().unwrap(), 1999);
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "gap or duplicate in kept logs"
    );
}

#[test]
fn long_lines_are_split_into_partial_records() {
    let dir = tempfile::tempdir().unwrap();
    run_logged(
        dir.path(),
        &[],
        "head -c 40000 /dev/zero | tr '\\0' a; echo",
    )
    .wait()
    .unwrap();
    let recs = records(dir.path());
    let tags: Vec<&str> = recs.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(tags, ["P", "P", "F"]);
    assert_eq!(recs.iter().map(|r| r.2.len()).sum::<usize>(), 40000);
}

#[test]
fn rejects_bad_arguments() {
    let out = Command::new(INIT)
        .args(["--log-max-bytes", "lots", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-max-bytes: expected a byte count"));
}

fn wait_for(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
}
