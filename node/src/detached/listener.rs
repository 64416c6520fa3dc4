//! The parent side of rejoining (RFC 001 §4.9): while this node leads, it listens for
//! detached nodes' `REJOIN_REQUEST`s (multicast to `REJOIN_GROUP` on `rejoinPort`, on the
//! interface of its advertise address) and answers each valid one straight back with a
//! signed `REJOIN_OFFER` naming its API endpoint. A request that does not prove a worker
//! certificate of this cluster's CA, or comes from a removed node or one the cluster does
//! not know, is ignored: no answer, a log line, and `kat_rejoin_requests{outcome="ignored"}`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kat_api::keys;
use kat_api::wire::REJOIN_GROUP;
use kat_leader::metrics::Metrics;
use kat_pki::Pki;
use kat_store::StateStore;
use tokio::net::UdpSocket;

use super::protocol::{self, Nonces, MAX_DATAGRAM};

/// Rejoin requests checked per second at most; the rest are ignored (a detached node sends
/// one every 2 s).
const MAX_CHECKS_PER_SECOND: u32 = 50;
/// Of those, from one address: one sender cannot take the whole budget.
const MAX_CHECKS_PER_SOURCE: u32 = 5;

/// A leader's listener for rejoin requests (see the module's documentation).
#[derive(Clone)]
pub struct RejoinListener {
    /// The cluster's name: requests for another are ignored.
    pub cluster: String,
    /// This node's certificate and key (offers are signed with them) and the cluster CA
    /// (requests are checked against it).
    pub pki: Arc<Pki>,
    /// The cluster's store: whether the node is known and not removed.
    pub store: Arc<dyn StateStore>,
    /// Where `kat_rejoin_requests` is counted.
    pub metrics: Arc<Metrics>,
    /// This leader's API endpoint, which the offers name.
    pub endpoint: String,
    /// `rejoinPort`.
    pub port: u16,
    /// The interface (by its address) to join the group on.
    pub interface: Ipv4Addr,
}

impl RejoinListener {
    fn bind(&self) -> std::io::Result<UdpSocket> {
        let socket =
            // Bound to the group: datagrams sent to this host's own addresses are not read.
            std::net::UdpSocket::bind(SocketAddr::from((REJOIN_GROUP, self.port)))?;
        socket.join_multicast_v4(&REJOIN_GROUP, &self.interface)?;
        socket.set_nonblocking(true)?;
        UdpSocket::from_std(socket)
    }

    /// Until the task is dropped (when this node stops leading).
    pub async fn run(self) {
        let socket = loop {
            match self.bind() {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, port = self.port, "cannot listen for rejoin requests (rejoinPort in cluster.kat); retrying in 5 s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        tracing::info!(port = self.port, group = %REJOIN_GROUP, "listening for detached nodes' rejoin requests");
        let mut nonces = Nonces::default();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        // A flood of junk is logged once in a while, not once per datagram.
        let mut last_word: Option<Instant> = None;
        let mut budget = CheckBudget::default();
        loop {
            let (n, from) = match socket.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "reading a rejoin request");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Checking a signature costs tens of microseconds: well-formed, fresh requests
            // of this cluster beyond MAX_CHECKS_PER_SECOND are not checked (junk, stale and
            // other clusters' requests cost a JSON parse and do not count).
            let checked = match protocol::parse_request(&buf[..n], &self.cluster, SystemTime::now())
            {
                Err(why) => Err(why),
                Ok(_) if !budget.take(from.ip(), Instant::now()) => {
                    Err("too many rejoin requests this second".to_string())
                }
                Ok(request) => self.check(request, &mut nonces).await,
            };
            match checked {
                Ok(request) => {
                    let answered = match protocol::offer(
                        &request,
                        &self.endpoint,
                        &self.pki,
                        SystemTime::now(),
                    ) {
                        Ok(offer) => match serde_json::to_vec(&offer) {
                            Ok(bytes) => socket.send_to(&bytes, from).await.is_ok(),
                            Err(_) => false,
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot sign a rejoin offer");
                            false
                        }
                    };
                    self.metrics.record_rejoin_request(if answered {
                        "answered"
                    } else {
                        "unanswered"
                    });
                    tracing::info!(node = %request.node, %from, answered, "a detached node asks to rejoin; offered this leader's endpoint");
                }
                Err(why) => {
                    self.metrics.record_rejoin_request("ignored");
                    if last_word.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        last_word = Some(Instant::now());
                        tracing::warn!(%from, %why, "ignored a rejoin request");
                    }
                }
            }
        }
    }

    /// The request, if it is one to answer.
    async fn check(
        &self,
        request: kat_api::wire::RejoinRequest,
        nonces: &mut Nonces,
    ) -> Result<kat_api::wire::RejoinRequest, String> {
        let proven =
            protocol::verify_request(&request, &self.pki.ca_pem, SystemTime::now(), nonces)?;
        let node = &request.node;
        let removed = self
            .store
            .get(&keys::revoked_node(node))
            .await
            .map_err(|e| format!("cannot check node {node}: {e}"))?;
        if let Some(kv) = removed {
            let revoked: Option<kat_api::wire::RevokedNode> = kat_store::decode_or_skip(&kv);
            if revoked.and_then(|r| r.serial) == proven.serial || proven.serial.is_none() {
                return Err(format!(
                    "node {node} was removed; its certificate is revoked"
                ));
            }
        }
        let registered = self
            .store
            .get(&keys::node_registration(node))
            .await
            .map_err(|e| format!("cannot check node {node}: {e}"))?;
        if registered.is_none() {
            return Err(format!("node {node} is not a node of this cluster"));
        }
        Ok(request)
    }
}

/// How many signature checks are left this second, in all and per sender.
struct CheckBudget {
    window: Instant,
    checks: u32,
    /// Bounded: cleared every second, and it holds at most MAX_CHECKS_PER_SECOND senders.
    by_source: HashMap<IpAddr, u32>,
}

impl Default for CheckBudget {
    fn default() -> Self {
        CheckBudget {
            window: Instant::now(),
            checks: 0,
            by_source: HashMap::new(),
        }
    }
}

impl CheckBudget {
    /// Whether a request from `from` may be checked now (and counts it if so).
    fn take(&mut self, from: IpAddr, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.checks = 0;
            self.by_source.clear();
        }
        let mine = self.by_source.get(&from).copied().unwrap_or(0);
        if self.checks >= MAX_CHECKS_PER_SECOND || mine >= MAX_CHECKS_PER_SOURCE {
            return false;
        }
        self.checks += 1;
        self.by_source.insert(from, mine + 1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sender_cannot_take_the_whole_budget() {
        let start = Instant::now();
        let mut budget = CheckBudget {
            window: start,
            ..CheckBudget::default()
        };
        let flooder = IpAddr::from([10, 0, 0, 66]);
        let taken = (0..100).filter(|_| budget.take(flooder, start)).count();
        assert_eq!(taken, MAX_CHECKS_PER_SOURCE as usize);
        // The laptop asking in the same second is still checked.
        assert!(budget.take(IpAddr::from([10, 0, 0, 7]), start));
        // Many senders together stop at the global bound.
        let others = (1..=200u8)
            .filter(|i| budget.take(IpAddr::from([10, 1, 0, *i]), start))
            .count() as u32;
        assert_eq!(others, MAX_CHECKS_PER_SECOND - MAX_CHECKS_PER_SOURCE - 1);
        // A second later the flooder is checked again.
        assert!(budget.take(flooder, start + Duration::from_secs(1)));
    }
}
