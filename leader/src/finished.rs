//! Finished instances kept for their exit codes and logs ([`kat_api::finished`]).
//!
//! - A Job's instance: its outcome is counted and its record deleted in one transaction
//!   (`crate::jobs`); the [`archive_op`] of that instance goes into the same transaction, so
//!   an instance is never counted without being kept, nor kept twice.
//! - A Service or DaemonService instance that ended (its node gave up under its
//!   `restartPolicy`): kept here from the round that first sees it ended ([`reconcile`]),
//!   which is no later than the round that replaces it ([`crate::replacement`]).
//! - [`reconcile`] also applies the retention (`finishedRunHistory` runs, at most
//!   `finishedRunMaxAgeHours`) and drops what a deleted workload left.

use kat_api::finished::{retained, FinishedInstance};
use kat_api::keys;
use kat_api::wire::{InstanceId, InstanceRecord, InstanceState, Timestamp};
use kat_api::workload::WorkloadType;
use kat_api::WorkloadKey;
use kat_store::TxnOp;

use crate::controller::{Round, WorkloadCtx};

/// The write that keeps `r`, which ended as `state`.
pub fn archive_op(
    round: &Round<'_>,
    r: &InstanceRecord,
    state: InstanceState,
    reason: Option<String>,
) -> TxnOp {
    let reported = round.status_of(&r.instance_id);
    let kept = FinishedInstance {
        record: r.clone(),
        state,
        exit_code: reported.and_then(|s| s.exit_code),
        reason,
        started_at: reported.and_then(|s| s.started_at),
        finished_at: reported.and_then(|s| s.finished_at).unwrap_or(round.wall()),
        finished_ms: finished_ms(round, reported.and_then(|s| s.finished_at)),
    };
    match serde_json::to_vec(&kept) {
        Ok(value) => TxnOp::put(
            keys::finished_instance(&r.namespace, &r.workload, &r.instance_id),
            value,
        ),
        // Never an empty value in its place (a reader takes that for a corrupt record).
        Err(e) => {
            tracing::warn!(instance = %r.instance_id, error = %e, "cannot encode a finished instance; not kept");
            TxnOp::delete(keys::finished_instance(
                &r.namespace,
                &r.workload,
                &r.instance_id,
            ))
        }
    }
}

/// When it finished, in ms since the epoch: as its node reported it (the same every round),
/// else now.
fn finished_ms(round: &Round<'_>, reported: Option<Timestamp>) -> u64 {
    reported.map_or(round.wall_ms(), Timestamp::unix_millis)
}

/// What the finished-runs controller remembers.
#[derive(Default)]
pub struct FinishedMemory {
    /// Ended Service instances already kept once: never kept again after the retention
    /// dropped them.
    pub archived: std::collections::HashSet<InstanceId>,
}

/// Keep Service instances that ended for good; drop what the retention no longer keeps and
/// what deleted workloads left. `exists` says whether a workload is still there.
/// An ended instance is kept once, and only if the retention would keep it: one the
/// retention already dropped (or would drop at once) is never written again, so a
/// workload with more ended instances than `finishedRunHistory` (or a history of 0) does
/// not make every round save and prune the same records.
pub fn reconcile(
    round: &mut Round<'_>,
    workloads: &[WorkloadCtx],
    exists: impl Fn(&WorkloadKey) -> bool,
    memory: &mut FinishedMemory,
) {
    let archived = &mut memory.archived;
    let view = round.view();
    let retention = round.config().finished;
    for w in workloads {
        if w.workload_type == WorkloadType::Job {
            continue;
        }
        let kept = view.finished.get(&w.key);
        let mut items: Vec<(String, u64)> = kept
            .into_iter()
            .flat_map(|k| k.values())
            .map(|f| (f.run().to_string(), f.finished_ms))
            .collect();
        for r in round.instances_of(&w.key) {
            if archived.contains(&r.instance_id)
                || kept.is_some_and(|k| k.contains_key(&r.instance_id))
            {
                continue;
            }
            let Some(s) = round.status_of(&r.instance_id) else {
                continue;
            };
            if s.state.is_ended() {
                archived.insert(r.instance_id.clone());
                items.push((r.instance_id.to_string(), finished_ms(round, s.finished_at)));
                let refs: Vec<(&str, u64)> =
                    items.iter().map(|(run, ms)| (run.as_str(), *ms)).collect();
                if !retained(&refs, retention, round.wall_ms()).contains(&(items.len() - 1)) {
                    continue;
                }
                let op = archive_op(round, r, s.state, s.reason.clone());
                round.push_ops(vec![op]);
            }
        }
    }
    archived.retain(|id| view.instances.contains_key(id));
    for (key, kept) in &view.finished {
        let items: Vec<(&str, u64)> = kept.values().map(|f| (f.run(), f.finished_ms)).collect();
        let keep = if exists(key) {
            retained(&items, retention, round.wall_ms())
        } else {
            Default::default()
        };
        let ops: Vec<TxnOp> = kept
            .keys()
            .enumerate()
            .filter(|(i, _)| !keep.contains(i))
            .map(|(_, id)| TxnOp::delete(keys::finished_instance(&key.namespace, &key.name, id)))
            .collect();
        if !ops.is_empty() {
            round.push_ops(ops);
        }
    }
}
