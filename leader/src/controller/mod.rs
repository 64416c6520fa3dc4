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
//! What the controller modules work on is in [`round`] ([`Round`], [`Plan`], [`WorkloadCtx`])
//! and [`memory`] ([`Memory`], what the leader keeps between rounds).

mod memory;
mod round;

pub use memory::{Memory, WorkloadMemory};
pub use round::{Plan, Round, WorkloadCtx};

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kat_api::cluster::ClusterSpec;
use kat_api::keys;
use kat_api::wire::InstanceRecord;
use kat_api::workload::WorkloadType;
use kat_api::WorkloadKey;
use kat_store::{
    batch_groups, Compare, Leadership, Result, StateStore, StoreError, Txn, TxnOp, WatchOptions,
    WatchStream, MAX_TXN_OPS,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::events::{self, EventLog};
use crate::ipam::{self, AddressPlan};
use crate::view::ClusterView;
use crate::{daemons, dns, jobs, nodes, services};

use round::{addresses_in_use, build_round, workload_ctx};

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
            &memory.nodes.ready,
            now,
            reported,
            used_ips,
            quarantine,
        );
        nodes::reconcile(&mut round, &mut memory.nodes);
        ipam::reconcile(&mut round);
        let workloads: Vec<WorkloadCtx> =
            view.workloads.values().filter_map(workload_ctx).collect();
        let live: HashSet<&WorkloadKey> = workloads.iter().map(|w| &w.key).collect();
        dns::reconcile(&mut round, &workloads);
        crate::stored_rules::reconcile(&mut round, &mut memory.refused_stored, &workloads);
        let builds = crate::builds::reported(&round);
        crate::builds::reconcile(&mut round, &mut memory.builds, &builds);
        for w in &workloads {
            let mut status = match w.workload_type {
                WorkloadType::Service => {
                    services::reconcile(&mut round, &mut memory.services, &mut memory.workloads, w)
                }
                WorkloadType::DaemonService => {
                    daemons::reconcile(&mut round, &mut memory.workloads, w)
                }
                WorkloadType::Job => {
                    jobs::reconcile(&mut round, &mut memory.jobs, &mut memory.workloads, w)
                }
            };
            status.builds = crate::builds::of(&builds, &w.key);
            if memory.statuses.get(&w.key) != Some(&status) {
                let key = keys::workload_status(&w.key.namespace, &w.key.name);
                round.push_group(TxnOp::put_json(key, &status).map(|op| vec![op]));
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
        crate::finished::reconcile(&mut round, &workloads, exists, &mut memory.finished);
        crate::health_events::reconcile(&mut round, &mut memory.health);
        for (key, runs) in &view.job_runs {
            if !exists(key) {
                let ops = runs
                    .values()
                    .map(|run| {
                        TxnOp::delete(keys::job_run(&run.namespace, &run.workload, &run.run_id))
                    })
                    .collect();
                round.push_ops(ops);
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
        for group in unused {
            round.push_ops(group);
        }
        memory.statuses.retain(|k, _| live.contains(k));
        memory
            .workloads
            .replacements
            .retain(|k, _| live.contains(k));
        round.into_plan()
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
