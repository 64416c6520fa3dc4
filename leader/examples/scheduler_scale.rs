//! Scale benchmark of the control plane: 1,000 simulated nodes, 10,000 instances.
//!
//! 1. Placement on MemStore: 100 Services x 100 replicas applied, then leader rounds until
//!    every instance is placed; placements/s over the rounds' wall time.
//! 2. The same against a real etcd (started here), writes batched in 127-op transactions.
//! 3. On etcd: 100 nodes stop heart-beating; once the leader detects it (after
//!    nodeLossTimeout), the time until every lost instance is replaced on live nodes.
//!
//! Last line: `placements_per_s mem=X etcd=Y node_loss_100_reconcile_s=Z leader_rss_mib=W`
//! (RSS of this process: the leader, its view of 10,000 instances, and the simulator).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kat_leader::sim::{SimCluster, SimNode};
use kat_leader::LeaderConfig;
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, MemStore, StateStore};

const NODES: usize = 1000;
const WORKLOADS: usize = 100;
const REPLICAS: usize = 100;

fn workload(i: usize) -> String {
    format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: svc-{i}}}\nspec:\n  type: Service\n  replicas: {REPLICAS}\n  source: {{image: 'app:{i}'}}\n  restartPolicy: {{condition: Always}}\n  container:\n    resources:\n      requests: {{cpu: 100m, memory: 64Mi}}\n"
    )
}

fn sim_nodes() -> Vec<SimNode> {
    (0..NODES)
        .map(|i| {
            let mut n = SimNode::new(&format!("node-{i:04}"), 16_000, 64 << 30);
            n.start_delay = Duration::ZERO;
            n.stop_delay = Duration::ZERO;
            n
        })
        .collect()
}

fn placed(c: &SimCluster) -> usize {
    c.leader.view().instances.len()
}

/// Apply all workloads, then run leader rounds (no node ticks) until all are placed.
async fn place_all(c: &mut SimCluster) -> f64 {
    for i in 0..WORKLOADS {
        c.apply(&[("workload.kat", &workload(i))]).await;
    }
    let start = Instant::now();
    while placed(c) < WORKLOADS * REPLICAS {
        c.leader.sync().await.expect("sync");
    }
    let secs = start.elapsed().as_secs_f64();
    (WORKLOADS * REPLICAS) as f64 / secs
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[tokio::main]
async fn main() {
    let config = LeaderConfig {
        node_loss_timeout: Duration::from_secs(5),
        seed: 1,
        // 1,000 nodes: 4,096 subnets of /20.
        addresses: kat_leader::ipam::AddressPlan::new("10.0.0.0/8".parse().unwrap(), 12),
        ..Default::default()
    };

    let mem: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let mut c = SimCluster::start(mem, sim_nodes(), config.clone(), false)
        .await
        .expect("start");
    let mem_rate = place_all(&mut c).await;
    println!(
        "MemStore: {} instances on {NODES} nodes, {mem_rate:.0} placements/s",
        WORKLOADS * REPLICAS
    );
    drop(c);

    let dir = tempfile::tempdir().expect("tempdir");
    let etcd_config = EtcdServerConfig::loopback("scale", dir.path()).expect("free ports");
    let server = EtcdServer::start(etcd_config).await.expect("start etcd");
    let etcd: Arc<dyn StateStore> = Arc::new(
        EtcdStore::connect(&[server.client_url().to_string()], None)
            .await
            .expect("connect"),
    );
    let mut c = SimCluster::start(etcd, sim_nodes(), config.clone(), false)
        .await
        .expect("start");
    let etcd_rate = place_all(&mut c).await;
    println!(
        "etcd:     {} instances on {NODES} nodes, {etcd_rate:.0} placements/s",
        WORKLOADS * REPLICAS
    );

    // Every node reports its instances, then 100 nodes go silent.
    c.nodes_tick().await.expect("nodes");
    c.leader.sync().await.expect("sync");
    for n in c.nodes.iter_mut().take(100) {
        n.partitioned = true;
    }
    let lost: usize = c
        .leader
        .view()
        .instances
        .values()
        .filter(|r| r.node.as_str() < "node-0100")
        .count();
    let silent_since = Instant::now();
    // Live nodes keep heart-beating while the timeout runs.
    while silent_since.elapsed() < config.node_loss_timeout + Duration::from_millis(200) {
        c.nodes_tick().await.expect("nodes");
        c.leader.sync().await.expect("sync");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let start = Instant::now();
    let mut rounds = 0;
    loop {
        c.leader.sync().await.expect("sync");
        rounds += 1;
        let view = c.leader.view();
        let on_lost = view
            .instances
            .values()
            .filter(|r| r.node.as_str() < "node-0100")
            .count();
        if on_lost == 0 && view.instances.len() == WORKLOADS * REPLICAS {
            break;
        }
    }
    let reconcile = start.elapsed().as_secs_f64();
    println!("node loss: {lost} instances on 100 lost nodes rescheduled in {reconcile:.2}s ({rounds} round(s)) after detection");
    let rss = rss_mib();
    println!("process RSS (leader + simulator): {rss:.1} MiB");
    println!(
        "ratio vs kube-scheduler (100-300 pods/s, documented): {:.0}x-{:.0}x on etcd",
        etcd_rate / 300.0,
        etcd_rate / 100.0
    );
    server.stop().await;
    println!("placements_per_s mem={mem_rate:.0} etcd={etcd_rate:.0} node_loss_100_reconcile_s={reconcile:.2} leader_rss_mib={rss:.1}");
}
