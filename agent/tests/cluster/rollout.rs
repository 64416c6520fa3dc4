//! A rolling update under traffic: clients through it, the failed requests counted.

use super::*;

/// One client's results: (uptime seconds, succeeded).
type Samples = Vec<(f64, bool)>;

/// Seconds since boot (`/proc/uptime`, CLOCK_BOOTTIME): the clock the in-cluster clients
/// stamp their requests with.
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Writes and applies `web` (3 replicas, a health check, hostPort 18080; its page says
/// `version`) through n1. The server listens a second after it starts, so an instance that
/// took requests before its health check passed would fail them.
fn apply_rollout_web(h: &Hosts, version: &str) {
    apply_bundle(h, 1, "web", &[
        ("workload.kat", format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: web, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 3\n  drainSeconds: 3\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www; echo page {version} $(hostname) > /tmp/www/index.html; sleep 1; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        )),
        ("VirtualLoadBalancer.kat", "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n    - {name: http, containerPort: 8080, hostPort: 18080}\n  healthCheck:\n    exec: {command: [/bin/sh, -c, 'printf \"GET /index.html HTTP/1.0\\r\\n\\r\\n\" | nc -w 1 127.0.0.1 8080 | grep -q page']}\n    initialDelaySeconds: 1\n    periodSeconds: 1\n    failureThreshold: 2\n".into()),
    ]);
}

/// Every instance of `web` runs `version` and is healthy, three of them, none other left.
fn web_rolled_to(h: &Hosts, version: u64) -> bool {
    let list = instances(h, 1, "web");
    list.len() == 3
        && list.iter().all(|i| {
            i.generation == version
                && i.state == InstanceState::Running
                && i.health == Health::Healthy
        })
}

/// `rollout requests=N failed=F max_gap_ms=G` over `streams` between `from` and `to`: the
/// gap is the longest time a client went without a successful answer.
fn rollout_figures(streams: &[Samples], from: f64, to: f64) -> (usize, usize, u64) {
    let (mut requests, mut failed, mut gap) = (0, 0, 0.0f64);
    for s in streams {
        let mut last_ok = from;
        for &(t, ok) in s.iter().filter(|(t, _)| *t >= from && *t <= to) {
            requests += 1;
            if ok {
                gap = gap.max(t - last_ok);
                last_ok = t;
            } else {
                failed += 1;
            }
        }
        gap = gap.max(to - last_ok);
    }
    (requests, failed, (gap * 1000.0).round() as u64)
}

/// Parses `ok T` / `fail T` lines.
fn samples(text: &str) -> Samples {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let ok = match w.next()? {
                "ok" => true,
                "fail" => false,
                _ => return None,
            };
            Some((w.next()?.parse().ok()?, ok))
        })
        .collect()
}

/// Rollouts lose no request: a 3-replica Service with a health check and a
/// hostPort on 3 nodes, a client on every node asking it by name (a DaemonService) and one on
/// every test host through the published port (10 requests/s each), a Rolling update and a
/// rollback. Replacements get fresh addresses (quarantine) with a MAC derived from them and
/// announced, take traffic only once healthy, and old instances leave DNS and the ports
/// before they drain and stop. Prints `rollout requests=N failed=F max_gap_ms=G`
/// (bench/rollout.sh) and asserts no request failed.
#[test]
fn rollout_loses_no_request() {
    let mut h = Hosts::up();
    // Departed nodes are removed after 20 s of silence (checked at the end; far above any
    // pause of a live node's heartbeats, 1 s apart, on a busy machine).
    let cluster = format!("{}  nodeRemoveAfterSeconds: 20\n", cluster_kat());
    let (_, pin) = init_with(&mut h, &cluster);
    join_others(&mut h, &pin);
    apply_rollout_web(&h, "v1");
    wait(
        "3 healthy instances of web",
        Duration::from_secs(120),
        || web_rolled_to(&h, 1),
    );
    // The by-name clients: one per node.
    apply_text(
        &h,
        "probe",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: probe, namespace: default}}\nspec:\n  type: DaemonService\n  source: {{image: {}/kat/busybox:latest}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do t=$(cut -d\" \" -f1 /proc/uptime); if printf \"GET /index.html HTTP/1.0\\r\\n\\r\\n\" | nc -w 2 web 8080 | grep -q page; then echo ok $t; else echo fail $t; fi; sleep 0.1; done']\n", h.registry_addr),
    );
    wait("a probe on every node", Duration::from_secs(60), || {
        h.running(1, "probe").len() == NODES
    });
    // The published-port clients: one in every test host's namespace, on its own address.
    let client = r#"import socket, sys, time
while True:
    t = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        s = socket.create_connection((sys.argv[1], 18080), timeout=2)
        s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
        d = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            d += b
        s.close()
        ok = b"page" in d
    except Exception:
        ok = False
    print("ok" if ok else "fail", "%.2f" % t, flush=True)
    time.sleep(max(0.0, t + 0.1 - time.clock_gettime(time.CLOCK_BOOTTIME)))
"#;
    let mut host_clients: Vec<Child> = (1..=NODES)
        .map(|i| {
            h.in_ns(i)
                .args(["python3", "-c", client, &ip(i)])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("python3 client")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let from = uptime();
    apply_rollout_web(&h, "v2");
    let update = wait(
        "web rolled to generation 2",
        Duration::from_secs(180),
        || web_rolled_to(&h, 2),
    );
    eprintln!("rolling update: {:.1} s", update.as_secs_f64());
    std::thread::sleep(Duration::from_secs(2));
    let out = h.katcall(1, &["rollback", "workload", "web"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rollback = wait("web rolled back", Duration::from_secs(180), || {
        let list = instances(&h, 1, "web");
        list.len() == 3
            && list.iter().all(|i| {
                i.generation >= 3
                    && i.state == InstanceState::Running
                    && i.health == Health::Healthy
            })
    });
    eprintln!("rollback: {:.1} s", rollback.as_secs_f64());
    // Old instances drain (3 s) and stop after the last step: keep asking meanwhile.
    std::thread::sleep(Duration::from_secs(6));
    let to = uptime() - 1.0;
    let mut streams: Vec<Samples> = Vec::new();
    for mut c in host_clients.drain(..) {
        let _ = c.kill();
        let mut text = String::new();
        if let Some(mut out) = c.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut out, &mut text);
        }
        let _ = c.wait();
        streams.push(samples(&text));
    }
    for i in instances(&h, 1, "probe") {
        let id = i.instance_id;
        let text = String::from_utf8_lossy(&h.katcall(1, &["logs", &format!("probe/{id}")]).stdout)
            .into_owned();
        streams.push(samples(&text));
    }
    assert_eq!(streams.len(), 2 * NODES, "a stream per client");
    let (requests, failed, gap) = rollout_figures(&streams, from, to);
    println!("rollout requests={requests} failed={failed} max_gap_ms={gap}");
    let failures: Vec<String> = streams
        .iter()
        .enumerate()
        .flat_map(|(n, s)| {
            s.iter()
                .filter(|(t, ok)| !ok && *t >= from && *t <= to)
                .map(move |(t, _)| format!("client {n} at +{:.2} s", t - from))
        })
        .collect();
    // Every client asked all along (a busybox client manages about 5 a second).
    let counts: Vec<usize> = streams
        .iter()
        .map(|s| s.iter().filter(|(t, _)| *t >= from && *t <= to).count())
        .collect();
    eprintln!("requests per client over {:.0} s: {counts:?}", to - from);
    assert!(
        counts.iter().all(|n| *n as f64 >= (to - from) * 3.0),
        "a client asked too little: {counts:?} in {:.0} s",
        to - from
    );
    assert_eq!(failed, 0, "failed requests: {failures:?}");

    // A node that never comes back (its agent and etcd killed) is removed after
    // `nodeRemoveAfterSeconds` as `katcall delete node` would: gone from the nodes and from
    // etcd's members, with an event that says why.
    let gone = format!("n{NODES}");
    h.kill(NODES);
    wait(
        "the departed node removed",
        Duration::from_secs(120),
        || {
            let nodes = h.k(1).nodes();
            !nodes.is_empty() && !nodes.iter().any(|n| n.metadata.name == gone)
        },
    );
    let events = h.k(1).events_of(&gone);
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("nodeRemoveAfterSeconds")),
        "{events:?}"
    );
    wait("etcd down to 2 members", Duration::from_secs(30), || {
        let out = h.etcdctl(1, &["member", "list", "-w", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["members"].as_array().map(Vec::len) == Some(NODES - 1)
    });
}
