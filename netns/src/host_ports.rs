//! Published ports (`hostPort`): a listener on the node's addresses (the host's network
//! namespace, where the agent lives) for each port a running instance of this node
//! publishes, relaying to the instance's address through a socket made in the node network.
//!
//! Why a userspace relay and not DNAT: the agent has no privilege in the host's network
//! namespace, so no netfilter rule there could send packets into the node network; rootless
//! podman's default port handler (rootlessport) relays the same way. The container sees
//! connections come from the node's bridge address, not the client's.
//!
//! The agent publishes only instances that are ready (healthy, or running without a health
//! check), and takes one out before it stops it. During a rolling update a node may hold an
//! old and a new instance of the workload: the relay spreads new connections over them (round
//! robin, the next one when one refuses) and keeps its listener open throughout.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::NodeNetwork;
use kat_api::load_balancer::Protocol;
use socket2::{Domain, Type};
use tokio::net::{TcpListener, TcpSocket, UdpSocket};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// A port a running instance publishes on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublishedPort {
    pub host_port: u16,
    pub protocol: Protocol,
    pub address: Ipv4Addr,
    pub container_port: u16,
}

/// UDP clients relayed at once per port, at most; the oldest flow goes first.
const MAX_UDP_FLOWS: usize = 1024;
/// A UDP flow with no packet either way for this long ends.
const UDP_IDLE: Duration = Duration::from_secs(60);
/// How soon a port that could not be bound (in use) is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How long a connection to one target may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a published port's connections go: the instances of this node that publish it and
/// are ready, in a stable order (a rolling update's old and new instance of one workload may
/// both be here for a while).
type Targets = watch::Receiver<Vec<SocketAddr>>;

/// One relay: its listener task and the targets it picks from.
struct Relay {
    task: JoinHandle<()>,
    targets: watch::Sender<Vec<SocketAddr>>,
}

/// Keeps one relay per published port and protocol, following `published` as instances
/// come, become ready and go. The listener stays open while the port has any target: an
/// instance that leaves (before it is stopped) or joins changes where new connections go
/// without a moment where the port refuses them; connections under way are left alone.
pub async fn serve(node: Arc<NodeNetwork>, mut published: watch::Receiver<Vec<PublishedPort>>) {
    let mut relays: BTreeMap<(u16, Protocol), Relay> = BTreeMap::new();
    loop {
        let mut wanted: BTreeMap<(u16, Protocol), Vec<SocketAddr>> = BTreeMap::new();
        for p in published.borrow_and_update().iter() {
            wanted
                .entry((p.host_port, p.protocol))
                .or_default()
                .push(SocketAddr::from((p.address, p.container_port)));
        }
        for targets in wanted.values_mut() {
            targets.sort();
            targets.dedup();
        }
        relays.retain(|key, relay| {
            let keep = wanted.contains_key(key) && !relay.task.is_finished();
            if !keep {
                relay.task.abort();
            }
            keep
        });
        let mut failed = false;
        for ((host_port, protocol), targets) in wanted {
            if let Some(relay) = relays.get(&(host_port, protocol)) {
                relay.targets.send_if_modified(|current| {
                    if *current == targets {
                        return false;
                    }
                    tracing::info!(host_port, ?protocol, to = ?targets, "published port targets");
                    *current = targets.clone();
                    true
                });
                continue;
            }
            let (tx, rx) = watch::channel(targets.clone());
            match start(node.clone(), host_port, protocol, rx).await {
                Ok(task) => {
                    tracing::info!(host_port, ?protocol, to = ?targets, "published port");
                    relays.insert((host_port, protocol), Relay { task, targets: tx });
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(
                        "cannot publish {host_port}/{protocol:?} for {targets:?}: {e} (retrying every {} s)",
                        RETRY.as_secs()
                    );
                }
            }
        }
        if failed {
            tokio::select! {
                changed = published.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(RETRY) => {}
            }
        } else if published.changed().await.is_err() {
            return;
        }
    }
}

async fn start(
    node: Arc<NodeNetwork>,
    host_port: u16,
    protocol: Protocol,
    targets: Targets,
) -> std::io::Result<JoinHandle<()>> {
    let on = SocketAddr::from((Ipv4Addr::UNSPECIFIED, host_port));
    Ok(match protocol {
        Protocol::TCP => {
            let listener = TcpListener::bind(on)
                .await
                .map_err(|e| explain(e, host_port))?;
            tokio::spawn(relay_tcp(node, listener, targets))
        }
        Protocol::UDP => {
            let socket = UdpSocket::bind(on)
                .await
                .map_err(|e| explain(e, host_port))?;
            tokio::spawn(relay_udp(node, Arc::new(socket), targets))
        }
    })
}

/// The targets in the order to try them for the `n`th connection (round robin).
fn in_turn(targets: &Targets, n: usize) -> Vec<SocketAddr> {
    let list = targets.borrow().clone();
    let len = list.len().max(1);
    list.iter()
        .cycle()
        .skip(n % len)
        .take(list.len())
        .copied()
        .collect()
}

fn explain(e: std::io::Error, port: u16) -> std::io::Error {
    if e.kind() == std::io::ErrorKind::PermissionDenied && port < 1024 {
        return std::io::Error::new(
            e.kind(),
            format!("{e}: ports below 1024 need `sysctl net.ipv4.ip_unprivileged_port_start={port}` for an unprivileged agent"),
        );
    }
    e
}

async fn relay_tcp(node: Arc<NodeNetwork>, listener: TcpListener, targets: Targets) {
    let mut count: usize = 0;
    loop {
        let Ok((mut client, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        count = count.wrapping_add(1);
        let order = in_turn(&targets, count);
        let node = node.clone();
        tokio::spawn(async move {
            // The next target when one refuses (it may be stopping this very moment).
            for to in order {
                let upstream = async {
                    let socket = node.socket(Domain::IPV4, Type::STREAM).await?;
                    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
                    tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(to))
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
                };
                match upstream.await {
                    Ok(mut server) => {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(%peer, %to, "published port: cannot reach the instance: {e}")
                    }
                }
            }
        });
    }
}

/// One UDP flow: the socket towards the instance (in the node network) and its reply task.
struct Flow {
    upstream: Arc<UdpSocket>,
    replies: JoinHandle<()>,
    last: tokio::time::Instant,
}

async fn relay_udp(node: Arc<NodeNetwork>, socket: Arc<UdpSocket>, targets: Targets) {
    let mut count: usize = 0;
    let flows: Arc<Mutex<HashMap<SocketAddr, Flow>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut buffer = vec![0u8; 65_535];
    loop {
        let Ok((n, client)) = socket.recv_from(&mut buffer).await else {
            continue;
        };
        let mut table = flows.lock().await;
        let now = tokio::time::Instant::now();
        table.retain(|_, f| {
            let live = now.duration_since(f.last) < UDP_IDLE && !f.replies.is_finished();
            if !live {
                f.replies.abort();
            }
            live
        });
        if !table.contains_key(&client) {
            if table.len() >= MAX_UDP_FLOWS {
                if let Some(oldest) = table.iter().min_by_key(|(_, f)| f.last).map(|(a, _)| *a) {
                    if let Some(f) = table.remove(&oldest) {
                        f.replies.abort();
                    }
                }
            }
            count = count.wrapping_add(1);
            let Some(to) = in_turn(&targets, count).first().copied() else {
                continue;
            };
            let upstream = match udp_towards(&node, to).await {
                Ok(u) => Arc::new(u),
                Err(e) => {
                    tracing::debug!(%client, %to, "published port: {e}");
                    continue;
                }
            };
            let replies = tokio::spawn(udp_replies(
                upstream.clone(),
                socket.clone(),
                client,
                flows.clone(),
            ));
            table.insert(
                client,
                Flow {
                    upstream,
                    replies,
                    last: now,
                },
            );
        }
        if let Some(flow) = table.get_mut(&client) {
            flow.last = now;
            let _ = flow.upstream.send(&buffer[..n]).await;
        }
    }
}

async fn udp_towards(node: &NodeNetwork, to: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = node.socket(Domain::IPV4, Type::DGRAM).await?;
    socket.connect(&to.into())?;
    UdpSocket::from_std(socket.into())
}

/// The instance's replies to `client`, until the flow is idle.
async fn udp_replies(
    upstream: Arc<UdpSocket>,
    socket: Arc<UdpSocket>,
    client: SocketAddr,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
) {
    let mut buffer = vec![0u8; 65_535];
    loop {
        match tokio::time::timeout(UDP_IDLE, upstream.recv(&mut buffer)).await {
            Ok(Ok(n)) => {
                let _ = socket.send_to(&buffer[..n], client).await;
                if let Some(f) = flows.lock().await.get_mut(&client) {
                    f.last = tokio::time::Instant::now();
                }
            }
            // The instance refused (nothing listens) or the flow went idle.
            Ok(Err(_)) | Err(_) => return,
        }
    }
}
