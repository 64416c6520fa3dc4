//! Restart policies (RFC 001 §4.6) as a pure state machine over (time, exit).
//!
//! - `Never`: the first exit is final.
//! - `MaxCount`: restart while fewer than `maxRestarts` restarts happened within the last
//!   `resetSeconds`; then the instance is `Failed`.
//! - `Always`: restart forever.
//!
//! Restarts wait a capped exponential backoff (0.5 s doubling to 60 s); a container that ran
//! for [`BACKOFF_RESET`] resets it. Jobs are never restarted here: exit 0 is `Succeeded`,
//! anything else `Failed`; retrying a job run is the leader's decision (`backoffLimit`).

use std::collections::VecDeque;
use std::time::Duration;

use kat_api::wire::InstanceState;
use kat_api::workload::{RestartCondition, RestartPolicy};
use tokio::time::Instant;

pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
pub const BACKOFF_RESET: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Restart {
        after: Duration,
    },
    Finish {
        state: InstanceState,
        reason: String,
    },
}

/// How one run of a container ended.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// `None` when the container could not even be created or started.
    pub code: Option<i32>,
    pub oom_killed: bool,
    pub ran_for: Duration,
}

#[derive(Debug, Clone)]
pub struct RestartTracker {
    condition: RestartCondition,
    max_restarts: u32,
    window: Duration,
    is_job: bool,
    /// Total restarts, reported in status.
    pub restarts: u32,
    recent: VecDeque<Instant>,
    next_backoff: Duration,
}

impl RestartTracker {
    pub fn new(policy: &RestartPolicy, is_job: bool) -> Self {
        RestartTracker {
            condition: policy.condition,
            max_restarts: policy.max_restarts(),
            window: Duration::from_secs(policy.reset_seconds() as u64),
            is_job,
            restarts: 0,
            recent: VecDeque::new(),
            next_backoff: BACKOFF_BASE,
        }
    }

    /// Continue counting from `restarts` (a container adopted after an agent restart).
    pub fn resume(mut self, restarts: u32) -> Self {
        self.restarts = restarts;
        self
    }

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
        if self.is_job {
            return Decision::Finish {
                state: terminal,
                reason: format!("job container {how}"),
            };
        }
        if exit.ran_for >= BACKOFF_RESET {
            self.next_backoff = BACKOFF_BASE;
        }
        match self.condition {
            RestartCondition::Never => Decision::Finish {
                state: terminal,
                reason: format!("container {how}; restartPolicy is Never"),
            },
            RestartCondition::MaxCount => {
                while self
                    .recent
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= self.window)
                {
                    self.recent.pop_front();
                }
                if self.recent.len() as u32 >= self.max_restarts {
                    return Decision::Finish {
                        state: if terminal == InstanceState::OOMKilled {
                            terminal
                        } else {
                            InstanceState::Failed
                        },
                        reason: format!(
                            "container {how} after {} restarts within {}s; maxRestarts reached (MaxCount)",
                            self.recent.len(),
                            self.window.as_secs()
                        ),
                    };
                }
                self.restart(now)
            }
            RestartCondition::Always => self.restart(now),
        }
    }

    fn restart(&mut self, now: Instant) -> Decision {
        let after = self.next_backoff;
        self.next_backoff = (self.next_backoff * 2).min(BACKOFF_CAP);
        self.restarts += 1;
        self.recent.push_back(now);
        Decision::Restart { after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test(start_paused = true)]
    async fn never_finishes_on_first_exit_with_the_right_state() {
        let mut t = RestartTracker::new(&policy(RestartCondition::Never, 3, 60), false);
        let now = Instant::now();
        assert!(matches!(
            t.on_exit(now, crash(0)),
            Decision::Finish {
                state: InstanceState::Succeeded,
                ..
            }
        ));
        let oom = Exit {
            oom_killed: true,
            ..crash(137)
        };
        assert!(matches!(
            t.on_exit(now, oom),
            Decision::Finish {
                state: InstanceState::OOMKilled,
                ..
            }
        ));
        assert_eq!(t.restarts, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn max_count_gives_up_within_the_window_and_forgives_after_it() {
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 2, 30), false);
        let start = Instant::now();
        assert!(matches!(
            t.on_exit(start, crash(1)),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            t.on_exit(start + Duration::from_secs(1), crash(1)),
            Decision::Restart { .. }
        ));
        match t.on_exit(start + Duration::from_secs(2), crash(1)) {
            Decision::Finish { state, reason } => {
                assert_eq!(state, InstanceState::Failed);
                assert!(reason.contains("maxRestarts"), "{reason}");
            }
            d => panic!("expected Failed, got {d:?}"),
        }
        // Outside the window the old restarts no longer count.
        let mut t = RestartTracker::new(&policy(RestartCondition::MaxCount, 2, 30), false);
        assert!(matches!(
            t.on_exit(start, crash(1)),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            t.on_exit(start, crash(1)),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            t.on_exit(start + Duration::from_secs(31), crash(1)),
            Decision::Restart { .. }
        ));
        assert_eq!(t.restarts, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn always_backs_off_exponentially_to_the_cap_and_resets_after_a_long_run() {
        let mut t = RestartTracker::new(&policy(RestartCondition::Always, 1, 1), false);
        let now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..10 {
            match t.on_exit(now, crash(1)) {
                Decision::Restart { after } => delays.push(after),
                d => panic!("Always must restart, got {d:?}"),
            }
        }
        assert_eq!(delays[0], BACKOFF_BASE);
        assert_eq!(delays[1], BACKOFF_BASE * 2);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*delays.last().unwrap(), BACKOFF_CAP);
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
    async fn jobs_are_never_restarted_locally() {
        let mut t = RestartTracker::new(&policy(RestartCondition::Always, 5, 60), true);
        let now = Instant::now();
        assert!(matches!(
            t.on_exit(now, crash(0)),
            Decision::Finish {
                state: InstanceState::Succeeded,
                ..
            }
        ));
        assert!(matches!(
            t.on_exit(now, crash(3)),
            Decision::Finish {
                state: InstanceState::Failed,
                ..
            }
        ));
    }
}
