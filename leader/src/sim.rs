//! Simulated nodes: an agent and a fake container runtime in one, for deterministic tests and
//! benchmarks of the control plane.
//!
//! A [`SimNode`] does what a real agent does with its assignments: it starts the instances
//! assigned to it (after `start_delay`), reports them Running and, per the behaviour the test
//! gives each instance, Healthy or Unhealthy, and lets jobs exit with a code. An instance whose
//! record disappears is stopped (after `stop_delay`), by instance id. A node can be cut off
//! ([`SimNode::partitioned`]): it keeps running its containers but neither hears the store nor
//! heartbeats, like a node behind a broken link, and catches up when reconnected.
//!
//! [`SimCluster`] ties a store, a [`Leader`] and nodes together and advances them in steps;
//! with `MemStore` and `tokio::time::pause()` a step costs no real time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::{
    GpuInfo, Health, InstanceRecord, InstanceState, InstanceStatus, NodeHeartbeat, NodeName,
    NodeRegistration, ResourceList, Taint,
};
use kat_api::WorkloadBundle;
use kat_store::{batch_groups, JsonStore, Result, StateStore, Txn, TxnOp, MAX_TXN_OPS};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::controller::{Leader, LeaderConfig, RoundReport};
use crate::desired::workloads;

/// How one simulated instance behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviour {
    pub healthy: bool,
    /// Exit after this long with this code (jobs, or crashing services).
    pub exit: Option<(Duration, i32)>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            healthy: true,
            exit: None,
        }
    }
}

/// Decides each instance's behaviour from its record (e.g. by generation or workload).
pub type BehaviourFn = Arc<dyn Fn(&InstanceRecord) -> Behaviour + Send + Sync>;

#[derive(Debug, Clone)]
struct SimInstance {
    record: InstanceRecord,
    created: Instant,
    behaviour: Behaviour,
    state: InstanceState,
    exit_code: Option<i32>,
    /// Set when the record disappeared: the instance is stopping since then.
    stopping_since: Option<Instant>,
    /// Turns to unhealthy, as a node counts them.
    unhealthy_turns: u32,
}

pub struct SimNode {
    pub name: NodeName,
    pub allocatable: ResourceList,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub gpus: Vec<GpuInfo>,
    /// Cut off from the store: no heartbeats, no new assignments; containers keep running.
    pub partitioned: bool,
    /// Hears its assignments and runs them but sends no heartbeat (heartbeats lost or late).
    pub silent: bool,
    pub start_delay: Duration,
    pub stop_delay: Duration,
    /// Builds the node reports in its heartbeats.
    pub builds: Vec<kat_api::wire::BuildReport>,
    instances: BTreeMap<kat_api::wire::InstanceId, SimInstance>,
}

impl SimNode {
    pub fn new(name: &str, cpu_millis: u64, memory_bytes: u64) -> Self {
        SimNode {
            name: NodeName::parse(name).unwrap_or_else(|e| panic!("a simulated node: {e}")),
            allocatable: ResourceList {
                cpu_millis,
                memory_bytes,
                pids: 4096,
            },
            labels: BTreeMap::new(),
            taints: vec![],
            gpus: vec![],
            partitioned: false,
            silent: false,
            builds: vec![],
            start_delay: Duration::from_secs(1),
            stop_delay: Duration::from_secs(1),
            instances: BTreeMap::new(),
        }
    }

    /// Make one of this node's instances healthy or not from now on.
    pub fn set_healthy(&mut self, instance_id: &str, healthy: bool) {
        if let Some(i) = self.instances.get_mut(instance_id) {
            if i.behaviour.healthy && !healthy {
                i.unhealthy_turns += 1;
            }
            i.behaviour.healthy = healthy;
        }
    }

    /// One of this node's instances failed its health check and restarts for it
    /// (`healthCheck.onFailure: restart`): the node has counted the turn, and reports it
    /// starting (health unknown) until it runs again, healthy, as a real node does when the
    /// restart is quicker than its heartbeats.
    pub fn restart_for_health(&mut self, instance_id: &str, now: Instant) {
        if let Some(i) = self.instances.get_mut(instance_id) {
            i.unhealthy_turns += 1;
            i.behaviour.healthy = true;
            i.state = InstanceState::Creating;
            i.created = now;
        }
    }

    /// Instances this node is running or still stopping, by id.
    pub fn live(&self) -> impl Iterator<Item = &InstanceRecord> {
        self.instances
            .values()
            .filter(|i| {
                matches!(
                    i.state,
                    InstanceState::Creating | InstanceState::Running | InstanceState::Stopping
                )
            })
            .map(|i| &i.record)
    }

    /// Converge on `assigned` and advance the instances' lives to `now`.
    fn converge(&mut self, assigned: &[InstanceRecord], now: Instant, behaviour: &BehaviourFn) {
        for r in assigned {
            self.instances
                .entry(r.instance_id.clone())
                .or_insert_with(|| SimInstance {
                    record: r.clone(),
                    created: now,
                    behaviour: behaviour(r),
                    state: InstanceState::Creating,
                    exit_code: None,
                    stopping_since: None,
                    unhealthy_turns: 0,
                });
        }
        let assigned_ids: std::collections::HashSet<&str> =
            assigned.iter().map(|r| r.instance_id.as_str()).collect();
        for inst in self.instances.values_mut() {
            if !assigned_ids.contains(inst.record.instance_id.as_str())
                && inst.stopping_since.is_none()
            {
                inst.stopping_since = Some(now);
                if matches!(inst.state, InstanceState::Creating | InstanceState::Running) {
                    inst.state = InstanceState::Stopping;
                }
            }
        }
        self.advance(now);
        let stop_delay = self.stop_delay;
        self.instances.retain(|_, i| {
            i.stopping_since
                .is_none_or(|since| now.saturating_duration_since(since) < stop_delay)
        });
    }

    fn advance(&mut self, now: Instant) {
        for inst in self.instances.values_mut() {
            let age = now.saturating_duration_since(inst.created);
            if inst.state == InstanceState::Creating && age >= self.start_delay {
                inst.state = InstanceState::Running;
            }
            if inst.state == InstanceState::Running {
                if let Some((after, code)) = inst.behaviour.exit {
                    if age >= self.start_delay + after {
                        inst.state = if code == 0 {
                            InstanceState::Succeeded
                        } else {
                            InstanceState::Failed
                        };
                        inst.exit_code = Some(code);
                    }
                }
            }
        }
    }

    fn heartbeat(&self, clock: &Clock) -> NodeHeartbeat {
        NodeHeartbeat {
            node: self.name.clone(),
            timestamp: clock.timestamp(),
            capacity: self.allocatable,
            allocatable: self.allocatable,
            gpus: self.gpus.clone(),
            instances: self
                .instances
                .values()
                .map(|i| InstanceStatus {
                    node: Some(self.name.clone()),
                    health: match (i.state, i.behaviour.healthy) {
                        (InstanceState::Running, true) => Health::Healthy,
                        (InstanceState::Running, false) => Health::Unhealthy,
                        _ => Health::Unknown,
                    },
                    exit_code: i.exit_code,
                    unhealthy_transitions: i.unhealthy_turns,
                    ..InstanceStatus::of(&i.record, i.state)
                })
                .collect(),
            usage: None,
            builds: self.builds.clone(),
            detached: None,
            overlay: vec![],
        }
    }

    pub fn registration(&self) -> NodeRegistration {
        NodeRegistration {
            labels: self.labels.clone(),
            taints: self.taints.clone(),
            ..NodeRegistration::new(self.name.to_string())
        }
    }
}

/// A store, a leader and simulated nodes, advanced together.
pub struct SimCluster {
    pub store: Arc<dyn StateStore>,
    pub leader: Leader,
    pub nodes: Vec<SimNode>,
    pub clock: Clock,
    pub behaviour: BehaviourFn,
    /// Simulated time per step when time is paused (`step` advances tokio's clock by it).
    pub step: Duration,
    pub paused_time: bool,
}

impl SimCluster {
    /// Register `nodes`, send their first heartbeats, and start a leader.
    pub async fn start(
        store: Arc<dyn StateStore>,
        nodes: Vec<SimNode>,
        config: LeaderConfig,
        paused_time: bool,
    ) -> Result<Self> {
        let clock = Clock::simulated(std::time::UNIX_EPOCH + Duration::from_secs(1_795_000_000));
        let mut ops = Vec::new();
        for n in &nodes {
            ops.push(TxnOp::put_json(
                keys::node_registration(&n.name),
                &n.registration(),
            )?);
            ops.push(TxnOp::put_json(
                keys::node_status(&n.name),
                &n.heartbeat(&clock),
            )?);
        }
        commit_batched(&*store, ops).await?;
        let leader = Leader::start(store.clone(), config, clock, None).await?;
        Ok(SimCluster {
            store,
            leader,
            nodes,
            clock,
            behaviour: Arc::new(|_| Behaviour::default()),
            step: Duration::from_secs(1),
            paused_time,
        })
    }

    /// A node joins the running cluster: registered now, heartbeating from the next step.
    pub async fn add_node(&mut self, node: SimNode) -> Result<()> {
        self.store
            .put_json(
                &keys::node_registration(&node.name),
                &node.registration(),
                None,
            )
            .await?;
        self.nodes.push(node);
        Ok(())
    }

    pub fn node(&mut self, name: &str) -> &mut SimNode {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("no such simulated node")
    }

    /// Apply a workload from YAML files (validated as the API would).
    pub async fn apply(&mut self, files: &[(&str, &str)]) -> workloads::Applied {
        let files = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
            .collect();
        let bundle =
            WorkloadBundle::parse(files).unwrap_or_else(|e| panic!("invalid test workload:\n{e}"));
        let events = self.leader.events().clone();
        workloads::apply(&*self.store, &events, &self.clock, &bundle)
            .await
            .expect("apply")
    }

    /// Nodes act on their assignments and heartbeat.
    pub async fn nodes_tick(&mut self) -> Result<()> {
        let listing = self.store.list("/kat/instances/").await?;
        let mut by_node: HashMap<&str, Vec<InstanceRecord>> = HashMap::new();
        let records: Vec<InstanceRecord> = listing
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip)
            .collect();
        for r in &records {
            by_node.entry(r.node.as_str()).or_default().push(r.clone());
        }
        let now = self.clock.now();
        let mut ops = Vec::new();
        for node in self.nodes.iter_mut() {
            if node.partitioned {
                node.advance(now);
                continue;
            }
            let assigned = by_node.remove(node.name.as_str()).unwrap_or_default();
            node.converge(&assigned, now, &self.behaviour);
            if node.silent {
                continue;
            }
            ops.push(TxnOp::put_json(
                keys::node_status(&node.name),
                &node.heartbeat(&self.clock),
            )?);
        }
        commit_batched(&*self.store, ops).await
    }

    /// One step: advance simulated time, nodes act, the leader reconciles.
    pub async fn tick(&mut self) -> Result<RoundReport> {
        if self.paused_time {
            tokio::time::advance(self.step).await;
        }
        self.nodes_tick().await?;
        self.leader.sync().await
    }

    /// Step until `done` holds (checked after each step) or `limit` steps passed.
    pub async fn run_until(
        &mut self,
        limit: usize,
        mut done: impl FnMut(&SimCluster) -> bool,
    ) -> Result<usize> {
        for i in 0..limit {
            self.tick().await?;
            if done(self) {
                return Ok(i + 1);
            }
        }
        Ok(limit)
    }

    /// Live instances across all nodes (running, starting or stopping), including on
    /// partitioned nodes.
    pub fn live(&self) -> Vec<&InstanceRecord> {
        self.nodes.iter().flat_map(|n| n.live()).collect()
    }

    pub fn live_of(&self, workload: &str) -> Vec<&InstanceRecord> {
        self.live()
            .into_iter()
            .filter(|r| r.workload == workload)
            .collect()
    }

    /// Instances reported Running and healthy, not stopping.
    pub fn healthy_of(&self, workload: &str) -> usize {
        self.nodes
            .iter()
            .flat_map(|n| n.instances.values())
            .filter(|i| {
                i.record.workload == workload
                    && i.state == InstanceState::Running
                    && i.behaviour.healthy
                    && i.stopping_since.is_none()
            })
            .count()
    }
}

async fn commit_batched(store: &dyn StateStore, ops: Vec<TxnOp>) -> Result<()> {
    for batch in batch_groups(ops.into_iter().map(|op| vec![op]).collect(), MAX_TXN_OPS) {
        store.txn(Txn::new().and_then(batch)).await?;
    }
    Ok(())
}
