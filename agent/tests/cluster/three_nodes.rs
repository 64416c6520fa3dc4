//! Three members and a worker: joins (and bad ones refused), a spread Service, the leader
//! killed, the worker's limits, container networking across nodes.

use super::*;

/// A Job that ran on the worker keeps its output after its record and container are gone:
/// asked through a control-plane node `via`, the leader finds the finished record and the
/// worker serves the log it kept (`katcall logs JOB`, `get instances --all`).
fn a_finished_job_on_the_worker_keeps_its_output(h: &Hosts, via: usize) {
    let app = h.path("report");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: report, namespace: default}}\nspec:\n  type: Job\n  source: {{image: {}/kat/busybox:latest}}\n  nodeSelector: {{kat.dws.rip/hostname: n{WORKER}}}\n  restartPolicy: {{condition: Never}}\n  container:\n    command: [/bin/sh, -c, 'echo report-from-$(hostname); exit 0']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    std::fs::write(
        app.join("job.kat"),
        "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec:\n  completions: 1\n",
    )
    .unwrap();
    let out = h.katcall(via, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
fn a_flood_from_the_workers_address_leaves_it_ready(h: &Hosts) {
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

fn worker_cannot_overreach(h: &Hosts) {
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

#[test]
fn three_nodes_join_spread_and_survive_the_leader() {
    let mut h = Hosts::up();
    let (token, pin) = init_first(&mut h);
    let leader_api = format!("{}:{API_PORT}", ip(1));

    // Refused joins write nothing: a wrong secret, a wrong CA pin, a malformed token, the
    // worker token init printed asking for etcd membership (and the CA key), an address the
    // join does not come from, a token on the command line.
    let mut wrong_secret = token.clone();
    wrong_secret.replace_range(wrong_secret.len() - 4.., "0000");
    let bad_pin = format!("sha256:{}", "0".repeat(64));
    let cp_token = control_plane_token(&h);
    let token_in_argv = ["--token", token.as_str()];
    let (own, other) = (ip(2), ip(3));
    for (tok, pin_arg, extra, address, expect) in [
        (
            wrong_secret.as_str(),
            pin.as_str(),
            &[][..],
            &own,
            "wrong secret",
        ),
        (
            token.as_str(),
            bad_pin.as_str(),
            &[][..],
            &own,
            "nothing was sent",
        ),
        (
            "katjoin.nope",
            pin.as_str(),
            &[][..],
            &own,
            "a join token looks like",
        ),
        (
            token.as_str(),
            pin.as_str(),
            &[][..],
            &own,
            "is a worker token: it admits worker nodes only",
        ),
        (
            cp_token.as_str(),
            pin.as_str(),
            &[][..],
            &other,
            "this join comes from 10.77.0.12, not from the advertised address 10.77.0.13",
        ),
        (
            "",
            pin.as_str(),
            &token_in_argv[..],
            &own,
            "visible to every local user",
        ),
    ] {
        let mut args = join_args(&leader_api, pin_arg).to_vec();
        args.extend_from_slice(extra);
        let mut command = h.agent_command_advertising(2, &args, address);
        if !tok.is_empty() {
            command.env("KAT_JOIN_TOKEN", tok);
        }
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expect),
            "{expect}: {err}"
        );
        assert!(
            !h.data(2).join("node.json").exists(),
            "a refused join wrote the identity"
        );
        assert!(
            !h.data(2).join("pki/node.key").exists(),
            "a refused join wrote a key"
        );
    }

    // The two joins as the docs give them: a 3-member quorum, all voting, mutual TLS only.
    let took = join_others(&mut h, &pin);
    eprintln!("join of 2 nodes: {:.1} s", took.as_secs_f64());
    let out = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "3",
            &format!("https://{}:2379/health", ip(2)),
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("health"),
        "etcd answered a client without a certificate"
    );

    // A 6-replica Service spreads 2/2/2.
    apply_spread(&h, 1, "spread");

    // Logs and exec of an instance on every node, through n1's API (proxied to the node
    // that runs it over mutual TLS), exit codes included.
    let spread = instances(&h, 1, "spread");
    for node in 1..=NODES {
        let id = spread
            .iter()
            .find(|i| i.node.as_deref() == Some(format!("n{node}").as_str()))
            .map(|i| i.instance_id.clone())
            .unwrap_or_else(|| panic!("an instance on n{node}: {spread:?}"));
        let target = format!("spread/{id}");
        wait(
            &format!("logs of {target} through n1"),
            Duration::from_secs(20),
            || {
                let out = h.katcall(1, &["logs", &target]);
                String::from_utf8_lossy(&out.stdout).contains("started")
            },
        );
        let out = h.katcall(
            1,
            &["exec", &target, "--", "sh", "-c", "echo from-$0; exit 7"],
        );
        assert_eq!(out.status.code(), Some(7), "exec on n{node}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("from-sh"),
            "{out:?}"
        );
    }

    // A node's certificate opens no admin route: 403.
    assert_eq!(
        h.status_as(2, &format!("https://{}:{API_PORT}/v1alpha1/nodes", ip(1))),
        "403",
        "a node certificate reached an admin route"
    );

    // A worker joins (no --etcd-peer) with the token init printed, and runs an instance
    // placed on it.
    h.spawn_join(
        WORKER,
        &token,
        &["join", "--leader-api", &leader_api, "--ca-pin", &pin],
    );
    wait("the worker Ready", Duration::from_secs(60), || {
        h.ready_nodes(1).len() == HOSTS
    });
    let roles: BTreeMap<String, String> = h
        .k(1)
        .nodes()
        .into_iter()
        .map(|n| {
            let role = n
                .metadata
                .labels
                .get("kat.dws.rip/role")
                .cloned()
                .unwrap_or_else(|| "?".into());
            (n.metadata.name, role)
        })
        .collect();
    assert_eq!(roles[&format!("n{WORKER}")], "worker", "{roles:?}");
    assert_eq!(roles["n2"], "control-plane", "{roles:?}");
    pinned(&h, 1, "onworker");
    a_finished_job_on_the_worker_keeps_its_output(&h, 2);
    worker_cannot_overreach(&h);
    a_flood_from_the_workers_address_leaves_it_ready(&h);
    if h.unprivileged {
        // Every agent (and the etcd it started) runs as its own user, none as root.
        for (i, agent) in &h.agents {
            let status = std::fs::read_to_string(format!("/proc/{}/status", agent.id())).unwrap();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .unwrap()
                .to_string();
            let expected = String::from_utf8(
                Command::new("id")
                    .args(["-u", &user(*i)])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap();
            assert_eq!(uid, expected.trim(), "n{i}'s agent runs as {}", user(*i));
        }
    }

    // The worker restarts as after a reboot (kill -9, then `kat-agent run`): it finds the
    // leader from its saved endpoints, adopts its instance (one, not two) and takes new work.
    h.kill(WORKER);
    h.spawn(WORKER, &["run"]);
    pinned(&h, 1, "afterrestart");
    wait(
        "the worker's first instance adopted, once",
        Duration::from_secs(30),
        || reported_running(&h, 1, "onworker") == 1,
    );

    container_network(&mut h);

    // `get nodes` marks the leader: the node whose endpoint the election recorded.
    let endpoint = h.leader(1).expect("a leader endpoint");
    let marked = h.leader_node(1).expect("a node marked as leader");
    let marked_index: usize = marked.trim_start_matches('n').parse().expect("nN");
    assert!(
        endpoint.contains(&format!("//{}:", ip(marked_index))),
        "{marked} is marked, {endpoint} leads"
    );
    let table = String::from_utf8_lossy(&h.katcall(1, &["get", "nodes"]).stdout).into_owned();
    let leader_rows: Vec<&str> = table
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some("yes"))
        .collect();
    assert!(
        table.lines().next().is_some_and(|h| h.contains("LEADER"))
            && leader_rows.len() == 1
            && leader_rows[0].starts_with(&marked),
        "{table}"
    );

    // Kill the leader's agent (and with it its etcd): a new leader within 10 s.
    let killed = Instant::now();
    let (dead, alive, failover) = kill_leader(&mut h);
    eprintln!("failover: {:.1} s", failover.as_secs_f64());
    assert_eq!(
        format!("n{dead}"),
        marked,
        "the marked leader was the one killed"
    );
    // The new leader is marked, not the dead one.
    wait("the new leader marked", Duration::from_secs(15), || {
        h.leader_node(alive)
            .is_some_and(|n| n != marked && n != format!("n{WORKER}"))
    });
    // Desired state intact, and the dead node's instances rescheduled after the timeout.
    wait(
        "6 running on the 2 live nodes",
        Duration::from_secs(60),
        || {
            let by_node = h.running(alive, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{dead}"))
        },
    );
    eprintln!("rescheduled after {:.1} s", killed.elapsed().as_secs_f64());
    // The worker found the new leader by itself: still Ready, its instance still running,
    // and a workload placed on it now reaches it through the new leader.
    wait(
        "the worker Ready under the new leader",
        Duration::from_secs(30),
        || h.ready_nodes(alive).contains(&format!("n{WORKER}")),
    );
    pinned(&h, alive, "afterfailover");
    assert_eq!(
        h.running(alive, "onworker").get(&format!("n{WORKER}")),
        Some(&1)
    );

    // The node comes back: it stops what was replaced elsewhere; nothing runs twice.
    h.spawn(dead, &["run"]);
    wait("4 Ready nodes again", Duration::from_secs(90), || {
        h.ready_nodes(alive).len() == HOSTS
    });
    wait(
        "exactly 6 running on the nodes",
        Duration::from_secs(30),
        || reported_running(&h, alive, "spread") == 6,
    );

    // A node cut off from the others (its link down, the process alive): its instances are
    // replaced elsewhere after the timeout; when the link is back, it stops its own copies.
    let cut = (1..=NODES).find(|i| *i != alive).unwrap();
    let other = (1..=NODES).find(|i| *i != cut).unwrap();
    let hosts = |verb: &str| {
        let ok = Command::new(hosts_sh())
            .args([verb, &h.prefix, &cut.to_string()])
            .status()
            .unwrap();
        assert!(ok.success(), "hosts.sh {verb}");
    };
    hosts("cut");
    wait(
        "the cut node's instances replaced",
        Duration::from_secs(60),
        || {
            let by_node = h.running(other, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{cut}"))
        },
    );
    hosts("heal");
    wait(
        "4 Ready nodes after the partition",
        Duration::from_secs(90),
        || h.ready_nodes(other).len() == HOSTS,
    );
    wait(
        "exactly 6 running after the partition",
        Duration::from_secs(30),
        || reported_running(&h, other, "spread") == 6,
    );
    holds_for("no instance running twice", Duration::from_secs(3), || {
        reported_running(&h, other, "spread") <= 6
    });
    assert_eq!(reported_running(&h, other, "spread"), 6);
    assert_eq!(h.running(other, "spread").values().sum::<usize>(), 6);

    // `katcall delete node`: the node leaves the quorum, its instances move, its certificate
    // is refused by the API and (new connections) by etcd.
    let gone = (1..=NODES).find(|i| *i != other).unwrap();
    let out = h.katcall(other, &["delete", "node", &format!("n{gone}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait(
        "the removed node's instances moved",
        Duration::from_secs(60),
        || {
            let by_node = h.running(other, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{gone}"))
        },
    );
    let members = h.etcdctl_as(other, other, &["member", "list", "-w", "json"]);
    let v: Value = serde_json::from_slice(&members.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["members"].as_array().map(Vec::len),
        Some(NODES - 1),
        "{v}"
    );
    let stream = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(other)
    );
    wait(
        "the removed node's certificate refused by the API",
        Duration::from_secs(10),
        || h.status_as(gone, &stream) == "401",
    );
    wait(
        "the removed node's certificate refused by etcd",
        Duration::from_secs(15),
        || {
            !h.etcdctl_as(gone, other, &["get", "/kat/schema_version"])
                .status
                .success()
        },
    );
    // The worker learns of it with its next heartbeat answer: its own API refuses the
    // removed node's certificate as well.
    let on_worker = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(WORKER)
    );
    wait(
        "the removed node's certificate refused by the worker",
        Duration::from_secs(15),
        || h.status_as(gone, &on_worker) == "401",
    );
    assert_eq!(h.status_as(other, &on_worker), "404");
    // The same requests with a node that is still a member: answered (the instance does not
    // exist: 404, not 401).
    assert_eq!(h.status_as(other, &stream), "404");
    assert!(h
        .etcdctl_as(other, other, &["get", "/kat/schema_version"])
        .status
        .success());
}

/// A workload `name` pinned to node `node` serving `page` over HTTP on 8080 (and, with
/// `host_port`, publishing it there), with `replicas` instances.
fn apply_server(
    h: &Hosts,
    name: &str,
    node: Option<usize>,
    replicas: u32,
    page: &str,
    host_port: Option<u16>,
) {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    let selector = node
        .map(|n| format!("  nodeSelector: {{kat.dws.rip/hostname: n{n}}}\n"))
        .unwrap_or_default();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: {replicas}\n{selector}  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www; echo {page} $(hostname) > /tmp/www/index.html; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    let ports = match host_port {
        Some(p) => format!("    - {{name: http, containerPort: 8080, hostPort: {p}}}\n"),
        None => "    - {name: http, containerPort: 8080}\n".to_string(),
    };
    std::fs::write(
        app.join("VirtualLoadBalancer.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n{ports}"
        ),
    )
    .unwrap();
    let out = h.katcall(1, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An HTTP GET of `/index.html` from inside instance `id` of `workload` to `host`:8080,
/// with busybox's nc (its wget crashes in static glibc's resolver).
fn fetch_inside(h: &Hosts, workload: &str, id: &str, host: &str) -> String {
    let script = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} 8080");
    let out = h.katcall(
        1,
        &[
            "exec",
            &format!("{workload}/{id}"),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// [`fetch_inside`] until the page has `token` or `timeout` passed; the last answer.
fn fetch_until(
    h: &Hosts,
    workload: &str,
    id: &str,
    host: &str,
    token: &str,
    timeout: Duration,
) -> String {
    let started = Instant::now();
    loop {
        let page = fetch_inside(h, workload, id, host);
        if page.contains(token) || started.elapsed() > timeout {
            return page;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Container networking across the test hosts: pages by DNS name and instance name across
/// the overlay in both directions (a member and the worker), a capture of the underlay
/// showing only WireGuard, egress with the node's address as source, a published hostPort
/// from the host and another test host (and Pending where every node has it taken), the
/// overlay surviving a restart of the worker's agent, and forced rekeys.
fn container_network(h: &mut Hosts) {
    let token = format!("page-{}", std::process::id());
    apply_server(h, "pa", Some(2), 1, &token, None);
    apply_server(h, "pb", Some(WORKER), 1, &token, None);
    wait(
        "pa on n2 and pb on the worker",
        Duration::from_secs(60),
        || {
            h.running(1, "pa").get("n2") == Some(&1)
                && h.running(1, "pb").get(&format!("n{WORKER}")) == Some(&1)
        },
    );
    let (pa, pb) = (
        instances(h, 1, "pa").remove(0),
        instances(h, 1, "pb").remove(0),
    );
    let (pa_id, pb_id) = (pa.instance_id, pb.instance_id);
    let (pa_ip, pb_ip) = (
        pa.ip.expect("pa's address").to_string(),
        pb.ip.expect("pb's address").to_string(),
    );

    // Capture the underlay (the test hosts' bridge) while pages cross it.
    let capture = h.path("underlay.pcap");
    let mut tcpdump = Command::new("tcpdump")
        .args([
            "-Z",
            "root",
            "--immediate-mode",
            "-i",
            &format!("{}-br", h.prefix),
            "-n",
            "-U",
            "-w",
        ])
        .arg(&capture)
        .args(["(udp and not port 53) or net 10.100.0.0/16"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump");
    let mut err = std::io::BufReader::new(tcpdump.stderr.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0) > 0
        && !line.contains("listening")
    {
        line.clear();
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));

    // A member's container to the worker's, by workload name (short and full) and by
    // instance name; and back.
    let full = |w: &str| format!("{w}.default.kat.cluster.local");
    for (from, from_id, to) in [
        ("pa", &pa_id, "pb".to_string()),
        ("pa", &pa_id, full("pb")),
        (
            "pa",
            &pa_id,
            format!("{pb_id}.pb.default.kat.cluster.local"),
        ),
        ("pb", &pb_id, "pa".to_string()),
        ("pb", &pb_id, format!("{pa_id}.{}", full("pa"))),
    ] {
        let page = fetch_until(h, from, from_id, &to, &token, Duration::from_secs(20));
        assert!(
            page.starts_with("HTTP/1.1 200") && page.contains(&token),
            "{from} → {to}: {page}"
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tcpdump.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tcpdump.wait();
    let raw = std::fs::read(&capture).unwrap();
    assert!(
        raw.len() > 1000,
        "the capture saw almost nothing ({} bytes)",
        raw.len()
    );
    assert!(
        !raw.windows(token.len()).any(|w| w == token.as_bytes()),
        "the page crossed the underlay in clear"
    );
    for addr in [&pa_ip, &pb_ip] {
        let bytes: Vec<u8> = addr.split('.').map(|o| o.parse().unwrap()).collect();
        assert!(
            !raw.windows(4).any(|w| w == bytes),
            "container address {addr} visible on the underlay"
        );
    }
    let text = Command::new("tcpdump")
        .args(["-n", "-r"])
        .arg(&capture)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l.contains(".51820 >") && l.contains(".51820: UDP"),
            "not WireGuard on the underlay: {l}"
        );
    }
    eprintln!(
        "underlay capture: {} WireGuard datagrams, nothing else",
        lines.len()
    );

    // Egress: a server outside the cluster (the bridge's host) sees the node's address.
    let outside = std::net::TcpListener::bind("10.77.0.1:0").unwrap();
    let port = outside.local_addr().unwrap().port();
    let seen = std::thread::spawn(move || {
        let (mut c, peer) = outside.accept().ok()?;
        std::io::Write::write_all(&mut c, b"outside\n").ok()?;
        Some(peer.ip().to_string())
    });
    let out = h.katcall(
        1,
        &[
            "exec",
            &format!("pa/{pa_id}"),
            "--",
            "sh",
            "-c",
            &format!("nc -w 3 10.77.0.1 {port} </dev/null"),
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("outside"),
        "{out:?}"
    );
    assert_eq!(
        seen.join().unwrap().as_deref(),
        Some(ip(2).as_str()),
        "the outside sees the node's address"
    );

    // A published port: one instance per node; the fifth has nowhere to go.
    apply_server(h, "hp", None, HOSTS as u32 + 1, &token, Some(18080));
    let started = Instant::now();
    loop {
        let status = h.k(1).workload("hp").map(|w| w.status).unwrap_or_default();
        let all = status.instances;
        let message = status.message.unwrap_or_default();
        let running = all
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .count();
        if running == HOSTS
            && message.contains("1 instance(s) Pending")
            && message.contains("host port already in use")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "hp on every node, one Pending for its host port: {running} running, {message:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for i in 1..=HOSTS {
        let url = format!("http://{}:18080/index.html", ip(i));
        wait(
            &format!("the published page on n{i}"),
            Duration::from_secs(20),
            || {
                let from_host = Command::new("curl")
                    .args(["-s", "--max-time", "2", &url])
                    .output()
                    .unwrap();
                let from_other = h
                    .in_ns(if i == 1 { 2 } else { 1 })
                    .args(["curl", "-s", "--max-time", "2", &url])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&from_host.stdout).contains(&token)
                    && String::from_utf8_lossy(&from_other.stdout).contains(&token)
            },
        );
    }
    let out = h.katcall(1, &["delete", "workload", "hp"]);
    assert!(out.status.success());

    // The worker's agent restarts: the overlay (run by its node network holder) carries on,
    // so the member's container still reaches the worker's while the agent is down.
    h.kill(WORKER);
    let killed = Instant::now();
    let mut page = String::new();
    while killed.elapsed() < Duration::from_secs(5) {
        page = fetch_inside(h, "pa", &pa_id, &pb_ip);
        if page.contains(&token) {
            break;
        }
        eprintln!(
            "{:.1} s after the kill: {}",
            killed.elapsed().as_secs_f64(),
            page.trim()
        );
        if std::env::var("KAT_TEST_DIAG").is_ok() {
            for i in [2, WORKER] {
                let ov = std::fs::read_to_string(h.data(i).join("network/overlay.json"))
                    .unwrap_or_default();
                let rec: Value = serde_json::from_slice(
                    &std::fs::read(h.data(i).join("network/holder.json")).unwrap_or_default(),
                )
                .unwrap_or_default();
                let k = rec["keeperPid"].as_i64().unwrap_or(0).to_string();
                // `ip ARGS` in the node's namespaces, through its keeper.
                let ip = |args: &[&str]| {
                    Command::new("nsenter")
                        .args(["-t", &k, "-U", "-n", "--preserve-credentials", "--", "ip"])
                        .args(args)
                        .output()
                        .unwrap()
                };
                let link = ip(&["-s", "-o", "link", "show", "kat-wg"]);
                let neigh = ip(&["neigh"]);
                eprintln!(
                    "DIAG n{i}: {}\n{}\n{}",
                    ov.replace('\n', " "),
                    String::from_utf8_lossy(&link.stdout),
                    String::from_utf8_lossy(&neigh.stdout)
                );
            }
        }
    }
    assert!(
        page.contains(&token),
        "the overlay went down with the worker's agent: {page}"
    );
    eprintln!(
        "worker's agent down: a page across the overlay {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    h.spawn(WORKER, &["run"]);
    // The restarted agent adopts pb: its first heartbeat reports it Running (an empty first
    // report made the leader show it Pending, "not reported yet", for a moment).
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(3) {
        for i in instances(h, 1, "pb") {
            assert_ne!(
                i.state,
                InstanceState::Pending,
                "pb across the agent's restart: {i:?}"
            );
        }
    }
    wait("the worker Ready again", Duration::from_secs(60), || {
        h.ready_nodes(1).len() == HOSTS
    });
    // (If the agent was down longer than nodeLossTimeoutSeconds, pb was replaced: ask again.)
    let running_pb = || {
        instances(h, 1, "pb")
            .iter()
            .find(|i| {
                i.state == InstanceState::Running
                    && i.node.as_deref() == Some(format!("n{WORKER}").as_str())
            })
            .map(|i| i.instance_id.clone())
    };
    let mut seen = None;
    wait(
        "pb running on the worker again",
        Duration::from_secs(60),
        || {
            seen = running_pb();
            seen.is_some()
        },
    );
    let pb_now = seen.expect("a running pb");
    let page = fetch_until(h, "pb", &pb_now, "pa", &token, Duration::from_secs(20));
    assert!(page.contains(&token), "after the worker's restart: {page}");

    // Rekeys (forced every 4 s here): the tunnel keeps working across them.
    let state = |i: usize| -> Vec<Value> {
        std::fs::read(h.data(i).join("network/overlay.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let started = Instant::now();
    while !state(2).iter().any(|p| {
        p["node"] == format!("n{WORKER}").as_str() && p["handshakes"].as_u64().unwrap_or(0) >= 3
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "several handshakes between n2 and the worker: n2 {:?} worker {:?}\n{}",
            state(2),
            state(WORKER),
            std::fs::read_to_string(h.data(2).join("network/holder.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let page = fetch_until(h, "pa", &pa_id, "pb", &token, Duration::from_secs(20));
    assert!(page.contains(&token), "after rekeys: {page}");
    for w in ["pa", "pb"] {
        let out = h.katcall(1, &["delete", "workload", w]);
        assert!(out.status.success());
    }
}
