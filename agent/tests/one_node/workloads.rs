//! What a workload does on the node: a healthy service with logs and a volume, exec,
//! restarts per policy, a stuck pull, an update, refusals of bad bundles, host mounts and
//! strangers, usage in `top` and metrics.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::*;
use crate::git_builds::*;
use crate::network::*;
use crate::specs::*;
use crate::Run;
use kat_api::wire::{ErrorBody, ErrorCode, InstanceStatus, Node};
use kat_api::wire::{Health, InstanceState};
use kat_testkit::bin;
use kat_testkit::katcall::{all_running_healthy, ids};

pub(crate) fn a_service_runs_healthy_with_its_logs_and_volume(r: &mut Run) {
    let Run {
        c,
        image,
        first,
        id: _,
        ..
    } = r;
    // A Service with 2 replicas, a health check and a volume: running, healthy, logged.
    let out = c.apply("web", &web(image, "hello"));
    assert!(
        out.contains("workload default/web created (generation 1)"),
        "{out}"
    );
    c.wait("2 healthy replicas", Duration::from_secs(60), |c| {
        all_running_healthy(&c.instances("web"), 2, 1)
    });
    let table = c.must(&["get", "workloads"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("web") && l.contains("2/2")),
        "{table}"
    );
    *first = ids(&c.instances("web"));
    for id in first.iter() {
        let logs = c.must(&["logs", &format!("web/{id}")]);
        assert_eq!(logs.trim(), format!("hello from {id}"));
    }
    assert!(Path::new(&c.path("volumes/default/web/data/www/index.html")).is_file());
}

pub(crate) fn exec_passes_the_exit_code_through(r: &mut Run) {
    let Run { c, first, id, .. } = r;
    // exec, with the exit code passed through.
    *id = first.iter().next().cloned().expect("an instance");
    let out = c.katcall(&[
        "exec",
        &format!("web/{id}"),
        "--",
        "sh",
        "-c",
        "cat /data/www/index.html; echo $KAT_INSTANCE_ID; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("hi\n{id}\n"));
}

pub(crate) fn containers_reach_each_other_and_the_outside(r: &mut Run) {
    let Run { c, image, .. } = r;
    container_network(c, image);
}

pub(crate) fn workloads_build_from_git(r: &mut Run) {
    let Run { c, image, .. } = r;
    git_builds(c, image);
}

pub(crate) fn a_killed_process_restarts_under_always(r: &mut Run) {
    let Run {
        c,
        first,
        id,
        other,
        second: _,
        ..
    } = r;
    // Killing the workload process restarts it (Always).
    *other = first
        .iter()
        .find(|i| *i != id)
        .cloned()
        .expect("a second instance");
    let pids = workload_pids(Some(id));
    assert!(!pids.is_empty(), "no process for {id}");
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    c.wait(
        "the killed instance to restart",
        Duration::from_secs(30),
        |c| {
            c.instances("web").iter().any(|i| {
                i.instance_id == *id && i.restarts == 1 && i.state == InstanceState::Running
            })
        },
    );
}

pub(crate) fn a_stuck_pull_delays_nothing_and_ended_instances_follow_the_policy(r: &mut Run) {
    let Run {
        c,
        image,
        other,
        before: _,
        ..
    } = r;
    // A registry that accepts connections and never answers: its pull runs beside the
    // convergence of everything else, so the crash loop below is not delayed by it.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole = blackhole.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in blackhole.incoming().flatten() {
            held.push(conn);
        }
    });
    c.apply(
        "stuck",
        &simple(
            "stuck",
            &format!("{hole}/kat/never:latest"),
            "    condition: Always",
            "true",
        ),
    );
    c.wait("stuck to wait for its pull", Duration::from_secs(20), |c| {
        c.stuck_pull_pending("stuck")
    });

    // MaxCount: restarted maxRestarts times within resetSeconds, then Failed; the leader
    // replaces the instance it gave up on (RFC 001 §4.6) with an event naming the exit code.
    c.apply(
        "crasher",
        &simple(
            "crasher",
            image,
            "    condition: MaxCount\n    maxRestarts: 2\n    resetSeconds: 60",
            "echo boom $(cat /proc/sys/kernel/random/uuid); exit 3",
        ),
    );
    let replaced = wait_replaced(c, "crasher", "exited with code 3");
    assert!(replaced.contains("maxRestarts reached"), "{replaced}");
    let gone = replaced.split(' ').next().unwrap_or_default().to_string();
    assert!(
        c.stuck_pull_pending("stuck"),
        "the stuck pull is still under way"
    );
    c.must(&["delete", "workload", "stuck"]);
    // The replaced instance's output is kept; a new instance runs (and crashes) in its place.
    let kept = c.must(&["logs", &format!("crasher/{gone}")]);
    assert!(kept.starts_with("boom "), "{kept}");
    let mut current = None;
    c.wait(
        "a new crasher instance restarting",
        Duration::from_secs(30),
        |c| {
            current = c
                .instances("crasher")
                .into_iter()
                // Two restarts: the attempt before the newest has surely been created (the count
                // goes up when a restart is decided, before its container exists).
                .find(|i| i.instance_id != gone.as_str() && i.restarts >= 2);
            current.is_some()
        },
    );
    let current = current
        .map(|i| i.instance_id.to_string())
        .unwrap_or_default();
    // `logs --previous` shows the run before the last one: its own line, not the current.
    let crasher = format!("crasher/{current}");
    let last = c.must(&["logs", &crasher]);
    let previous = c.must(&["logs", "--previous", &crasher]);
    assert!(
        last.starts_with("boom ") && previous.starts_with("boom "),
        "{last} / {previous}"
    );
    assert_ne!(last, previous);
    let out = c.katcall(&["logs", "--previous", &format!("web/{other}")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no previous container"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.must(&["delete", "workload", "crasher"]);

    // Never: the first exit is final on the node, even exit 0 of a Service; the leader
    // places a new instance.
    c.apply(
        "once",
        &simple("once", image, "    condition: Never", "sleep 1; exit 0"),
    );
    let replaced = wait_replaced(c, "once", "exited with code 0");
    assert!(replaced.contains("restartPolicy Never"), "{replaced}");
    c.must(&["delete", "workload", "once"]);

    // A Job follows its restartPolicy on the node: under MaxCount a failed container is
    // restarted in place, so a second attempt that succeeds completes the run without a
    // failure counted against `backoffLimit: 0`.
    c.apply("retry", &retrying_job(image));
    c.wait("the retry job to succeed", Duration::from_secs(60), |c| {
        c.k()
            .events_of("retry")
            .iter()
            .any(|e| e.reason == "JobRunSucceeded")
    });
    assert!(
        !c.k()
            .events_of("retry")
            .iter()
            .any(|e| e.reason == "JobRunFailed" || e.reason == "InstanceFailed"),
        "{:?}",
        c.k().events_of("retry")
    );
    c.must(&["delete", "workload", "retry"]);

    // Under Never a Job's failed instance is not restarted: the leader counts it against
    // `backoffLimit` and places another, and the run fails once the limit is passed.
    c.apply("doomed", &doomed_job(image));
    c.wait("the doomed job to fail", Duration::from_secs(60), |c| {
        c.k()
            .events_of("doomed")
            .iter()
            .any(|e| e.reason == "JobRunFailed")
    });
    let events = c.k().events_of("doomed");
    let failed = events
        .iter()
        .find(|e| e.reason == "JobRunFailed")
        .map(|e| e.message.clone())
        .unwrap_or_default();
    assert!(
        failed.contains("BackoffLimitExceeded: 2 failed instance(s), backoffLimit 1"),
        "{failed}"
    );
    assert!(
        !events.iter().any(|e| e.reason == "JobRunSucceeded"),
        "{events:?}"
    );
    c.must(&["delete", "workload", "doomed"]);
}

/// `healthCheck.onFailure: restart`: an instance that fails its check is stopped and started
/// again in place (same instance, even under `restartPolicy: Never`), and the transitions are
/// events: Unhealthy, then Healthy once the second run passes.
pub(crate) fn an_unhealthy_instance_restarts_when_asked(r: &mut Run) {
    let Run { c, image, .. } = r;
    c.apply("hung", &restarted_when_unhealthy(image));
    let mut instance = None;
    c.wait(
        "hung to turn unhealthy, restart and be healthy",
        Duration::from_secs(60),
        |c| {
            instance = c.instances("hung").into_iter().find(|i| {
                i.restarts >= 1
                    && i.state == InstanceState::Running
                    && i.health == kat_api::wire::Health::Healthy
            });
            instance.is_some()
        },
    );
    let id = instance
        .map(|i| i.instance_id.to_string())
        .unwrap_or_default();
    c.wait("the health events", Duration::from_secs(20), |c| {
        let events = c.k().events_of("hung");
        let has = |reason: &str| {
            events
                .iter()
                .any(|e| e.reason == reason && e.message.contains(&id))
        };
        has("InstanceUnhealthy") && has("InstanceHealthy")
    });
    assert!(
        !c.k()
            .events_of("hung")
            .iter()
            .any(|e| e.reason == "InstanceReplaced"),
        "restarted in place, not replaced"
    );
    c.must(&["delete", "workload", "hung"]);
}

/// Wait for an `InstanceReplaced` event of `workload` whose message has `says`; its message.
fn wait_replaced(c: &Cluster, workload: &str, says: &str) -> String {
    let mut message = String::new();
    c.wait(
        &format!("{workload}'s ended instance replaced"),
        Duration::from_secs(60),
        |c| {
            message = c
                .k()
                .events_of(workload)
                .into_iter()
                .find(|e| e.reason == "InstanceReplaced" && e.message.contains(says))
                .map(|e| e.message)
                .unwrap_or_default();
            !message.is_empty()
        },
    );
    message
}

pub(crate) fn an_updated_spec_replaces_the_instances(r: &mut Run) {
    let Run {
        c,
        image,
        first,
        id: _,
        second,
        ..
    } = r;
    // `katcall diff` first: the changed line, the instances it would replace, exit code 1,
    // and nothing stored.
    let dir = c.write_dir("web-next", &web(image, "bonjour"));
    let diff = c.katcall(&["diff", "-f", &dir]);
    let text = String::from_utf8_lossy(&diff.stdout).into_owned();
    assert_eq!(
        diff.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    let changed = |sign: char, value: &str| {
        text.lines()
            .any(|l| l.starts_with(sign) && l.trim_end().ends_with(&format!("value: {value}")))
    };
    assert!(changed('-', "hello") && changed('+', "bonjour"), "{text}");
    assert!(
        text.contains(
            "default/web: generation 1 -> 2; 2 instances replaced one by one (Rolling): "
        ),
        "{text}"
    );
    assert!(
        first.iter().all(|id| text.contains(id.as_str())),
        "{first:?} {text}"
    );
    eprintln!("katcall diff -f web-next:\n{text}");
    let json = c.katcall(&["diff", "-f", &dir, "-o", "json"]);
    let preview: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON preview");
    assert_eq!(json.status.code(), Some(1), "{preview}");
    assert_eq!(preview["generation"], 2, "{preview}");
    assert_eq!(preview["changed"], true, "{preview}");
    assert_eq!(
        preview["replaced"].as_array().map(Vec::len),
        Some(2),
        "{preview}"
    );
    let stored: serde_json::Value =
        serde_json::from_str(&c.must(&["get", "workload", "-o", "json"])).expect("JSON workloads");
    assert_eq!(
        stored[0]["metadata"]["generation"], 1,
        "the diff stored nothing: {stored}"
    );
    // A bundle the apply would refuse is an error, exit code 2.
    let broken = c.write_dir(
        "web-broken",
        &[(
            "workload.kat",
            web(image, "x")[0].1.replace("replicas: 2", "replicas: -1"),
        )],
    );
    let refused = c.katcall(&["diff", "-f", &broken]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("spec.replicas"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // An updated spec replaces the instances: `apply --wait` returns when the rollout is
    // over, with progress on the way (plain lines: stderr is not a terminal), while
    // `get instances --watch` shows the new instances as they come.
    let watch = c.k().spawn(&["get", "instances", "--watch"]);
    let out = c.katcall(&["apply", "-f", &dir, "--wait", "--timeout", "90s"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{stdout}{stderr}\n{}",
        c.agent_log_tail()
    );
    assert!(stdout.contains("configured (generation 2)"), "{stdout}");
    assert!(
        stdout.contains("workload default/web: 2/2 ready at generation 2"),
        "{stdout}"
    );
    assert!(
        stderr.contains("web: ") && stderr.contains("generation 2"),
        "{stderr}"
    );
    eprintln!("katcall apply --wait:\n{stdout}{stderr}");
    let now = c.instances("web");
    let new: Vec<_> = now
        .iter()
        .filter(|i| i.generation == 2 && !i.state.is_leaving())
        .collect();
    assert!(
        new.len() == 2
            && new
                .iter()
                .all(|i| i.state == InstanceState::Running && i.health == Health::Healthy),
        "after apply --wait: {now:?}"
    );
    c.wait(
        "2 healthy replicas of generation 2 only",
        Duration::from_secs(30),
        |c| all_running_healthy(&c.instances("web"), 2, 2),
    );
    *second = ids(&c.instances("web"));
    // The watch reads once a second: it shows them running a moment later.
    let shows_running = |text: &str, id: &str| {
        text.lines()
            .any(|l| l.starts_with(id) && l.contains("Running"))
    };
    let seen = kat_testkit::wait_until(Duration::from_secs(10), || {
        second.iter().all(|id| shows_running(&watch.stdout(), id))
    });
    assert!(
        seen.is_some(),
        "get --watch never showed {second:?} running:\n{}",
        watch.stdout()
    );
    let watched = watch.stdout();
    assert!(watched.starts_with("INSTANCE"), "{watched}");
    drop(watch);
    assert!(second.is_disjoint(first), "{first:?} {second:?}");
    // Applied, the same directory is no change: exit code 0.
    let same = c.katcall(&["diff", "-f", &dir]);
    let text = String::from_utf8_lossy(&same.stdout);
    assert_eq!(same.status.code(), Some(0), "{text}");
    assert_eq!(text.trim(), "default/web: no change (generation 2)");
    for id in second.iter() {
        assert_eq!(
            c.must(&["logs", &format!("web/{id}")]).trim(),
            format!("bonjour from {id}")
        );
    }
    c.wait(
        "the old instances' processes to stop",
        Duration::from_secs(20),
        |_| first.iter().all(|id| workload_pids(Some(id)).is_empty()),
    );
}

pub(crate) fn a_bad_bundle_is_refused_and_changes_nothing(r: &mut Run) {
    let Run {
        c, image, second, ..
    } = r;
    // A bad bundle gets 400 naming the file and field; nothing changes.
    let token = c.token();
    let bad = c.dir.path().join("bad");
    std::fs::create_dir_all(&bad).expect("dir");
    let broken = web(image, "x")[0].1.replace("replicas: 2", "replicas: -1");
    std::fs::write(bad.join("workload.kat"), broken).expect("write");
    let tgz = c.path("bad.tgz");
    assert!(Command::new("tar")
        .args(["czf", &tgz, "-C", &bad.display().to_string(), "."])
        .status()
        .expect("tar")
        .success());
    let (code, body) = c.curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("Authorization: Bearer {token}"),
        "--data-binary",
        &format!("@{tgz}"),
        &c.url("/v1alpha1/n/default/workloads/web"),
    ]);
    assert_eq!(code, 400, "{body}");
    let err: ErrorBody = serde_json::from_str(&body).expect("JSON error body");
    assert_eq!(err.error, ErrorCode::InvalidQuadlet);
    let message = err.message;
    assert!(
        message.contains("workload.kat") && message.contains("spec.replicas"),
        "{message}"
    );
    let w = c.workload("web").expect("web");
    assert_eq!(w.metadata.generation, 2);
    assert_eq!(ids(&c.instances("web")), *second);
}

pub(crate) fn host_mounts_off_the_allow_list_are_refused(r: &mut Run) {
    let Run { c, image, .. } = r;
    // hostMount of `/`, the agent's data directory or a path off the allow-list is refused
    // at apply, naming the file and field; nothing is stored.
    let data_dir = c.path("data");
    for host_path in ["/", data_dir.as_str(), "/etc"] {
        let mut files = simple("sneaky", image, "    condition: Always", "ls /host");
        files[0].1.push_str(&format!(
            "    volumeMounts:\n      - name: host\n        mountPath: /host\n  volumes:\n    - name: host\n      hostMount:\n        hostPath: {host_path}\n"
        ));
        let path = c.dir.path().join("sneaky");
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("dir");
        std::fs::write(path.join(files[0].0), &files[0].1).expect("write");
        let out = c.katcall(&["apply", "-f", &path.display().to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "hostMount {host_path} was accepted");
        assert!(
            stderr.contains("spec.volumes[0].hostMount.hostPath"),
            "{host_path}: {stderr}"
        );
        assert!(c.workload("sneaky").is_none());
    }
}

pub(crate) fn the_api_and_etcd_refuse_strangers(r: &mut Run) {
    let Run { c, .. } = r;
    let token = c.token();
    // Without the token, or with a wrong one: 401, with the error body.
    let (code, body) = c.curl(&[&c.url("/v1alpha1/n/default/workloads")]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"error\":\"unauthorized\""), "{body}");
    let (code, _) = c.curl(&[
        "-H",
        "Authorization: Bearer nope",
        &c.url("/v1alpha1/nodes"),
    ]);
    assert_eq!(code, 401);
    let (code, _) = c.curl(&[&c.url("/healthz")]);
    assert_eq!(code, 200);
    // etcd speaks only mutual TLS with certificates from the cluster CA, loopback included.
    let etcd = format!("https://127.0.0.1:{}/health", c.etcd_port);
    let (code, body) = c.curl(&["--max-time", "5", &etcd]);
    assert!(
        code == 0 && !body.contains("health"),
        "etcd answered without a client certificate: {code} {body}"
    );
    let (_, body) = c.curl(&["--max-time", "5", &etcd.replace("https://", "http://")]);
    assert!(
        !body.contains("\"health\""),
        "etcd answered plain HTTP: {body}"
    );
    let (code, body) = c.curl(&[
        "--max-time",
        "5",
        "--cert",
        &c.path("data/pki/node.crt"),
        "--key",
        &c.path("data/pki/node.key"),
        &etcd,
    ]);
    assert!(
        code == 200 && body.contains("\"health\":\"true\""),
        "{code} {body}"
    );
    let (code, metrics) = c.curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        &c.url("/metrics"),
    ]);
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kat_api_request_duration_seconds_bucket")
            && metrics.contains("kat_instances{state=\"Running\"}")
            && metrics.contains("kat_is_leader 1")
            && metrics.contains("kat_etcd_up 1")
            && metrics.contains("kat_scheduling_attempts_total{result=\"scheduled\",reason=\"\"}"),
        "{metrics}"
    );
}

pub(crate) fn usage_shows_in_top_and_metrics(r: &mut Run) {
    let Run { c, .. } = r;
    let token = c.token();
    // What the node and its running instances use, from /proc and their cgroups: in
    // `/metrics` and in `katcall top`.
    c.wait("usage in the heartbeats", Duration::from_secs(30), |c| {
        let instances: Vec<InstanceStatus> = c
            .k()
            .json(&["top", "instances", "-A", "-o", "json"])
            .unwrap_or_default();
        instances.iter().any(|i| {
            i.usage
                .as_ref()
                .is_some_and(|u| u.memory_bytes > 0 && u.pids >= 1)
        })
    });
    let nodes: Vec<Node> = c
        .k()
        .json(&["top", "nodes", "-o", "json"])
        .expect("top nodes as JSON");
    let usage = nodes.first().and_then(|n| n.usage.as_ref());
    assert!(
        usage.is_some_and(|u| u.memory_bytes > 0
            && u.pids > 0
            && u.disk_bytes.is_some_and(|d| d > 0)),
        "{nodes:?}"
    );
    let table = c.katcall_ok(&["top", "instances"]);
    assert!(
        table.starts_with("WORKLOAD")
            && table
                .lines()
                .skip(1)
                .any(|row| row
                    .split_whitespace()
                    .nth(4)
                    .is_some_and(|m| ["B", "Ki", "Mi", "Gi"].iter().any(|u| m.ends_with(u)))),
        "{table}"
    );
    let (_, metrics) = c.curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        &c.url("/metrics"),
    ]);
    for family in [
        "kat_node_cpu_usage_millicores{node=",
        "kat_node_memory_used_bytes{node=",
        "kat_node_disk_used_bytes{node=",
        "kat_instance_memory_bytes{namespace=\"default\"",
        "kat_instance_pids{namespace=\"default\"",
        "kat_instance_restarts{namespace=\"default\"",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
}

/// `katcall exec` killed (a closed laptop, a dropped link): the process it started inside
/// the container goes too, instead of running on unseen.
pub(crate) fn an_exec_ends_with_its_client(c: &Cluster, instance: &str) {
    let marker = ["sleep", "3072"];
    let mut exec = Command::new(bin("katcall"))
        .args(["exec", &format!("web/{instance}"), "--"])
        .args(marker)
        .env("KAT_CONFIG", c.path("katcall.yaml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("katcall exec");
    kat_testkit::wait("the exec'd sleep to start", Duration::from_secs(20), || {
        !pids_running(&marker).is_empty()
    });
    let _ = exec.kill();
    let _ = exec.wait();
    kat_testkit::wait(
        "the exec'd process to end with its client",
        Duration::from_secs(20),
        || pids_running(&marker).is_empty(),
    );
}

/// A deleted token ends its exec sessions: an exec opened with a namespace token ends with
/// an error naming why within seconds of `katcall delete token`, and the exec'd process is
/// gone from the host.
pub(crate) fn a_deleted_tokens_exec_ends(c: &Cluster, instance: &str) {
    let config = c.path("exec-token.yaml");
    let made: kat_api::wire::NewApiToken = serde_json::from_str(&c.must(&[
        "create",
        "token",
        "--namespace",
        "default",
        "--description",
        "an exec to revoke",
        "--client-config",
        &config,
        "-o",
        "json",
    ]))
    .expect("the new token as JSON");
    let marker = ["sleep", "3073"];
    let mut exec = Command::new(bin("katcall"))
        .args(["exec", &format!("web/{instance}"), "--"])
        .args(marker)
        .env("KAT_CONFIG", &config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("katcall exec");
    kat_testkit::wait("the exec'd sleep to start", Duration::from_secs(20), || {
        !pids_running(&marker).is_empty()
    });
    let deleted = Instant::now();
    c.must(&["delete", "token", &made.info.id]);
    let status = loop {
        if let Some(status) = exec.try_wait().expect("katcall exec") {
            break status;
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(10),
            "the exec outlived its deleted token by 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = deleted.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut exec.stderr.take().expect("stderr"), &mut stderr)
        .expect("katcall's stderr");
    eprintln!("an exec of a deleted token ended {took:?} after the deletion");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("token that opened this session was deleted"),
        "{stderr}"
    );
    kat_testkit::wait(
        "the exec'd process to end with its deleted token",
        Duration::from_secs(20),
        || pids_running(&marker).is_empty(),
    );
}

/// GPUs through CDI on a fake vendor (no GPU is on these machines): the node reports the
/// GPU its specification and sysfs describe, an instance asking for one gets its device node
/// (opened: its device cgroup allows it), the specification's environment and its hook run
/// with the container's state, and one asking for more than the node has stays Pending
/// with the reason.
pub(crate) fn a_gpu_workload_gets_its_device(r: &mut Run) {
    let Run { c, image, .. } = r;
    let wide = c.must(&["get", "nodes", "-o", "wide"]);
    assert!(wide.contains("amd 8192MB"), "{wide}");
    let described = c.must(&["describe", "node", "e2e-node"]);
    assert!(
        described.contains("amd Kat Test GPU 8192MB (kat.test/gpu=0)"),
        "{described}"
    );
    c.apply("gpu", &gpu_workload("gpu", image, 1));
    c.wait("the GPU instance to run", Duration::from_secs(60), |c| {
        c.instances("gpu")
            .iter()
            .any(|i| i.state == InstanceState::Running)
    });
    let out = c.must(&[
        "exec",
        "gpu",
        "--",
        "sh",
        "-c",
        "test -c /dev/dri/renderD128 && : < /dev/dri/renderD128 && echo $KAT_TEST_GPU_VENDOR $KAT_TEST_GPU",
    ]);
    assert_eq!(out.trim(), "kat 0");
    let instance = &c.instances("gpu")[0];
    let state = std::fs::read_to_string(c.path("gpu-root/marks/created"))
        .expect("the CDI hook's mark: the hook did not run");
    assert!(
        state.contains(&format!("\"{}-0\"", instance.instance_id)),
        "the hook's input is not the container's state: {state}"
    );
    c.apply("gpu2", &gpu_workload("gpu2", image, 2));
    c.wait(
        "the two-GPU instance pending",
        Duration::from_secs(30),
        |c| {
            c.workload("gpu2")
                .and_then(|w| w.status.message)
                .is_some_and(|m| m.contains("not enough matching GPUs"))
        },
    );
    c.must(&["delete", "workload", "gpu2"]);
    c.must(&["delete", "workload", "gpu"]);
}
