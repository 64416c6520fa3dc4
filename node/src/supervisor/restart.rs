//! Restart policies (RFC 001 §4.6) as a pure state machine over (time, exit).
//!
//! - `Never`: the first exit is final. For a Service or DaemonService the leader then
//!   replaces the instance (a new instance id, event `InstanceReplaced`); a Job's leader
//!   counts a failed instance against `backoffLimit`.
//! - `MaxCount`: restart on a **non-zero** exit (or OOM, or a container that could not be
//!   started) up to `maxRestarts` times per *series*. A series starts at its first restart;
//!   once `resetSeconds` have passed since then without reaching `maxRestarts`, the count
//!   starts again (the RFC's words, not a sliding window). Reaching `maxRestarts` within a
//!   series makes the instance `Failed`, and the leader acts on that. Exit 0 is final
//!   (`Succeeded`).
//! - `Always`: a Service restarts on every exit; a Job restarts on a non-zero exit (exit 0
//!   is the job's success and final).
//!
//! Restarts wait a capped exponential backoff (0.5 s doubling to 60 s); a container that ran
//! for [`BACKOFF_RESET`] resets it.

use std::time::Duration;

use kat_api::wire::InstanceState;
use kat_api::workload::{RestartCondition, RestartPolicy};
use tokio::time::Instant;

/// The backoff before the first restart; it doubles at each next one.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// The longest backoff.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// A container that ran this long resets the backoff to [`BACKOFF_BASE`].
pub const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// What follows a container's exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start the next attempt.
    Restart {
        /// The backoff before it starts.
        after: Duration,
    },
    /// No restart: the instance ends.
    Finish {
        /// Its final state: `Succeeded`, `Failed` or `OOMKilled`.
        state: InstanceState,
        /// Why it ended (the instance status's reason).
        reason: String,
    },
}

/// How one run of a container ended.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// `None` when the container could not even be created or started.
    pub code: Option<i32>,
    /// Whether the kernel killed it for exceeding its memory limit.
    pub oom_killed: bool,
    /// How long it ran.
    pub ran_for: Duration,
}

impl Exit {
    fn succeeded(&self) -> bool {
        !self.oom_killed && self.code == Some(0)
    }
}

/// A `MaxCount` series: when its first restart happened and how many it has had.
#[derive(Debug, Clone, Copy)]
struct Series {
    first: Instant,
    count: u32,
}

/// One instance's restart policy applied to its exits: restart counts and backoff.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    condition: RestartCondition,
    max_restarts: u32,
    window: Duration,
    is_job: bool,
    /// Total restarts, reported in status.
    pub restarts: u32,
    series: Option<Series>,
    next_backoff: Duration,
}

impl RestartTracker {
    /// A tracker of `policy`; `is_job` for a Job's instance (under `Always`, its exit 0 is
    /// final).
    pub fn new(policy: &RestartPolicy, is_job: bool) -> Self {
        RestartTracker {
            condition: policy.condition,
            max_restarts: policy.max_restarts(),
            window: Duration::from_secs(policy.reset_seconds() as u64),
            is_job,
            restarts: 0,
            series: None,
            next_backoff: BACKOFF_BASE,
        }
    }

    /// Continue counting from `restarts` (a container adopted after an agent restart). The
    /// `MaxCount` series starts afresh: its times died with the earlier agent.
    pub fn resume(mut self, restarts: u32) -> Self {
        self.restarts = restarts;
        self
    }

    /// What follows `exit` at `now`: a restart after the backoff, or the final state and why.
    pub fn on_exit(&mut self, now: Instant, exit: Exit) -> Decision {
        let terminal = match (exit.oom_killed, exit.code) {
            (true, _) => InstanceState::OOMKilled,
            (false, Some(0)) => InstanceState::Succeeded,
            _ => InstanceState::Failed,
        };
        let how = match (exit.oom_killed, exit.code) {
            (true, _) => "was OOM-killed (exceeded limits.memory)".to_string(),
            (false, Some(code)) => format!("exited with code {code}"),
            (false, None) => "could not be started".to_string(),
        };
        let what = if self.is_job {
            "job container"
        } else {
            "container"
        };
        if exit.ran_for >= BACKOFF_RESET {
            self.next_backoff = BACKOFF_BASE;
        }
        let finish = |reason: String| Decision::Finish {
            state: terminal,
            reason,
        };
        match self.condition {
            RestartCondition::Never => finish(format!("{what} {how}; restartPolicy is Never")),
            RestartCondition::Always if self.is_job && exit.succeeded() => {
                finish(format!("{what} {how}"))
            }
            RestartCondition::Always => self.restart(),
            RestartCondition::MaxCount if exit.succeeded() => finish(format!(
                "{what} {how}; MaxCount restarts only after a failure"
            )),
            RestartCondition::MaxCount => {
                if self
                    .series
                    .is_some_and(|s| now.saturating_duration_since(s.first) >= self.window)
                {
                    self.series = None;
                }
                let count = self.series.map_or(0, |s| s.count);
                if count >= self.max_restarts {
                    return finish(format!(
                        "{what} {how} after {count} restarts within {}s; maxRestarts reached (MaxCount)",
                        self.window.as_secs()
                    ));
                }
                let series = self.series.get_or_insert(Series {
                    first: now,
                    count: 0,
                });
                series.count += 1;
                self.restart()
            }
        }
    }

    /// The container was stopped for failing its health check (`healthCheck.onFailure:
    /// restart`, opted into): restarted whatever the policy, with the same backoff, so a
    /// container that is never healthy costs the node one start per backoff step.
    pub fn on_unhealthy(&mut self, ran_for: Duration) -> Decision {
        if ran_for >= BACKOFF_RESET {
            self.next_backoff = BACKOFF_BASE;
        }
        self.restart()
    }

    fn restart(&mut self) -> Decision {
        let after = self.next_backoff;
        self.next_backoff = (self.next_backoff * 2).min(BACKOFF_CAP);
        self.restarts += 1;
        Decision::Restart { after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(condition: RestartCondition, max: u32, reset: u32) -> RestartPolicy {
        RestartPolicy {
            condition,
            max_restarts: Some(max),
            reset_seconds: Some(reset),
        }
    }

    fn crash(code: i32) -> Exit {
        Exit {
            code: Some(code),
            oom_killed: false,
            ran_for: Duration::from_millis(10),
        }
    }

    fn restarts(d: &Decision) -> bool {
        matches!(d, Decision::Restart { .. })
    }

    fn finished_as(d: &Decision) -> Option<InstanceState> {
        match d {
            Decision::Finish { state, .. } => Some(*state),
            Decision::Restart { .. } => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn never_finishes_on_first_exit_with_the_right_state() {
        let mut t = RestartTracker::new(&policy(RestartCondition::Never, 3, 60), false);
        let now = Instant::now();
        assert_eq!(
            finished_as(&t.on_exit(now, crash(0))),
            Some(InstanceState::Succeeded)
        );
        assert_eq!(
            finished_as(&t.on_exit(now, crash(2))),
            Some(InstanceState::Failed)
        );
        let oom = Exit {
            oom_killed: true,
            ..crash(137)
        };
        assert_eq!(
            finished_as(&t.on_exit(now, oom)),
            Some(InstanceState::OOMKilled)
        );
        assert_eq!(t.restarts, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn max_count_restarts_only_after_a_failure() {
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 5, 60), false);
        let now = Instant::now();
        match t.on_exit(now, crash(0)) {
            Decision::Finish { state, reason } => {
                assert_eq!(state, InstanceState::Succeeded);
                assert!(reason.contains("only after a failure"), "{reason}");
            }
            d => panic!("exit 0 under MaxCount must be final, got {d:?}"),
        }
        let unstartable = Exit {
            code: None,
            ..crash(0)
        };
        assert!(restarts(&t.on_exit(now, unstartable)));
        assert!(restarts(&t.on_exit(now, crash(1))));
    }

    #[tokio::test(start_paused = true)]
    async fn max_count_gives_up_within_a_series() {
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 2, 30), false);
        let start = Instant::now();
        assert!(restarts(&t.on_exit(start, crash(1))));
        assert!(restarts(
            &t.on_exit(start + Duration::from_secs(1), crash(1))
        ));
        match t.on_exit(start + Duration::from_secs(2), crash(1)) {
            Decision::Finish { state, reason } => {
                assert_eq!(state, InstanceState::Failed);
                assert!(reason.contains("maxRestarts"), "{reason}");
            }
            d => panic!("expected Failed, got {d:?}"),
        }
    }

    /// The count resets once `resetSeconds` passed since the *first* restart of the series
    /// (RFC 001 §4.6), not over a sliding window: with maxRestarts 3, restarts at 0 s and
    /// 29 s then a crash at 31 s start a new series, which allows three more.
    #[tokio::test(start_paused = true)]
    async fn max_count_series_resets_from_its_first_restart() {
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 3, 30), false);
        let at = |s: u64| Instant::now() + Duration::from_secs(s);
        for s in [0, 29, 31, 32, 33] {
            assert!(restarts(&t.on_exit(at(s), crash(1))), "crash at {s}s");
        }
        // A sliding window would have failed at 33 s (29, 31, 32 within 30 s).
        assert_eq!(
            finished_as(&t.on_exit(at(34), crash(1))),
            Some(InstanceState::Failed)
        );
        assert_eq!(t.restarts, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn always_backs_off_exponentially_to_the_cap_and_resets_after_a_long_run() {
        let mut t = RestartTracker::new(&policy(RestartCondition::Always, 1, 1), false);
        let now = Instant::now();
        let mut delays = Vec::new();
        for code in (0..10).map(|i| i % 2) {
            match t.on_exit(now, crash(code)) {
                Decision::Restart { after } => delays.push(after),
                d => panic!("Always must restart a service, got {d:?}"),
            }
        }
        assert_eq!(delays[0], BACKOFF_BASE);
        assert_eq!(delays[1], BACKOFF_BASE * 2);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(delays.last().copied(), Some(BACKOFF_CAP));
        let long = Exit {
            ran_for: BACKOFF_RESET,
            ..crash(1)
        };
        assert_eq!(
            t.on_exit(now, long),
            Decision::Restart {
                after: BACKOFF_BASE
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jobs_follow_the_policy_on_failure_and_finish_on_success() {
        let now = Instant::now();
        for condition in [RestartCondition::Always, RestartCondition::MaxCount] {
            let mut t = RestartTracker::new(&policy(condition, 1, 60), true);
            assert!(restarts(&t.on_exit(now, crash(3))), "{condition:?}");
            assert_eq!(
                finished_as(&t.on_exit(now, crash(0))),
                Some(InstanceState::Succeeded),
                "{condition:?}"
            );
        }
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 1, 60), true);
        assert!(restarts(&t.on_exit(now, crash(3))));
        assert_eq!(
            finished_as(&t.on_exit(now, crash(3))),
            Some(InstanceState::Failed)
        );
        let mut t = RestartTracker::new(&policy(RestartCondition::Never, 5, 60), true);
        assert_eq!(
            finished_as(&t.on_exit(now, crash(3))),
            Some(InstanceState::Failed)
        );
    }

    fn arb_condition() -> impl Strategy<Value = RestartCondition> {
        prop::sample::select(vec![
            RestartCondition::Never,
            RestartCondition::MaxCount,
            RestartCondition::Always,
        ])
    }

    proptest! {
        /// Over any sequence of exits, each decision follows §4.6: `Never` never restarts;
        /// a success is final except for an `Always` service; `MaxCount` gives up only with
        /// `maxRestarts` restarts inside the last `resetSeconds`, and never allows more than
        /// two series' worth (2 × maxRestarts) in any `resetSeconds` interval; backoff stays
        /// within [base, cap]; `restarts` counts the restarts.
        #[test]
        fn decisions_follow_the_policy(
            condition in arb_condition(),
            is_job in any::<bool>(),
            max in 0u32..6,
            window_s in 1u32..120,
            exits in prop::collection::vec((0u64..90, prop::option::of(0i32..3), any::<bool>()), 1..60),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async {
                let mut t = RestartTracker::new(&policy(condition, max, window_s), is_job);
                let window = Duration::from_secs(window_s as u64);
                let start = Instant::now();
                let mut now = start;
                let mut restart_times: Vec<Instant> = Vec::new();
                for (dt, code, oom) in exits {
                    now += Duration::from_secs(dt);
                    let exit = Exit { code, oom_killed: oom && code.is_some(), ran_for: Duration::from_secs(dt) };
                    let d = t.on_exit(now, exit);
                    match &d {
                        Decision::Restart { after } => {
                            prop_assert_ne!(condition, RestartCondition::Never);
                            prop_assert!(!exit.succeeded() || (condition == RestartCondition::Always && !is_job));
                            prop_assert!(*after >= BACKOFF_BASE && *after <= BACKOFF_CAP);
                            restart_times.push(now);
                        }
                        Decision::Finish { state, .. } => {
                            let expected = match (exit.oom_killed, exit.code) {
                                (true, _) => InstanceState::OOMKilled,
                                (false, Some(0)) => InstanceState::Succeeded,
                                _ => InstanceState::Failed,
                            };
                            prop_assert_eq!(*state, expected);
                            prop_assert!(condition != RestartCondition::Always || is_job, "an Always service must restart");
                            if condition == RestartCondition::MaxCount && !exit.succeeded() {
                                let recent = restart_times.iter().filter(|r| now.duration_since(**r) < window).count();
                                prop_assert!(recent as u32 >= max, "gave up after {} recent restarts, max {}", recent, max);
                            }
                            break;
                        }
                    }
                    if condition == RestartCondition::MaxCount {
                        for r in &restart_times {
                            let inside = restart_times.iter().filter(|x| **x >= *r && x.duration_since(*r) < window).count();
                            prop_assert!(inside as u32 <= 2 * max, "{} restarts within {}s", inside, window_s);
                        }
                    }
                }
                prop_assert_eq!(t.restarts as usize, restart_times.len());
                Ok(())
            })?;
        }
    }
}
