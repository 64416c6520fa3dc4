//! `DaemonService` workloads: one instance on every eligible node (RFC 001 §4.4).
//!
//! Eligibility is the scheduler's: static filters and free resources. Nodes that join get an
//! instance; nodes that stop being eligible (label or taint changes, removal) lose theirs.
//! Instances on NotReady nodes stay: the node runs them when it comes back, and there is no
//! other node they could move to. Draining leaves them in place.
//!
//! An instance that ended (its node gave up under `restartPolicy`) is replaced on its node,
//! with a backoff for crash loops ([`crate::replacement`]).
//!
//! Updates roll node by node: on up to `maxSurge` nodes at a time a new instance starts
//! beside the old one, and the old one goes once the new one is healthy. `Simultaneous`
//! replaces every node's instance at once.

use std::collections::HashMap;

use kat_api::wire::{EventType, InstanceRecord, WorkloadStatus, DRAIN_TAINT_KEY};
use kat_api::workload::UpdateStrategyType;

use crate::controller::{Round, WorkloadCtx, WorkloadMemory};
use crate::replacement;
use crate::scheduler;

pub fn reconcile(
    round: &mut Round<'_>,
    memory: &mut WorkloadMemory,
    w: &WorkloadCtx,
) -> WorkloadStatus {
    let mut by_node: HashMap<String, Vec<&InstanceRecord>> = HashMap::new();
    for r in round.instances_of(&w.key) {
        by_node.entry(r.node.to_string()).or_default().push(r);
    }
    let req = w.request();
    let mut created = Vec::new();
    let mut kept: Vec<&InstanceRecord> = Vec::new();
    // Nodes mid-replacement: a new instance beside an old one (the old one runs until its
    // node stops it, even once retired this round), or an old instance still stopping.
    // Counted before acting, so node order does not matter.
    let mut in_progress = round.terminating(&w.key) as usize;
    for records in by_node.values() {
        let has_new = records.iter().any(|r| r.spec_hash == w.template_hash);
        let has_old = records.iter().any(|r| r.spec_hash != w.template_hash);
        if has_old && has_new {
            in_progress += 1;
        }
    }
    let mut unschedulable = scheduler::Unschedulable {
        total_nodes: round.nodes().len(),
        ..Default::default()
    };
    let surge = w.max_surge.absolute(round.nodes().len() as u32) as usize;

    // Current instances that ended (the node gave up under its restartPolicy) on nodes that
    // can run a new one: replaced together once the backoff allows ([`replacement`]); the
    // node then gets a new instance below like a node without one.
    let draining = |round: &Round<'_>, node: &str| {
        round
            .view()
            .nodes
            .get(node)
            .and_then(|e| e.registration.as_ref())
            .is_some_and(|r| r.draining)
    };
    let ended: Vec<&InstanceRecord> = by_node
        .values()
        .flatten()
        .copied()
        .filter(|r| {
            r.spec_hash == w.template_hash
                && round.node_ready(&r.node)
                && !draining(round, &r.node)
                && round
                    .status_of(&r.instance_id)
                    .is_some_and(replacement::ended)
        })
        .collect();
    let mut waiting = None;
    if !ended.is_empty() {
        let wait = replacement::wait(round, memory, w);
        if wait.is_zero() {
            replacement::replace(round, memory, w, &ended);
            for records in by_node.values_mut() {
                records.retain(|r| !ended.iter().any(|e| e.instance_id == r.instance_id));
            }
        } else {
            waiting = Some(replacement::waiting_message(ended.len(), wait));
        }
    }

    // Nodes whose registration is gone: their instances go too.
    for (node, records) in &by_node {
        if round.node_position(node).is_none() {
            for r in records {
                round.delete_instance(r);
            }
        }
    }

    for i in 0..round.nodes().len() {
        let name = round.nodes()[i].name.clone();
        let records = by_node.remove(name.as_str()).unwrap_or_default();
        let ready = round.node_ready(&name);
        let draining = draining(round, &name);
        // A node that is merely NotReady or draining keeps what it has: readiness and the
        // drain taint do not make it ineligible.
        let static_ok = {
            let mut node = round.nodes()[i].clone();
            node.schedulable = true;
            node.taints.retain(|t| t.key != DRAIN_TAINT_KEY);
            scheduler::static_exclusion(&node, &req)
        };
        if let Some(why) = static_ok {
            for r in &records {
                round.event(
                    EventType::Normal,
                    "InstanceRemoved",
                    w.object(),
                    format!(
                        "{} removed: node {name} is no longer eligible ({why})",
                        r.instance_id
                    ),
                );
                round.delete_instance(r);
            }
            *unschedulable.excluded.entry(why).or_default() += 1;
            continue;
        }
        let (current, old): (Vec<&InstanceRecord>, Vec<&InstanceRecord>) =
            records.iter().partition(|r| r.spec_hash == w.template_hash);
        if !ready || draining {
            kept.extend(records.iter().copied());
            continue;
        }
        if current.is_empty() {
            let replace_now = old.is_empty()
                || w.strategy == UpdateStrategyType::Simultaneous
                || in_progress < surge;
            if w.strategy == UpdateStrategyType::Simultaneous {
                for r in &old {
                    round.delete_instance(r);
                }
            } else {
                kept.extend(old.iter().copied());
            }
            if !replace_now {
                continue;
            }
            if !old.is_empty() {
                in_progress += 1;
            }
            // Resources: the old instance's share is still counted, as it still runs.
            if let Some(why) = scheduler::resource_exclusion(&round.nodes()[i], round.load(i), &req)
            {
                // GPUs are not shared: the old instance holding them goes first.
                if why == scheduler::Exclusion::GpuInUse {
                    for r in old.iter().filter(|r| !r.gpus.is_empty()) {
                        round.delete_instance(r);
                    }
                }
                *unschedulable.excluded.entry(why).or_default() += 1;
                continue;
            }
            let record = round.create_on(w, i, None);
            created.push(record);
            continue;
        }
        // Keep one current instance; retire duplicates, and old ones once it is healthy.
        let keep = current[0];
        kept.push(keep);
        for extra in &current[1..] {
            round.delete_instance(extra);
        }
        if round.healthy(keep, w.has_health_check) {
            for r in &old {
                round.delete_instance(r);
            }
        } else {
            kept.extend(old.iter().copied());
        }
    }
    round.schedule(
        w,
        &created,
        &format!("generation {} (daemon)", w.generation),
    );
    let eligible = kept
        .iter()
        .map(|r| r.node.as_str())
        .chain(created.iter().map(|r| r.node.as_str()))
        .collect::<std::collections::HashSet<_>>()
        .len();
    let why = (!unschedulable.excluded.is_empty() && eligible == 0).then_some(&unschedulable);
    let message = round.note_pending(memory, w, 0, why).or(waiting);
    let records: Vec<&InstanceRecord> = kept.iter().copied().chain(created.iter()).collect();
    let ready = kept
        .iter()
        .filter(|r| r.spec_hash == w.template_hash && round.healthy(r, w.has_health_check))
        .count();
    WorkloadStatus {
        observed_generation: w.generation,
        observed_spec_hash: w.spec_hash.clone(),
        replicas_desired: eligible as u32,
        replicas_ready: ready as u32,
        instances: round.instance_statuses(&records),
        rollout: None,
        message,
        builds: Vec::new(), // filled in by crate::builds
    }
}
