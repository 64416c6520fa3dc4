//! A token bucket per client, in bounded memory.
//!
//! A client is a node of the cluster when the connection showed that node's certificate
//! (verified against the cluster CA in the TLS handshake), else its address: an IPv4 address
//! or an IPv6 /64 (one host usually holds a whole /64, so counting its addresses apart would
//! give it 2^64 buckets). A node's certificate gets a bucket of its own because a node shares
//! its address with everything it runs: container egress leaves from the node's address, so
//! with buckets per address a container flooding the API would spend the bucket of its
//! node's heartbeats until the leader declared the node lost. An unauthenticated client (or
//! one with a bearer token only) cannot reach a node's bucket: only the node's key can. Node
//! buckets are bounded too, by the certificates the cluster CA signed. The limiter holds at most
//! `max_clients` buckets. When it is full and a new client comes, it first forgets the
//! buckets idle for `idle_forget`, then, if that is not enough, the least recently used
//! tenth: a flood of new addresses costs a sweep per tenth of the table (amortized constant
//! time per request) and never grows it, and a client that keeps sending stays among the
//! most recently used and keeps its (empty) bucket.
//!
//! Why not `governor`'s keyed limiter: its store has no cap, only `retain_recent`, which
//! drops keys that are idle; a flood of distinct *active* addresses (the test below: 50,000
//! in half a second) would grow it without bound. The bounded table is the point here, and
//! the bucket arithmetic beside it is five lines.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The default number of clients tracked at once (about 64 bytes each).
pub const MAX_CLIENTS: usize = 10_000;

pub struct RateLimiter {
    burst: f64,
    per_second: f64,
    idle_forget: Duration,
    max_clients: usize,
    buckets: Mutex<HashMap<Client, Bucket>>,
}

/// Whom a request is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Client {
    /// A connection without a node certificate: its address (see [`Client::addr`]).
    Addr(IpAddr),
    /// A connection that showed the certificate of this node.
    Node(String),
}

impl Client {
    /// The bucket of an address: itself for IPv4 (also IPv4-mapped IPv6), its /64 for IPv6.
    pub fn addr(addr: IpAddr) -> Client {
        Client::Addr(client_key(addr))
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Client::Addr(addr) => write!(f, "{addr}"),
            Client::Node(node) => write!(f, "node {node}"),
        }
    }
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The bucket of an address: itself for IPv4 (also IPv4-mapped IPv6), its /64 for IPv6.
fn client_key(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

impl RateLimiter {
    /// `burst` requests at once, refilled at `per_second`; buckets idle for `idle_forget`
    /// go first when [`MAX_CLIENTS`] are tracked.
    pub fn new(burst: u32, per_second: f64, idle_forget: Duration) -> Self {
        RateLimiter {
            burst: burst as f64,
            per_second,
            idle_forget,
            max_clients: MAX_CLIENTS,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Track at most `max` clients (at least 1).
    pub fn with_max_clients(mut self, max: usize) -> Self {
        self.max_clients = max.max(1);
        self
    }

    /// How many clients have a bucket.
    pub fn clients(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Take a token for the address `client`, or say how long until one is available.
    pub fn check(&self, client: IpAddr) -> Result<(), Duration> {
        self.check_client(Client::addr(client))
    }

    /// Take a token for `client` (a node or an address), or say how long until one is
    /// available.
    pub fn check_client(&self, client: Client) -> Result<(), Duration> {
        self.check_key(client, Instant::now())
    }

    #[cfg(test)]
    fn check_at(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        self.check_key(Client::addr(client), now)
    }

    fn check_key(&self, client: Client, now: Instant) -> Result<(), Duration> {
        let key = match client {
            Client::Addr(addr) => Client::addr(addr),
            node => node,
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= self.max_clients && !buckets.contains_key(&key) {
            self.evict(&mut buckets, now);
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.burst);
        bucket.updated = bucket.updated.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_second,
            ))
        }
    }

    /// Make room: drop idle buckets, then the least recently used down to 90% of the cap.
    fn evict(&self, buckets: &mut HashMap<Client, Bucket>, now: Instant) {
        let idle = self.idle_forget;
        buckets.retain(|_, b| now.saturating_duration_since(b.updated) < idle);
        let keep = self.max_clients - self.max_clients.div_ceil(10);
        if buckets.len() <= keep {
            return;
        }
        let drop = buckets.len() - keep;
        let mut by_age: Vec<(Instant, Client)> = buckets
            .iter()
            .map(|(k, b)| (b.updated, k.clone()))
            .collect();
        by_age.select_nth_unstable_by_key(drop - 1, |(updated, _)| *updated);
        for (_, key) in &by_age[..drop] {
            buckets.remove(key);
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

    #[test]
    fn a_node_has_its_own_bucket_beside_its_address() {
        let limiter = RateLimiter::new(2, 0.001, Duration::from_secs(60));
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        // Whatever runs on the node spends the address's bucket...
        while limiter.check_key(Client::addr(addr), t0).is_ok() {}
        // ...not the node's, nor another node's.
        for node in ["w1", "w2"] {
            for _ in 0..2 {
                assert!(limiter.check_key(Client::Node(node.into()), t0).is_ok());
            }
            assert!(limiter.check_key(Client::Node(node.into()), t0).is_err());
        }
        // A node name is not an address: no name reaches the address's bucket.
        assert!(limiter
            .check_key(Client::Node("10.0.0.1".into()), t0)
            .is_ok());
        assert!(limiter.check_at(addr, t0).is_err());
        assert_eq!(limiter.clients(), 4);
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        let limiter = RateLimiter::new(2, 1.0, Duration::from_secs(60));
        let t0 = Instant::now();
        let ok = (0..10u16)
            .filter(|i| {
                let addr: IpAddr = format!("2001:db8:1:2::{i:x}").parse().unwrap();
                limiter.check_at(addr, t0).is_ok()
            })
            .count();
        assert_eq!(ok, 2, "one /64, one bucket");
        assert!(limiter
            .check_at("2001:db8:1:3::1".parse().unwrap(), t0)
            .is_ok());
        // An IPv4-mapped address is its IPv4 client.
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(limiter.check_at(v4, t0).is_ok());
        assert!(limiter.check_at(mapped, t0).is_ok());
        assert!(limiter.check_at(v4, t0).is_err());
        assert_eq!(limiter.clients(), 3);
    }

    #[test]
    fn memory_is_capped_and_a_flooding_client_stays_limited() {
        let cap = 1_000;
        let limiter = RateLimiter::new(5, 1.0, Duration::from_secs(300)).with_max_clients(cap);
        let flooder: IpAddr = "203.0.113.9".parse().unwrap();
        let t0 = Instant::now();
        let mut flooder_ok = 0;
        let mut newcomers_ok = 0;
        let mut most = 0;
        // 50,000 distinct active clients (half IPv4, half distinct IPv6 /64s) within
        // 0.5 s, the flooder sending between every ten of them.
        for i in 0..50_000u32 {
            let now = t0 + Duration::from_micros(10 * u64::from(i));
            let addr = if i % 2 == 0 {
                IpAddr::from((0x0a00_0000 + i).to_be_bytes())
            } else {
                IpAddr::V6(Ipv6Addr::from(
                    (0x2001_0db8_u128 << 96) | (u128::from(i) << 64),
                ))
            };
            if limiter.check_at(addr, now).is_ok() {
                newcomers_ok += 1;
            }
            if i % 10 == 0 && limiter.check_at(flooder, now).is_ok() {
                flooder_ok += 1;
            }
            let clients = limiter.clients();
            assert!(clients <= cap, "{clients} buckets");
            most = most.max(clients);
        }
        assert_eq!(most, cap, "full, never more");
        assert!(limiter.clients() >= cap * 9 / 10, "{}", limiter.clients());
        assert_eq!(newcomers_ok, 50_000, "new clients are served");
        // 5,000 requests in 0.5 s: the burst of 5 and no more (less than one token refilled).
        assert_eq!(flooder_ok, 5);
        assert!(limiter
            .check_at(flooder, t0 + Duration::from_millis(500))
            .is_err());
    }

    #[test]
    fn idle_clients_go_before_active_ones() {
        let limiter = RateLimiter::new(1, 0.001, Duration::from_secs(60)).with_max_clients(10);
        let long_ago = Instant::now();
        let t0 = long_ago + Duration::from_secs(120);
        let active: IpAddr = "10.1.0.1".parse().unwrap();
        assert!(limiter.check_at(active, t0).is_ok());
        for i in 0..9u8 {
            assert!(limiter
                .check_at(IpAddr::from([10, 2, 0, i]), long_ago)
                .is_ok());
        }
        assert_eq!(limiter.clients(), 10);
        // A newcomer: the nine idle buckets go, the active one stays (and stays empty).
        assert!(limiter.check_at("10.3.0.1".parse().unwrap(), t0).is_ok());
        assert_eq!(limiter.clients(), 2);
        assert!(limiter.check_at(active, t0).is_err());
    }
}
