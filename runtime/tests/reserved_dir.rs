//! A workload cannot put its own program where the runtime expects kat-init: `/.kat` is a
//! read-only mount that the container can neither rename, remove, unmount nor write, no
//! volume may cover it (declared there, or led there by a symbolic link of the image), and
//! an exec (`katcall exec`, exec health probes) starts kat-init from the host's binary by
//! descriptor, so even a container whose `/.kat/init` was replaced runs the real kat-init,
//! under its seccomp filter.

mod support;

use std::time::Duration;

use kat_runtime::{ContainerRuntime, ContainerState, ExecOptions, VolumeMount};
use support::*;

/// Runs `script` with `sh -c` through an exec in `id`; its exit code and output.
async fn exec_script(rt: &dyn ContainerRuntime, id: &str, script: &str) -> (i32, String) {
    let mut h = rt
        .exec(
            id,
            ExecOptions {
                command: vec!["/bin/sh".into(), "-c".into(), script.into()],
                ..Default::default()
            },
        )
        .await
        .expect("exec");
    let stdout = h.stdout.take().expect("stdout");
    drop(h.stdin.take());
    let out =
        tokio::task::spawn_blocking(move || std::io::read_to_string(stdout).unwrap_or_default())
            .await
            .expect("reader");
    (h.wait().await.expect("exit"), out)
}

/// The attack as reported (`mv /.kat /.k0; mkdir /.kat; <script> > /.kat/init`), and every
/// other way to change `/.kat` from inside: all refused, and the next exec still runs under
/// the seccomp filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_cannot_rename_remove_or_write_its_kat_directory() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("holder", &image(&f), "sleep 60"))
        .await
        .unwrap();
    rt.start("holder").await.unwrap();
    wait_state(
        &rt,
        "holder",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    let attack = r#"
mv /.kat /.k0 2>/dev/null && echo "LEAK renamed /.kat"
mv /.kat/init /.kat/init0 2>/dev/null && echo "LEAK renamed /.kat/init"
rm -rf /.kat 2>/dev/null; [ -e /.kat/init ] || echo "LEAK removed /.kat/init"
umount -l /.kat 2>/dev/null && echo "LEAK unmounted /.kat"
umount -l /.kat/init 2>/dev/null && echo "LEAK unmounted /.kat/init"
mkdir /.kat/x 2>/dev/null && echo "LEAK made a directory in /.kat"
(printf '#!/bin/sh\necho PWNED\n' > /.kat/init) 2>/dev/null && echo "LEAK wrote /.kat/init"
chmod 777 /.kat 2>/dev/null && echo "LEAK chmod /.kat"
echo done"#;
    let (code, out) = exec_script(&rt, "holder", attack).await;
    assert_eq!(code, 0, "{out}");
    let leaks: Vec<&str> = out.lines().filter(|l| l.starts_with("LEAK")).collect();
    assert!(leaks.is_empty(), "{leaks:#?}");
    assert_eq!(out.lines().last(), Some("done"), "{out}");
    let (code, out) = exec_script(&rt, "holder", "grep ^Seccomp: /proc/self/status").await;
    assert_eq!(
        (code, out.trim()),
        (0, "Seccomp:\t2"),
        "the exec runs filtered"
    );
    rt.remove("holder", true).await.unwrap();
}

/// Suppose a workload did get its own program to `/.kat/init` (here the test, as root of the
/// host, binds one there in the container's mount namespace): an exec still runs the host's
/// kat-init, which starts the command under the filter; the planted program never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_runs_the_hosts_kat_init_not_the_containers_path() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: binding over /.kat/init in the container takes root of the host");
        return;
    }
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("planted", &image(&f), "sleep 60"))
        .await
        .unwrap();
    rt.start("planted").await.unwrap();
    let status = wait_state(
        &rt,
        "planted",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    let pid = status.pid.expect("a running container has a pid");
    let (code, out) = exec_script(
        &rt,
        "planted",
        "printf '#!/bin/sh\\necho PWNED; grep ^Seccomp: /proc/self/status\\n' > /evil && chmod 755 /evil",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let bound = std::process::Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-m",
            "/bin/busybox",
            "mount",
            "--bind",
            "/evil",
            "/.kat/init",
        ])
        .output()
        .expect("nsenter");
    assert!(
        bound.status.success(),
        "binding /evil over /.kat/init: {}",
        String::from_utf8_lossy(&bound.stderr)
    );
    let (code, out) =
        exec_script(&rt, "planted", "echo ran; grep ^Seccomp: /proc/self/status").await;
    assert!(
        !out.contains("PWNED"),
        "the container's /.kat/init ran: {out}"
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["ran", "Seccomp:\t2"],
        "{out}"
    );
    rt.remove("planted", true).await.unwrap();
}

fn volume(source: &std::path::Path, destination: &str) -> VolumeMount {
    VolumeMount {
        name: "data".into(),
        source: source.to_path_buf(),
        sub_path: None,
        destination: destination.into(),
        read_only: false,
        owned_by_container: false,
    }
}

/// A volume declared at or under `/.kat` is refused at create, whatever the spelling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_at_the_kat_directory_is_refused() {
    let (rt, dir, f) = ready_runtime().await;
    let source = dir.path().join("vol");
    std::fs::create_dir(&source).unwrap();
    for destination in ["/.kat", "/.kat/init", "//.kat/", "/./.kat/log"] {
        let mut o = options("covered", &image(&f), "true");
        o.volumes = vec![volume(&source, destination)];
        let err = rt
            .create(&o)
            .await
            .expect_err(&format!("a volume at {destination} was accepted"))
            .to_string();
        assert!(
            err.contains("reserves") && err.contains(destination),
            "{destination}: {err}"
        );
        assert!(
            rt.status("covered").await.is_err(),
            "nothing is left behind"
        );
    }
}

/// An image whose `/data` is a symbolic link to `/.kat`, with a volume at `/data`; and an
/// image whose `/.kat` itself is a link: both refused before the container starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_link_cannot_lead_a_volume_over_kat_init() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let source = dir.path().join("vol");
    std::fs::create_dir(&source).unwrap();
    // A program that would run as PID 1 if anything covered kat-init.
    std::fs::write(source.join("init"), "#!/x\n").unwrap();
    let layer = |links: &[(&str, &str)]| {
        let mut layer = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o755);
        h.set_size(4);
        layer.append_data(&mut h, "x", &b"#!x\n"[..]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        layer
            .append_data(&mut h, "elsewhere", std::io::empty())
            .unwrap();
        for (name, target) in links {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            layer.append_link(&mut h, name, target).unwrap();
        }
        layer.into_inner().unwrap()
    };
    let pid = std::process::id();
    let cases = [
        (
            push_image(
                &f.registry,
                &format!("kat/link-volume-{pid}"),
                &layer(&[("data", "/.kat")]),
                &["/x"],
            ),
            Some("/data"),
        ),
        (
            push_image(
                &f.registry,
                &format!("kat/link-kat-{pid}"),
                &layer(&[(".kat", "/elsewhere")]),
                &["/x"],
            ),
            None,
        ),
    ];
    for (i, (image, destination)) in cases.iter().enumerate() {
        rt.pull_image(image, None).await.expect("pull the image");
        let id = format!("linked-{i}");
        let mut o = options(&id, image, "true");
        o.command = vec!["/x".into()];
        o.volumes = destination.iter().map(|d| volume(&source, d)).collect();
        let err = rt
            .create(&o)
            .await
            .expect_err(&format!(
                "{image} with a volume at {destination:?} was accepted"
            ))
            .to_string();
        assert!(err.contains("symbolic link"), "{image}: {err}");
        assert!(
            rt.status(&id).await.is_err(),
            "the refused container is removed"
        );
    }
}
