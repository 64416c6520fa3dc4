//! Three members and a worker: joins (and bad ones refused), a spread Service, the leader
//! killed, the worker's limits, container networking across nodes.

use super::*;

use super::overlay_network::container_network;
use super::worker_limits::*;

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
                .get("kat.dws.rip/cluster-role")
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
    every_node_reports_its_overlay_and_metrics(&h);

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

/// The worker reads the DNS records and the overlay's peers with long polls: idle, each costs
/// the leader a request per 30 s (and one per change), where it read them twice and once a
/// second. Counted by the leader's own metrics over an 8 s window.
fn the_workers_reads_wait_for_changes(leader_metrics: impl Fn() -> String) {
    let reads = || -> f64 {
        let body = leader_metrics();
        assert!(body.contains("kat_api_request_duration_seconds"), "{body}");
        body.lines()
            .filter(|l| l.starts_with("kat_api_request_duration_seconds_count"))
            .filter(|l| l.contains("/dns\"") || l.contains("/peers\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = reads();
    assert!(
        before >= 2.0,
        "the worker's reads are not in the metrics ({before})"
    );
    std::thread::sleep(Duration::from_secs(8));
    let answered = reads() - before;
    // Read on a clock it was 24 (8 × (2 + 1)); a change or two may come in the window.
    eprintln!("the worker's reads of DNS records and peers answered in 8 s idle: {answered}");
    assert!(
        answered <= 4.0,
        "{answered} reads of DNS records and peers answered in 8 s"
    );
}

/// Heartbeats carry each peer's last overlay handshake and each instance's container and
/// image digest (`describe node` shows them); the worker serves its own `/metrics` to a
/// control-plane certificate and to a metrics token (the leader says what it is), and
/// refuses another worker's certificate, every other token (read-only, namespace, the
/// admin's, made up, empty); the metrics token reads the leader's `/metrics` and nothing
/// else.
fn every_node_reports_its_overlay_and_metrics(h: &Hosts) {
    let worker = format!("n{WORKER}");
    let mut text = String::new();
    wait(
        "the worker's overlay peers in describe node",
        Duration::from_secs(30),
        || {
            let out = h.katcall(1, &["describe", "node", &worker]);
            text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("Overlay peers:") && text.contains(" ago ")
        },
    );
    assert!(
        text.contains("CONTAINER") && text.contains("sha256:"),
        "{text}"
    );
    let node = h
        .k(1)
        .nodes()
        .into_iter()
        .find(|n| n.metadata.name == worker)
        .expect("the worker's node");
    assert!(
        node.overlay
            .iter()
            .any(|p| p.last_peer_sync.is_some() && p.handshakes > 0),
        "{:?}",
        node.overlay
    );
    let metrics = format!("https://{}:{API_PORT}/metrics", ip(WORKER));
    let body = h.body_as(1, &metrics);
    let own = format!("kat_node_memory_used_bytes{{node=\"{worker}\"}}");
    assert!(body.contains(&own), "{body}");
    assert_eq!(h.status_as(WORKER, &metrics), "403");

    let token = |args: &[&str]| -> String {
        let mut all = vec!["create", "token"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let made: kat_api::wire::NewApiToken = h.k(1).json(&all).expect("a token");
        made.token
    };
    let scraper = token(&["--metrics"]);
    let read_only = token(&["--read-only"]);
    let namespaced = token(&["--read-only", "--namespace", "default"]);
    let admin = kat_api::client_config::ClientConfig::load(&h.client_config(1))
        .expect("the admin config")
        .token;
    let ca = h.data(1).join("pki/ca.crt");
    let with_token = |token: &str, url: &str| -> (String, String) {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "15", "--cacert"])
            .arg(&ca)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-w", "\n%{http_code}"])
            .arg(url)
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.to_string(), body.to_string())
    };
    let (code, body) = with_token(&scraper, &metrics);
    assert_eq!(code, "200", "{body}");
    assert!(body.contains(&own), "{body}");
    for refused in [
        read_only.as_str(),
        namespaced.as_str(),
        admin.as_str(),
        "katapi.nosuch.secret",
        "",
    ] {
        let (code, body) = with_token(refused, &metrics);
        assert_eq!(code, "401", "token {refused:?}: {body}");
    }
    let leader = |path: &str| format!("https://{}:{API_PORT}{path}", ip(1));
    let (code, body) = with_token(&scraper, &leader("/metrics"));
    assert_eq!(code, "200", "{body}");
    assert!(
        body.contains(&own),
        "the leader has every node's heartbeat: {body}"
    );
    let (code, body) = with_token(&scraper, &leader("/v1alpha1/n/default/workloads"));
    assert_eq!(code, "403", "{body}");
    the_workers_reads_wait_for_changes(|| with_token(&scraper, &leader("/metrics")).1);
}
