//! Heartbeats: this node's capacity, allocatable and usage, every instance's state and usage,
//! and its builds, written to its status key every `agentTickSeconds` and at once (debounced)
//! when an instance or a build changes; through the store on a control-plane node, the
//! leader's API on a worker.

use std::sync::Arc;
use std::time::Duration;

use kat_api::node_limits::{HEARTBEAT_BURST, MIN_HEARTBEAT_INTERVAL};

/// How long a burst of status changes may take to settle into one heartbeat.
const SETTLE: Duration = Duration::from_millis(5);

use kat_api::wire::{
    BuildReport, Detachment, NodeHeartbeat, OverlayPeerStatus, ResourceList, Timestamp,
};
use tokio::sync::watch;

use crate::link::ControlPlane;
use crate::network::ContainerNetwork;
use crate::supervisor::Statuses;
use crate::usage::UsageMeter;

/// What the host has: CPUs, memory and the pid limit.
pub fn capacity() -> ResourceList {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let pids = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(32768);
    ResourceList {
        cpu_millis: cpus * 1000,
        memory_bytes: memory,
        pids,
    }
}

/// Capacity minus what the system and KAT itself need: 100m CPU and a tenth of memory
/// (at most 1 GiB).
pub fn allocatable(capacity: ResourceList) -> ResourceList {
    ResourceList {
        cpu_millis: capacity.cpu_millis.saturating_sub(100),
        memory_bytes: capacity
            .memory_bytes
            .saturating_sub((capacity.memory_bytes / 10).min(1 << 30)),
        pids: capacity.pids,
    }
}

/// What a node's heartbeat is made of, and where it goes.
pub struct Heartbeat {
    /// Where heartbeats go: the store on a control-plane node, the leader's API on a worker.
    pub link: Arc<dyn ControlPlane>,
    /// The node's name.
    pub node: kat_api::wire::NodeName,
    /// Interval between two heartbeats while nothing changes (`agentTickSeconds`).
    pub tick: Duration,
    /// Every instance's status, from the supervisor; heartbeats stop when it ends.
    pub statuses: watch::Receiver<Statuses>,
    /// The node's builds, reported in every heartbeat.
    pub builds: watch::Receiver<Vec<BuildReport>>,
    /// Measures what the node and each running instance use.
    pub meter: UsageMeter,
    /// Set while the node runs detached from its parent cluster.
    pub detached: Option<Detachment>,
    /// The container network, for the overlay's peers.
    pub overlay: Option<Arc<ContainerNetwork>>,
    /// Where the heartbeat last sent is kept (a worker's `/metrics`).
    pub last: Arc<watch::Sender<Option<NodeHeartbeat>>>,
    /// The node's GPUs (found at start).
    pub gpus: Vec<kat_api::wire::GpuInfo>,
}

/// Send heartbeats until the statuses end.
pub async fn run(heartbeat: Heartbeat) {
    let Heartbeat {
        link,
        node,
        tick,
        mut statuses,
        mut builds,
        mut meter,
        detached,
        overlay,
        last,
        gpus,
    } = heartbeat;
    // Read from /proc: off the async threads like every other file.
    let capacity = tokio::task::spawn_blocking(capacity)
        .await
        .unwrap_or_default();
    let allocatable = allocatable(capacity);
    // Not before the supervisor knows what runs here: a restarted agent's first heartbeat
    // must carry the containers it adopted, not an empty list.
    if statuses.wait_for(Option::is_some).await.is_err() {
        return;
    }
    let mut pacer = Pacer::new(link.heartbeats_rate_limited(), tokio::time::Instant::now());
    loop {
        let mut instances = statuses.borrow_and_update().clone().unwrap_or_default();
        let usage = meter.measure(&mut instances).await;
        let overlay_peers = overlay_status(overlay.as_ref()).await;
        let hb = NodeHeartbeat {
            node: node.clone(),
            timestamp: Timestamp::now(),
            capacity,
            allocatable,
            gpus: gpus.clone(),
            instances,
            usage: Some(usage),
            builds: builds.borrow_and_update().clone(),
            detached: detached.clone(),
            overlay: overlay_peers,
        };
        if let Err(e) = link.heartbeat(&hb).await {
            tracing::warn!(error = %e, "heartbeat failed; sending again in 0.5 s");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        last.send_replace(Some(hb));
        pacer.spend(tokio::time::Instant::now());
        // Let a burst of changes settle into one heartbeat, and never send more than the
        // leader takes (an early heartbeat is refused with 429 and only delays the news).
        let allowed = pacer.next_allowed(tokio::time::Instant::now());
        let settled =
            || tokio::time::sleep_until(allowed.max(tokio::time::Instant::now() + SETTLE));
        tokio::select! {
            changed = statuses.changed() => {
                if changed.is_err() { return; }
                settled().await;
            }
            Ok(()) = builds.changed() => settled().await,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

/// The agent's side of the leader's heartbeat limit: a token bucket like the leader's, one
/// token short and refilled a quarter slower, so that heartbeats the network delays by up to
/// an interval still find a token at the leader. After a burst the next heartbeat waits one
/// interval, not until the whole burst has aged out (that cost 0.4 s of news every few
/// applies in `bench/apply-to-running.sh`). A control-plane node writes its heartbeats to
/// the store itself, past the leader's limit: it paces itself only against a storm of
/// changes (20 a second after a burst of 10), so an apply's news never waits.
struct Pacer {
    tokens: f64,
    burst: f64,
    interval: Duration,
    updated: tokio::time::Instant,
}

impl Pacer {
    fn new(rate_limited: bool, now: tokio::time::Instant) -> Pacer {
        let (burst, interval) = if rate_limited {
            ((HEARTBEAT_BURST - 1) as f64, MIN_HEARTBEAT_INTERVAL * 5 / 4)
        } else {
            (10.0, Duration::from_millis(50))
        };
        Pacer {
            tokens: burst,
            burst,
            interval,
            updated: now,
        }
    }

    fn refill(&mut self, now: tokio::time::Instant) {
        let earned =
            now.saturating_duration_since(self.updated).as_secs_f64() / self.interval.as_secs_f64();
        self.tokens = (self.tokens + earned).min(self.burst);
        self.updated = now;
    }

    /// The earliest time the next heartbeat may go.
    fn next_allowed(&mut self, now: tokio::time::Instant) -> tokio::time::Instant {
        self.refill(now);
        if self.tokens >= 1.0 {
            now
        } else {
            now + self.interval.mul_f64(1.0 - self.tokens)
        }
    }

    /// A heartbeat went at `now` (one that went early anyway, after a failure, still counts).
    fn spend(&mut self, now: tokio::time::Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }
}

/// The overlay's peers as the node's WireGuard last wrote them (a small file: read on a
/// blocking thread); none before the node network is up.
async fn overlay_status(network: Option<&Arc<ContainerNetwork>>) -> Vec<OverlayPeerStatus> {
    let Some(network) = network.cloned() else {
        return Vec::new();
    };
    let peers = tokio::task::spawn_blocking(move || network.overlay_state())
        .await
        .unwrap_or_default();
    let now = std::time::SystemTime::now();
    peers
        .into_iter()
        .map(|p| OverlayPeerStatus {
            node: p.node,
            endpoint: p.endpoint,
            last_peer_sync: p
                .last_handshake_seconds
                .and_then(|s| now.checked_sub(Duration::from_secs(s)).map(Timestamp::from)),
            handshakes: p.handshakes,
            tx_bytes: p.tx_bytes,
            rx_bytes: p.rx_bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// A burst goes at once, then one per interval; an idle while refills the burst.
    #[test]
    fn pacer_allows_a_burst_then_one_per_interval() {
        let t0 = Instant::now();
        // Through the leader's API: its burst less one, then one per 125 ms. Written to
        // the store directly: 10, then one per 50 ms.
        for (limited, burst, interval) in [
            (true, HEARTBEAT_BURST - 1, MIN_HEARTBEAT_INTERVAL * 5 / 4),
            (false, 10, Duration::from_millis(50)),
        ] {
            let mut p = Pacer::new(limited, t0);
            for _ in 0..burst {
                assert_eq!(p.next_allowed(t0), t0);
                p.spend(t0);
            }
            let next = p.next_allowed(t0);
            assert_eq!(next, t0 + interval);
            p.spend(next);
            assert_eq!(p.next_allowed(next), next + interval);
            let later = next + interval * 10;
            assert_eq!(p.next_allowed(later), later);
        }
    }

    /// Sent as fast as it allows, for 10 s, the heartbeats never exceed what the leader
    /// takes (a burst of HEARTBEAT_BURST, then one per MIN_HEARTBEAT_INTERVAL), even when
    /// each is delayed by up to one interval on the way and the delays differ.
    #[test]
    fn pacer_never_sends_more_than_the_leader_takes() {
        let t0 = Instant::now();
        let mut p = Pacer::new(true, t0);
        let mut now = t0;
        let mut arrivals = Vec::new();
        for i in 0u32..200 {
            now = p.next_allowed(now);
            p.spend(now);
            // Alternating delays: the worst case packs late sends after early ones.
            let delay = if i % 2 == 0 {
                MIN_HEARTBEAT_INTERVAL
            } else {
                Duration::ZERO
            };
            arrivals.push(now + delay);
        }
        arrivals.sort();
        // The leader's bucket, replayed on the arrivals.
        let (burst, interval) = (f64::from(HEARTBEAT_BURST), MIN_HEARTBEAT_INTERVAL);
        let (mut tokens, mut at) = (burst, t0);
        for a in arrivals {
            tokens = (tokens + (a - at).as_secs_f64() / interval.as_secs_f64()).min(burst);
            at = a;
            assert!(tokens >= 1.0 - 1e-9, "refused at {:?}", a - t0);
            tokens -= 1.0;
        }
        assert!(
            now - t0 < Duration::from_secs(26),
            "paced too slowly: {:?}",
            now - t0
        );
    }
}
