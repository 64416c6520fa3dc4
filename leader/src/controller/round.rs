//! One round's working state ([`Round`]), what it decides ([`Plan`]) and what the controllers
//! know of each workload ([`WorkloadCtx`]); [`build_round`] makes a round from the view.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use kat_api::keys;
use kat_api::load_balancer::HostPort;
use kat_api::wire::{
    Event, EventType, Health, InstanceRecord, InstanceState, InstanceStatus, ObjectReference,
    ResourceList,
};
use kat_api::wire::{InstanceId, NodeName, Timestamp};
use kat_api::workload::{GpuRequest, MaxSurge, Toleration, UpdateStrategyType, WorkloadType};
use kat_api::WorkloadKey;
use kat_store::{Result, StoreError, TxnOp};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::events::{self};
use crate::ipam::{self};
use crate::scheduler::{self, NodeLoad, Request, SchedNode, Unschedulable};
use crate::view::ClusterView;

use super::{LeaderConfig, WorkloadMemory};

/// Decisions of one round: groups of writes (each group atomic) and events.
#[derive(Default)]
pub struct Plan {
    pub groups: Vec<Vec<TxnOp>>,
    pub events: Vec<Event>,
    /// Instances placed this round.
    pub scheduled: usize,
    /// Instances that could not be placed this round, by [`Unschedulable::reason_label`].
    pub unschedulable: BTreeMap<&'static str, usize>,
    /// A record that could not be encoded: the round writes nothing and fails (retried).
    pub failed: Option<StoreError>,
}

impl Plan {
    /// Queue one atomic group of writes, or, if building it failed, fail the round.
    pub fn push_group(&mut self, group: Result<Vec<TxnOp>>) {
        match group {
            Ok(ops) => self.groups.push(ops),
            Err(e) => {
                tracing::error!(error = %e, "a record of this round cannot be encoded; the round writes nothing");
                self.failed.get_or_insert(e);
            }
        }
    }
}

/// What the controllers need to know about a workload, extracted once per round.
pub struct WorkloadCtx {
    pub key: WorkloadKey,
    pub generation: u64,
    pub spec_hash: String,
    pub template_hash: String,
    pub workload_type: WorkloadType,
    pub replicas: u32,
    pub strategy: UpdateStrategyType,
    pub max_surge: MaxSurge,
    pub requests: ResourceList,
    pub node_selector: std::collections::BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub gpu: Option<GpuRequest>,
    pub has_health_check: bool,
    /// Ports each instance publishes on its node.
    pub host_ports: Vec<HostPort>,
    /// Creation time in minutes since the epoch, from the workload's metadata.
    pub created_minute: Option<u64>,
    pub desired: Arc<kat_api::Template>,
}

impl WorkloadCtx {
    pub fn request(&self) -> Request<'_> {
        Request {
            workload: &self.key,
            requests: self.requests,
            node_selector: &self.node_selector,
            tolerations: &self.tolerations,
            gpu: self.gpu.as_ref(),
            host_ports: &self.host_ports,
            template_hash: &self.template_hash,
        }
    }

    pub fn object(&self) -> ObjectReference {
        events::workload_ref(&self.key.namespace, &self.key.name)
    }
}

/// One round's working state: what the view says, with the nodes' loads and readiness, and
/// the plan the controllers add to. Controllers read it and add to the plan through its
/// methods.
pub struct Round<'a> {
    view: &'a ClusterView,
    config: &'a LeaderConfig,
    now: Instant,
    wall: Timestamp,
    wall_ms: u64,
    nodes: Vec<SchedNode>,
    node_index: HashMap<NodeName, usize>,
    loads: Vec<NodeLoad>,
    ready: HashMap<NodeName, bool>,
    reported: Reported<'a>,
    by_workload: HashMap<WorkloadKey, Vec<&'a InstanceRecord>>,
    /// Instances nodes still report whose records are gone, per workload: still running.
    terminating: HashMap<WorkloadKey, u32>,
    plan: Plan,
    rng: &'a mut StdRng,
    new_ids: HashSet<InstanceId>,
    /// Node subnets, with those given this round.
    subnets: HashMap<NodeName, IpNet>,
    /// Addresses in use per node: its instances' and those of containers it still reports.
    used_ips: HashMap<NodeName, HashSet<IpAddr>>,
    /// Addresses freed recently, not to be given again yet.
    quarantine: &'a ipam::Quarantine,
}

impl<'a> Round<'a> {
    /// The cluster as the leader last read it.
    pub fn view(&self) -> &'a ClusterView {
        self.view
    }

    /// The leader's settings.
    pub fn config(&self) -> &'a LeaderConfig {
        self.config
    }

    /// The round's time (monotonic, simulated in tests).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The round's wall-clock time.
    pub fn wall(&self) -> Timestamp {
        self.wall
    }

    /// The round's wall-clock time in milliseconds since the epoch.
    pub fn wall_ms(&self) -> u64 {
        self.wall_ms
    }

    /// The nodes instances may be placed on, as the scheduler sees them.
    pub fn nodes(&self) -> &[SchedNode] {
        &self.nodes
    }

    /// Where node `name` is in [`Round::nodes`].
    pub fn node_position(&self, name: &str) -> Option<usize> {
        self.node_index.get(name).copied()
    }

    /// What is placed on the node at `position` in [`Round::nodes`].
    pub fn load(&self, position: usize) -> &NodeLoad {
        &self.loads[position]
    }

    /// Instances of `workload` still stopping whose records are gone.
    pub fn terminating(&self, workload: &WorkloadKey) -> u32 {
        self.terminating.get(workload).copied().unwrap_or(0)
    }

    /// What nodes report: each instance, the node that runs it and its status.
    pub fn reported(
        &self,
    ) -> impl Iterator<Item = (&'a InstanceId, &'a NodeName, &'a InstanceStatus)> + '_ {
        self.reported.iter().map(|(id, (node, s))| (*id, *node, *s))
    }

    /// Whether a node reports instance `id`.
    pub fn is_reported(&self, id: &InstanceId) -> bool {
        self.reported.contains_key(id)
    }

    /// The nodes' readiness as the node controller decided it this round: a node takes new
    /// instances when it is ready and not draining.
    pub fn set_readiness(&mut self, ready: HashMap<NodeName, bool>) {
        for node in &mut self.nodes {
            let draining = self
                .view
                .nodes
                .get(&node.name)
                .and_then(|e| e.registration.as_ref())
                .is_some_and(|r| r.draining);
            node.schedulable = ready.get(&node.name).copied().unwrap_or(false) && !draining;
        }
        self.ready = ready;
    }

    /// Queue one atomic group of writes, or, if building it failed, fail the round.
    pub fn push_group(&mut self, group: Result<Vec<TxnOp>>) {
        self.plan.push_group(group);
    }

    /// Queue one atomic group of writes.
    pub fn push_ops(&mut self, ops: Vec<TxnOp>) {
        self.plan.groups.push(ops);
    }

    /// What the round decided.
    pub fn into_plan(self) -> Plan {
        self.plan
    }

    /// Whether node `node` is ready (heartbeats within `nodeLossTimeoutSeconds`).
    pub fn node_ready(&self, node: &str) -> bool {
        self.ready.get(node).copied().unwrap_or(false)
    }

    /// What the node running `id` reports of it.
    pub fn status_of(&self, id: &InstanceId) -> Option<&'a InstanceStatus> {
        self.reported.get(id).map(|(_, s)| *s)
    }

    /// Whether `rec` runs (and, with a health check, is healthy).
    pub fn healthy(&self, rec: &InstanceRecord, has_health_check: bool) -> bool {
        self.status_of(&rec.instance_id).is_some_and(|s| {
            s.state == InstanceState::Running && (!has_health_check || s.health == Health::Healthy)
        })
    }

    /// The instance records of `workload`.
    pub fn instances_of(&self, workload: &WorkloadKey) -> Vec<&'a InstanceRecord> {
        self.by_workload.get(workload).cloned().unwrap_or_default()
    }

    /// Record an event of this round.
    pub fn event(
        &mut self,
        event_type: EventType,
        reason: &str,
        object: ObjectReference,
        message: impl Into<String>,
    ) {
        self.plan.events.push(events::event(
            self.wall, event_type, reason, object, message,
        ));
    }

    fn new_id(&mut self, name: &str) -> InstanceId {
        loop {
            let id = InstanceId::generated(name, self.rng.gen::<u32>());
            if !self.view.instances.contains_key(&id) && self.new_ids.insert(id.clone()) {
                return id;
            }
        }
    }

    /// Node `name` got `subnet` this round: its addresses count from now.
    pub fn give_subnet(&mut self, name: &NodeName, subnet: IpNet) {
        self.subnets.insert(name.clone(), subnet);
        if let Some(&i) = self.node_index.get(name) {
            let used = self.used_ips.get(name).map_or(0, HashSet::len);
            self.nodes[i].free_ips = ipam::free_count(&subnet, used);
        }
    }

    /// A new instance record on `node` (an index into `nodes`), accounted in the loads, with
    /// the lowest free address of the node's subnet that is not quarantined
    /// ([`ipam::Quarantine::pick`]).
    pub fn create_on(
        &mut self,
        w: &WorkloadCtx,
        node: usize,
        job_run: Option<&str>,
    ) -> InstanceRecord {
        let id = self.new_id(&w.key.name);
        let name = &self.nodes[node].name;
        let ip = self.subnets.get(name.as_str()).and_then(|subnet| {
            let used = self.used_ips.entry(name.clone()).or_default();
            let ip = self.quarantine.pick(name, subnet, used, self.now)?;
            used.insert(ip);
            Some(ip)
        });
        self.nodes[node].free_ips = self.nodes[node].free_ips.saturating_sub(1);
        // The resource filter has checked there are enough.
        let gpus = scheduler::free_gpus(&self.nodes[node], &self.loads[node], &w.request())
            .unwrap_or_default();
        let record = InstanceRecord {
            instance_id: id,
            namespace: w.key.namespace.clone(),
            workload: w.key.name.clone(),
            node: self.nodes[node].name.clone(),
            generation: w.generation,
            spec_hash: w.template_hash.clone(),
            workload_type: w.workload_type,
            requests: w.requests,
            job_run: job_run.map(str::to_string),
            created_at: self.wall,
            ip,
            host_ports: w.host_ports.clone(),
            gpus,
        };
        self.loads[node].add(&record);
        record
    }

    /// Place and create up to `count` instances; returns how many were placed and, if some
    /// could not be, why. `extra` ops join each instance's group (e.g. a job run update).
    pub fn place(
        &mut self,
        w: &WorkloadCtx,
        count: u32,
        job_run: Option<&str>,
    ) -> (Vec<InstanceRecord>, Option<Unschedulable>) {
        let mut placed = Vec::new();
        if count == 0 {
            return (placed, None);
        }
        let req = w.request();
        let (candidates, why) = scheduler::eligible(&self.nodes, &req);
        for _ in 0..count {
            match scheduler::pick(&self.nodes, &self.loads, &candidates, &req, &why, self.rng) {
                Ok(node) => placed.push(self.create_on(w, node, job_run)),
                Err(reason) => return (placed, Some(reason)),
            }
        }
        (placed, None)
    }

    /// Write a new instance's record and its address allocation.
    pub fn put_instance_ops(record: &InstanceRecord) -> Result<Vec<TxnOp>> {
        let mut ops = vec![TxnOp::put_json(
            keys::instance(&record.node, &record.instance_id),
            record,
        )?];
        if let Some(ip) = record.ip {
            ops.push(TxnOp::put(
                keys::ip_allocation(&record.instance_id),
                ip.to_string(),
            ));
        }
        Ok(ops)
    }

    /// Delete an instance's record and release its address.
    pub fn delete_instance_ops(record: &InstanceRecord) -> [TxnOp; 2] {
        [
            TxnOp::delete(keys::instance(&record.node, &record.instance_id)),
            TxnOp::delete(keys::ip_allocation(&record.instance_id)),
        ]
    }

    /// Write the records of newly placed instances and record one `Scheduled` event for them,
    /// its message starting with `context` (e.g. "generation 3").
    pub fn schedule(&mut self, w: &WorkloadCtx, created: &[InstanceRecord], context: &str) {
        if created.is_empty() {
            return;
        }
        for r in created {
            self.plan.push_group(Self::put_instance_ops(r));
        }
        self.plan.scheduled += created.len();
        let placements: Vec<String> = created
            .iter()
            .map(|r| format!("{} on {}", r.instance_id, r.node))
            .collect();
        self.event(
            EventType::Normal,
            "Scheduled",
            w.object(),
            format!("{context}: {}", placements.join(", ")),
        );
    }

    /// Delete an instance record (its node stops the container) and release its resources.
    pub fn delete_instance(&mut self, record: &InstanceRecord) {
        if let Some(&i) = self.node_index.get(record.node.as_str()) {
            self.loads[i].remove(record);
        }
        self.plan
            .groups
            .push(Self::delete_instance_ops(record).to_vec());
    }

    /// Status entries for `records`, as reported or as just assigned. Without usage: it
    /// changes at every heartbeat and would rewrite every workload's status each time (usage
    /// is read from the heartbeats themselves: `/metrics`, `katcall top`).
    pub fn instance_statuses(&self, records: &[&InstanceRecord]) -> Vec<InstanceStatus> {
        records
            .iter()
            .map(|r| match self.status_of(&r.instance_id) {
                Some(s) => InstanceStatus {
                    usage: None,
                    ip: r.ip,
                    template_hash: Some(r.spec_hash.clone()),
                    ..s.clone()
                },
                None => InstanceStatus {
                    reason: Some(format!("assigned to {}, not reported yet", r.node)),
                    template_hash: Some(r.spec_hash.clone()),
                    ..InstanceStatus::of(r, InstanceState::Pending)
                },
            })
            .collect()
    }

    /// Record (as an event, once per change) why instances stay Pending.
    pub fn note_pending(
        &mut self,
        memory: &mut WorkloadMemory,
        w: &WorkloadCtx,
        missing: u32,
        why: Option<&Unschedulable>,
    ) -> Option<String> {
        let Some(why) = why else {
            memory.pending_reason.remove(&w.key);
            return None;
        };
        *self
            .plan
            .unschedulable
            .entry(why.reason_label())
            .or_default() += missing as usize;
        let message = format!("{missing} instance(s) Pending: {why}");
        if memory.pending_reason.get(&w.key) != Some(&message) {
            self.event(
                EventType::Warning,
                "FailedScheduling",
                w.object(),
                message.clone(),
            );
            memory.pending_reason.insert(w.key.clone(), message.clone());
        }
        Some(message)
    }
}

/// What nodes report, by instance id: the node and the instance's status.
type Reported<'a> = HashMap<&'a InstanceId, (&'a NodeName, &'a InstanceStatus)>;

/// Addresses in use: every record's, and every reported container's on its node (a deleted
/// instance may still be stopping with its address).
pub(super) fn addresses_in_use(
    view: &ClusterView,
    reported: &Reported<'_>,
) -> HashMap<NodeName, HashSet<IpAddr>> {
    let mut used_ips: HashMap<NodeName, HashSet<IpAddr>> = HashMap::new();
    for r in view.instances.values() {
        if let Some(ip) = r.ip {
            used_ips.entry(r.node.clone()).or_default().insert(ip);
        }
    }
    for (node, s) in reported.values() {
        if let Some(ip) = s.ip {
            used_ips.entry((*node).clone()).or_default().insert(ip);
        }
    }
    used_ips
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_round<'a>(
    view: &'a ClusterView,
    config: &'a LeaderConfig,
    rng: &'a mut StdRng,
    clock: &Clock,
    ready: &HashMap<NodeName, bool>,
    now: Instant,
    reported: Reported<'a>,
    used_ips: HashMap<NodeName, HashSet<IpAddr>>,
    quarantine: &'a ipam::Quarantine,
) -> Round<'a> {
    let mut by_workload: HashMap<WorkloadKey, Vec<&InstanceRecord>> = HashMap::new();
    for r in view.instances.values() {
        by_workload.entry(r.workload_key()).or_default().push(r);
    }
    let mut terminating: HashMap<WorkloadKey, u32> = HashMap::new();
    for (id, (_, s)) in &reported {
        let alive = !matches!(
            s.state,
            InstanceState::Stopped
                | InstanceState::Succeeded
                | InstanceState::Failed
                | InstanceState::OOMKilled
        );
        if alive && !view.instances.contains_key(id.as_str()) {
            *terminating
                .entry(WorkloadKey::new(&s.namespace, &s.workload))
                .or_default() += 1;
        }
    }
    let nodes = sched_nodes(view, config, ready, &used_ips);
    let node_index: HashMap<NodeName, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let mut loads = vec![NodeLoad::default(); nodes.len()];
    for r in view.instances.values() {
        if let Some(&i) = node_index.get(r.node.as_str()) {
            loads[i].add(r);
        }
    }
    // GPUs of instances still stopping (their records gone) are not free yet.
    for (id, (node, s)) in &reported {
        let stopped = matches!(
            s.state,
            InstanceState::Stopped
                | InstanceState::Succeeded
                | InstanceState::Failed
                | InstanceState::OOMKilled
        );
        if !stopped && !s.gpus.is_empty() && !view.instances.contains_key(id.as_str()) {
            if let Some(&i) = node_index.get(*node) {
                loads[i].gpus.extend(s.gpus.iter().cloned());
            }
        }
    }
    Round {
        view,
        config,
        now,
        wall: clock.timestamp(),
        wall_ms: clock.wall_ms(),
        nodes,
        node_index,
        loads,
        ready: ready.clone(),
        reported,
        by_workload,
        terminating,
        plan: Plan::default(),
        rng,
        new_ids: HashSet::new(),
        subnets: view.subnets.iter().map(|(n, s)| (n.clone(), *s)).collect(),
        used_ips,
        quarantine,
    }
}

fn sched_nodes(
    view: &ClusterView,
    config: &LeaderConfig,
    ready: &HashMap<NodeName, bool>,
    used_ips: &HashMap<NodeName, HashSet<IpAddr>>,
) -> Vec<SchedNode> {
    view.nodes
        .iter()
        .filter_map(|(name, entry)| {
            let reg = entry.registration.as_ref()?;
            let hb = entry.heartbeat.as_ref()?;
            Some(SchedNode {
                name: name.clone(),
                schedulable: ready.get(name.as_str()).copied().unwrap_or(false) && !reg.draining,
                labels: reg.labels.clone(),
                taints: reg.taints.clone(),
                // Never more than approved: a heartbeat's claim alone raises nothing.
                allocatable: reg
                    .capacity
                    .as_ref()
                    .map_or(hb.allocatable, |c| c.clamp(hb.allocatable)),
                gpus: reg
                    .capacity
                    .as_ref()
                    .map_or_else(|| hb.gpus.clone(), |c| c.approved_gpus(&hb.gpus)),
                free_ips: match (config.addresses, view.subnets.get(name.as_str())) {
                    // Without an address plan instances get no address: nothing to run out of.
                    (None, _) => u64::MAX,
                    (Some(_), None) => 0,
                    (Some(_), Some(subnet)) => ipam::free_count(
                        subnet,
                        used_ips.get(name.as_str()).map_or(0, HashSet::len),
                    ),
                },
            })
        })
        .collect()
}

pub(super) fn workload_ctx(entry: &crate::view::WorkloadEntry) -> Option<WorkloadCtx> {
    let meta = entry.meta.as_ref()?;
    let desired = entry.desired.clone()?;
    let spec = &desired.workload.spec;
    let parsed = spec
        .container
        .resources
        .as_ref()
        .map(|r| r.parsed())
        .unwrap_or_default();
    Some(WorkloadCtx {
        key: entry.key.clone(),
        generation: meta.metadata.generation,
        spec_hash: meta.spec_hash.clone(),
        template_hash: meta.template_hash.clone(),
        workload_type: spec.workload_type,
        replicas: spec.replicas.unwrap_or(0),
        strategy: spec.update_strategy_type(),
        max_surge: spec.max_surge(),
        requests: ResourceList {
            cpu_millis: parsed.cpu_request.map_or(0, |c| c.0),
            memory_bytes: parsed.memory_request.map_or(0, |m| m.0),
            pids: 0,
        },
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        gpu: spec
            .container
            .resources
            .as_ref()
            .and_then(|r| r.gpu.clone()),
        has_health_check: desired
            .load_balancer
            .as_ref()
            .is_some_and(|lb| lb.spec.health_check.is_some()),
        host_ports: desired
            .load_balancer
            .as_ref()
            .map(|lb| lb.spec.host_ports())
            .unwrap_or_default(),
        created_minute: meta
            .metadata
            .creation_timestamp
            .map(|t| t.unix_millis() / 60_000),
        desired: desired.clone(),
    })
}
