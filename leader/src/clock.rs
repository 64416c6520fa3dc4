//! Time for the leader: monotonic time for timeouts, wall time for cron and timestamps.
//!
//! Both come from tokio's clock, so under `tokio::time::pause()` a simulation controls all of
//! it: wall time is a fixed start plus the (simulated) time elapsed since the clock was made.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_start: SystemTime,
    start: Instant,
}

impl Clock {
    /// Wall time follows the system clock.
    pub fn system() -> Self {
        Clock {
            wall_at_start: SystemTime::now(),
            start: Instant::now(),
        }
    }

    /// Wall time starts at `wall` and advances with tokio's (possibly paused) clock.
    pub fn simulated(wall: SystemTime) -> Self {
        Clock {
            wall_at_start: wall,
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Instant {
        Instant::now()
    }

    pub fn wall(&self) -> SystemTime {
        self.wall_at_start + (Instant::now() - self.start)
    }

    pub fn wall_ms(&self) -> u64 {
        self.wall()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis() as u64
    }

    /// The wall clock now, as records carry it.
    pub fn timestamp(&self) -> kat_api::wire::Timestamp {
        self.wall().into()
    }
}
