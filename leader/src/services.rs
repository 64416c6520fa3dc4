//! `Service` workloads: keep `replicas` instances running and roll them to new versions
//! (RFC 001 §4.5).
//!
//! Each round classifies the workload's instance records:
//! - on a NotReady node: lost, deleted here and replaced elsewhere (the node stops it by
//!   instance id if it comes back) — unless the workload is pinned to that node: nowhere
//!   else to go, the record stays and the instance goes on when the node is back;
//! - reported ended (`Succeeded`, `Failed`, `OOMKilled`: the node applied `restartPolicy`
//!   and gave up): deleted and replaced, with a backoff for crash loops
//!   ([`crate::replacement`]);
//! - on a draining node, or with an old template hash: *old*, to be replaced;
//! - otherwise: *new*.
//!
//! Rolling rule (availability first):
//! - create new instances up to `replicas`, but while old ones exist never beyond
//!   `replicas + maxSurge` instances in total, counting instances still terminating;
//! - delete an old instance only while the healthy count stays at or above `replicas`, so
//!   old instances go only once new ones are healthy;
//! - unhealthy old instances go first; they hold no availability; then those on a node that
//!   has a healthy new instance.
//!
//! GPUs are not shared: with no matching GPU free for a new instance, an old instance holding
//! some is retired first, one at a time (an update without a spare GPU costs one instance's
//! capacity while it runs).
//!
//! A version that never becomes healthy leaves the old ones serving and, after
//! `rollout_progress_deadline` without progress, the rollout is marked stalled.
//!
//! `Simultaneous` deletes every old instance, waits until their nodes report them gone (or a
//! timeout), then creates the new ones: downtime by design.

use kat_api::wire::{EventType, InstanceRecord, RolloutStatus, WorkloadStatus};
use kat_api::workload::UpdateStrategyType;
use tokio::time::Instant;

use crate::controller::{Round, WorkloadCtx, WorkloadMemory};
use crate::replacement;
use crate::scheduler::Exclusion;

/// Progress of one rollout, kept in leader memory.
#[derive(Debug, Clone)]
pub struct RolloutTracker {
    pub target: String,
    pub from_generations: Vec<u64>,
    pub last_progress: Instant,
    pub healthy_new: usize,
    pub old: usize,
    pub stalled: bool,
}

/// What the Service controller remembers per workload.
#[derive(Default)]
pub struct ServiceMemory {
    /// Rollouts under way.
    pub rollouts: std::collections::HashMap<kat_api::WorkloadKey, RolloutTracker>,
    /// Since when a Service without a surge runs old and new instances at once.
    pub simultaneous_since: std::collections::HashMap<kat_api::WorkloadKey, Instant>,
}

pub fn reconcile(
    round: &mut Round<'_>,
    memory: &mut ServiceMemory,
    shared: &mut WorkloadMemory,
    w: &WorkloadCtx,
) -> WorkloadStatus {
    let replicas = w.replicas as usize;
    let (kept, waiting) = drop_lost_and_ended(round, shared, w);
    let draining = |r: &InstanceRecord| {
        round
            .view()
            .nodes
            .get(r.node.as_str())
            .and_then(|n| n.registration.as_ref())
            .is_some_and(|reg| reg.draining)
    };
    let (mut new, mut old): (Vec<&InstanceRecord>, Vec<&InstanceRecord>) = kept
        .iter()
        .partition(|r| r.spec_hash == w.template_hash && !draining(r));
    let terminating = round.terminating(&w.key) as usize;
    let healthy = |round: &Round<'_>, r: &InstanceRecord| round.healthy(r, w.has_health_check);

    // Simultaneous: all old go first; new ones start once the old have stopped.
    let mut hold_creation = false;
    if w.strategy == UpdateStrategyType::Simultaneous
        && old.iter().any(|r| r.spec_hash != w.template_hash)
    {
        for r in old.drain(..) {
            round.delete_instance(r);
        }
        memory.simultaneous_since.insert(w.key.clone(), round.now());
        round.event(
            EventType::Normal,
            "RolloutStep",
            w.object(),
            format!(
                "Simultaneous update to generation {}: stopping all old instances",
                w.generation
            ),
        );
        hold_creation = true;
    } else if let Some(since) = memory.simultaneous_since.get(&w.key).copied() {
        if terminating > 0
            && round.now().saturating_duration_since(since)
                < round.config().simultaneous_stop_timeout
        {
            hold_creation = true;
        } else {
            memory.simultaneous_since.remove(&w.key);
        }
    }

    // Scale-down of new instances beyond replicas: unhealthy first.
    if new.len() > replicas {
        new.sort_by_key(|r| healthy(round, r));
        let surplus: Vec<&InstanceRecord> = new.drain(..new.len() - replicas).collect();
        for r in surplus {
            round.delete_instance(r);
        }
    }

    // Create.
    let surge = w.max_surge.absolute(w.replicas) as usize;
    let total = new.len() + old.len() + terminating;
    let mut want = replicas.saturating_sub(new.len());
    if !old.is_empty() || terminating > 0 {
        want = want.min((replicas + surge).saturating_sub(total));
    }
    if hold_creation {
        want = 0;
    }
    let (created, unschedulable) = round.place(w, want as u32, None);
    let missing = replicas.saturating_sub(new.len() + created.len());
    let pending = round.note_pending(shared, w, missing as u32, unschedulable.as_ref());
    round.schedule(w, &created, &format!("generation {}", w.generation));

    // Retire old instances: unhealthy ones freely, healthy ones only above `replicas` healthy.
    let healthy_new = new.iter().filter(|r| healthy(round, r)).count();
    let mut healthy_total = healthy_new + old.iter().filter(|r| healthy(round, r)).count();
    // Among healthy ones, first those sharing a node with a healthy new instance: the node
    // keeps serving (its published ports move to the new one), and a node left with only an
    // old instance is where the next new one can go when host ports rule the others out.
    let with_new: std::collections::HashSet<&str> = new
        .iter()
        .filter(|r| healthy(round, r))
        .map(|r| r.node.as_str())
        .collect();
    old.sort_by_key(|r| (healthy(round, r), !with_new.contains(r.node.as_str())));
    let mut retired = Vec::new();
    for r in old.iter() {
        let is_healthy = healthy(round, r);
        if !is_healthy && new.len() + created.len() > 0 {
            retired.push(*r);
        } else if is_healthy && healthy_total > replicas {
            healthy_total -= 1;
            retired.push(*r);
        }
    }
    // GPUs are not shared: when no matching one is free for a new instance and none of this
    // workload's is already stopping, an old instance holding some goes first (one at a
    // time), or an update on nodes without a spare GPU would wait forever.
    let gpus_in_use = unschedulable
        .as_ref()
        .is_some_and(|u| u.excluded.contains_key(&Exclusion::GpuInUse));
    if gpus_in_use && created.len() < want && terminating == 0 && retired.is_empty() {
        let req = w.request();
        // Only on a node where the old instances' GPUs, once all free, let a new instance in
        // (a new version asking for another kind of GPU makes no room by stopping these).
        let helps = |r: &InstanceRecord| {
            let Some(i) = round.node_position(&r.node) else {
                return false;
            };
            let mut load = round.load(i).clone();
            for o in old.iter().filter(|o| o.node == r.node) {
                for g in &o.gpus {
                    load.gpus.remove(g);
                }
            }
            crate::scheduler::free_gpus(&round.nodes()[i], &load, &req).is_some()
        };
        if let Some(r) = old.iter().find(|r| !r.gpus.is_empty() && helps(r)) {
            retired.push(*r);
        }
    }
    for r in &retired {
        round.delete_instance(r);
    }
    let old_left = old.len() - retired.len();

    let rollout = track_rollout(round, memory, w, healthy_new, old_left, &old);
    let records: Vec<&InstanceRecord> = new
        .iter()
        .chain(
            old.iter()
                .filter(|r| !retired.iter().any(|x| x.instance_id == r.instance_id)),
        )
        .copied()
        .chain(created.iter())
        .collect();
    WorkloadStatus {
        observed_generation: w.generation,
        observed_spec_hash: w.spec_hash.clone(),
        replicas_desired: w.replicas,
        replicas_ready: healthy_new as u32
            + old
                .iter()
                .filter(|r| {
                    !retired.iter().any(|x| x.instance_id == r.instance_id) && healthy(round, r)
                })
                .count() as u32,
        instances: round.instance_statuses(&records),
        rollout,
        message: pending.or(waiting),
        builds: Vec::new(), // filled in by crate::builds
    }
}

/// Delete records on NotReady nodes and, once the replacement backoff allows, records of
/// ended instances ([`replacement`]); return the rest and, while ended instances wait, the
/// status message saying so.
fn drop_lost_and_ended<'a>(
    round: &mut Round<'a>,
    memory: &mut WorkloadMemory,
    w: &WorkloadCtx,
) -> (Vec<&'a InstanceRecord>, Option<String>) {
    let mut kept = Vec::new();
    let mut ended = Vec::new();
    // Pinned to one node (a workload a detached node created, or `nodeName` set by hand):
    // a replacement could only go to that same node, and would make it restart a container
    // that may well still run there (a detached node keeps its workloads). The record stays.
    // Only while the node is still registered: one removed for good is not coming back.
    let pinned = kat_api::pinning::pinned_node(&w.desired.workload);
    for r in round.instances_of(&w.key) {
        let registered = round
            .view()
            .nodes
            .get(r.node.as_str())
            .is_some_and(|n| n.registration.is_some());
        if !round.node_ready(&r.node) && registered && pinned == Some(r.node.as_str()) {
            kept.push(r);
            continue;
        }
        if !round.node_ready(&r.node) {
            round.event(
                EventType::Warning,
                "InstanceLost",
                w.object(),
                format!(
                    "{} on node {} is lost with its node; replacing it",
                    r.instance_id, r.node
                ),
            );
            round.delete_instance(r);
            continue;
        }
        if round
            .status_of(&r.instance_id)
            .is_some_and(replacement::ended)
        {
            ended.push(r);
        } else {
            kept.push(r);
        }
    }
    let wait = replacement::wait(round, memory, w);
    if ended.is_empty() || !wait.is_zero() {
        let message = (!ended.is_empty()).then(|| replacement::waiting_message(ended.len(), wait));
        kept.extend(ended);
        return (kept, message);
    }
    replacement::replace(round, memory, w, &ended);
    (kept, None)
}

/// Update the rollout tracker; emit step, stall and completion events.
fn track_rollout(
    round: &mut Round<'_>,
    memory: &mut ServiceMemory,
    w: &WorkloadCtx,
    healthy_new: usize,
    old_left: usize,
    old: &[&InstanceRecord],
) -> Option<RolloutStatus> {
    let done = old_left == 0 && healthy_new >= w.replicas as usize;
    let tracker = match memory.rollouts.get_mut(&w.key) {
        Some(t) if t.target == w.template_hash => t,
        _ if done || old.is_empty() => {
            memory.rollouts.remove(&w.key);
            return None;
        }
        _ => {
            let mut from: Vec<u64> = old.iter().map(|r| r.generation).collect();
            from.sort_unstable();
            from.dedup();
            round.event(
                EventType::Normal,
                "RolloutStarted",
                w.object(),
                format!(
                    "rolling {} instance(s) from generation {:?} to {}",
                    old.len(),
                    from,
                    w.generation
                ),
            );
            memory
                .rollouts
                .entry(w.key.clone())
                .or_insert(RolloutTracker {
                    target: w.template_hash.clone(),
                    from_generations: from,
                    last_progress: round.now(),
                    healthy_new: 0,
                    old: old.len(),
                    stalled: false,
                })
        }
    };
    if healthy_new > tracker.healthy_new || old_left < tracker.old {
        tracker.last_progress = round.now();
        tracker.healthy_new = healthy_new;
        tracker.old = old_left;
        tracker.stalled = false;
        if !done {
            let msg = format!(
                "{healthy_new}/{} new instances healthy, {old_left} old left",
                w.replicas
            );
            round.event(EventType::Normal, "RolloutStep", w.object(), msg);
        }
    }
    if done {
        memory.rollouts.remove(&w.key);
        round.event(
            EventType::Normal,
            "RolloutComplete",
            w.object(),
            format!(
                "all {} instances run generation {}",
                w.replicas, w.generation
            ),
        );
        return None;
    }
    let message;
    if !tracker.stalled
        && round.now().saturating_duration_since(tracker.last_progress)
            >= round.config().rollout_progress_deadline
    {
        tracker.stalled = true;
        message = format!(
            "rollout to generation {} stalled: no new instance became healthy for {}s; {old_left} old instance(s) keep serving",
            w.generation,
            round.config().rollout_progress_deadline.as_secs()
        );
        round.event(
            EventType::Warning,
            "RolloutStalled",
            w.object(),
            message.clone(),
        );
    }
    let tracker = &memory.rollouts[&w.key];
    Some(RolloutStatus {
        from_generation: tracker.from_generations.first().copied().unwrap_or(0),
        to_generation: w.generation,
        updated: healthy_new as u32,
        total: w.replicas,
        stalled: tracker.stalled,
        message: tracker.stalled.then(|| format!("stalled: new instances are not becoming healthy; {old_left} old instance(s) keep serving")),
    })
}
