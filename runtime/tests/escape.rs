//! Escape attempts from inside a workload and from an exec'd process, each followed by a
//! look at the host: the runc CVE-2024-21626 class (a host directory fd held by PID 1,
//! reached through `/proc/PID/fd/N/..`), `/proc/PID/{cwd,root,map_files}`, and overwriting
//! kat-init through `/proc/1/exe` or its mount (the CVE-2019-5736 class); and a hostile
//! image pulled from the registry, as a node pulls one.
//!
//! One file because it is one list of isolation attacks on real containers: nine of its ten
//! tests start from `support::ready_runtime`, and `attack_script` with `assert_host_untouched`
//! serves both the workload's and the exec's `/proc` attack.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kat_runtime::{ContainerRuntime, ContainerState, ExecOptions};
use support::*;

const MARKER: &str = "kat-host-marker";
const ESCAPED: &str = "kat-escaped";

/// For every process the attacker can see, every `fd/*`, `cwd`, `root` and `map_files/*`
/// entry, climbs up to 10 levels looking for the host marker and trying to create a file.
/// Prints `LEAK …` for what it reaches; ends with `done`.
fn attack_script() -> String {
    format!(
        r#"for d in /proc/[0-9]*; do
  for f in $d/cwd $d/root $d/fd/* $d/map_files/*; do
    up=""
    for i in 1 2 3 4 5 6 7 8 9 10; do
      [ -e "$f/$up{MARKER}" ] && echo "LEAK $f/$up{MARKER}"
      touch "$f/${{up}}{ESCAPED}" 2>/dev/null
      up="../$up"
    done
  done
done
for x in /proc/1/fd/*; do readlink "$x" >/dev/null 2>&1 && echo "LEAK $x leads to $(readlink $x)"; done
readlink /proc/1/exe >/dev/null 2>&1 && echo "LEAK /proc/1/exe is readable"
readlink /proc/1/cwd >/dev/null 2>&1 && echo "LEAK /proc/1/cwd is readable"
(echo x >> /proc/1/exe) 2>/dev/null && echo "LEAK /proc/1/exe is writable"
(echo x >> /.kat/init) 2>/dev/null && echo "LEAK /.kat/init is writable"
[ "$(readlink /proc/self/exe)" = /bin/busybox ] || echo "LEAK /proc/self/exe is $(readlink /proc/self/exe)"
echo done"#
    )
}

/// Host directories a climb out of the container would land in: every ancestor of the
/// container's directory (its log directory itself is the container's own, mounted in).
fn host_ancestors(dir: &Path, id: &str) -> Vec<PathBuf> {
    let container = dir.join("root/containers").join(id);
    container.ancestors().map(Path::to_path_buf).collect()
}

fn assert_host_untouched(dir: &Path, id: &str, init: &Path, init_before: &[u8]) {
    for ancestor in host_ancestors(dir, id) {
        let planted = ancestor.join(ESCAPED);
        assert!(
            !planted.exists(),
            "the workload created {} on the host",
            planted.display()
        );
    }
    assert_eq!(
        std::fs::read(init).unwrap(),
        init_before,
        "kat-init on the host changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_cannot_reach_host_files_through_proc() {
    let (rt, dir, f) = ready_runtime().await;
    std::fs::write(dir.path().join(MARKER), "host secret").unwrap();
    let init_before = std::fs::read(&f.init).unwrap();
    let (code, out) = run(&rt, "escape", &image(&f), &attack_script()).await;
    assert_eq!(code, 0, "{out:?}");
    let leaks: Vec<&String> = out.iter().filter(|l| l.starts_with("LEAK")).collect();
    assert!(leaks.is_empty(), "{leaks:#?}");
    assert_eq!(out.last().map(String::as_str), Some("done"), "{out:?}");
    assert_host_untouched(dir.path(), "escape", &f.init, &init_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_cannot_reach_host_files_through_proc() {
    let (rt, dir, f) = ready_runtime().await;
    std::fs::write(dir.path().join(MARKER), "host secret").unwrap();
    let init_before = std::fs::read(&f.init).unwrap();
    rt.create(&options("target", &image(&f), "sleep 60"))
        .await
        .unwrap();
    rt.start("target").await.unwrap();
    wait_state(
        &rt,
        "target",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    let mut h = rt
        .exec(
            "target",
            ExecOptions {
                command: vec!["/bin/sh".into(), "-c".into(), attack_script()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let stdout = h.stdout.take().unwrap();
    drop(h.stdin.take());
    let out =
        tokio::task::spawn_blocking(move || std::io::read_to_string(stdout).unwrap_or_default())
            .await
            .unwrap();
    let code = h.wait().await.unwrap();
    assert_eq!(code, 0, "{out}");
    let leaks: Vec<&str> = out.lines().filter(|l| l.starts_with("LEAK")).collect();
    assert!(leaks.is_empty(), "{leaks:#?}");
    assert_eq!(out.lines().last(), Some("done"), "{out}");
    assert_host_untouched(dir.path(), "target", &f.init, &init_before);
    rt.remove("target", true).await.unwrap();
}

/// Another container of the same volume swaps `sub` between a directory and a symlink to a
/// host directory, in a loop, while containers with `subPath: sub` are created: each create
/// either fails with a clear error or mounts the real `sub`, never the host directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_symlink_swapped_during_create_never_mounts_the_host() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (rt, dir, f) = ready_runtime().await;
    let volume = dir.path().join("volume");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join(MARKER), "host secret").unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&volume).unwrap().permissions(),
        0o755,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (volume, outside, stop) = (volume.clone(), outside.clone(), stop.clone());
        std::thread::spawn(move || {
            let (sub, real, link) = (volume.join("sub"), volume.join("real"), volume.join("link"));
            std::fs::create_dir_all(&real).unwrap();
            let _ = std::os::unix::fs::symlink(&outside, &link);
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // rename(2) over the name: at every instant `sub` is the real directory
                // or a symlink to the host directory.
                let _ = std::fs::remove_file(volume.join("sub.l"));
                let _ = std::os::unix::fs::symlink(&outside, volume.join("sub.l"));
                let _ = std::fs::rename(volume.join("sub.l"), &sub);
                let _ = std::fs::remove_file(&sub);
                let _ = std::fs::rename(&real, &sub);
                let _ = std::fs::rename(&sub, &real);
                swaps += 1;
            }
            swaps
        })
    };
    let (mut mounted, mut refused) = (0, 0);
    for i in 0..12 {
        let id = format!("race-{i}");
        let mut o = options(
            &id,
            &image(&f),
            &format!("ls /data; test -e /data/{MARKER} && echo LEAK"),
        );
        o.volumes = vec![kat_runtime::VolumeMount {
            name: "v".into(),
            source: volume.clone(),
            sub_path: Some("sub".into()),
            destination: "/data".into(),
            read_only: true,
            owned_by_container: false,
        }];
        match rt.create(&o).await {
            Ok(_) => {
                mounted += 1;
                rt.start(&id).await.unwrap();
                wait_state(&rt, &id, ContainerState::Exited, Duration::from_secs(20)).await;
                let out = texts(&rt, &id).await;
                assert!(
                    !out.iter().any(|l| l.contains("LEAK") || l.contains(MARKER)),
                    "{out:?}"
                );
                rt.remove(&id, true).await.unwrap();
            }
            // Refused by our checks (a symlink, a change after the mount) or by
            // libcontainer (the name missing mid-swap): either way nothing ran.
            Err(e) => {
                refused += 1;
                eprintln!("refused: {e}");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!(
        "subPath race: {mounted} mounted the real directory, {refused} refused, {swaps} swaps"
    );
    assert!(swaps > 100, "the swapper ran");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "the host directory is untouched"
    );
}

/// Two workloads share a host directory (sticky and world-writable, like /tmp): each one's
/// root is a different host id, so neither reads, changes or deletes what the other wrote
/// with mode 0600, while a second container of the same workload (same slice) can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_get_their_own_id_slices() {
    let (rt, dir, f) = ready_runtime().await;
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(
        &shared,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let run_in = |id: &str, workload: &str, script: &str| {
        let mut o = options(id, &image(&f), script);
        o.workload = workload.into();
        o.volumes = vec![kat_runtime::VolumeMount {
            name: "shared".into(),
            source: shared.clone(),
            sub_path: None,
            destination: "/shared".into(),
            read_only: false,
            owned_by_container: false,
        }];
        o
    };
    let mut outputs = Vec::new();
    for (id, workload, script) in [
        ("owner", "alpha", "head -1 /proc/self/uid_map | awk '{print $2}'; echo secret > /shared/a; chmod 600 /shared/a; cat /shared/a"),
        ("sibling", "alpha", "head -1 /proc/self/uid_map | awk '{print $2}'; cat /shared/a"),
        ("other", "beta", "head -1 /proc/self/uid_map | awk '{print $2}'; cat /shared/a 2>/dev/null || echo read-denied; (echo x >> /shared/a) 2>/dev/null || echo write-denied; rm -f /shared/a 2>/dev/null; test -e /shared/a && echo still-there"),
    ] {
        rt.create(&run_in(id, workload, script)).await.unwrap();
        rt.start(id).await.unwrap();
        let s = wait_state(&rt, id, ContainerState::Exited, Duration::from_secs(20)).await;
        let out = texts(&rt, id).await;
        assert_eq!(s.exit_code, Some(0), "{id}: {out:?}");
        outputs.push(out);
    }
    let (alpha, sibling, beta) = (&outputs[0], &outputs[1], &outputs[2]);
    assert_eq!(alpha[1], "secret");
    assert_eq!(sibling[0], alpha[0], "one workload, one slice");
    assert_eq!(sibling[1], "secret");
    assert_ne!(beta[0], alpha[0], "another workload, another slice");
    assert_eq!(&beta[1..], ["read-denied", "write-denied", "still-there"]);
    assert!(shared.join("a").exists(), "alpha's file is still there");
}

/// With every slice taken, one of them by a workload whose containers are gone, two new
/// workloads created at once: one reclaims that slice and the other is refused. They never
/// share it: a create under way holds its workload's slice before its container is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workloads_created_at_once_never_share_a_slice() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: gives the runtime an id range of its own, which needs root");
        return;
    }
    let f = fixtures();
    let dir = runtime_dir("kat-rt-");
    let mut config = config_in(&f, dir.path());
    let slices = 4 * kat_runtime::idmap::SLICE_SIZE;
    config.id_range = Some(kat_runtime::idmap::NodeIdRange {
        uid_start: 300_000,
        uid_count: slices,
        gid_start: 300_000,
        gid_count: slices,
    });
    let rt = kat_runtime::NativeRuntime::new(config).unwrap();
    rt.pull_image(&image(&f), None).await.unwrap();
    let made = |workload: &str| {
        let mut o = options(&format!("{workload}-1"), &image(&f), "sleep 60");
        o.workload = workload.into();
        o
    };
    // Every workload slice taken by a workload with a container.
    let mut fillers = Vec::new();
    loop {
        let name = format!("filler{}", fillers.len());
        match rt.create(&made(&name)).await {
            Ok(_) => fillers.push(name),
            Err(e) => {
                assert!(e.to_string().contains("user-id slices"), "{e}");
                break;
            }
        }
        assert!(
            fillers.len() < 8,
            "a range of 4 slices gave out {} of them",
            fillers.len()
        );
    }
    // The first filler's container goes: its slice may be reclaimed, once.
    rt.remove("filler0-1", true).await.unwrap();
    let (x, y) = (made("x"), made("y"));
    let (x, y) = tokio::join!(rt.create(&x), rt.create(&y));
    let outcome = format!("x: {x:?}\ny: {y:?}");
    let refused = match (x, y) {
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => e,
        _ => panic!("exactly one of the two new workloads gets the free slice:\n{outcome}"),
    };
    assert!(refused.to_string().contains("user-id slices"), "{refused}");
    for id in fillers
        .iter()
        .skip(1)
        .map(|w| format!("{w}-1"))
        .chain(["x-1".into(), "y-1".into()])
    {
        let _ = rt.remove(&id, true).await;
    }
}

/// A probe that times out is killed with everything it started inside the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_exec_is_killed_with_its_whole_tree() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("probed", &image(&f), "sleep 60"))
        .await
        .unwrap();
    rt.start("probed").await.unwrap();
    wait_state(
        &rt,
        "probed",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    let exec = |script: &str| ExecOptions {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let mut probe = rt
        .exec("probed", exec("sleep 501 & (sleep 502 &) ; sleep 503"))
        .await
        .unwrap();
    drop(probe.stdin.take());
    tokio::time::sleep(Duration::from_millis(500)).await;
    probe.kill_tree();
    let code = probe.wait().await.unwrap();
    assert_eq!(code, 137);
    // `sleep 502` was orphaned to the container's PID 1 but stayed in the probe's group.
    let mut ps = rt
        .exec(
            "probed",
            exec("sleep 0.3; ps -o args | grep -c '^sleep 50[123]' || true"),
        )
        .await
        .unwrap();
    drop(ps.stdin.take());
    let stdout = ps.stdout.take().unwrap();
    let out =
        tokio::task::spawn_blocking(move || std::io::read_to_string(stdout).unwrap_or_default())
            .await
            .unwrap();
    ps.wait().await.unwrap();
    assert_eq!(out.trim(), "0", "probe processes left behind");
    rt.remove("probed", true).await.unwrap();
}

fn probe_dir() -> std::path::PathBuf {
    std::env::var("KAT_TEST_PROBE_DIR")
        .map(Into::into)
        .unwrap_or_else(|_| {
            panic!("KAT_TEST_PROBE_DIR is not set: run `source <(scripts/test-fixtures.sh)` first")
        })
}

fn with_probe(mut o: kat_runtime::CreateOptions) -> kat_runtime::CreateOptions {
    o.volumes.push(kat_runtime::VolumeMount {
        name: "probe".into(),
        source: probe_dir(),
        sub_path: None,
        destination: "/probe".into(),
        read_only: true,
        owned_by_container: false,
    });
    o
}

fn assert_all_denied(who: &str, out: &[String]) {
    let allowed: Vec<&String> = out.iter().filter(|l| l.contains("ALLOWED")).collect();
    assert!(allowed.is_empty(), "{who}: {allowed:#?}\n{out:#?}");
    assert_eq!(
        out.last().map(String::as_str),
        Some("done"),
        "{who}: {out:#?}"
    );
    assert!(out.len() > 30, "{who}: every attempt ran: {out:#?}");
}

/// mount, unshare, setns, ptrace, pidfd_getfd, process_vm_readv and signals against this
/// container's PID 1 and another workload's process; mknod; raw and packet sockets; writes
/// to /proc/sys, /proc/sysrq-trigger and /sys; modules, kexec, bpf, keyrings, clocks,
/// reboot: all refused, from the workload and from an exec'd process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_escapes_are_refused_from_a_workload_and_an_exec() {
    let (rt, _dir, f) = ready_runtime().await;
    let mut victim = options("victim", &image(&f), "sleep 60");
    victim.workload = "victim".into();
    rt.create(&victim).await.unwrap();
    rt.start("victim").await.unwrap();
    let victim_pid = wait_state(
        &rt,
        "victim",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await
    .pid
    .unwrap();

    let mut attacker = with_probe(options(
        "attacker",
        &image(&f),
        &format!("/probe/kat-escape-probe {victim_pid}; sleep 60"),
    ));
    attacker.workload = "attacker".into();
    rt.create(&attacker).await.unwrap();
    rt.start("attacker").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = texts(&rt, "attacker").await;
        if out.last().map(String::as_str) == Some("done") || std::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_all_denied("workload", &out);

    let mut h = rt
        .exec(
            "attacker",
            ExecOptions {
                command: vec!["/probe/kat-escape-probe".into(), victim_pid.to_string()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    drop(h.stdin.take());
    let stdout = h.stdout.take().unwrap();
    let text =
        tokio::task::spawn_blocking(move || std::io::read_to_string(stdout).unwrap_or_default())
            .await
            .unwrap();
    h.wait().await.unwrap();
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert_all_denied("exec", &lines);

    // The victim never noticed.
    let s = rt.status("victim").await.unwrap();
    assert_eq!(
        (s.state, s.pid),
        (ContainerState::Running, Some(victim_pid))
    );
    for id in ["attacker", "victim"] {
        rt.remove(id, true).await.unwrap();
    }
}

/// A fork bomb and a memory hog beside a healthy workload, which keeps answering: the
/// bomb stops at its pids limit, the hog is OOM-killed, the healthy one ticks on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_and_a_memory_hog_do_not_starve_a_neighbour() {
    let (rt, _dir, f) = ready_runtime().await;
    let caps = rt.capabilities().clone();
    assert!(
        caps.memory_limit && caps.pids_limit,
        "this suite needs memory and pids limits enforced: {caps:?}"
    );
    let mut healthy = options(
        "healthy",
        &image(&f),
        "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done",
    );
    healthy.workload = "healthy".into();
    let mut bomb = options("bomb", &image(&f), "b() { b | b & }; b; sleep 5");
    bomb.workload = "bomb".into();
    bomb.resources.pids_limit = 64;
    let mut hog = options("hog", &image(&f), "x=a; while true; do x=$x$x$x$x; done");
    hog.workload = "hog".into();
    hog.resources.memory_limit_bytes = 32 * 1024 * 1024;
    rt.create(&healthy).await.unwrap();
    rt.start("healthy").await.unwrap();
    // Its pace alone first (a slow, emulated host ticks slower), then beside the attack.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let alone = texts(&rt, "healthy").await.len();
    for o in [&bomb, &hog] {
        rt.create(o).await.unwrap();
        rt.start(&o.id).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beside = texts(&rt, "healthy").await.len() - alone;
    let hog_status = wait_state(&rt, "hog", ContainerState::Exited, Duration::from_secs(60)).await;
    assert!(hog_status.oom_killed, "{hog_status:?}");
    eprintln!("healthy workload: {alone} ticks alone, {beside} beside a fork bomb and a memory hog (3 s each)");
    assert!(
        alone >= 3,
        "the healthy workload barely ran: {alone} ticks in 3 s"
    );
    assert!(
        beside * 2 >= alone,
        "the healthy workload slowed from {alone} to {beside} ticks per 3 s"
    );
    let s = rt.status("healthy").await.unwrap();
    assert_eq!(s.state, ContainerState::Running);
    for id in ["healthy", "bomb", "hog"] {
        rt.remove(id, true).await.unwrap();
    }
}

/// What the runtime keeps on the host is not another local user's to read or change: no
/// directory of ours is world-writable, and the container's spec (its environment), its
/// metadata and logs are readable by the agent alone (the log directory also by the
/// workload's user, through an ACL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_state_is_private_to_the_agent() {
    use std::os::unix::fs::PermissionsExt;
    let (rt, dir, f) = ready_runtime().await;
    let mut o = options("private", &image(&f), "echo secret-env=$SECRET");
    o.env.insert("SECRET".into(), "hunter2".into());
    rt.create(&o).await.unwrap();
    rt.start("private").await.unwrap();
    wait_state(
        &rt,
        "private",
        ContainerState::Exited,
        Duration::from_secs(20),
    )
    .await;
    let root = dir.path().join("root");
    let mut stack = vec![root.clone()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(&root).unwrap().display().to_string();
        // Image contents and the container's own layer keep the image's modes (layers and
        // snapshots sit in directories only the agent enters, checked below).
        if meta.file_type().is_symlink()
            || rel.starts_with("slots/")
            || rel.starts_with("images/layers/")
            || rel.starts_with("images/snapshots/")
            || rel.contains("/upper")
            || rel.contains("/rootfs")
        {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        assert!(mode & 0o002 == 0, "{rel} is world-writable ({mode:o})");
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    let container = root.join("containers/private");
    for (path, what) in [
        (container.join("bundle"), "the spec with the environment"),
        (container.join("logs"), "the logs"),
        (root.join("images/layers"), "image layers"),
        (root.join("images/snapshots"), "image snapshots"),
    ] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o007, 0, "{what}: {} is {mode:o}", path.display());
    }
    let meta = std::fs::metadata(container.join("meta.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o077, 0, "meta.json");
    rt.remove("private", true).await.unwrap();
}

/// Another local user (`nobody`) can neither list, read nor write a container's files, its
/// image copies or the image store, even where the data directory above is searchable by
/// everyone. Root only (it switches to `nobody` with `setpriv`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_local_users_cannot_reach_container_files() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to act as another local user");
        return;
    }
    let (rt, dir, f) = ready_runtime().await;
    // The worst case: every directory above the runtime's root is searchable by all.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = options(
        "peek",
        &image(&f),
        "echo private-data > /tmp/secret; echo ready; sleep 60",
    );
    rt.create(&o).await.unwrap();
    rt.start("peek").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !texts(&rt, "peek").await.iter().any(|l| l == "ready") {
        assert!(
            std::time::Instant::now() < deadline,
            "the container never wrote its file"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let root = dir.path().join("root");
    let container = root.join("containers/peek");
    let writable = ["upper", "rootfs"]
        .iter()
        .map(|d| container.join(d).join("tmp"))
        .find(|p| p.join("secret").exists())
        .expect("the container's /tmp on the host");
    let slot_dirs: Vec<PathBuf> = std::fs::read_dir(root.join("slots"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let mut attempts = vec![
        format!("ls {}", container.display()),
        format!("ls {}", writable.display()),
        format!("cat {}", writable.join("secret").display()),
        format!("echo x > {}", writable.join("planted").display()),
        format!("ls {}", root.join("images").display()),
    ];
    for slot in &slot_dirs {
        attempts.push(format!("ls {}", slot.display()));
    }
    for attempt in &attempts {
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(attempt)
            .output()
            .expect("setpriv (util-linux)");
        assert!(
            !out.status.success(),
            "as nobody, `{attempt}` succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    assert!(!writable.join("planted").exists(), "nobody planted a file");
    rt.remove("peek", true).await.unwrap();
}

// ---- a hostile image, pulled from the registry as a node would ----

/// The attack reported against a root agent, for real: an image in the registry whose one
/// layer makes directories `x` and `d` (mode 6777) and then, in the same layer, symlinks
/// `x -> HOST_FILE` and `d -> HOST_DIR`. Pulling it, as a node does the moment a workload
/// names it, once made the host file setuid. The pull goes through (the layer is a valid
/// tar) and nothing outside the image store changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_image_cannot_chmod_a_host_file() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let host_file = dir.path().join("host-file");
    std::fs::write(&host_file, "root's").unwrap();
    std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let host_dir = dir.path().join("host-dir");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    let mut layer = tar::Builder::new(Vec::new());
    for name in ["x", "d"] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o6777);
        h.set_size(0);
        layer.append_data(&mut h, name, std::io::empty()).unwrap();
    }
    for (name, target) in [("x", &host_file), ("d", &host_dir)] {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        layer.append_link(&mut h, name, target).unwrap();
    }
    let tar = layer.into_inner().unwrap();
    let repo = format!("kat/attack-{}", std::process::id());
    push_image(&f.registry, &repo, &tar, &["/x"]);

    let pulled = rt
        .pull_image(&format!("{}/{repo}:latest", f.registry), None)
        .await;
    assert!(pulled.is_ok(), "the layer is a valid tar: {pulled:?}");
    let file_mode = std::fs::metadata(&host_file).unwrap().mode() & 0o7777;
    let dir_mode = std::fs::metadata(&host_dir).unwrap().mode() & 0o7777;
    assert_eq!(
        file_mode, 0o600,
        "the host file's mode changed: {file_mode:o}"
    );
    assert_eq!(
        dir_mode, 0o700,
        "the host directory's mode changed: {dir_mode:o}"
    );
    assert_eq!(std::fs::read(&host_file).unwrap(), b"root's");
}
