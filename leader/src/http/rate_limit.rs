//! A token bucket per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimiter {
    burst: f64,
    per_second: f64,
    idle_forget: Duration,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// `burst` requests at once, refilled at `per_second`; buckets idle for `idle_forget` go.
    pub fn new(burst: u32, per_second: f64, idle_forget: Duration) -> Self {
        RateLimiter {
            burst: burst as f64,
            per_second,
            idle_forget,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Take a token for `client`, or say how long until one is available.
    pub fn check(&self, client: IpAddr) -> Result<(), Duration> {
        self.check_at(client, Instant::now())
    }

    fn check_at(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > 10_000 {
            let idle = self.idle_forget;
            buckets.retain(|_, b| now.duration_since(b.updated) < idle);
        }
        let bucket = buckets.entry(client).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_second,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill_per_client() {
        let limiter = RateLimiter::new(3, 10.0, Duration::from_secs(60));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check_at(a, t0).is_ok());
        }
        let wait = limiter.check_at(a, t0).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        assert!(
            limiter.check_at(b, t0).is_ok(),
            "clients have separate buckets"
        );
        assert!(limiter.check_at(a, t0 + Duration::from_millis(100)).is_ok());
    }
}
