//! Finished instances kept for their exit codes and logs ([`kat_api::finished`]).
//!
//! - A Job's instance: its outcome is counted and its record deleted in one transaction
//!   (`crate::jobs`); the [`archive_op`] of that instance goes into the same transaction, so
//!   an instance is never counted without being kept, nor kept twice.
//! - A Service or DaemonService instance that ended where it is not restarted
//!   (`restartPolicy` `Never` or `MaxCount`): its record stays until the next apply replaces
//!   it; it is kept here from the round that first sees it ended ([`reconcile`]).
//! - [`reconcile`] also applies the retention (`finishedRunHistory` runs, at most
//!   `finishedRunMaxAgeHours`) and drops what a deleted workload left.

use kat_api::finished::{retained, FinishedInstance};
use kat_api::keys;
use kat_api::wire::{InstanceRecord, InstanceState};
use kat_api::workload::{RestartCondition, WorkloadType};
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
        started_at: reported.and_then(|s| s.started_at.clone()),
        finished_at: reported
            .and_then(|s| s.finished_at.clone())
            .unwrap_or_else(|| round.wall.clone()),
        finished_ms: round.wall_ms,
    };
    TxnOp::put(
        keys::finished_instance(&r.namespace, &r.workload, &r.instance_id),
        serde_json::to_vec(&kept).unwrap_or_default(),
    )
}

/// Keep Service instances that ended for good; drop what the retention no longer keeps and
/// what deleted workloads left. `exists` says whether a workload is still there.
pub fn reconcile(
    round: &mut Round<'_>,
    workloads: &[WorkloadCtx],
    exists: impl Fn(&WorkloadKey) -> bool,
) {
    let view = round.view;
    for w in workloads {
        let gives_up = w.desired.workload.spec.restart_policy.condition != RestartCondition::Always;
        if w.workload_type == WorkloadType::Job || !gives_up {
            continue;
        }
        let kept = view.finished.get(&w.key);
        for r in round.instances_of(&w.key) {
            if kept.is_some_and(|k| k.contains_key(&r.instance_id)) {
                continue;
            }
            let Some(s) = round.status_of(&r.instance_id) else {
                continue;
            };
            if matches!(
                s.state,
                InstanceState::Succeeded | InstanceState::Failed | InstanceState::OOMKilled
            ) {
                let op = archive_op(round, r, s.state, s.reason.clone());
                round.plan.groups.push(vec![op]);
            }
        }
    }
    let retention = round.config.finished;
    for (key, kept) in &view.finished {
        let items: Vec<(&str, u64)> = kept.values().map(|f| (f.run(), f.finished_ms)).collect();
        let keep = if exists(key) {
            retained(&items, retention, round.wall_ms)
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
            round.plan.groups.push(ops);
        }
    }
}
