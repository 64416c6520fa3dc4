//! `bench/cluster.sh`: apply to running on three nodes, and failover, timed (ignored in the suite).

use super::*;

/// `bench/cluster.sh`: join time, 5 leader failovers (each killed node restarted), and
/// apply-to-running of a 6-replica Service across 3 nodes. Prints one line.
#[test]
#[ignore = "a benchmark: bench/cluster.sh runs it"]
fn cluster_benchmark() {
    let mut h = Hosts::up();
    let (_, pin) = init_first(&mut h);
    let join = join_others(&mut h, &pin);
    let mut failovers = Vec::new();
    for round in 0..5 {
        let (dead, alive, failover) = kill_leader(&mut h);
        eprintln!("failover {}: {:.2} s", round + 1, failover.as_secs_f64());
        failovers.push(failover);
        h.spawn(dead, &["run"]);
        // The restarted node's own API answers (it is up, not only its record from before
        // the kill, which stays Ready for a while), and all three are Ready.
        wait("3 Ready nodes again", Duration::from_secs(90), || {
            h.katcall(dead, &["get", "nodes"]).status.success()
                && h.ready_nodes(alive).len() == NODES
        });
    }
    let via = (1..=NODES).find(|i| h.leader(*i).is_some()).unwrap_or(1);
    let mut applies: Vec<Duration> = (0..5)
        .map(|k| {
            let took = apply_spread(&h, via, &format!("bench{k}"));
            eprintln!("apply to running {}: {} ms", k + 1, took.as_millis());
            took
        })
        .collect();
    for k in 0..5 {
        h.katcall(via, &["delete", "workload", &format!("bench{k}")]);
    }
    // Their 30 containers drain for 5 s, then stop: not during the applies below.
    std::thread::sleep(Duration::from_secs(8));
    let mut polled: Vec<Duration> = (0..5)
        .map(|k| {
            let name = format!("polled{k}");
            let took = apply_polled(&h, via, &name);
            eprintln!(
                "apply to running {} (polled): {} ms",
                k + 1,
                took.as_millis()
            );
            h.katcall(via, &["delete", "workload", &name]);
            took
        })
        .collect();
    // KAT_BENCH_KEEP=DIR keeps the agents' logs (with KAT_LOG=info,kat_runtime::phases=debug,
    // each create's phases) to see where an apply's time goes.
    if let Some(keep) = std::env::var_os("KAT_BENCH_KEEP") {
        for i in 1..=NODES {
            let log = format!("n{i}.log");
            let _ = std::fs::copy(h.path(&log), std::path::Path::new(&keep).join(&log));
        }
    }
    failovers.sort();
    applies.sort();
    polled.sort();
    let ready = h.ready_nodes(via).len();
    println!(
        "cluster nodes_ready={ready} join_s={:.1} failover_p50_s={:.1} failover_max_s={:.1} apply_to_running_3nodes_p50_ms={} apply_to_running_3nodes_polled_p50_ms={}",
        join.as_secs_f64(),
        failovers[failovers.len() / 2].as_secs_f64(),
        failovers[failovers.len() - 1].as_secs_f64(),
        applies[applies.len() / 2].as_millis(),
        polled[polled.len() / 2].as_millis()
    );
}

/// An apply timed as `bench/apply-to-running.sh` times one: from `katcall apply` until the
/// API, asked every 10 ms on one kept-alive HTTPS connection from host `via`
/// (`bench/poll_running.py`), shows the six instances Running, two per node. (The looks of
/// `apply_spread` are each a `katcall` process and a TLS handshake, 20 ms apart.)
fn apply_polled(h: &Hosts, via: usize, name: &str) -> Duration {
    use std::io::{BufRead, Write};
    let config = kat_api::client_config::ClientConfig::load(&h.client_config(1))
        .expect("n1's client config");
    let (ca, token) = (
        h.path(&format!("{name}-ca.crt")),
        h.path(&format!("{name}-token")),
    );
    std::fs::write(&ca, &config.ca_certificate).unwrap();
    std::fs::write(&token, &config.token).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/poll_running.py");
    let mut poller = h
        .in_ns(via)
        .args(["python3", script, &config.endpoint])
        .args([&ca, &token])
        .args([name, "6", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines = std::io::BufReader::new(poller.stdout.take().expect("piped")).lines();
    assert_eq!(
        lines.next().and_then(Result::ok).as_deref(),
        Some("ready"),
        "the poller did not reach the API"
    );
    let started = Instant::now();
    writeln!(poller.stdin.as_mut().expect("piped"), "go").expect("the poller's input");
    apply_bundle(h, via, name, &[("workload.kat", spread_workload(h, name))]);
    let line = lines.next().and_then(Result::ok);
    let took = started.elapsed();
    assert_eq!(
        line.as_deref(),
        Some("running"),
        "{name}: six instances 2/2/2 not within 60 s"
    );
    let _ = poller.wait();
    took
}
