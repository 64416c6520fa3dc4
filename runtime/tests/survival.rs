//! Containers outlive the agent; logs stream with follow, since and tail; exec.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use kat_runtime::async_pipe::AsyncPipe;
use kat_runtime::{ContainerRuntime, ContainerState, ExecOptions, LogOptions, NativeRuntime};
use support::*;

/// Not a test on its own: the "agent" the survival test kills. It runs only when the
/// survival test re-executes this binary with KAT_HELPER_ROOT set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_agent_process() {
    let Ok(root) = std::env::var("KAT_HELPER_ROOT") else {
        return;
    };
    let f = fixtures();
    let rt = runtime_in(&f, std::path::Path::new(&root));
    rt.pull_image(&image(&f), None).await.expect("pull");
    let tick = "i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.02; done";
    rt.create(&options("survivor", &image(&f), tick))
        .await
        .expect("create");
    rt.create(&options(
        "finisher",
        &image(&f),
        "echo working; sleep 1; exit 7",
    ))
    .await
    .expect("create");
    rt.start("survivor").await.expect("start");
    rt.start("finisher").await.expect("start");
    println!("ready");
    std::io::stdout().flush().ok();
    tokio::time::sleep(Duration::from_secs(600)).await;
}

fn ticks(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("tick-")?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_outlive_a_killed_agent_and_are_readopted() {
    let f = fixtures();
    let dir = runtime_dir("kat-survive-");
    let mut agent = Command::new(std::env::current_exe().unwrap())
        .args([
            "helper_agent_process",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("KAT_HELPER_ROOT", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(agent.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "helper agent died before its containers started"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    agent.kill().unwrap(); // SIGKILL: no cleanup of any kind
    agent.wait().unwrap();
    let killed_at = std::time::Instant::now();

    // A new agent finds both containers from disk, with the right state.
    let rt = runtime_in(&f, dir.path());
    let list = rt.list().await.unwrap();
    let ids: Vec<&str> = list.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["finisher", "survivor"], "no duplicates, nothing lost");
    assert_eq!(list[1].state, ContainerState::Running);
    let finished = wait_state(
        &rt,
        "finisher",
        ContainerState::Exited,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        finished.exit_code,
        Some(7),
        "exit code kept while no agent was there"
    );
    assert!(finished.finished_at.is_some());

    // Logs went on without the agent: more ticks than before, none lost or repeated.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(killed_at.elapsed() >= Duration::from_millis(300));
    let s = rt.stop("survivor", Duration::from_secs(5)).await.unwrap();
    assert_eq!(s.state, ContainerState::Exited);
    let n = ticks(&texts(&rt, "survivor").await);
    assert!(n.len() > 20, "only {} ticks", n.len());
    assert!(
        n.iter().enumerate().all(|(i, t)| *t == i as u32),
        "gap or duplicate in {n:?}"
    );
    for id in ["finisher", "survivor"] {
        rt.remove(id, true).await.unwrap();
    }
    assert!(rt.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_since_and_tail() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options(
        "talker",
        &image(&f),
        "for i in 1 2 3; do echo line-$i; done; sleep 0.5; echo late; printf tail-no-newline",
    ))
    .await
    .unwrap();
    rt.start("talker").await.unwrap();
    // Follow from the start: everything, in order, ending when the container does.
    let mut rx = rt
        .logs(
            "talker",
            LogOptions {
                follow: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        got.push((r.text, r.partial));
    }
    let texts_seen: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        texts_seen,
        ["line-1", "line-2", "line-3", "late", "tail-no-newline"]
    );
    assert!(
        got.last().unwrap().1,
        "the unterminated last line is partial"
    );

    let tail = logs_with(
        &rt,
        "talker",
        LogOptions {
            tail: Some(2),
            ..Default::default()
        },
    )
    .await;
    let tail: Vec<String> = tail.into_iter().map(|r| r.text).collect();
    assert_eq!(tail, ["late", "tail-no-newline"]);

    let all = all_logs(&rt, "talker").await;
    let since = kat_runtime::logs::parse_time(&all[3].time).unwrap();
    let since = logs_with(
        &rt,
        "talker",
        LogOptions {
            since: Some(since),
            ..Default::default()
        },
    )
    .await;
    let v: Vec<String> = since.into_iter().map(|r| r.text).collect();
    assert_eq!(v, ["late", "tail-no-newline"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_pipes_env_exit_code_and_tty() {
    let (rt, _dir, f) = ready_runtime().await;
    rt.create(&options("host", &image(&f), "echo up; exec sleep 60"))
        .await
        .unwrap();
    rt.start("host").await.unwrap();
    wait_state(
        &rt,
        "host",
        ContainerState::Running,
        Duration::from_secs(10),
    )
    .await;
    // The workload runs (so kat-init has set up the loopback and dropped CAP_NET_ADMIN):
    // then PID 1's capability sets are the ones an exec gets.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !texts(&rt, "host").await.iter().any(|l| l == "up") {
        assert!(
            std::time::Instant::now() < deadline,
            "the workload never said up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut opts = ExecOptions {
        command: vec![
            "sh".into(),
            "-c".into(),
            concat!(
                "read x; echo got-$x-$FOO; echo oops >&2; cat /proc/1/cmdline | tr '\\0' ' '; echo;",
                "[ \"$(cat /proc/self/cgroup)\" = \"$(cat /proc/1/cgroup)\" ] && echo same-cgroup;",
                "[ \"$(grep CapBnd /proc/self/status)\" = \"$(grep CapBnd /proc/1/status)\" ] && echo same-caps;",
                "grep -q '^NoNewPrivs:.*1' /proc/self/status && echo no-new-privs;",
                "grep -q '^Seccomp:.*2' /proc/self/status && echo seccomp-filtered;",
                "hostname; id -u; exit 5"
            )
            .into(),
        ],
        ..Default::default()
    };
    opts.env.insert("FOO".into(), "bar".into());
    let mut h = rt.exec("host", opts).await.unwrap();
    h.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let mut stdout = String::new();
    h.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    h.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(h.wait().await.unwrap(), 5);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "got-hello-bar");
    assert!(
        lines[1].starts_with("/.kat/init"),
        "exec sees the container's PID 1: {stdout}"
    );
    assert_eq!(stderr, "oops\n");
    assert_eq!(
        &lines[2..],
        [
            "same-cgroup",
            "same-caps",
            "no-new-privs",
            "seccomp-filtered",
            "host",
            "0"
        ],
        "exec joins the container's cgroups, capabilities, seccomp filter, hostname and user: {stdout}"
    );

    // A TTY: the process sees a terminal of the requested size, and resizes reach it.
    let mut h = rt
        .exec(
            "host",
            ExecOptions {
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "tty; stty size; read x; stty size".into(),
                ],
                tty: true,
                size: Some((30, 100)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // Read as the agent reads it: the end of a terminal confirmed, not taken from its first
    // EIO (which once came here before the last line did).
    let pty = AsyncPipe::new(h.pty.as_ref().unwrap().try_clone().unwrap()).unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("30 100") {
        let n = pty.read_terminal(&mut buf).await.unwrap();
        assert!(n > 0, "{seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("/dev/pts/"), "{seen:?}");
    h.resize(40, 120).unwrap();
    pty.write_all(b"go\n").await.unwrap();
    while !seen.contains("40 120") {
        let n = pty.read_terminal(&mut buf).await.unwrap();
        assert!(n > 0, "{seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(h.wait().await.unwrap(), 0);

    let err = exec_error(&rt, "/nope").await;
    assert!(
        err.to_string()
            .contains("executable not found in image: /nope"),
        "{err}"
    );
    rt.remove("host", true).await.unwrap();
}

/// The error of exec'ing `program` in the "host" container.
async fn exec_error(rt: &NativeRuntime, program: &str) -> kat_runtime::RuntimeError {
    let options = ExecOptions {
        command: vec![program.into()],
        ..Default::default()
    };
    match rt.exec("host", options).await {
        Ok(_) => panic!("exec of {program} should fail"),
        Err(e) => e,
    }
}
