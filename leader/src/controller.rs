//! The leader's reconcile loop.
//!
//! [`Leader::sync`] runs one round: take in what changed (watch events), decide (controllers
//! on the in-memory view, no I/O), and commit the decisions as a [`Plan`]: groups of writes,
//! each group atomic, packed into transactions of at most 128 operations and fenced by the
//! leadership so that a deposed leader cannot write. The plan's writes are applied to the view
//! at once, so the next round sees them even before their watch events come back.
//!
//! Rounds are level-triggered: each one looks at the whole desired and observed state, so a
//! missed event or a leader restart only delays convergence, never breaks it. Tests drive
//! `sync` step by step under simulated time; production calls [`Leader::run`].
//!
//! Long because it holds what every controller module works on ([`Round`], [`Plan`],
//! [`Memory`], [`WorkloadCtx`]) with the [`Leader`] that builds each round and commits it;
//! `build_round` fills `Round`'s private id and address fields, which its methods here use.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kat_api::cluster::ClusterSpec;
use kat_api::keys;
use kat_api::load_balancer::HostPort;
use kat_api::wire::{
    Event, EventType, Health, InstanceRecord, InstanceState, InstanceStatus, ObjectReference,
    ResourceList, WorkloadStatus,
};
use kat_api::wire::{InstanceId, Timestamp};
use kat_api::workload::{GpuRequest, MaxSurge, Toleration, UpdateStrategyType, WorkloadType};
use kat_api::WorkloadKey;
use kat_store::{
    batch_groups, Compare, Leadership, Result, StateStore, StoreError, Txn, TxnOp, WatchOptions,
    WatchStream, MAX_TXN_OPS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::events::{self, EventLog};
use crate::ipam::{self, AddressPlan};
use crate::scheduler::{self, NodeLoad, Request, SchedNode, Unschedulable};
use crate::view::ClusterView;
use crate::{daemons, dns, jobs, nodes, services};

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// A node without a heartbeat for this long is NotReady (`nodeLossTimeoutSeconds`).
    pub node_loss_timeout: Duration,
    /// A rollout that makes no progress for this long is reported as stalled.
    pub rollout_progress_deadline: Duration,
    /// How long a `Simultaneous` update waits for old instances to stop before starting anyway.
    pub simultaneous_stop_timeout: Duration,
    /// Finished job runs kept per workload.
    pub job_history: usize,
    /// Finished instances kept for their exit codes and logs (`crate::finished`).
    pub finished: kat_api::finished::Retention,
    pub event_capacity: u64,
    /// Seed for tie-breaks and instance ids (fixed in simulations, random in production).
    pub seed: u64,
    /// How `clusterCIDR` is cut into node subnets; `None` gives instances no address.
    pub addresses: Option<AddressPlan>,
    /// Backoff between replacements of a workload's ended instances
    /// ([`crate::replacement`]): the second waits `base`, each next one twice as long, up to
    /// `cap`.
    pub replacement_backoff_base: Duration,
    pub replacement_backoff_cap: Duration,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            node_loss_timeout: Duration::from_secs(60),
            rollout_progress_deadline: Duration::from_secs(600),
            simultaneous_stop_timeout: Duration::from_secs(60),
            job_history: 5,
            finished: Default::default(),
            event_capacity: events::DEFAULT_CAPACITY,
            seed: rand::random(),
            addresses: "10.100.0.0/16"
                .parse()
                .ok()
                .and_then(|net| AddressPlan::new(net, 7)),
            replacement_backoff_base: Duration::from_secs(10),
            replacement_backoff_cap: Duration::from_secs(300),
        }
    }
}

impl LeaderConfig {
    pub fn from_cluster(spec: &ClusterSpec) -> Self {
        LeaderConfig {
            node_loss_timeout: Duration::from_secs(spec.node_loss_timeout_seconds as u64),
            finished: kat_api::finished::Retention::from_cluster(spec),
            addresses: spec
                .cluster_net()
                .and_then(|net| AddressPlan::new(net, spec.node_subnet_bits)),
            ..Default::default()
        }
    }
}

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

/// What leader remembers between rounds; all of it can be rebuilt from the store (a new
/// leader starts with none of it and converges to the same decisions).
#[derive(Default)]
pub struct Memory {
    pub ready: HashMap<String, bool>,
    pub known_nodes: HashSet<String>,
    pub rollouts: HashMap<WorkloadKey, services::RolloutTracker>,
    pub simultaneous_since: HashMap<WorkloadKey, Instant>,
    pub pending_reason: HashMap<WorkloadKey, String>,
    pub statuses: HashMap<WorkloadKey, WorkloadStatus>,
    pub first_seen: HashMap<WorkloadKey, u64>,
    pub builds: crate::builds::BuildMemory,
    /// Ended Service instances already kept once ([`crate::finished::reconcile`]): never
    /// kept again after the retention dropped them.
    pub archived: HashSet<InstanceId>,
    /// Each instance's last reported health ([`crate::health_events`]).
    pub health: crate::health_events::HealthMemory,
    /// Replacements of ended instances in a row, per workload ([`crate::replacement`]).
    pub replacements: HashMap<WorkloadKey, crate::replacement::Streak>,
    /// Refused stored generations already told ([`crate::stored_rules`]).
    pub refused_stored: HashMap<WorkloadKey, u64>,
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

/// One round's working state.
pub struct Round<'a> {
    pub view: &'a ClusterView,
    pub config: &'a LeaderConfig,
    pub now: Instant,
    pub wall: Timestamp,
    pub wall_ms: u64,
    pub nodes: Vec<SchedNode>,
    pub node_index: HashMap<String, usize>,
    pub loads: Vec<NodeLoad>,
    pub ready: HashMap<String, bool>,
    pub reported: HashMap<&'a str, (&'a str, &'a InstanceStatus)>,
    pub by_workload: HashMap<WorkloadKey, Vec<&'a InstanceRecord>>,
    /// Instances nodes still report whose records are gone, per workload: still running.
    pub terminating: HashMap<WorkloadKey, u32>,
    pub plan: Plan,
    pub rng: &'a mut StdRng,
    new_ids: HashSet<InstanceId>,
    /// Node subnets, with those given this round.
    subnets: HashMap<String, IpNet>,
    /// Addresses in use per node: its instances' and those of containers it still reports.
    used_ips: HashMap<String, HashSet<IpAddr>>,
    /// Addresses freed recently, not to be given again yet.
    quarantine: &'a ipam::Quarantine,
}

impl<'a> Round<'a> {
    pub fn node_ready(&self, node: &str) -> bool {
        self.ready.get(node).copied().unwrap_or(false)
    }

    pub fn status_of(&self, id: &str) -> Option<&'a InstanceStatus> {
        self.reported.get(id).map(|(_, s)| *s)
    }

    pub fn healthy(&self, rec: &InstanceRecord, has_health_check: bool) -> bool {
        self.status_of(&rec.instance_id).is_some_and(|s| {
            s.state == InstanceState::Running && (!has_health_check || s.health == Health::Healthy)
        })
    }

    pub fn instances_of(&self, workload: &WorkloadKey) -> Vec<&'a InstanceRecord> {
        self.by_workload.get(workload).cloned().unwrap_or_default()
    }

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
    pub fn give_subnet(&mut self, name: &str, subnet: IpNet) {
        self.subnets.insert(name.to_string(), subnet);
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
            let used = self.used_ips.entry(name.to_string()).or_default();
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
        memory: &mut Memory,
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

/// The leader's controllers over one store.
pub struct Leader {
    store: Arc<dyn StateStore>,
    config: LeaderConfig,
    clock: Clock,
    view: ClusterView,
    memory: Memory,
    events: EventLog,
    rng: StdRng,
    watch: WatchStream,
    fence: Option<Compare>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Recently freed addresses (kept apart from [`Memory`], which controllers borrow
    /// mutably while the round holds this).
    quarantine: ipam::Quarantine,
}

/// What one round did, for tests, metrics and benchmarks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoundReport {
    pub writes: usize,
    pub transactions: usize,
    pub events: usize,
    pub scheduled: usize,
    pub unschedulable: BTreeMap<&'static str, usize>,
}

impl Leader {
    /// Load the state and start watching it. `fence` (from [`Leadership::fence`]) guards every
    /// write; `None` is for tests that run a leader without an election.
    pub async fn start(
        store: Arc<dyn StateStore>,
        config: LeaderConfig,
        clock: Clock,
        fence: Option<Compare>,
    ) -> Result<Self> {
        let events = EventLog::new(config.event_capacity);
        let (view, watch) = load(&*store, clock.now()).await?;
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Leader {
            store,
            config,
            clock,
            view,
            memory: Memory::default(),
            events,
            rng,
            watch,
            fence,
            metrics: None,
            quarantine: ipam::Quarantine::default(),
        })
    }

    /// Record every round's duration in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    pub fn events(&self) -> &EventLog {
        &self.events
    }

    /// Take in watch events already delivered; on a broken watch, reload everything.
    async fn catch_up(&mut self) -> Result<()> {
        let now = self.clock.now();
        loop {
            match self.watch.try_next() {
                None => return Ok(()),
                Some(Ok(e)) => {
                    let value =
                        (e.kind == kat_store::EventKind::Put).then_some(e.kv.value.as_slice());
                    self.view.apply(&e.kv.key, value, e.revision(), now);
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "watch broke; reloading state");
                    let (view, watch) = load(&*self.store, now).await?;
                    // A reload treats every node as just seen: a full timeout of grace.
                    self.view = view;
                    self.watch = watch;
                    return Ok(());
                }
            }
        }
    }

    /// One reconcile round.
    pub async fn sync(&mut self) -> Result<RoundReport> {
        self.catch_up().await?;
        let plan = self.decide();
        let report = self.commit(plan).await;
        if report.is_err() {
            // The statuses this round meant to write may not be in the store: the next
            // round writes every status again rather than trust what it remembers; and it
            // looks at health as the last good round left it, so its events are not lost.
            self.memory.statuses.clear();
            self.memory.health.forget_round();
            // Its warnings about refused stored workloads too: told again next round.
            self.memory.refused_stored.clear();
        } else {
            self.memory.health.settle();
        }
        report
    }

    fn decide(&mut self) -> Plan {
        let now = self.clock.now();
        let Leader {
            view,
            config,
            memory,
            rng,
            clock,
            quarantine,
            ..
        } = self;
        let reported = view.reported();
        let used_ips = addresses_in_use(view, &reported);
        quarantine.observe(&used_ips, now);
        let mut round = build_round(
            view,
            config,
            rng,
            clock,
            &memory.ready,
            now,
            reported,
            used_ips,
            quarantine,
        );
        nodes::reconcile(&mut round, memory);
        ipam::reconcile(&mut round);
        let workloads: Vec<WorkloadCtx> =
            view.workloads.values().filter_map(workload_ctx).collect();
        let live: HashSet<&WorkloadKey> = workloads.iter().map(|w| &w.key).collect();
        dns::reconcile(&mut round, &workloads);
        crate::stored_rules::reconcile(&mut round, &mut memory.refused_stored, &workloads);
        let builds = crate::builds::reported(&round);
        crate::builds::reconcile(&mut round, memory, &builds);
        for w in &workloads {
            let mut status = match w.workload_type {
                WorkloadType::Service => services::reconcile(&mut round, memory, w),
                WorkloadType::DaemonService => daemons::reconcile(&mut round, memory, w),
                WorkloadType::Job => jobs::reconcile(&mut round, memory, w),
            };
            status.builds = crate::builds::of(&builds, &w.key);
            if memory.statuses.get(&w.key) != Some(&status) {
                let key = keys::workload_status(&w.key.namespace, &w.key.name);
                round
                    .plan
                    .push_group(TxnOp::put_json(key, &status).map(|op| vec![op]));
                memory.statuses.insert(w.key.clone(), status);
            }
        }
        // Instances and runs of workloads that no longer exist. A workload whose files are
        // mid-update (meta present, bundle not parsed yet) keeps its instances.
        let exists = |key: &WorkloadKey| {
            live.contains(key) || view.workloads.get(key).is_some_and(|e| e.meta.is_some())
        };
        let orphans: Vec<&InstanceRecord> = view
            .instances
            .values()
            .filter(|r| !exists(&r.workload_key()))
            .collect();
        for r in orphans {
            round.delete_instance(r);
        }
        crate::finished::reconcile(&mut round, &workloads, exists, &mut memory.archived);
        crate::health_events::reconcile(&mut round, &mut memory.health);
        for (key, runs) in &view.job_runs {
            if !exists(key) {
                let ops = runs
                    .values()
                    .map(|run| {
                        TxnOp::delete(keys::job_run(&run.namespace, &run.workload, &run.run_id))
                    })
                    .collect();
                round.plan.groups.push(ops);
            }
        }
        // Templates no instance and no rollback target uses. Only those written before the
        // newest revision taken in: the metadata written with a template (same transaction)
        // has then been seen, so a template is never taken for unused before its workload's
        // new generation is.
        let mut used: HashSet<(&str, &str, &str)> = HashSet::new();
        for e in view.workloads.values() {
            if let Some(m) = &e.meta {
                used.insert((&e.key.namespace, &e.key.name, &m.template_hash));
                if let Some(p) = &m.previous_template_hash {
                    used.insert((&e.key.namespace, &e.key.name, p));
                }
            }
        }
        for r in view.instances.values() {
            used.insert((&r.namespace, &r.workload, &r.spec_hash));
        }
        let unused = view
            .templates
            .iter()
            .filter(|((ns, name, hash), revision)| {
                **revision < view.latest
                    && !used.contains(&(ns.as_str(), name.as_str(), hash.as_str()))
            })
            .map(|((ns, name, hash), _)| vec![TxnOp::delete(keys::template(ns, name, hash))]);
        round.plan.groups.extend(unused);
        memory.statuses.retain(|k, _| live.contains(k));
        memory.replacements.retain(|k, _| live.contains(k));
        round.plan
    }

    /// Write a plan in fenced transactions of at most [`MAX_TXN_OPS`] operations.
    async fn commit(&mut self, plan: Plan) -> Result<RoundReport> {
        if let Some(e) = plan.failed {
            return Err(e);
        }
        let mut groups = plan.groups;
        for event in &plan.events {
            groups.push(self.events.ops(event));
        }
        let mut report = RoundReport {
            events: plan.events.len(),
            scheduled: plan.scheduled,
            unschedulable: plan.unschedulable,
            ..Default::default()
        };
        let budget = MAX_TXN_OPS - self.fence.is_some() as usize;
        for batch in batch_groups(groups, budget) {
            self.commit_batch(batch, &mut report).await?;
        }
        if let Err(e) = self.events.maintain(&*self.store).await {
            tracing::warn!(error = %e, "cannot trim the event log; retrying next round");
        }
        Ok(report)
    }

    async fn commit_batch(&mut self, ops: Vec<TxnOp>, report: &mut RoundReport) -> Result<()> {
        let txn = Txn::new().when(self.fence.clone()).and_then(ops.clone());
        let result = self.store.txn(txn).await?;
        if !result.succeeded {
            return Err(StoreError::InvalidRequest(
                "leadership lost: a fenced write was refused".into(),
            ));
        }
        self.view.apply_ops(&ops, result.revision, self.clock.now());
        report.writes += ops.len();
        report.transactions += 1;
        Ok(())
    }

    /// Reconcile until leadership is lost: on every change (debounced by `min_interval`) and at
    /// least every `tick`.
    pub async fn run(
        mut self,
        leadership: &Leadership,
        tick: Duration,
        min_interval: Duration,
    ) -> Result<()> {
        loop {
            let started = std::time::Instant::now();
            let result = self.sync().await;
            if let Some(m) = &self.metrics {
                m.observe_reconcile(started.elapsed());
                if let Ok(report) = &result {
                    m.observe_scheduling(report.scheduled, &report.unschedulable);
                }
            }
            if let Err(e) = result {
                if !leadership.is_leader() {
                    return Ok(());
                }
                tracing::warn!(error = %e, "reconcile round failed; retrying");
            }
            tokio::select! {
                _ = leadership.lost() => return Ok(()),
                _ = tokio::time::sleep(tick) => {}
                _ = self.wait_for_change(min_interval) => {}
            }
        }
    }

    async fn wait_for_change(&mut self, min_interval: Duration) {
        tokio::time::sleep(min_interval).await;
        if let Some(event) = self.watch.next().await {
            let now = self.clock.now();
            match event {
                Ok(e) => {
                    let value =
                        (e.kind == kat_store::EventKind::Put).then_some(e.kv.value.as_slice());
                    self.view.apply(&e.kv.key, value, e.revision(), now);
                }
                Err(_) => {
                    // catch_up in the next round reloads
                    if let Ok((view, watch)) = load(&*self.store, now).await {
                        self.view = view;
                        self.watch = watch;
                    }
                }
            }
        }
    }
}

/// What nodes report, by instance id: the node and the instance's status.
type Reported<'a> = HashMap<&'a str, (&'a str, &'a InstanceStatus)>;

/// Addresses in use: every record's, and every reported container's on its node (a deleted
/// instance may still be stopping with its address).
fn addresses_in_use(
    view: &ClusterView,
    reported: &Reported<'_>,
) -> HashMap<String, HashSet<IpAddr>> {
    let mut used_ips: HashMap<String, HashSet<IpAddr>> = HashMap::new();
    for r in view.instances.values() {
        if let Some(ip) = r.ip {
            used_ips.entry(r.node.to_string()).or_default().insert(ip);
        }
    }
    for (node, s) in reported.values() {
        if let Some(ip) = s.ip {
            used_ips.entry(node.to_string()).or_default().insert(ip);
        }
    }
    used_ips
}

#[allow(clippy::too_many_arguments)]
fn build_round<'a>(
    view: &'a ClusterView,
    config: &'a LeaderConfig,
    rng: &'a mut StdRng,
    clock: &Clock,
    ready: &HashMap<String, bool>,
    now: Instant,
    reported: Reported<'a>,
    used_ips: HashMap<String, HashSet<IpAddr>>,
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
        if alive && !view.instances.contains_key(*id) {
            *terminating
                .entry(WorkloadKey::new(&s.namespace, &s.workload))
                .or_default() += 1;
        }
    }
    let nodes = sched_nodes(view, config, ready, &used_ips);
    let node_index: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.to_string(), i))
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
        if !stopped && !s.gpus.is_empty() && !view.instances.contains_key(*id) {
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

async fn load(store: &dyn StateStore, now: Instant) -> Result<(ClusterView, WatchStream)> {
    let listing = store.list(keys::ROOT).await?;
    let mut view = ClusterView::default();
    for kv in &listing.kvs {
        view.apply(&kv.key, Some(&kv.value), kv.mod_revision, now);
    }
    let watch = store
        .watch(
            keys::ROOT,
            WatchOptions::prefix().from_revision(listing.revision + 1),
        )
        .await?;
    Ok((view, watch))
}

fn sched_nodes(
    view: &ClusterView,
    config: &LeaderConfig,
    ready: &HashMap<String, bool>,
    used_ips: &HashMap<String, HashSet<IpAddr>>,
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

fn workload_ctx(entry: &crate::view::WorkloadEntry) -> Option<WorkloadCtx> {
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
