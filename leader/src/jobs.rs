//! `Job` workloads (RFC 001 §3.4, §4.8): runs to completion.
//!
//! A job without `schedule` has one run per generation; applying a new generation supersedes
//! a run still active. A cron job starts a run at each tick of its schedule (UTC).
//!
//! A run starts instances, at most `parallelism` at a time, until `completions` of them
//! succeeded. Each instance that fails (non-zero exit, OOM, or lost with its node) counts
//! against `backoffLimit`; more failures than that fail the run. A run active longer than
//! `activeDeadlineSeconds` fails and its instances are stopped. An instance's outcome is
//! counted and its record deleted in one transaction, so it is never counted twice.
//!
//! Missed ticks: if the leader was down across several ticks, the next leader starts **one**
//! run, for the latest missed tick, and records a `MissedSchedule` event naming how many were
//! skipped. Runs of a cron job may overlap if a run outlasts the interval. The last
//! `job_history` finished runs are kept; older ones are deleted.
//!
//! Each instance that ended (or was stopped with its run) is kept with its exit code and
//! node, in the transaction that deletes its record ([`crate::finished`]), so `katcall logs`
//! of a Job still finds the last run's output.

use std::collections::BTreeMap;

use kat_api::cron::CronSchedule;
use kat_api::job::JobSpec;
use kat_api::keys;
use kat_api::wire::{
    EventType, InstanceRecord, InstanceState, JobRun, JobRunState, WorkloadStatus,
};
use kat_store::TxnOp;

use crate::controller::{Round, WorkloadCtx, WorkloadMemory};
use crate::finished;

/// What the Job controller remembers per workload.
#[derive(Default)]
pub struct JobMemory {
    /// When this leader first saw a scheduled Job whose creation time is unknown, in
    /// minutes since the epoch: its ticks count from then.
    pub first_seen: std::collections::HashMap<kat_api::WorkloadKey, u64>,
}

pub fn reconcile(
    round: &mut Round<'_>,
    memory: &mut JobMemory,
    shared: &mut WorkloadMemory,
    w: &WorkloadCtx,
) -> WorkloadStatus {
    let spec = w
        .desired
        .job
        .as_ref()
        .map(|j| j.spec.clone())
        .unwrap_or_default();
    let mut runs: BTreeMap<String, JobRun> = round
        .view()
        .job_runs
        .get(&w.key)
        .cloned()
        .unwrap_or_default();
    start_due_runs(round, memory, w, &spec, &mut runs);
    let mut pending = None;
    let ids: Vec<String> = runs.keys().cloned().collect();
    for id in ids {
        if let Some(run) = runs.get_mut(&id).filter(|r| r.state == JobRunState::Active) {
            if let Some(p) = advance_run(round, shared, w, &spec, run) {
                pending = Some(p);
            }
        }
    }
    prune_history(round, w, &mut runs);
    let latest = runs.values().next_back();
    let records = round.instances_of(&w.key);
    WorkloadStatus {
        observed_generation: w.generation,
        observed_spec_hash: w.spec_hash.clone(),
        replicas_desired: spec.completions,
        replicas_ready: latest.map_or(0, |r| r.succeeded),
        instances: round.instance_statuses(&records),
        rollout: None,
        message: pending.or_else(|| {
            latest.map(|r| {
                format!(
                    "run {}: {:?}{}",
                    r.run_id,
                    r.state,
                    r.reason
                        .as_ref()
                        .map(|x| format!(" ({x})"))
                        .unwrap_or_default()
                )
            })
        }),
        builds: Vec::new(), // filled in by crate::builds
    }
}

fn next_run_id(runs: &BTreeMap<String, JobRun>) -> String {
    let n = runs
        .keys()
        .filter_map(|k| k.get(..10)?.parse::<u64>().ok())
        .max()
        .map_or(1, |n| n + 1);
    format!("{n:010}")
}

fn new_run(
    round: &Round<'_>,
    w: &WorkloadCtx,
    run_id: String,
    scheduled_minute: Option<u64>,
) -> JobRun {
    JobRun {
        run_id,
        namespace: w.key.namespace.clone(),
        workload: w.key.name.clone(),
        generation: w.generation,
        state: JobRunState::Active,
        reason: None,
        succeeded: 0,
        failed: 0,
        started_at: round.wall(),
        started_ms: round.wall_ms(),
        finished_at: None,
        scheduled_minute,
    }
}

fn put_run_op(run: &JobRun) -> kat_store::Result<TxnOp> {
    TxnOp::put_json(
        keys::job_run(&run.namespace, &run.workload, &run.run_id),
        run,
    )
}

/// Queue `group` with the run's record written last, in one transaction.
fn push_with_run(round: &mut Round<'_>, mut group: Vec<TxnOp>, run: &JobRun) {
    round.push_group(put_run_op(run).map(|op| {
        group.push(op);
        group
    }));
}

fn start_due_runs(
    round: &mut Round<'_>,
    memory: &mut JobMemory,
    w: &WorkloadCtx,
    spec: &JobSpec,
    runs: &mut BTreeMap<String, JobRun>,
) {
    let Some(schedule) = spec
        .schedule
        .as_deref()
        .and_then(|s| CronSchedule::parse(s).ok())
    else {
        // One run per generation; a newer generation supersedes an active older run.
        if runs.values().any(|r| r.generation == w.generation) {
            return;
        }
        for run in runs.values_mut().filter(|r| r.state == JobRunState::Active) {
            finish(
                round,
                w,
                run,
                JobRunState::Failed,
                format!("superseded by generation {}", w.generation),
            );
        }
        let run = new_run(round, w, next_run_id(runs), None);
        round.event(
            EventType::Normal,
            "JobRunStarted",
            w.object(),
            format!("run {} for generation {}", run.run_id, w.generation),
        );
        push_with_run(round, Vec::new(), &run);
        runs.insert(run.run_id.clone(), run);
        return;
    };
    let now_minute = round.wall_ms() / 60_000;
    // Without earlier runs, ticks count from the workload's creation (or, if that is
    // unknown, from when this leader first saw it).
    let since = runs
        .values()
        .filter_map(|r| r.scheduled_minute)
        .max()
        .unwrap_or_else(|| {
            *memory
                .first_seen
                .entry(w.key.clone())
                .or_insert(w.created_minute.unwrap_or(now_minute))
        });
    let Some(mut due) = schedule.next_after(since) else {
        return;
    };
    if due > now_minute {
        return;
    }
    let mut missed = 0u64;
    while let Some(next) = schedule.next_after(due) {
        if next > now_minute || missed > 1_000_000 {
            break;
        }
        due = next;
        missed += 1;
    }
    if missed > 0 {
        round.event(
            EventType::Warning,
            "MissedSchedule",
            w.object(),
            format!("{missed} scheduled run(s) were missed while no leader was running; starting one run for the latest tick"),
        );
    }
    let run = new_run(round, w, next_run_id(runs), Some(due));
    round.event(
        EventType::Normal,
        "JobRunStarted",
        w.object(),
        format!("run {} for the tick at minute {due}", run.run_id),
    );
    push_with_run(round, Vec::new(), &run);
    runs.insert(run.run_id.clone(), run);
}

/// Count finished instances, check limits, start more instances. Returns a pending message.
fn advance_run(
    round: &mut Round<'_>,
    memory: &mut WorkloadMemory,
    w: &WorkloadCtx,
    spec: &JobSpec,
    run: &mut JobRun,
) -> Option<String> {
    let mine: Vec<&InstanceRecord> = round
        .instances_of(&w.key)
        .into_iter()
        .filter(|r| r.job_run.as_deref() == Some(run.run_id.as_str()))
        .collect();
    let mut active = Vec::new();
    let mut group = Vec::new();
    for r in mine {
        let outcome = if !round.node_ready(&r.node) {
            Some((
                false,
                InstanceState::Unknown,
                format!("{} lost with node {}", r.instance_id, r.node),
            ))
        } else {
            match round
                .status_of(&r.instance_id)
                .map(|s| (s.state, s.exit_code))
            {
                Some((InstanceState::Succeeded, code)) => Some((
                    true,
                    InstanceState::Succeeded,
                    format!(
                        "{} exited with {}",
                        r.instance_id,
                        code.map_or("success".into(), |c| c.to_string())
                    ),
                )),
                Some((InstanceState::Failed, code)) => Some((
                    false,
                    InstanceState::Failed,
                    format!(
                        "{} exited with {}",
                        r.instance_id,
                        code.map_or("an error".into(), |c| c.to_string())
                    ),
                )),
                Some((InstanceState::OOMKilled, _)) => Some((
                    false,
                    InstanceState::OOMKilled,
                    format!(
                        "{} was killed for exceeding its memory limit",
                        r.instance_id
                    ),
                )),
                _ => None,
            }
        };
        // Counted, kept (exit code, node for its logs) and deleted in one transaction.
        match outcome {
            Some((true, state, why)) => {
                run.succeeded += 1;
                group.push(finished::archive_op(round, r, state, Some(why)));
                group.extend(Round::delete_instance_ops(r));
            }
            Some((false, state, why)) => {
                run.failed += 1;
                round.event(
                    EventType::Warning,
                    "InstanceFailed",
                    w.object(),
                    format!("run {}: {why}", run.run_id),
                );
                group.push(finished::archive_op(round, r, state, Some(why)));
                group.extend(Round::delete_instance_ops(r));
            }
            None => active.push(r),
        }
    }
    let changed = !group.is_empty();
    let elapsed_s = round.wall_ms().saturating_sub(run.started_ms) / 1000;
    let verdict = if run.succeeded >= spec.completions {
        Some((
            JobRunState::Succeeded,
            format!("{} of {} completions", run.succeeded, spec.completions),
        ))
    } else if run.failed > spec.backoff_limit {
        Some((
            JobRunState::Failed,
            format!(
                "BackoffLimitExceeded: {} failed instance(s), backoffLimit {}",
                run.failed, spec.backoff_limit
            ),
        ))
    } else if spec
        .active_deadline_seconds
        .is_some_and(|d| elapsed_s >= d as u64)
    {
        Some((
            JobRunState::Failed,
            format!("DeadlineExceeded: active for {elapsed_s}s"),
        ))
    } else {
        None
    };
    if let Some((state, reason)) = verdict {
        for r in &active {
            let why = format!("stopped: run {} ended ({reason})", run.run_id);
            group.push(finished::archive_op(
                round,
                r,
                InstanceState::Stopped,
                Some(why),
            ));
            group.extend(Round::delete_instance_ops(r));
        }
        set_finished(round, w, run, state, reason);
        push_with_run(round, group, run);
        return None;
    }
    if changed {
        push_with_run(round, group, run);
    }
    let remaining = spec.completions - run.succeeded;
    let want = spec
        .parallelism
        .min(remaining)
        .saturating_sub(active.len() as u32);
    let run_id = run.run_id.clone();
    let (created, why) = round.place(w, want, Some(&run_id));
    round.schedule(w, &created, &format!("run {run_id}"));
    round.note_pending(memory, w, want - created.len() as u32, why.as_ref())
}

fn set_finished(
    round: &mut Round<'_>,
    w: &WorkloadCtx,
    run: &mut JobRun,
    state: JobRunState,
    reason: String,
) {
    run.state = state;
    run.finished_at = Some(round.wall());
    let (t, r) = if state == JobRunState::Succeeded {
        (EventType::Normal, "JobRunSucceeded")
    } else {
        (EventType::Warning, "JobRunFailed")
    };
    round.event(t, r, w.object(), format!("run {}: {reason}", run.run_id));
    run.reason = Some(reason);
}

/// End an active run now, stopping its instances.
fn finish(
    round: &mut Round<'_>,
    w: &WorkloadCtx,
    run: &mut JobRun,
    state: JobRunState,
    reason: String,
) {
    let mut group: Vec<TxnOp> = Vec::new();
    for r in round
        .instances_of(&w.key)
        .into_iter()
        .filter(|r| r.job_run.as_deref() == Some(run.run_id.as_str()))
    {
        let why = format!("stopped: run {} ended ({reason})", run.run_id);
        group.push(finished::archive_op(
            round,
            r,
            InstanceState::Stopped,
            Some(why),
        ));
        group.extend(Round::delete_instance_ops(r));
    }
    set_finished(round, w, run, state, reason);
    push_with_run(round, group, run);
}

fn prune_history(round: &mut Round<'_>, w: &WorkloadCtx, runs: &mut BTreeMap<String, JobRun>) {
    let finished: Vec<String> = runs
        .values()
        .filter(|r| r.state != JobRunState::Active)
        .map(|r| r.run_id.clone())
        .collect();
    let excess = finished.len().saturating_sub(round.config().job_history);
    for id in finished.into_iter().take(excess) {
        round.push_ops(vec![TxnOp::delete(keys::job_run(
            &w.key.namespace,
            &w.key.name,
            &id,
        ))]);
        runs.remove(&id);
    }
}
