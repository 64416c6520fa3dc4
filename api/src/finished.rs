//! Finished instances kept after their run: the record, how it ended, and (on its node) its
//! logs, for `finishedRunHistory` runs and at most `finishedRunMaxAgeHours`.
//!
//! A Job's instances end and their records go (so the node removes the container); a Service
//! instance that ended under `restartPolicy: Never` goes at the next apply. Without more,
//! `katcall logs` of a Job that ran last night finds nothing. So the leader writes a
//! [`FinishedInstance`] in the transaction that removes the record, and the node copies the
//! container's log before it removes the container. Both sides drop them with the same rule,
//! [`retained`]: a *run* is a Job run (all its instances) or, outside Jobs, one instance;
//! the newest `history` runs are kept, none older than the age limit.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::wire::{InstanceRecord, InstanceState, InstanceStatus, Timestamp};

/// An instance that ended, as the leader keeps it (`keys::finished_instance`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FinishedInstance {
    /// The record it ran under (node, job run, generation).
    pub record: InstanceRecord,
    /// `Succeeded`, `Failed` or `OOMKilled`; `Unknown` if it was lost with its node.
    pub state: InstanceState,
    /// The exit code of its container, if it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How it ended, in words (an exit code, a lost node, a run that ended first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it started, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// RFC 3339, and the same in milliseconds since the epoch (for the age limit).
    pub finished_at: Timestamp,
    /// When it finished, in milliseconds since the Unix epoch.
    pub finished_ms: u64,
}

impl FinishedInstance {
    /// The run it belongs to: its Job run, or itself.
    pub fn run(&self) -> &str {
        self.record
            .job_run
            .as_deref()
            .unwrap_or(&self.record.instance_id)
    }

    /// As `katcall get instances --all` lists it.
    pub fn status(&self) -> InstanceStatus {
        InstanceStatus {
            exit_code: self.exit_code,
            reason: self.reason.clone(),
            ip: None,
            started_at: self.started_at,
            finished_at: Some(self.finished_at),
            ..InstanceStatus::of(&self.record, self.state)
        }
    }
}

/// How many runs to keep, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How many of a workload's newest runs to keep.
    pub history: usize,
    /// How long a finished instance is kept at most, in milliseconds.
    pub max_age_ms: u64,
}

impl Retention {
    /// The retention `cluster.kat` sets: `finishedRunHistory` and `finishedRunMaxAgeHours`.
    pub fn from_cluster(spec: &crate::cluster::ClusterSpec) -> Retention {
        Retention {
            history: spec.finished_run_history as usize,
            max_age_ms: u64::from(spec.finished_run_max_age_hours) * 3_600_000,
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            history: crate::cluster::defaults::finished_run_history() as usize,
            max_age_ms: u64::from(crate::cluster::defaults::finished_run_max_age_hours())
                * 3_600_000,
        }
    }
}

/// Of one workload's finished instances, given as `(run, finished_ms)`, the indexes to keep
/// at `now_ms`: those of the newest `history` runs (a run is as new as its last instance),
/// none finished more than `max_age_ms` ago.
pub fn retained(items: &[(&str, u64)], retention: Retention, now_ms: u64) -> BTreeSet<usize> {
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    for (run, ms) in items {
        let e = newest.entry(run).or_insert(*ms);
        *e = (*e).max(*ms);
    }
    let mut runs: Vec<(&str, u64)> = newest.into_iter().collect();
    // Newest first; equal times by run name, newest name first (run ids count up).
    runs.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(a.0)));
    let kept_runs: BTreeSet<&str> = runs
        .iter()
        .take(retention.history)
        .map(|(run, _)| *run)
        .collect();
    items
        .iter()
        .enumerate()
        .filter(|(_, (run, ms))| {
            kept_runs.contains(run) && now_ms.saturating_sub(*ms) <= retention.max_age_ms
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn keeps_the_newest_runs_within_the_age_limit() {
        let r = Retention {
            history: 2,
            max_age_ms: 24 * HOUR,
        };
        let now = 100 * HOUR;
        // Run 1 (two instances), run 2, run 3: the newest two runs stay, whole.
        let items = [
            ("0000000001", 90 * HOUR),
            ("0000000001", 91 * HOUR),
            ("0000000002", 95 * HOUR),
            ("0000000003", 99 * HOUR),
            ("0000000003", 98 * HOUR),
        ];
        assert_eq!(retained(&items, r, now), BTreeSet::from([2, 3, 4]));
        // A day later only what finished within 24 h stays: nothing.
        assert!(retained(&items, r, now + 30 * HOUR).is_empty());
        // Run 2 is 25 h old at this time, run 3 is not.
        assert_eq!(retained(&items, r, 120 * HOUR), BTreeSet::from([3, 4]));
        // history 0 keeps none.
        let none = Retention { history: 0, ..r };
        assert!(retained(&items, none, now).is_empty());
    }
}
