//! Replacing ended instances of Services and DaemonServices (RFC 001 §4.6: "Leader
//! reschedules for Services/DaemonServices").
//!
//! A node restarts a container itself as its `restartPolicy` says; an instance it reports
//! ended (`Succeeded`, `Failed`, `OOMKilled`: under `Never` at the first exit, under
//! `MaxCount` once `maxRestarts` is reached or after exit 0) is one the node gave up on. The
//! leader deletes its record (the node removes the container; [`crate::finished`] keeps its
//! exit code and logs) and the workload's controller places a new instance, with an
//! `InstanceReplaced` event naming the exit code.
//!
//! A crash loop must cost the cluster little: replacements of one workload back off. The
//! first is immediate; after it, each round that replaces waits
//! `replacement_backoff_base × 2^(n-1)` (capped at `replacement_backoff_cap`) after the
//! previous one. All instances found ended in one round are replaced together, so replicas
//! that fail at once are not serialised. The streak ends when the workload goes
//! `replacement_backoff_cap × 2` without a replacement, or with a new template (a new apply is
//! a fix to try at once). While waiting, the ended instance stays and is shown as it ended.

use std::time::Duration;

use kat_api::wire::{EventType, InstanceRecord, InstanceState, InstanceStatus};
use tokio::time::Instant;

use crate::controller::{Round, WorkloadCtx, WorkloadMemory};

/// Replacements of one workload in a row, kept in leader memory.
#[derive(Debug, Clone)]
pub struct Streak {
    template_hash: String,
    count: u32,
    last: Instant,
}

/// Whether `status` says the instance ended for good (the node will not restart it).
pub fn ended(status: &InstanceStatus) -> bool {
    status.state.is_ended()
}

/// The delay after the previous replacement before the next one may happen.
fn delay(round: &Round<'_>, streak: &Streak) -> Duration {
    let base = round.config().replacement_backoff_base;
    let cap = round.config().replacement_backoff_cap;
    if streak.count == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (streak.count - 1).min(20);
    base.saturating_mul(factor).min(cap)
}

/// How long until `w`'s ended instances may be replaced; zero when they may be now.
pub fn wait(round: &Round<'_>, memory: &mut WorkloadMemory, w: &WorkloadCtx) -> Duration {
    let quiet = round.config().replacement_backoff_cap * 2;
    let Some(streak) = memory.replacements.get(&w.key) else {
        return Duration::ZERO;
    };
    let since = round.now().saturating_duration_since(streak.last);
    if streak.template_hash != w.template_hash || since >= quiet {
        memory.replacements.remove(&w.key);
        return Duration::ZERO;
    }
    delay(round, streak).saturating_sub(since)
}

/// Replace `ended` (records of `w` whose instances ended): delete each with an
/// `InstanceReplaced` event, and count one more step of the streak. The caller has checked
/// [`wait`] and places the new instances.
pub fn replace(
    round: &mut Round<'_>,
    memory: &mut WorkloadMemory,
    w: &WorkloadCtx,
    ended: &[&InstanceRecord],
) {
    if ended.is_empty() {
        return;
    }
    let condition = w.desired.workload.spec.restart_policy.condition;
    for r in ended {
        let status = round.status_of(&r.instance_id);
        let how = match status.map(|s| (s.state, s.exit_code)) {
            Some((InstanceState::OOMKilled, _)) => "was OOM-killed".to_string(),
            Some((_, Some(code))) => format!("exited with code {code}"),
            _ => "ended".to_string(),
        };
        let why = status
            .and_then(|s| s.reason.as_deref())
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let event_type = match status.map(|s| s.state) {
            Some(InstanceState::Succeeded) => EventType::Normal,
            _ => EventType::Warning,
        };
        round.event(
            event_type,
            "InstanceReplaced",
            w.object(),
            format!(
                "{} on {} {how}{why}; restartPolicy {condition:?}: replacing it with a new instance",
                r.instance_id, r.node
            ),
        );
        round.delete_instance(r);
    }
    let streak = memory
        .replacements
        .entry(w.key.clone())
        .or_insert_with(|| Streak {
            template_hash: w.template_hash.clone(),
            count: 0,
            last: round.now(),
        });
    streak.count += 1;
    streak.last = round.now();
}

/// The status message while ended instances wait for their replacement.
pub fn waiting_message(ended: usize, wait: Duration) -> String {
    format!(
        "{ended} instance(s) ended; replacing in {}s (backoff: this workload keeps failing)",
        wait.as_secs().max(1)
    )
}
