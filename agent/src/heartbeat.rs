//! Heartbeats: this node's capacity, allocatable and usage, every instance's state and usage,
//! and its builds, written to its status key every `agentTickSeconds` and at once (debounced)
//! when an instance or a build changes; through the store on a control-plane node, the
//! leader's API on a worker.

use std::sync::Arc;
use std::time::Duration;

use kat_apiserver::service::{HEARTBEAT_BURST, MIN_HEARTBEAT_INTERVAL};

/// How long a burst of status changes may take to settle into one heartbeat.
const SETTLE: Duration = Duration::from_millis(5);

use kat_api::wire::{
    BuildReport, Detachment, NodeHeartbeat, OverlayPeerStatus, ResourceList, Timestamp,
};
use tokio::sync::watch;

use crate::control_plane::ControlPlane;
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
    pub link: Arc<dyn ControlPlane>,
    pub node: kat_api::wire::NodeName,
    pub tick: Duration,
    pub statuses: watch::Receiver<Statuses>,
    pub builds: watch::Receiver<Vec<BuildReport>>,
    pub meter: UsageMeter,
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
    // When the last heartbeats went, oldest first.
    let mut sent = std::collections::VecDeque::with_capacity(HEARTBEAT_BURST as usize);
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
        if sent.len() == HEARTBEAT_BURST as usize {
            sent.pop_front();
        }
        sent.push_back(tokio::time::Instant::now());
        // Let a burst of changes settle into one heartbeat, and never send more than the
        // leader takes: at most a burst in any window of that many intervals, with a margin
        // for the network's jitter (an early heartbeat is refused with 429 and only delays
        // the news).
        let settled = || {
            let window = MIN_HEARTBEAT_INTERVAL * HEARTBEAT_BURST * 3 / 2;
            let soonest = tokio::time::Instant::now() + SETTLE;
            let earliest = match sent.front() {
                Some(oldest) if sent.len() == HEARTBEAT_BURST as usize => *oldest + window,
                _ => soonest,
            };
            tokio::time::sleep_until(earliest.max(soonest))
        };
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
