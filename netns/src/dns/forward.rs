//! Names outside the cluster domain: asked of the host's resolvers, answers cached.
//!
//! Each question goes out from a fresh socket (a random source port) with a random id of
//! our own, and only an answer from the server asked, with that id and the same question,
//! is taken: an off-path attacker has to guess both to poison the cache. Answers are cached
//! for their smallest TTL (at most 5 minutes); negative ones (NXDOMAIN, NODATA) for their
//! SOA's minimum, as RFC 2308 says; failures are not cached. The cache holds at most
//! [`CACHE_ENTRIES`] questions.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{DNSClass, LowerName, RData, RecordType};
use tokio::net::UdpSocket;
use tokio::time::Instant;

/// Questions remembered at most.
pub const CACHE_ENTRIES: usize = 10_000;
/// The longest an answer is remembered.
const MAX_TTL: u32 = 300;

type Key = (LowerName, RecordType, DNSClass);

pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    cache: Mutex<HashMap<Key, (Instant, Vec<u8>)>>,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration) -> Forwarder {
        Forwarder {
            upstreams,
            timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The answer to `request` (its raw bytes `raw`), from the cache or an upstream; a
    /// SERVFAIL when no upstream answers.
    pub async fn forward(&self, request: &Message, raw: &[u8]) -> Option<Vec<u8>> {
        let key = key_of(request)?;
        if let Some(mut cached) = self.cached(&key) {
            cached[..2].copy_from_slice(&request.metadata.id.to_be_bytes());
            return Some(cached);
        }
        for upstream in &self.upstreams {
            match self.ask(*upstream, request, raw).await {
                Some((message, mut bytes)) => {
                    if let Some(ttl) = cache_ttl(&message) {
                        self.remember(key, ttl, &bytes);
                    }
                    bytes[..2].copy_from_slice(&request.metadata.id.to_be_bytes());
                    return Some(bytes);
                }
                None => continue,
            }
        }
        let mut failed = Message::response(request.metadata.id, request.metadata.op_code);
        failed.metadata.recursion_desired = request.metadata.recursion_desired;
        failed.metadata.recursion_available = true;
        failed.metadata.response_code = ResponseCode::ServFail;
        failed.add_queries(request.queries.iter().cloned());
        failed.to_vec().ok()
    }

    async fn ask(
        &self,
        upstream: SocketAddr,
        request: &Message,
        raw: &[u8],
    ) -> Option<(Message, Vec<u8>)> {
        let local: SocketAddr = match upstream.ip() {
            IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = UdpSocket::bind(local).await.ok()?;
        socket.connect(upstream).await.ok()?;
        let id: u16 = rand::random();
        let mut query = raw.to_vec();
        query[..2].copy_from_slice(&id.to_be_bytes());
        socket.send(&query).await.ok()?;
        let deadline = Instant::now() + self.timeout;
        let mut buf = vec![0u8; 65_535];
        loop {
            let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
                .await
                .ok()?
                .ok()?;
            let Ok(message) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            if message.metadata.id == id
                && message.metadata.message_type == MessageType::Response
                && message.queries == request.queries
            {
                return Some((message, buf[..n].to_vec()));
            }
            // Anything else on this socket is noise (or an attempt): keep waiting.
        }
    }

    fn cached(&self, key: &Key) -> Option<Vec<u8>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(key) {
            Some((until, bytes)) if *until > Instant::now() => Some(bytes.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        }
    }

    fn remember(&self, key: Key, ttl: u32, bytes: &[u8]) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            let now = Instant::now();
            cache.retain(|_, (until, _)| *until > now);
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        let until = Instant::now() + Duration::from_secs(u64::from(ttl.min(MAX_TTL)));
        cache.insert(key, (until, bytes.to_vec()));
    }

    /// How many questions are cached now (for tests and metrics).
    pub fn cached_questions(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

fn key_of(request: &Message) -> Option<Key> {
    let [q] = request.queries.as_slice() else {
        return None;
    };
    Some((
        LowerName::from(q.name().clone()),
        q.query_type(),
        q.query_class(),
    ))
}

/// How long an answer may be cached: its smallest TTL; a negative answer its SOA's minimum;
/// `None` for failures and answers that say nothing about their lifetime.
fn cache_ttl(message: &Message) -> Option<u32> {
    // A truncated answer is not the whole answer (the client asks again over TCP).
    if message.metadata.truncation {
        return None;
    }
    match message.metadata.response_code {
        ResponseCode::NoError if !message.answers.is_empty() => {
            message.answers.iter().map(|r| r.ttl).min()
        }
        ResponseCode::NoError | ResponseCode::NXDomain => {
            message.authorities.iter().find_map(|r| match &r.data {
                RData::SOA(soa) => Some(soa.minimum.min(r.ttl)),
                _ => None,
            })
        }
        _ => None,
    }
}

/// The `nameserver` lines of a resolv.conf, on port 53. Loopback resolvers (a local stub
/// such as systemd-resolved on 127.0.0.53) are kept: the caller decides whether it can reach
/// them.
pub fn upstreams_from_resolv_conf(path: &Path) -> std::io::Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers() {
        let dir = std::env::temp_dir().join(format!("kat-resolv-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# comment\nsearch example.org\nnameserver 192.0.2.1\nnameserver fe80::1%eth0\nnameserver   2001:db8::53\nnameserver bogus\n",
        )
        .unwrap();
        let got = upstreams_from_resolv_conf(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(
            got,
            vec![
                "192.0.2.1:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap(),
                "[2001:db8::53]:53".parse().unwrap()
            ]
        );
    }
}
