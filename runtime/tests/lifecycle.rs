//! Containers on the real kernel: create, start, isolation, volumes, limits, stop, remove.

mod support;

use std::path::Path;
use std::time::Duration;

use kat_runtime::{ContainerRuntime, ContainerState, Resources, RuntimeError, VolumeMount};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_a_container_and_collects_output_and_exit_code() {
    let (rt, _dir, f) = ready_runtime().await;
    let (code, out) = run(
        &rt,
        "hello",
        &image(&f),
        "echo hello from $(hostname); echo err >&2; exit 3",
    )
    .await;
    assert_eq!(code, 3);
    assert_eq!(out, ["hello from hello", "err"]);
    let s = rt.status("hello").await.unwrap();
    assert!(s.started_at.is_some() && s.finished_at.is_some());
    assert!(!s.oom_killed);
    rt.remove("hello", false).await.unwrap();
    assert!(matches!(
        rt.status("hello").await,
        Err(RuntimeError::ContainerNotFound(_))
    ));
}

/// libcontainer's create runs in a helper process; kat-init ends up our child (we are a
/// subreaper) so a SIGKILL of it is still recorded precisely, by a reaper that is no thread;
/// a missing helper is explained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_runs_in_a_helper_and_kat_init_is_reaped_by_us() {
    let (rt, dir, f) = ready_runtime().await;
    rt.create(&options("reaped", &image(&f), "sleep 30"))
        .await
        .unwrap();
    rt.start("reaped").await.unwrap();
    let pid = wait_state(
        &rt,
        "reaped",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await
    .pid
    .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ppid = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .map(|v| v.trim().to_string());
    assert_eq!(ppid, Some(std::process::id().to_string()), "{status}");
    // The reaper is a task waiting on a process descriptor: a running container keeps no
    // thread of ours.
    let reaper_threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("reap-"))
        .collect();
    assert!(reaper_threads.is_empty(), "{reaper_threads:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    let s = wait_state(
        &rt,
        "reaped",
        ContainerState::Exited,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!((s.exit_code, s.signal), (Some(137), Some(9)));
    assert!(
        s.warnings.is_empty(),
        "the reaper recorded the end: {:?}",
        s.warnings
    );
    rt.remove("reaped", true).await.unwrap();

    let mut config = config_in(&f, dir.path());
    config.create_helper = "/nonexistent/kat-helper".into();
    let broken = kat_runtime::NativeRuntime::new(config).unwrap();
    let err = broken
        .create(&options("nohelper", &image(&f), "true"))
        .await
        .unwrap_err()
        .to_string();
    // Unprivileged, the id helper (the same program) is the first to be missed.
    assert!(
        err.contains("running the create helper /nonexistent/kat-helper")
            || err.contains("cannot run /nonexistent/kat-helper"),
        "{err}"
    );
    assert!(!broken.container_dir("nohelper").exists());
}

/// After a create, the next create's helper is started ahead (a spare that reads its request
/// from its standard input): the next create uses it and its container runs; a spare killed
/// meanwhile is replaced by a helper of the create's own; an unused spare is ended after its
/// keep time, so an idle runtime keeps no extra process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_create_uses_a_spare_helper_started_ahead() {
    let f = fixtures();
    let dir = runtime_dir("spare");
    let mut config = config_in(&f, dir.path());
    config.spare_helper_keep = Duration::from_secs(2);
    let rt = kat_runtime::NativeRuntime::new(config).unwrap();
    rt.pull_image(&image(&f), None).await.unwrap();
    let root = dir.path().join("root");
    assert_eq!(
        spare_helpers(&root),
        Vec::<i32>::new(),
        "a spare before any create"
    );

    rt.create(&options("first", &image(&f), "echo first"))
        .await
        .unwrap();
    let first_spare = wait_spare(&root, |s| s.len() == 1).await[0];
    rt.create(&options("second", &image(&f), "echo second"))
        .await
        .unwrap();
    let second_spare = wait_spare(&root, |s| s.len() == 1 && s[0] != first_spare).await[0];
    assert_eq!(
        rt.spare_helpers_used(),
        1,
        "the second create used the spare"
    );
    rt.start("second").await.unwrap();
    wait_log(&rt, "second", "second").await;

    // A spare killed before its create: the create starts a helper of its own.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second_spare),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    rt.create(&options("third", &image(&f), "echo third"))
        .await
        .unwrap();
    assert_eq!(rt.spare_helpers_used(), 1, "a dead spare was not used");
    rt.start("third").await.unwrap();
    wait_log(&rt, "third", "third").await;

    // A create that fails in a spare says why, as one in a helper of its own does.
    wait_spare(&root, |s| s.len() == 1).await;
    // libcontainer's state root is a file for a moment: only the helper finds out.
    let lib = root.join("libcontainer");
    std::fs::rename(&lib, root.join("libcontainer.moved")).unwrap();
    std::fs::write(&lib, b"").unwrap();
    let err = rt
        .create(&options("fourth", &image(&f), "true"))
        .await
        .unwrap_err()
        .to_string();
    std::fs::remove_file(&lib).unwrap();
    std::fs::rename(root.join("libcontainer.moved"), &lib).unwrap();
    assert_eq!(rt.spare_helpers_used(), 2, "{err}");
    // libcontainer's own words ("io error"), as the spare wrote them.
    assert!(
        err.starts_with("creating container fourth: io error"),
        "{err}"
    );

    // Unused for its keep time (2 s here), the last spare is ended.
    wait_spare(&root, |s| s.len() == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_spare(&root, |s| s.is_empty()).await;
    for id in ["first", "second", "third"] {
        rt.remove(id, true).await.unwrap();
    }
}

/// Spare create helpers of the runtime in `root`: children of this process running
/// `HELPER __kat-create-container -`, not yet ended, whose error output goes to the runtime's
/// `helpers/` (other tests' runtimes have spares too).
fn spare_helpers(root: &Path) -> Vec<i32> {
    let helpers = root.join("helpers");
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let (Ok(status), Ok(cmdline)) = (
            std::fs::read_to_string(format!("/proc/{pid}/status")),
            std::fs::read(format!("/proc/{pid}/cmdline")),
        ) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z'));
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .is_ok_and(|err| err.starts_with(&helpers));
        if field("PPid:").as_deref() == Some(me.as_str())
            && !zombie
            && ours
            && args.get(1) == Some(&b"__kat-create-container".as_slice())
            && args.get(2) == Some(&b"-".as_slice())
        {
            found.push(pid);
        }
    }
    found
}

/// The spare helpers of the runtime in `root` once `ready` holds for them (within 5 s).
async fn wait_spare(root: &Path, ready: impl Fn(&[i32]) -> bool) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let spares = spare_helpers(root);
        if ready(&spares) {
            return spares;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spare helpers now: {spares:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_cmd_env_and_generated_files() {
    let (rt, _dir, f) = ready_runtime().await;
    // No command and no args: the image's Cmd (/bin/sh, stdin at EOF) runs and exits 0.
    let mut o = options("plain", &image(&f), "");
    o.command = vec![];
    let (code, out) = {
        rt.create(&o).await.unwrap();
        rt.start("plain").await.unwrap();
        let s = wait_state(
            &rt,
            "plain",
            ContainerState::Exited,
            Duration::from_secs(20),
        )
        .await;
        (s.exit_code, texts(&rt, "plain").await)
    };
    assert_eq!((code, out.len()), (Some(0), 0));

    let mut o = options("envy", &image(&f), "");
    o.command = vec![];
    o.args = vec!["sh".into(), "-c".into(), "echo $GREETING $PATH; cat /etc/hostname; grep -c envy-host /etc/hosts; cat /etc/resolv.conf; pwd".into()];
    o.env.insert("GREETING".into(), "hi".into());
    o.hostname = "envy-host".into();
    o.dns_servers = vec!["10.0.0.53".into()];
    rt.create(&o).await.unwrap();
    rt.start("envy").await.unwrap();
    let s = wait_state(&rt, "envy", ContainerState::Exited, Duration::from_secs(20)).await;
    assert_eq!(s.exit_code, Some(0));
    // The image's Entrypoint is empty: args replace its Cmd.
    let out = texts(&rt, "envy").await;
    assert_eq!(
        out,
        ["hi /bin", "envy-host", "1", "nameserver 10.0.0.53", "/"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_namespaces_capabilities_and_masked_paths() {
    let (rt, _dir, f) = ready_runtime().await;
    let script = "id -u; echo pid=$$; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; \
        head -1 /proc/self/uid_map | awk '{print $1, $2}'; ls /dev | tr '\\n' ' '; echo; \
        (wc -c < /proc/kcore) 2>/dev/null || echo 0; touch /sys/x 2>/dev/null && echo sys-writable || echo sys-ro; \
        ip link 2>/dev/null | grep -c '^[0-9]' ; cat /proc/1/cmdline | tr '\\0' ' '; echo; \
        grep '^Seccomp:' /proc/self/status; grep '^Seccomp:' /proc/1/status; \
        unshare -U true 2>/dev/null && echo userns-allowed || echo userns-refused; \
        cat /sys/class/net/lo/flags; grep '^CapBnd' /proc/1/status; grep '^CapBnd' /proc/self/status; \
        ip link set lo down 2>/dev/null && echo lo-changed || echo lo-refused; \
        httpd -p 127.0.0.1:8080 -h /etc \
          && printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' | nc 127.0.0.1 8080 | tail -1 \
          || echo no-loopback";
    let (code, out) = run(&rt, "iso", &image(&f), script).await;
    assert_eq!(code, 0, "{out:?}");
    assert_eq!(out[0], "0", "root inside");
    assert_eq!(
        out[1], "pid=2",
        "own pid namespace: kat-init is 1, the workload 2"
    );
    // CAP_CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE
    assert_eq!(out[2], "CapEff:\t00000000000005fb");
    assert_eq!(out[3], "NoNewPrivs:\t1");
    // Container root is a host id of the node's range, never host root.
    let (_, start, count) = rt.capabilities().uid_map[0];
    let host_root: u32 = out[4]
        .strip_prefix("0 ")
        .and_then(|h| h.parse().ok())
        .unwrap_or_else(|| panic!("uid_map: {}", out[4]));
    assert!(
        host_root != 0 && host_root >= start && host_root - start < count,
        "{}",
        out[4]
    );
    for dev in ["null", "zero", "urandom", "pts", "shm"] {
        assert!(
            out[5].split(' ').any(|d| d == dev),
            "/dev has {dev}: {}",
            out[5]
        );
    }
    assert!(
        !out[5].contains("sda") && !out[5].contains("kmsg"),
        "{}",
        out[5]
    );
    assert_eq!(out[6], "0", "/proc/kcore is masked");
    assert_eq!(out[7], "sys-ro");
    assert_eq!(out[8], "1", "only loopback in the new network namespace");
    // Loopback is up (kat-init set it, then dropped CAP_NET_ADMIN from every set: its own
    // bounding set is the workload's, and the workload cannot take lo down) and carries a
    // connection to 127.0.0.1.
    let tail = &out[out.len() - 5..];
    assert_eq!(tail[0], "0x9", "lo is UP|LOOPBACK: {out:?}");
    assert_eq!(
        tail[1], "CapBnd:\t00000000000005fb",
        "kat-init kept CAP_NET_ADMIN"
    );
    assert_eq!(tail[2], "CapBnd:\t00000000000005fb");
    assert_eq!(tail[3], "lo-refused");
    assert_eq!(tail[4], "iso", "a page over loopback: {out:?}");
    assert!(
        out[9].starts_with("/.kat/init --log-dir /.kat/log"),
        "{}",
        out[9]
    );
    // KAT's seccomp filter, in the workload and in kat-init; no nested user namespace.
    assert!(rt.capabilities().seccomp);
    assert_eq!(out[10], "Seccomp:\t2");
    assert_eq!(out[11], "Seccomp:\t2");
    assert_eq!(out[12], "userns-refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_bind_with_subpath_and_read_only() {
    let (rt, dir, f) = ready_runtime().await;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("in.txt"), "from host\n").unwrap();
    make_world_writable(&data);
    let mut o = options("vol", &image(&f), "cat /data/in.txt; echo written > /data/sub/out.txt; (echo x > /ro/y) 2>/dev/null || echo ro-denied");
    o.volumes = vec![
        VolumeMount {
            name: "data".into(),
            source: data.clone(),
            sub_path: None,
            destination: "/data".into(),
            read_only: false,
            owned_by_container: false,
        },
        VolumeMount {
            name: "ro".into(),
            source: data.clone(),
            sub_path: Some("sub".into()),
            destination: "/ro".into(),
            read_only: true,
            owned_by_container: false,
        },
    ];
    rt.create(&o).await.unwrap();
    make_world_writable(&data.join("sub"));
    rt.start("vol").await.unwrap();
    let s = wait_state(&rt, "vol", ContainerState::Exited, Duration::from_secs(20)).await;
    assert_eq!(s.exit_code, Some(0));
    assert_eq!(texts(&rt, "vol").await, ["from host", "ro-denied"]);
    assert_eq!(
        std::fs::read_to_string(data.join("sub/out.txt")).unwrap(),
        "written\n"
    );
}

fn make_world_writable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_term_then_kill_after_the_grace_period() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options(
        "polite",
        &image(&f),
        "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done",
    ))
    .await
    .unwrap();
    rt.start("polite").await.unwrap();
    wait_log(&rt, "polite", "up").await;
    let s = rt.stop("polite", Duration::from_secs(10)).await.unwrap();
    assert_eq!((s.state, s.exit_code), (ContainerState::Exited, Some(0)));
    assert!(texts(&rt, "polite").await.contains(&"bye".to_string()));

    rt.create(&options(
        "stubborn",
        &image(&f),
        "trap '' TERM; echo up; while :; do sleep 0.05; done",
    ))
    .await
    .unwrap();
    rt.start("stubborn").await.unwrap();
    wait_log(&rt, "stubborn", "up").await;
    let t = std::time::Instant::now();
    let s = rt
        .stop("stubborn", Duration::from_millis(500))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        (s.state, s.exit_code, s.signal),
        (ContainerState::Exited, Some(137), Some(9))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_is_enforced_and_reported_as_oom_killed() {
    let (rt, _dir, f) = ready_runtime().await;
    if !rt.capabilities().memory_limit {
        panic!(
            "this host cannot enforce memory limits: {:?}",
            rt.capabilities().notes
        );
    }
    let mut o = options(
        "hog",
        &image(&f),
        "echo start; exec dd if=/dev/zero of=/dev/null bs=128M count=1",
    );
    o.resources = Resources {
        memory_limit_bytes: 32 * 1024 * 1024,
        cpu_limit_millis: 500,
        cpu_request_millis: 250,
        pids_limit: 64,
    };
    rt.create(&o).await.unwrap();
    rt.start("hog").await.unwrap();
    let s = wait_state(&rt, "hog", ContainerState::Exited, Duration::from_secs(30)).await;
    assert!(s.oom_killed, "{s:?}");
    assert_eq!((s.exit_code, s.signal), (Some(137), Some(9)), "{s:?}");
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_and_pids_limits_reach_the_cgroup_and_stop_a_fork_bomb() {
    let (rt, _dir, f) = ready_runtime().await;
    let mut o = options(
        "limited",
        &image(&f),
        "echo up; while :; do sleep 10 & done",
    );
    o.resources = Resources {
        memory_limit_bytes: 64 * 1024 * 1024,
        cpu_limit_millis: 500,
        cpu_request_millis: 250,
        pids_limit: 10,
    };
    rt.create(&o).await.unwrap();
    let caps = rt.capabilities().clone();
    if caps.cgroup_mode == kat_runtime::CgroupMode::V1 {
        let parent = std::env::var("KAT_TEST_CGROUP_PARENT").unwrap_or_else(|_| "kat".into());
        let base = Path::new("/sys/fs/cgroup");
        let read = |c: &str, f: &str| {
            let p = base
                .join(c)
                .join(parent.trim_start_matches('/'))
                .join("limited")
                .join(f);
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .trim()
                .to_string()
        };
        assert_eq!(read("cpu", "cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu", "cpu.shares"), "256");
        assert_eq!(read("pids", "pids.max"), "10");
        assert_eq!(
            read("memory", "memory.limit_in_bytes"),
            (64 * 1024 * 1024).to_string()
        );
    } else if caps.cpu_limit {
        // cgroup v2: delegated, as root, or a systemd scope (run in the VM stage).
        let dir = rt.cgroup_dirs("limited").remove(0);
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .unwrap_or_else(|e| panic!("{}/{f}: {e}", dir.display()))
                .trim()
                .to_string()
        };
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("pids.max"), "10");
        assert_eq!(read("memory.max"), (64 * 1024 * 1024).to_string());
        // A 250m request weighs less than the default 100 of an unlimited neighbour.
        let weight: u64 = read("cpu.weight").parse().unwrap();
        assert!(weight > 0 && weight < 100, "cpu.weight {weight}");
    }
    rt.start("limited").await.unwrap();
    // The fork bomb hits pids.max; ash gives up with "can't fork" instead of taking the node.
    let s = wait_state(
        &rt,
        "limited",
        ContainerState::Exited,
        Duration::from_secs(30),
    )
    .await;
    assert_ne!(s.exit_code, Some(0));
    let out = texts(&rt, "limited").await;
    assert!(out.iter().any(|l| l.contains("can't fork")), "{out:?}");
    rt.remove("limited", true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_read_from_the_container_cgroup() {
    let (rt, _dir, f) = ready_runtime().await;
    let o = options(
        "busy",
        &image(&f),
        "sleep 60 & sleep 60 & echo up; while :; do :; done",
    );
    rt.create(&o).await.unwrap();
    rt.start("busy").await.unwrap();
    wait_log(&rt, "busy", "up").await;
    let first = rt.usage("busy").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = rt.usage("busy").await.unwrap();
    if rt.capabilities().cgroup_mode == kat_runtime::CgroupMode::None {
        assert_eq!(second, Default::default());
    } else {
        // A shell spinning on one core: well over a fifth of a core over that second.
        let busy = second.cpu_usec.saturating_sub(first.cpu_usec);
        assert!(busy > 200_000, "{first:?} then {second:?}");
        // kat-init, the shell and two sleeps.
        assert!(second.pids >= 4, "{second:?}");
        assert!(second.memory_bytes > 0, "{second:?}");
    }
    assert!(matches!(
        rt.usage("no-such-container").await,
        Err(kat_runtime::RuntimeError::ContainerNotFound(_))
    ));
    rt.remove("busy", true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_leaves_no_cgroup_mount_directory_or_process() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("gone", &image(&f), "sleep 1000 & sleep 1000"))
        .await
        .unwrap();
    rt.start("gone").await.unwrap();
    let s = wait_state(
        &rt,
        "gone",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    let pid = s.pid.unwrap();
    let dir = rt.container_dir("gone");
    assert!(rt.cgroup_exists("gone") || !rt.capabilities().memory_limit);
    assert!(matches!(
        rt.remove("gone", false).await,
        Err(RuntimeError::WrongState { .. })
    ));
    rt.remove("gone", true).await.unwrap();
    assert!(!dir.exists(), "container directory left behind");
    assert!(!rt.cgroup_exists("gone"), "cgroup left behind");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "mount left behind");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "process left behind"
    );
    assert!(rt.list().await.unwrap().is_empty());
}

/// A workload given a new id slice gets its copy of the image there; the slice the next new
/// workload will be given gets one made in the background, which that workload's create uses
/// as it is (the longest step of a new workload's first create, off its path); removing the
/// image removes every slice's copy of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_new_workload_finds_its_image_copy_made() {
    use std::os::unix::fs::MetadataExt;
    let (rt, dir, f) = ready_runtime().await;
    if rt.capabilities().rootfs != kat_runtime::RootfsMode::Overlay {
        eprintln!("skipped: containers get private copies here, not a slice's shared copy");
        return;
    }
    let hex = rt.list_images().await.unwrap()[0]
        .id
        .trim_start_matches("sha256:")
        .to_string();
    let slots = dir.path().join("root/slots");
    let copy = |slot: u32| slots.join(slot.to_string()).join(&hex);
    let made = |slot: u32| async move {
        // Made at nice 19: slow on a busy machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !copy(slot).is_dir() {
            assert!(
                std::time::Instant::now() < deadline,
                "no copy of the image for slice {slot} after 90 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::symlink_metadata(copy(slot)).unwrap()
    };
    let create = |id: &'static str, workload: &'static str| {
        let mut o = options(id, &image(&f), "true");
        o.workload = workload.into();
        o
    };
    rt.create(&create("first", "first")).await.unwrap();
    let mine = std::fs::symlink_metadata(copy(0)).expect("the first workload's copy");
    let spare = made(1).await;
    assert_eq!(
        (spare.uid(), spare.gid()),
        (
            mine.uid() + kat_runtime::idmap::SLICE_SIZE,
            mine.gid() + kat_runtime::idmap::SLICE_SIZE
        ),
        "the spare belongs to the next slice's root"
    );
    // Restarts of a known workload make no spare, only a new slice does: with slice 1's
    // copy moved aside, another container of the first workload does not bring it back.
    let aside = slots.join("1").join(format!("{hex}.aside"));
    std::fs::rename(copy(1), &aside).unwrap();
    rt.create(&create("first-again", "first")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!copy(1).exists(), "a spare copy made for a known workload");
    std::fs::rename(&aside, copy(1)).unwrap();

    rt.create(&create("second", "second")).await.unwrap();
    assert_eq!(
        std::fs::symlink_metadata(copy(1)).unwrap().ino(),
        spare.ino(),
        "the second workload made its own copy instead of using the one made for it"
    );
    made(2).await;

    // Created, never started: a forced remove kills each init and waits for it to exit
    // before its cgroup goes (libcontainer alone removed the cgroup too early).
    for id in ["first", "first-again", "second"] {
        rt.remove(id, true).await.unwrap();
    }
    rt.remove_image(&image(&f)).await.unwrap();
    for slot in 0..3 {
        assert!(
            !copy(slot).exists(),
            "slice {slot} kept a copy of a removed image"
        );
    }
    // A copy half made by an agent that stopped goes when the next one starts.
    let stale = slots.join("0").join(format!("{hex}.partial-1-2"));
    std::fs::create_dir(&stale).unwrap();
    drop(rt);
    let _again = runtime_in(&f, dir.path());
    assert!(!stale.exists(), "a half-made copy was kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_explained_and_leaves_nothing() {
    let (rt, _dir, f) = ready_runtime().await;
    let img = image(&f);
    let cases: Vec<(kat_runtime::CreateOptions, &str)> = vec![
        (
            options("a", "127.0.0.1:5000/kat/nope:latest", "true"),
            "not in the node's image store",
        ),
        (
            {
                let mut o = options("b", &img, "");
                o.command = vec!["/app/server".into()];
                o
            },
            "executable not found in image: /app/server",
        ),
        (
            {
                let mut o = options("c", &img, "true");
                o.volumes = vec![VolumeMount {
                    name: "v".into(),
                    source: "/does/not/exist".into(),
                    sub_path: None,
                    destination: "/v".into(),
                    read_only: false,
                    owned_by_container: false,
                }];
                o
            },
            "volume v: mount source /does/not/exist",
        ),
        (
            {
                let mut o = options("d", &img, "true");
                o.resources.memory_limit_bytes = 1024;
                o
            },
            "impossible limits: memory limit 1024 bytes",
        ),
        (
            {
                let mut o = options("e", &img, "true");
                o.resources.cpu_limit_millis = 100;
                o.resources.cpu_request_millis = 200;
                o
            },
            "cpu request 200m is above the cpu limit 100m",
        ),
        (
            {
                let mut o = options("f", &img, "true");
                o.user = "ghost".into();
                o
            },
            "user \"ghost\" is not in the image's /etc/passwd",
        ),
        (options("Bad_ID", &img, "true"), "is not a DNS label"),
    ];
    for (o, expected) in cases {
        let err = rt.create(&o).await.expect_err(expected).to_string();
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
    assert!(rt.list().await.unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(rt.container_dir("x").parent().unwrap())
        .unwrap()
        .collect();
    assert!(left.is_empty(), "state left behind: {left:?}");

    let err = rt
        .pull_image(&format!("{}/kat/busybox:no-such-tag", f.registry), None)
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::ImageNotFound { .. }), "{err}");
    assert!(err.to_string().contains("not found in registry"), "{err}");
}

async fn wait_log(rt: &dyn ContainerRuntime, id: &str, text: &str) {
    let start = std::time::Instant::now();
    while !texts(rt, id).await.iter().any(|t| t == text) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{id} never logged {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The runtime is a child subreaper: a process of an exec whose kat-init dies first (an OOM
/// kill, a `kill` from the host) becomes our child, though it lives in the container's PID
/// namespace. When the container's PID 1 then dies, the kernel does not let it finish
/// exiting until every process of its namespace is reaped, so an orphan nobody waits for
/// left the container "running" for ever: no exit seen, no restart (the one-node test's
/// killed instance that never restarted). Orphans of a container are reaped by the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_whose_exec_lost_its_kat_init_still_ends() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("orphaned", &image(&f), "sleep 300"))
        .await
        .unwrap();
    rt.start("orphaned").await.unwrap();
    let init = wait_state(
        &rt,
        "orphaned",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await
    .pid
    .unwrap();
    let mut exec = rt
        .exec(
            "orphaned",
            kat_runtime::ExecOptions {
                command: vec!["sleep".into(), "301".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // The exec's kat-init (our child, in our PID namespace) has started its command (its
    // child, in the container's).
    let children = format!("/proc/{}/task/{}/children", exec.pid, exec.pid);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let command = loop {
        let listed = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = listed.split_whitespace().next() {
            break pid.parse::<i32>().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the exec never started its command"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kill = |pid: i32| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap()
    };
    kill(exec.pid);
    assert_eq!(exec.wait().await.unwrap(), 137);
    let parent = std::fs::read_to_string(format!("/proc/{command}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("PPid:").map(|p| p.trim().to_string()));
    assert_eq!(
        parent,
        Some(std::process::id().to_string()),
        "the exec's command was adopted by us"
    );
    kill(init);
    let s = wait_state(
        &rt,
        "orphaned",
        ContainerState::Exited,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!((s.exit_code, s.signal), (Some(137), Some(9)));
    assert!(
        !std::path::Path::new(&format!("/proc/{command}")).exists(),
        "the orphan was reaped"
    );
    rt.remove("orphaned", true).await.unwrap();
}
