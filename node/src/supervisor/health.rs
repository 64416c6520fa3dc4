//! Exec health checks (`VirtualLoadBalancer.kat` `healthCheck`) as a pure state machine.
//!
//! The first probe runs `initialDelaySeconds` after the container started, then one every
//! `periodSeconds` (never two at once). `successThreshold` consecutive successes make the
//! instance `Healthy`, `failureThreshold` consecutive failures `Unhealthy`; a probe that
//! outlives `timeoutSeconds` is a failure. Health feeds status and rollouts; it does not
//! restart the container.

use std::time::Duration;

use kat_api::load_balancer::HealthCheck;
use kat_api::wire::Health;
use tokio::time::Instant;

/// One instance's health check: when the next probe is due and what the probes so far say.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    /// The command each probe runs in the container.
    pub command: Vec<String>,
    /// How long a probe may run before it counts as a failure (at least 1 s).
    pub timeout: Duration,
    period: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    next_probe: Instant,
    in_flight: bool,
    successes: u32,
    failures: u32,
    /// The health the probes show; `Unknown` until a threshold is reached.
    pub health: Health,
}

impl HealthTracker {
    /// The tracker of `check` for a container started at `started`.
    pub fn new(check: &HealthCheck, started: Instant) -> Self {
        HealthTracker {
            command: check.exec.command.clone(),
            timeout: Duration::from_secs(check.timeout_seconds.max(1) as u64),
            period: Duration::from_secs(check.period_seconds.max(1) as u64),
            success_threshold: check.success_threshold.max(1),
            failure_threshold: check.failure_threshold.max(1),
            next_probe: started + Duration::from_secs(check.initial_delay_seconds as u64),
            in_flight: false,
            successes: 0,
            failures: 0,
            health: Health::Unknown,
        }
    }

    /// Whether a probe should start now; if so, it is marked in flight.
    pub fn start_probe(&mut self, now: Instant) -> bool {
        if self.in_flight || now < self.next_probe {
            return false;
        }
        self.in_flight = true;
        true
    }

    /// When the next probe is due (for the supervisor's timer); `None` while one is in
    /// flight: its result wakes the supervisor, and a due time in the past would wake it in a
    /// loop until then.
    pub fn next_probe(&self) -> Option<Instant> {
        (!self.in_flight).then_some(self.next_probe)
    }

    /// Record a probe's result; returns the new health if it changed.
    pub fn record(&mut self, now: Instant, ok: bool) -> Option<Health> {
        self.in_flight = false;
        self.next_probe = now + self.period;
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let new = if self.successes >= self.success_threshold {
            Health::Healthy
        } else if self.failures >= self.failure_threshold {
            Health::Unhealthy
        } else {
            self.health
        };
        (new != self.health).then(|| {
            self.health = new;
            new
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::load_balancer::ExecAction;

    fn check(delay: u32, period: u32, success: u32, failure: u32) -> HealthCheck {
        HealthCheck {
            exec: ExecAction {
                command: vec!["true".into()],
            },
            initial_delay_seconds: delay,
            period_seconds: period,
            timeout_seconds: 1,
            success_threshold: success,
            failure_threshold: failure,
            on_failure: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_initial_delay_and_never_overlaps() {
        let t0 = Instant::now();
        let mut h = HealthTracker::new(&check(5, 2, 1, 1), t0);
        assert!(!h.start_probe(t0 + Duration::from_secs(4)));
        assert_eq!(h.next_probe(), Some(t0 + Duration::from_secs(5)));
        assert!(h.start_probe(t0 + Duration::from_secs(5)));
        assert!(
            !h.start_probe(t0 + Duration::from_secs(9)),
            "one probe at a time"
        );
        // In flight: no due time (its result wakes the supervisor, not a timer in the past).
        assert_eq!(h.next_probe(), None);
        h.record(t0 + Duration::from_secs(9), true);
        assert_eq!(h.next_probe(), Some(t0 + Duration::from_secs(11)));
        assert!(!h.start_probe(t0 + Duration::from_secs(10)));
        assert!(h.start_probe(t0 + Duration::from_secs(11)));
    }

    #[tokio::test(start_paused = true)]
    async fn thresholds_govern_transitions() {
        let t0 = Instant::now();
        let mut h = HealthTracker::new(&check(0, 1, 2, 3), t0);
        assert_eq!(h.record(t0, true), None, "one success is not enough");
        assert_eq!(h.record(t0, true), Some(Health::Healthy));
        assert_eq!(h.record(t0, false), None);
        assert_eq!(h.record(t0, false), None);
        assert_eq!(
            h.record(t0, true),
            None,
            "a success resets the failure count"
        );
        assert_eq!(h.record(t0, false), None);
        assert_eq!(h.record(t0, false), None);
        assert_eq!(h.record(t0, false), Some(Health::Unhealthy));
        assert_eq!(h.record(t0, true), None);
        assert_eq!(h.record(t0, true), Some(Health::Healthy));
    }
}
