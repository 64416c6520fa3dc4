//! What the worker of the three-node cluster may and may not do: its finished Job's output
//! served through a control-plane node, no reach beyond its own records and routes, and a
//! flood from its address that leaves it Ready.

use super::*;

/// A Job that ran on the worker keeps its output after its record and container are gone:
/// asked through a control-plane node `via`, the leader finds the finished record and the
/// worker serves the log it kept (`katcall logs JOB`, `get instances --all`).
pub(crate) fn a_finished_job_on_the_worker_keeps_its_output(h: &Hosts, via: usize) {
    apply_bundle(
        h,
        via,
        "report",
        &[
            (
                "workload.kat",
                format!(
                    "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: report, namespace: default}}\nspec:\n  type: Job\n  source: {{image: {}/kat/busybox:latest}}\n  nodeSelector: {{kat.dws.rip/hostname: n{WORKER}}}\n  restartPolicy: {{condition: Never}}\n  container:\n    command: [/bin/sh, -c, 'echo report-from-$(hostname); exit 0']\n",
                    h.registry_addr
                ),
            ),
            (
                "job.kat",
                "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec:\n  completions: 1\n".into(),
            ),
        ],
    );
    let mut id = String::new();
    wait(
        "the report job to succeed on the worker",
        Duration::from_secs(90),
        || {
            let list: Vec<InstanceStatus> = h
                .k(via)
                .json(&["get", "instances", "--all", "-o", "json"])
                .unwrap_or_default();
            match list
                .into_iter()
                .find(|i| i.workload == "report" && i.state == InstanceState::Succeeded)
            {
                Some(i) => {
                    assert_eq!(
                        i.node.as_deref(),
                        Some(format!("n{WORKER}").as_str()),
                        "{i:?}"
                    );
                    id = i.instance_id.to_string();
                    true
                }
                None => false,
            }
        },
    );
    let worker_log = h.dir.path().join(format!("n{WORKER}.log"));
    wait(
        "the worker to remove the report container",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&worker_log)
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("kept the log of a removed container") && l.contains(&id))
        },
    );
    let out = h.katcall(via, &["logs", "report"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("report-from-"),
        "logs of a finished Job through n{via}: stdout {stdout} stderr {stderr}"
    );
    assert!(
        stderr.contains(&id) && stderr.contains("exit code 0"),
        "{stderr}"
    );
    let out = h.katcall(via, &["delete", "workload", "report"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A worker's certificate: nothing in etcd, only its own records on the leader's API, and
/// no logs or exec on another node. Each refusal beside a positive control.
/// What a workload on the worker sends leaves from the worker's own address. A flood of
/// requests from there to the leader's API (four clients, keep-alive, for 1.5 times
/// `nodeLossTimeoutSeconds`) is limited by address, while the worker's heartbeats, made
/// with its node certificate, count against the node: it never goes NotReady.
pub(crate) fn a_flood_from_the_workers_address_leaves_it_ready(h: &Hosts) {
    let leader = (1..=NODES)
        .find_map(|i| h.leader(i))
        .expect("a leader endpoint");
    let flood_for = Duration::from_secs(12);
    let urls = format!("{leader}/v1alpha1/nodes?n=[1-100000]");
    let flooders: Vec<std::process::Child> = (0..4)
        .map(|_| {
            h.in_ns(WORKER)
                .args(["timeout", &flood_for.as_secs().to_string(), "curl", "-sk"])
                .args(["-w", "\\nCODE:%{http_code}\\n", &urls])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("curl")
        })
        .collect();
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < flood_for {
        let state = h
            .k(1)
            .nodes()
            .into_iter()
            .find(|n| n.metadata.name == format!("n{WORKER}"))
            .map(|n| n.state);
        assert_eq!(
            state,
            Some(NodeState::Ready),
            "the worker under a flood from its own address, after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        checks += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let (mut sent, mut limited) = (0, 0);
    for f in flooders {
        let out = f.wait_with_output().expect("curl output");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(code) = line.strip_prefix("CODE:") {
                sent += 1;
                limited += usize::from(code == "429");
            }
        }
    }
    eprintln!(
        "flood from the worker's address: {sent} requests, {limited} answered 429; the worker stayed Ready ({checks} checks over {} s)",
        flood_for.as_secs()
    );
    assert!(
        limited > 0,
        "the flood was never limited ({sent} requests): it did not test anything"
    );
    // Each refill of the address's bucket goes to whoever asks first, so with the node
    // counted by address some heartbeats would find it empty: none may.
    let log =
        std::fs::read_to_string(h.dir.path().join(format!("n{WORKER}.log"))).unwrap_or_default();
    let starved: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("too many requests"))
        .collect();
    assert!(
        starved.is_empty(),
        "the worker's own requests were limited with the flood's: {starved:?}"
    );
}

pub(crate) fn worker_cannot_overreach(h: &Hosts) {
    let w = WORKER;
    let worker_pki = h.data(w).join("pki");
    assert!(
        !worker_pki.join("ca.key").exists(),
        "a worker holds the CA key"
    );
    assert!(!h.data(w).join("etcd").exists(), "a worker runs etcd");
    // etcd: a member's certificate is answered, the worker's (same CA) is not.
    assert!(h
        .etcdctl_as(2, 1, &["get", "/kat/schema_version"])
        .status
        .success());
    let out = h.etcdctl_as(w, 1, &["get", "/kat/schema_version"]);
    assert!(!out.status.success(), "etcd answered a worker: {out:?}");
    let out = h.etcdctl_as(
        w,
        1,
        &["put", "/kat/config/leader_endpoint", "https://evil"],
    );
    assert!(
        !out.status.success(),
        "etcd took a write from a worker: {out:?}"
    );

    // The leader's API: another node's records, workloads, tokens, admin routes: 403.
    let leader = (1..=NODES)
        .find_map(|i| h.leader(i))
        .expect("a leader endpoint");
    let api = |path: &str| format!("{leader}/v1alpha1/{path}");
    for path in [
        "nodes/n1/assignments",
        "nodes/n1/templates/default/spread/x",
        "nodes",
        "n/default/workloads",
        "join-tokens",
        "events",
    ] {
        assert_eq!(
            h.status_as(w, &api(path)),
            "403",
            "the worker reached {path}"
        );
    }
    for (path, body) in [
        ("nodes/n1/status", r#"{"node":"n1"}"#),
        ("join-tokens", "{}"),
        ("nodes/n1/drain", "{}"),
        ("nodes/n1/template-problems", "[]"),
    ] {
        assert_eq!(
            h.request_as(w, "POST", &api(path), Some(body)),
            "403",
            "the worker posted to {path}"
        );
    }
    assert_eq!(
        h.request_as(w, "DELETE", &api("nodes/n1"), None),
        "403",
        "the worker removed a node"
    );
    // Logs and exec of an instance on a member: a member's certificate passes (404 for an
    // instance that is not there), the worker's is forbidden.
    let stream = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(2)
    );
    assert_eq!(h.status_as(1, &stream), "404");
    assert_eq!(
        h.status_as(w, &stream),
        "403",
        "the worker read another node's logs"
    );
    // The worker's own API serves the control plane only, and sends others to the leader.
    let on_worker = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(w)
    );
    assert_eq!(h.status_as(1, &on_worker), "404");
    assert_eq!(h.status_as(w, &on_worker), "403");
    assert_eq!(
        h.status_as(1, &format!("https://{}:{API_PORT}/v1alpha1/nodes", ip(w))),
        "421"
    );
}
