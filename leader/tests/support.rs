//! Shared helpers for the leader simulations.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use kat_leader::sim::{SimCluster, SimNode};
use kat_leader::LeaderConfig;
use kat_store::{MemStore, StateStore};

pub const GI: u64 = 1 << 30;

pub fn config() -> LeaderConfig {
    LeaderConfig {
        node_loss_timeout: Duration::from_secs(30),
        rollout_progress_deadline: Duration::from_secs(120),
        simultaneous_stop_timeout: Duration::from_secs(30),
        job_history: 3,
        finished: kat_api::finished::Retention {
            history: 2,
            max_age_ms: 24 * 3_600_000,
        },
        event_capacity: 200,
        seed: 7,
        addresses: kat_leader::ipam::AddressPlan::new("10.100.0.0/16".parse().unwrap(), 7),
        replacement_backoff_base: Duration::from_secs(10),
        replacement_backoff_cap: Duration::from_secs(300),
    }
}

pub fn nodes(n: usize) -> Vec<SimNode> {
    (1..=n)
        .map(|i| SimNode::new(&format!("node-{i}"), 4000, 8 * GI))
        .collect()
}

pub async fn cluster(n: usize) -> SimCluster {
    cluster_with(nodes(n)).await
}

pub async fn cluster_with(nodes: Vec<SimNode>) -> SimCluster {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    SimCluster::start(store, nodes, config(), true)
        .await
        .expect("start")
}

/// A Service; `extra` is appended to `spec:` (indented two spaces).
pub fn service(name: &str, replicas: u32, image: &str, extra: &str) -> String {
    format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  type: Service\n  replicas: {replicas}\n  source:\n    image: {image}\n  restartPolicy:\n    condition: Always\n  container:\n    resources:\n      requests: {{cpu: 500m, memory: 256Mi}}\n      limits: {{cpu: '1', memory: 512Mi}}\n{extra}"
    )
}

pub const HEALTH_CHECK: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 8080}]\n  healthCheck:\n    exec: {command: [/bin/check]}\n";

pub async fn events(c: &SimCluster) -> Vec<kat_api::wire::Event> {
    kat_leader::events::list(&*c.store, &Default::default(), config().event_capacity)
        .await
        .unwrap()
}

pub async fn status(c: &SimCluster, name: &str) -> kat_api::wire::WorkloadStatus {
    let kv = c
        .store
        .get(&kat_api::keys::workload_status("default", name))
        .await
        .unwrap()
        .expect("status written");
    kat_store::decode(&kv).unwrap()
}
