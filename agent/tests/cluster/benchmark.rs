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
        wait("3 Ready nodes again", Duration::from_secs(90), || {
            h.ready_nodes(alive).len() == NODES
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
    failovers.sort();
    applies.sort();
    let ready = h.ready_nodes(via).len();
    println!(
        "cluster nodes_ready={ready} join_s={:.1} failover_p50_s={:.1} failover_max_s={:.1} apply_to_running_3nodes_p50_ms={}",
        join.as_secs_f64(),
        failovers[failovers.len() / 2].as_secs_f64(),
        failovers[failovers.len() - 1].as_secs_f64(),
        applies[applies.len() / 2].as_millis()
    );
}
