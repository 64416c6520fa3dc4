//! Builds from Git on the real system: a repository served by `git daemon` on loopback, a
//! Dockerfile `FROM` the loopback registry's busybox, buildah in the build slice's user
//! namespace, the result imported and run. Failures say why and leave no workspace; a
//! Dockerfile cannot read the agent's files.
//!
//! One file because its nine tests and the build benchmark share one harness: the `git
//! daemon` `Repo` with `commit` and `request`, `build` (which records the phases) and
//! `builds_left`; the two network tests also share `listen` and `host_address`.

mod support;

use kat_testkit::free_port;
use kat_testkit::git::{git, GitDaemon};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use kat_runtime::build::{BuildError, BuildLimits, BuildPhase, BuildRequest, CacheOutcome};
use kat_runtime::{ContainerRuntime, RuntimeError};
use support::*;

/// A Git repository: the working copy `dir/work`, served by `git daemon`.
struct Repo {
    work: PathBuf,
    url: String,
    _daemon: GitDaemon,
}

fn repo(dir: &Path) -> Repo {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    let daemon = GitDaemon::serve(dir);
    Repo {
        work,
        url: daemon.url("work"),
        _daemon: daemon,
    }
}

/// Writes `files` (path, content) into the working copy and commits them; the commit id.
fn commit(repo: &Repo, files: &[(&str, &str)], message: &str) -> String {
    for (path, content) in files {
        let p = repo.work.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
    }
    git(&repo.work, &["add", "-A"]);
    git(&repo.work, &["commit", "-q", "-m", message]);
    git(&repo.work, &["rev-parse", "HEAD"])
}

fn request(repo: &Repo, commit: &str, reference: &str) -> BuildRequest {
    BuildRequest {
        repository: repo.url.clone(),
        commit: commit.to_string(),
        context: "app".into(),
        dockerfile: "Dockerfile".into(),
        reference: reference.into(),
        ..Default::default()
    }
}

fn builds_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("root/builds"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

async fn build(
    rt: &dyn ContainerRuntime,
    request: &BuildRequest,
) -> (
    Result<kat_runtime::build::BuildOutcome, RuntimeError>,
    Vec<BuildPhase>,
) {
    let (tx, mut rx) = tokio::sync::watch::channel(BuildPhase::Cloning);
    let seen = tokio::spawn(async move {
        let mut seen = vec![rx.borrow_and_update().clone()];
        while rx.changed().await.is_ok() {
            seen.push(rx.borrow_and_update().clone());
        }
        seen
    });
    let result = rt.build_image(request, BuildLimits::default(), &tx).await;
    drop(tx);
    (result, seen.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_a_commit_with_its_options_and_runs_it() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let token = format!("token-{}", std::process::id());
    let dockerfile = format!(
        "FROM {} AS base\nARG GREETING=unset\nRUN echo \"$GREETING\" > /greeting\n\
         FROM base AS final\nCOPY commit.txt /commit.txt\nCMD [\"sh\", \"-c\", \"cat /greeting /commit.txt\"]\n\
         FROM base AS other\nRUN echo the-wrong-stage > /greeting\n",
        image(&f)
    );
    let first = commit(
        &r,
        &[
            ("app/Dockerfile", &dockerfile),
            ("app/commit.txt", &token),
            ("README", "outside the build context\n"),
        ],
        "first",
    );
    // The leader's question: which commit is `main` now?
    let url = r.url.clone();
    let resolved = tokio::task::spawn_blocking(move || {
        kat_git::resolve(&url, Some("main"), None, &support::loopback())
    })
    .await
    .unwrap()
    .expect("resolve main");
    assert_eq!(resolved, first);
    let reference = kat_runtime::build::local_reference("default", "app", &first);
    let mut req = request(&r, &first, &reference);
    req.build_args = [("GREETING".to_string(), "hello-from-build-args".to_string())].into();
    req.target = Some("final".into());
    let started = std::time::Instant::now();
    let (result, phases) = build(&rt, &req).await;
    let summary = result.expect("the build").image;
    eprintln!("build took {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        summary
            .references
            .iter()
            .any(|r| r.contains("kat-local/default_app:")),
        "{summary:?}"
    );
    assert!(
        phases
            .iter()
            .any(|p| matches!(p, BuildPhase::Building(Some(s)) if s.steps > 0)),
        "progress by step: {phases:?}"
    );
    assert!(
        builds_left(dir.path()).is_empty(),
        "workspace left: {:?}",
        builds_left(dir.path())
    );
    let (code, out) = run(&rt, "built", &reference, "cat /greeting /commit.txt").await;
    assert_eq!(code, 0);
    assert_eq!(out, ["hello-from-build-args", token.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_say_why_and_leave_no_workspace() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let broken = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!("FROM {}\nRUN echo about to fail && false\n", image(&f)),
        )],
        "broken",
    );
    let (result, _) = build(&rt, &request(&r, &broken, "kat-local/default_app:broken")).await;
    match result {
        Err(RuntimeError::Build(BuildError::Failed { step, tail })) => {
            assert!(step.contains("RUN echo about to fail"), "{step}");
            assert!(tail.contains("about to fail"), "{tail}");
        }
        other => panic!("a broken Dockerfile: {other:?}"),
    }
    assert!(builds_left(dir.path()).is_empty());

    // A base image on a cloud's metadata address: buildah pulls with the node's network,
    // so the registry is checked first and the build refused before anything runs.
    let metadata = commit(
        &r,
        &[(
            "app/Dockerfile",
            "FROM 169.254.169.254/latest/meta-data:x\nRUN true\n",
        )],
        "metadata",
    );
    let (result, _) = build(&rt, &request(&r, &metadata, "kat-local/default_app:meta")).await;
    let e = result
        .expect_err("a base image at a link-local address")
        .to_string();
    assert!(
        e.contains("base image 169.254.169.254/latest/meta-data:x") && e.contains("link-local"),
        "{e}"
    );
    assert!(builds_left(dir.path()).is_empty());

    let unknown = "0123456789abcdef0123456789abcdef01234567";
    let (result, _) = build(&rt, &request(&r, unknown, "kat-local/default_app:unknown")).await;
    let e = result.expect_err("an unknown commit").to_string();
    assert!(e.contains(unknown), "{e}");
    assert!(builds_left(dir.path()).is_empty());

    let mut missing = request(&r, &broken, "kat-local/default_app:missing");
    missing.context = "no-such-dir".into();
    let (result, _) = build(&rt, &missing).await;
    let e = result.expect_err("a missing context").to_string();
    assert!(
        e.contains("buildContext") && e.contains("no-such-dir"),
        "{e}"
    );

    let port = free_port();
    let mut unreachable = request(&r, &broken, "kat-local/default_app:x");
    unreachable.repository = format!("git://127.0.0.1:{port}/nothing");
    let (result, _) = build(&rt, &unreachable).await;
    let e = result.expect_err("an unreachable repository").to_string();
    assert!(e.contains("cannot reach") || e.contains("fetching"), "{e}");

    unreachable.repository = "file:///etc".into();
    let (result, _) = build(&rt, &unreachable).await;
    let e = result.expect_err("a local path").to_string();
    assert!(e.contains("expected an https://"), "{e}");
    assert!(builds_left(dir.path()).is_empty());
    assert!(rt
        .list_images()
        .await
        .unwrap()
        .iter()
        .all(|i| !i.references.iter().any(|r| r.contains("kat-local"))));
}

/// A build pushed to its cache repository is pulled, not built, by a node that lacks it
/// (here a second runtime with an empty image store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_build_is_pulled_instead_of_built() {
    let f = fixtures();
    let (first_rt, first_dir) = runtime(&f);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let token = format!("cached-{}-{}", std::process::id(), free_port());
    let commit_id = commit(
        &r,
        &[
            (
                "app/Dockerfile",
                &format!("FROM {}\nCOPY token /token\n", image(&f)),
            ),
            ("app/token", &token),
        ],
        "cached",
    );
    let cache = format!("{}/kat-cache/app-{}", f.registry, std::process::id());
    let reference = kat_runtime::build::local_reference("default", "app", &commit_id);
    let mut req = request(&r, &commit_id, &reference);
    req.cache = Some(cache.clone());
    let (result, _) = build(&first_rt, &req).await;
    let outcome = result.expect("the first build");
    assert_eq!(
        outcome.cache,
        CacheOutcome::Pushed(kat_runtime::build::cache_reference(&cache, &req))
    );
    assert!(builds_left(first_dir.path()).is_empty());

    // Another node: nothing in its store, the repository gone (a build could not even clone).
    drop(r);
    let (second_rt, second_dir) = runtime(&f);
    let started = std::time::Instant::now();
    let (result, phases) = build(&second_rt, &req).await;
    let took = started.elapsed();
    let outcome = result.expect("the cache hit");
    assert!(
        matches!(&outcome.cache, CacheOutcome::Hit(from) if from.contains(&commit_id)),
        "{:?}",
        outcome.cache
    );
    // (The first phase is the channel's initial value.)
    assert!(
        !phases[1..]
            .iter()
            .any(|p| matches!(p, BuildPhase::Cloning | BuildPhase::Building(_))),
        "nothing was cloned or built: {phases:?}"
    );
    assert!(took < Duration::from_secs(3), "a cache hit took {took:?}");
    assert!(
        !second_dir.path().join("root/builds").exists()
            || builds_left(second_dir.path()).is_empty()
    );
    // Kept under the workload's name only, and it is the image that was built.
    let images = second_rt.list_images().await.unwrap();
    assert!(images
        .iter()
        .all(|i| !i.references.iter().any(|r| r.contains("kat-cache"))));
    let (code, out) = run(&second_rt, "cached", &reference, "cat /token").await;
    assert_eq!(code, 0);
    assert_eq!(out, [token.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dockerfile_cannot_read_the_agents_files() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    // A secret of the agent's, as its PKI keys are: 0600 in a 0700 directory.
    let private = dir.path().join("root/pki");
    std::fs::create_dir_all(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let secret = private.join("node.key");
    std::fs::write(&secret, "AGENT-SECRET-KEY\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    std::fs::create_dir_all(r.work.join("app")).unwrap();
    std::os::unix::fs::symlink(&secret, r.work.join("app/leak")).unwrap();
    let reading = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!(
                "FROM {}\nRUN (cat {} || echo denied) > /out 2>&1; (ls {} || echo denied) >> /out 2>&1\n",
                image(&f),
                secret.display(),
                private.display()
            ),
        )],
        "reads the host",
    );
    let (result, _) = build(&rt, &request(&r, &reading, "kat-local/default_app:reads")).await;
    result.expect("the build itself succeeds");
    let (_, out) = run(&rt, "reads", "kat-local/default_app:reads", "cat /out").await;
    assert!(!out.join("\n").contains("AGENT-SECRET"), "{out:?}");

    // A symbolic link in the context that points at the key: COPY must not follow it out.
    let copying = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!("FROM {}\nCOPY leak /leak\n", image(&f)),
        )],
        "copies a link",
    );
    let (result, _) = build(&rt, &request(&r, &copying, "kat-local/default_app:copies")).await;
    if result.is_ok() {
        let (_, out) = run(&rt, "copies", "kat-local/default_app:copies", "cat /leak").await;
        assert!(!out.join("\n").contains("AGENT-SECRET"), "{out:?}");
    }
    assert!(builds_left(dir.path()).is_empty());
}

/// A listener on `addr` that answers every connection with `token` and counts them.
struct Listener {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn listen(addr: &str, token: &str) -> Listener {
    use std::io::Write;
    let l = std::net::TcpListener::bind((addr, 0)).expect("listen");
    let port = l.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (count, token) = (accepted.clone(), format!("{token}\n"));
    std::thread::spawn(move || {
        for mut conn in l.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = conn.write_all(token.as_bytes());
        }
    });
    Listener { port, accepted }
}

/// The host's first global IPv4 address (not loopback), if it has one.
fn host_address() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut words = l.split_whitespace();
        words.find(|w| *w == "inet")?;
        Some(words.next()?.split('/').next()?.to_string())
    })
}

/// A process of the host's whose command line carries `marker`; killed on drop.
struct Marker(Child);

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn marker_process(marker: &str) -> Marker {
    let child = Command::new("sleep")
        .arg0(marker)
        .arg("300")
        .spawn()
        .expect("sleep");
    // The host sees it (once it has exec'd): the test below would see a leak.
    let path = format!("/proc/{}/cmdline", child.id());
    let seen = (0..200).any(|_| {
        let found =
            std::fs::read(&path).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker));
        if !found {
            std::thread::sleep(Duration::from_millis(10));
        }
        found
    });
    assert!(seen, "the marker process's command line");
    Marker(child)
}

/// The attacks of a `RUN` step on the host: its processes' command lines (a process of the
/// test's carries a marker in its argv), a listener on the host's loopback (directly and
/// through slirp4netns's host alias 10.0.2.2). None may work; the build itself, `RUN`
/// steps and egress to the host's non-loopback address (a listener there stands for the
/// outside world) must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_step_sees_no_host_process_and_reaches_no_host_loopback() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let id = format!("{}-{}", std::process::id(), free_port());
    let marker = format!("kat-host-marker-{id}");
    let _marker = marker_process(&marker);
    let loopback = listen("127.0.0.1", &format!("HOST-LOOPBACK-{id}"));
    let outside = host_address();
    let egress = outside
        .as_deref()
        .map(|a| (a.to_string(), listen(a, &format!("EGRESS-{id}"))));
    // The marker is split in the script, so that the RUN step's own command line does not
    // carry it; `cat` reads every command line before `grep` (which has it) starts.
    let (first, rest) = marker.split_at(9);
    let egress_run = match &egress {
        Some((addr, l)) => format!(
            "RUN (nc -w 5 {addr} {} </dev/null || echo failed) > /egress 2>&1\n",
            l.port
        ),
        None => "RUN echo no-address > /egress\n".into(),
    };
    let dockerfile = format!(
        "FROM {image}\n\
         RUN M={first}; M=\"${{M}}{rest}\"; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' > /tmp/all; \
             if grep -q \"$M\" /tmp/all; then echo LEAK; else echo clean; fi > /procs; \
             ls -d /proc/[0-9]* | wc -l > /count\n\
         RUN (nc -w 3 127.0.0.1 {port} </dev/null || echo refused) > /loopback 2>&1; \
             (nc -w 3 10.0.2.2 {port} </dev/null || echo refused) > /gateway 2>&1; \
             cat /proc/net/dev > /links\n\
         {egress_run}",
        image = image(&f),
        port = loopback.port,
    );
    let c = commit(&r, &[("app/Dockerfile", &dockerfile)], "attacks the host");
    let reference = "kat-local/default_app:contained";
    let (result, _) = build(&rt, &request(&r, &c, reference)).await;
    result.expect("the build succeeds, RUN steps run");
    let (code, out) = run(
        &rt,
        "contained",
        reference,
        "cat /procs /count /loopback /gateway /egress; echo; cat /links",
    )
    .await;
    assert_eq!(code, 0, "{out:?}");
    let text = out.join("\n");
    eprintln!("{text}");
    assert_eq!(out[0], "clean", "a RUN step saw a host process: {out:?}");
    let count: usize = out[1].trim().parse().expect("a process count");
    assert!(
        (1..20).contains(&count),
        "a RUN step sees its build's processes only: {count}"
    );
    assert!(
        !text.contains("HOST-LOOPBACK"),
        "reached the host's loopback: {text}"
    );
    assert_eq!(
        loopback.accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the loopback listener was connected to"
    );
    assert!(text.contains("tap0"), "the build's egress device: {text}");
    assert!(!text.contains("eth0"), "the host's interfaces: {text}");
    match &egress {
        Some((addr, l)) => {
            assert!(
                text.contains(&format!("EGRESS-{id}")),
                "egress to {addr} did not work: {text}"
            );
            assert!(l.accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        }
        None => eprintln!("no global IPv4 address on this host: egress not tested"),
    }
    assert!(builds_left(dir.path()).is_empty());
}

/// `network: none`: `RUN` steps have `lo` and nothing else, and reach nothing outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_network_none_a_run_step_has_only_lo() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let id = format!("{}-{}", std::process::id(), free_port());
    let outside = host_address().unwrap_or_else(|| "192.0.2.1".into());
    let target = listen(&outside, &format!("REACHED-{id}"));
    let loopback = listen("127.0.0.1", &format!("REACHED-{id}"));
    let dockerfile = format!(
        "FROM {}\n\
         RUN cat /proc/net/dev > /links; \
             (nc -w 3 {outside} {} </dev/null || echo failed) > /out 2>&1; \
             (nc -w 3 127.0.0.1 {} </dev/null || echo failed) >> /out 2>&1\n",
        image(&f),
        target.port,
        loopback.port
    );
    let c = commit(&r, &[("app/Dockerfile", &dockerfile)], "no network");
    let reference = "kat-local/default_app:offline";
    let mut req = request(&r, &c, reference);
    req.network = kat_runtime::build::BuildNetwork::None;
    let (result, _) = build(&rt, &req).await;
    result.expect("the build succeeds without a network");
    let (code, out) = run(&rt, "offline", reference, "cat /links; echo ==; cat /out").await;
    assert_eq!(code, 0, "{out:?}");
    let interfaces: Vec<&str> = out
        .iter()
        .take_while(|l| *l != "==")
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .filter(|name| !name.contains('|') && !name.is_empty())
        .collect();
    assert_eq!(interfaces, ["lo"], "{out:?}");
    let text = out.join("\n");
    assert!(!text.contains("REACHED"), "{text}");
    for l in [&target, &loopback] {
        assert_eq!(l.accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
    assert!(builds_left(dir.path()).is_empty());
}

/// Two builds at once run as the same host uid (the build slice's root), and a `RUN` step
/// holds `CAP_SYS_CHROOT` under chroot isolation. A `RUN` step of the second build, knowing
/// the first's workspace (a build argument here), leaves its chroot the classic way
/// (`kat-escape-probe --chroot-escape`: chroot to a subdirectory, climb out, chroot there)
/// and lists the workspaces' directory and reads the first's: it gets out of the chroot (the
/// directory exists there), sees its own workspace only, and the first build goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_step_cannot_reach_a_concurrent_builds_workspace() {
    let f = fixtures();
    let probe = std::path::PathBuf::from(
        std::env::var("KAT_TEST_PROBE_DIR")
            .expect("KAT_TEST_PROBE_DIR: run `source <(scripts/test-fixtures.sh)` first"),
    )
    .join("kat-escape-probe");
    let (rt, dir) = runtime(&f);
    let rt = std::sync::Arc::new(rt);
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let slow = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!("FROM {}\nRUN sleep 12 && echo slow > /slow\n", image(&f)),
        )],
        "slow",
    );
    let first = {
        let (rt, req) = (rt.clone(), request(&r, &slow, "kat-local/default_app:slow"));
        tokio::spawn(async move { build(&*rt, &req).await.0 })
    };
    let builds = dir.path().join("root/builds");
    let mut other = None;
    for _ in 0..200 {
        if let [name] = builds_left(dir.path()).as_slice() {
            if builds.join(name).join("state").exists() {
                other = Some(builds.join(name).canonicalize().unwrap());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = other.expect("the first build's workspace");
    let parent = other.parent().unwrap().display().to_string();
    std::fs::create_dir_all(r.work.join("app")).unwrap();
    std::fs::copy(&probe, r.work.join("app/probe")).expect("the escape probe");
    let snoop = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!(
                "FROM {}\nARG OTHER\nARG PARENT\nCOPY probe /probe\n\
                 RUN /probe --chroot-escape \"$PARENT\" \"$OTHER/conf\" > /escape 2>&1\n",
                image(&f)
            ),
        )],
        "snoops",
    );
    let mut req = request(&r, &snoop, "kat-local/default_app:snoop");
    req.build_args = [
        ("OTHER".to_string(), other.display().to_string()),
        ("PARENT".to_string(), parent.clone()),
    ]
    .into();
    let (result, _) = build(&*rt, &req).await;
    result.expect("the second build");
    assert!(other.exists(), "the first build is still running");
    let (code, out) = run(&*rt, "snoop", "kat-local/default_app:snoop", "cat /escape").await;
    assert_eq!(code, 0, "{out:?}");
    // Out of the chroot: the workspaces' directory exists there...
    assert!(
        out.iter()
            .any(|l| l == &format!("escaped: {parent} exists")),
        "the chroot escape did not work, so proves nothing: {out:?}"
    );
    // ...the other workspace is out of reach, and the directory holds one, its own.
    assert!(
        out.iter().any(|l| l.starts_with("other: denied")),
        "a RUN step read another build's workspace: {out:?}"
    );
    let entries: Vec<&String> = out.iter().filter(|l| l.starts_with("entry: ")).collect();
    let other_name = other.file_name().unwrap().to_string_lossy().to_string();
    assert_eq!(entries.len(), 1, "{out:?}");
    assert_ne!(entries[0], &format!("entry: {other_name}"), "{out:?}");
    first.await.unwrap().expect("the first build, undisturbed");
    assert!(builds_left(dir.path()).is_empty());
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
}

/// Workspace `name` (and `others` beside it) in the builder's directory, open to the build's
/// root as the runtime opens one (mode 0777 here, where the runtime uses an ACL), with
/// `conf/` and `state/`; and a sandbox in it behind `prefix`, with `env`.
fn sandbox_in(
    b: &kat_runtime::build::Builder,
    name: &str,
    others: &[&str],
    prefix: Vec<String>,
    env: Vec<(String, String)>,
) -> (PathBuf, kat_runtime::build::buildah::Sandbox) {
    std::fs::create_dir_all(&b.root).unwrap();
    chmod(&b.root, 0o711);
    for dir in std::iter::once(&name).chain(others) {
        std::fs::create_dir_all(b.root.join(dir).join("conf")).unwrap();
        chmod(&b.root.join(dir), 0o777);
    }
    let ws = b.root.join(name).canonicalize().unwrap();
    std::fs::create_dir(ws.join("state")).unwrap();
    chmod(&ws.join("state"), 0o777);
    let sandbox = kat_runtime::build::buildah::Sandbox {
        host_uid: b.slice.0,
        host_gid: b.slice.1,
        count: b.slice.2,
        workspace: ws.clone(),
        state: ws.join("state"),
        private: None,
        conf: ws.join("conf"),
        prefix,
        helper: b.helper.clone(),
        env,
    };
    (ws, sandbox)
}

/// Under systemd the sandbox runs behind `systemd-run --scope …` (the VM stage takes that
/// path). Here a prefix that does not even exec in place (a shell that waits for it, so
/// the sandbox is not the agent's child) stands for it: the sandbox says its own pid, gets
/// its id maps and its egress, and its command runs contained all the same: few processes
/// in `/proc`, slirp4netns's `tap0` and no host interface, one workspace in the
/// workspaces' directory, slirp4netns's DNS forwarder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_behind_a_prefix_is_contained_too() {
    use kat_runtime::build::buildah::{Contain, Spawned};
    use tokio::io::AsyncReadExt;
    let f = fixtures();
    let (rt, _dir) = runtime(&f);
    let b = rt.builder().expect("the builder");
    let builds = b.root.clone();
    let (ws, sandbox) = sandbox_in(
        &b,
        "bprefixed",
        &["bother"],
        ["sh", "-c", "\"$@\"; exit $?", "sh"]
            .map(String::from)
            .to_vec(),
        Vec::new(),
    );
    std::fs::write(
        ws.join("conf/resolv.conf"),
        kat_runtime::build::egress::RESOLV_CONF,
    )
    .unwrap();
    let script = format!(
        "ls -d /proc/[0-9]* | wc -l; echo ==; cat /proc/net/dev; echo ==; ls -a {}; echo ==; cat /etc/resolv.conf",
        builds.canonicalize().unwrap().display()
    );
    let Spawned {
        mut child,
        mut stdout,
        egress,
    } = sandbox
        .spawn(
            "sh",
            &["-c".to_string(), script],
            Vec::new(),
            Contain::Build(kat_runtime::build::BuildNetwork::Egress),
        )
        .await
        .expect("the sandbox behind a prefix");
    assert!(egress.is_some());
    let mut out = String::new();
    let mut err = String::new();
    let mut stderr = child.stderr.take().unwrap();
    let (a, e) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err)
    );
    a.unwrap();
    e.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{status}: {out}{err}");
    drop(egress);
    let parts: Vec<&str> = out.split("==\n").collect();
    assert_eq!(parts.len(), 4, "{out}");
    let count: usize = parts[0].trim().parse().expect("a count");
    assert!((1..10).contains(&count), "{count} processes: {out}");
    assert!(
        parts[1].contains("tap0") && !parts[1].contains("eth0"),
        "{out}"
    );
    let entries: Vec<&str> = parts[2]
        .lines()
        .filter(|l| *l != "." && *l != "..")
        .collect();
    assert_eq!(entries, ["bprefixed"], "{out}");
    assert!(parts[3].contains("nameserver 10.0.2.3"), "{out}");
    let _ = sandbox
        .output(
            "rm",
            &["-rf".into(), ws.join("state").display().to_string()],
        )
        .await;
}

/// buildah's pulls and pushes connect through the outbound proxy, which checks the address
/// it connects to: a registry name that resolves elsewhere after the runtime's own check (DNS
/// rebinding) is refused there. A registry at a link-local address, pulled by buildah in a
/// sandbox with the proxy's environment, is refused by the proxy (without it, buildah would
/// connect there itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buildahs_connections_go_through_the_outbound_proxy() {
    use kat_runtime::build::buildah::{registries_conf, registries_d};
    let f = fixtures();
    let (rt, _dir) = runtime(&f);
    let b = rt.builder().expect("the builder");
    let proxy = kat_outbound::PinnedProxy::start(kat_outbound::OutboundPolicy::default())
        .expect("the proxy");
    let env = vec![
        ("HTTPS_PROXY".into(), proxy.url()),
        ("NO_PROXY".into(), String::new()),
    ];
    let (ws, sandbox) = sandbox_in(&b, "bproxied", &[], Vec::new(), env);
    std::fs::create_dir(ws.join("conf/registries.d")).unwrap();
    std::fs::write(ws.join("conf/registries.conf"), registries_conf(&[])).unwrap();
    std::fs::write(
        ws.join("conf/registries.d/default.yaml"),
        registries_d(&ws.join("state")),
    )
    .unwrap();
    for dir in ["conf", "conf/registries.d"] {
        chmod(&ws.join(dir), 0o755);
    }
    for file in ["conf/registries.conf", "conf/registries.d/default.yaml"] {
        chmod(&ws.join(file), 0o644);
    }
    let mut args = sandbox.global_args();
    args.extend(["pull".into(), "docker://169.254.169.254/metadata:1".into()]);
    let (ok, out) =
        tokio::time::timeout(Duration::from_secs(120), sandbox.output("buildah", &args))
            .await
            .expect("buildah answers within 2 minutes")
            .expect("buildah runs");
    assert!(!ok, "a pull from a link-local registry: {out}");
    match proxy.refusal() {
        Some(kat_outbound::OutboundError::Refused { addr, .. }) => {
            assert_eq!(addr.to_string(), "169.254.169.254", "{out}")
        }
        other => panic!("the proxy refused nothing ({other:?}): buildah said {out}"),
    }
    let _ = sandbox
        .output(
            "rm",
            &["-rf".into(), ws.join("state").display().to_string()],
        )
        .await;
}

/// `bench/build.sh`: a cold build of a git commit through the runtime (clone, buildah,
/// import) until its container runs, against `git clone` + `buildah bud` of the same commit
/// by hand with the same storage driver and isolation, 3 runs each, medians. Prints one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: bench/build.sh runs it"]
async fn build_benchmark() {
    let f = fixtures();
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    let first = commit(
        &r,
        &[
            (
                "app/Dockerfile",
                &format!(
                    "FROM {}\nRUN echo built > /built && for i in 1 2 3; do echo step $i; done\nCOPY commit.txt /commit.txt\n",
                    image(&f)
                ),
            ),
            ("app/commit.txt", "bench\n"),
        ],
        "bench",
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let mut kat = Vec::new();
    for run in 0..3 {
        let (rt, _dir) = runtime(&f);
        let reference = format!("kat-local/default_bench{run}:{}", &first[..7]);
        let started = std::time::Instant::now();
        let (result, _) = build(&rt, &request(&r, &first, &reference)).await;
        result.expect("build");
        let id = format!("bench{run}");
        rt.create(&options(&id, &reference, "cat /built"))
            .await
            .expect("create");
        rt.start(&id).await.expect("start");
        kat.push(started.elapsed().as_secs_f64());
        rt.remove(&id, true).await.ok();
    }
    let mut by_hand = Vec::new();
    for _ in 0..3 {
        let work = tempfile::tempdir_in(test_root()).unwrap();
        let w = work.path().display().to_string();
        let script = format!(
            "set -e; cd {w}; git clone -q {url} src; cd src; git checkout -q {first}; \
             printf 'default-docker:\\n  lookaside: file://{w}/sig\\n' > {w}/d.yaml; mkdir -p {w}/regd; mv {w}/d.yaml {w}/regd/default.yaml; \
             printf '[[registry]]\\nlocation = \"{reg}\"\\ninsecure = true\\n' > {w}/registries.conf; \
             buildah --root {w}/st --runroot {w}/run --storage-driver vfs --registries-conf {w}/registries.conf --registries-conf-dir {w}/regd \
               bud -q --isolation chroot --layers=false -f app/Dockerfile -t bench app >/dev/null",
            url = r.url,
            reg = f.registry,
        );
        let started = std::time::Instant::now();
        let out = Command::new("sh").args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        by_hand.push(started.elapsed().as_secs_f64());
        let _ = Command::new("buildah")
            .args([
                "--root",
                &format!("{w}/st"),
                "--runroot",
                &format!("{w}/run"),
                "--storage-driver",
                "vfs",
                "rm",
                "-a",
            ])
            .output();
        let _ = Command::new("sh")
            .args(["-c", &format!("chmod -R u+w {w} 2>/dev/null; true")])
            .output();
    }
    // Cache hits: the commit pushed to a cache repository once, then pulled by fresh
    // runtimes (an empty image store each, as a node that never built it) until it starts.
    let cache = format!("{}/kat-cache/bench-{}", f.registry, std::process::id());
    {
        let (rt, _dir) = runtime(&f);
        let mut req = request(&r, &first, "kat-local/default_benchcache:seed");
        req.cache = Some(cache.clone());
        let (result, _) = build(&rt, &req).await;
        assert!(matches!(
            result.expect("seeding the cache").cache,
            CacheOutcome::Pushed(_)
        ));
    }
    let mut hits = Vec::new();
    for run in 0..3 {
        let (rt, _dir) = runtime(&f);
        let reference = format!("kat-local/default_benchhit{run}:{}", &first[..7]);
        let mut req = request(&r, &first, &reference);
        req.cache = Some(cache.clone());
        let started = std::time::Instant::now();
        let (result, _) = build(&rt, &req).await;
        assert!(matches!(
            result.expect("cache hit").cache,
            CacheOutcome::Hit(_)
        ));
        let id = format!("hit{run}");
        rt.create(&options(&id, &reference, "cat /built"))
            .await
            .expect("create");
        rt.start(&id).await.expect("start");
        hits.push(started.elapsed().as_secs_f64());
        rt.remove(&id, true).await.ok();
    }
    let (cold, hand, hit) = (median(kat), median(by_hand), median(hits));
    println!(
        "build cold_s={cold:.2} buildah_s={hand:.2} kat/buildah={:.2} cache_hit_s={hit:.2}",
        cold / hand
    );
}

/// The node's registry credentials never reach a RUN step: the workspace's copy of the auth
/// file is there for the base image pulls and gone before `bud` starts. The step escapes its
/// chroot (it keeps `CAP_SYS_CHROOT`) into the workspace, where the copy was, and tries to
/// read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_step_cannot_read_the_nodes_registry_credentials() {
    let f = fixtures();
    let probe = std::path::PathBuf::from(
        std::env::var("KAT_TEST_PROBE_DIR")
            .expect("KAT_TEST_PROBE_DIR: run `source <(scripts/test-fixtures.sh)` first"),
    )
    .join("kat-escape-probe");
    let dir = runtime_dir("kat-rt-");
    let marker = format!("secret-{}", std::process::id());
    let auth = dir.path().join("auth.json");
    {
        use base64::Engine;
        let creds = base64::engine::general_purpose::STANDARD.encode(format!("kat:{marker}"));
        std::fs::write(
            &auth,
            format!(
                "{{\"auths\": {{\"{}\": {{\"auth\": \"{creds}\"}}}}}}",
                f.registry
            ),
        )
        .unwrap();
    }
    let mut config = config_in(&f, dir.path());
    config.registries.auth_files = vec![auth];
    let rt = kat_runtime::NativeRuntime::new(config).expect("runtime");
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    std::fs::create_dir_all(r.work.join("app")).unwrap();
    std::fs::copy(&probe, r.work.join("app/probe")).expect("the escape probe");
    let builds = dir
        .path()
        .join("root/builds")
        .canonicalize()
        .unwrap_or_else(|_| dir.path().join("root/builds"));
    let reads = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!(
                "FROM {}\nARG BUILDS\nCOPY probe /probe\n\
                 RUN /probe --chroot-escape \"$BUILDS\" \"$BUILDS/{{entry}}/conf/auth.json\" > /escape 2>&1\n",
                image(&f)
            ),
        )],
        "reads credentials",
    );
    let mut req = request(&r, &reads, "kat-local/default_app:creds");
    req.build_args = [("BUILDS".to_string(), builds.display().to_string())].into();
    let (result, _) = build(&rt, &req).await;
    result.expect("the build");
    let (code, out) = run(&rt, "creds", "kat-local/default_app:creds", "cat /escape").await;
    assert_eq!(code, 0, "{out:?}");
    assert!(
        out.iter()
            .any(|l| l.starts_with("escaped: ") && l.ends_with(" exists")),
        "the chroot escape did not work, so proves nothing: {out:?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("entry: ")),
        "the step sees its own workspace: {out:?}"
    );
    assert!(
        !out.iter().any(|l| l.starts_with("other: READ")),
        "a RUN step read the node's registry credentials: {out:?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("other: denied")),
        "{out:?}"
    );
}

/// A RUN step that escapes its chroot swaps its workspace's `conf/` for links to a host
/// file; the cache push after the build, which needs the node's credentials, writes none of
/// them through those links: the host file keeps its content and mode, and the push still
/// works from a directory the agent made after the build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_cannot_aim_the_cache_push_at_a_host_file() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixtures();
    let probe = std::path::PathBuf::from(
        std::env::var("KAT_TEST_PROBE_DIR")
            .expect("KAT_TEST_PROBE_DIR: run `source <(scripts/test-fixtures.sh)` first"),
    )
    .join("kat-escape-probe");
    let dir = runtime_dir("kat-rt-");
    let auth = dir.path().join("auth.json");
    std::fs::write(&auth, "{\"auths\": {}}").unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "the host's").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut config = config_in(&f, dir.path());
    config.registries.auth_files = vec![auth];
    let rt = kat_runtime::NativeRuntime::new(config).expect("runtime");
    let src = tempfile::tempdir_in(test_root()).unwrap();
    let r = repo(src.path());
    std::fs::create_dir_all(r.work.join("app")).unwrap();
    std::fs::copy(&probe, r.work.join("app/probe")).expect("the escape probe");
    let builds = dir.path().join("root/builds");
    let plants = commit(
        &r,
        &[(
            "app/Dockerfile",
            &format!(
                "FROM {}\nARG BUILDS\nARG VICTIM\nCOPY probe /probe\n\
                 RUN /probe --chroot-escape-plant \"$BUILDS\" \"$VICTIM\" > /escape 2>&1\n",
                image(&f)
            ),
        )],
        "plants links",
    );
    let mut req = request(&r, &plants, "kat-local/default_app:plants");
    req.build_args = [
        ("BUILDS".to_string(), builds.display().to_string()),
        ("VICTIM".to_string(), victim.display().to_string()),
    ]
    .into();
    req.cache = Some(format!(
        "{}/kat-cache/plants-{}",
        f.registry,
        std::process::id()
    ));
    let (result, _) = build(&rt, &req).await;
    let outcome = result.expect("the build");
    let (code, out) = run(&rt, "plants", "kat-local/default_app:plants", "cat /escape").await;
    assert_eq!(code, 0, "{out:?}");
    assert!(
        out.iter().any(|l| l == "planted"),
        "the links were not planted, so this proves nothing: {out:?}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the host's");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the host file's mode changed");
    assert!(
        matches!(outcome.cache, CacheOutcome::Pushed(_)),
        "the push works from the agent's own directory: {:?}",
        outcome.cache
    );
}
