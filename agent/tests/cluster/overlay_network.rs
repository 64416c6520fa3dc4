//! Container networking across the nodes of the three-node cluster: the overlay between
//! instances on different nodes (nothing readable on the underlay), published host ports,
//! and a worker agent's restart that the overlay survives.

use super::*;

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
    let selector = node
        .map(|n| format!("  nodeSelector: {{kat.dws.rip/hostname: n{n}}}\n"))
        .unwrap_or_default();
    let workload = format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: {replicas}\n{selector}  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www; echo {page} $(hostname) > /tmp/www/index.html; yes {page} | head -c 4000000 > /tmp/www/big.txt; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        );
    let ports = match host_port {
        Some(p) => format!("    - {{name: http, containerPort: 8080, hostPort: {p}}}\n"),
        None => "    - {name: http, containerPort: 8080}\n".to_string(),
    };
    let balancer = format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n{ports}"
    );
    apply_bundle(
        h,
        1,
        name,
        &[
            ("workload.kat", workload),
            ("VirtualLoadBalancer.kat", balancer),
        ],
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
pub(crate) fn container_network(h: &mut Hosts) {
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
    // A stream, not a page: 4 MB from the worker's container to n2's, through the TUN
    // offloads (super-packets split and merged by the overlay), whole.
    let script = "printf 'GET /big.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 10 pb 8080 | sed '1,/^\\r$/d' | sha256sum; yes TOKEN | head -c 4000000 | sha256sum".replace("TOKEN", &token);
    let out = h.katcall(
        1,
        &["exec", &format!("pa/{pa_id}"), "--", "sh", "-c", &script],
    );
    let sums = String::from_utf8_lossy(&out.stdout).into_owned();
    let sums: Vec<&str> = sums
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(
        sums.len() == 2 && sums[0] == sums[1],
        "4 MB across the overlay arrived changed: {sums:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let worker = format!("n{WORKER}");
    let adopted: Vec<_> = instances(h, 1, "pb")
        .into_iter()
        .filter(|i| i.node.as_deref() == Some(worker.as_str()))
        .map(|i| i.instance_id)
        .collect();
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
    // report made the leader show it Pending, "not reported yet", for a moment). Only the
    // instance it had: on a busy machine the agent can be down past nodeLossTimeoutSeconds,
    // and a replacement is rightly Pending until the node reports it.
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(3) {
        for i in instances(h, 1, "pb")
            .into_iter()
            .filter(|i| adopted.contains(&i.instance_id))
        {
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
