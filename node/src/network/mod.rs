//! The node's container network, from the agent's side: it waits for the node's subnet,
//! brings up the node network (kat-netns: namespaces, bridge, egress), then serves DNS on
//! the node's address and the published host ports, for as long as the agent runs.
//!
//! The runtime reaches the node network through [`ContainerNetwork`], the
//! [`kat_runtime::network::NetworkNamespaces`] seam; the supervisor learns from
//! [`NetworkSettings`] which gateway and DNS a container gets, and reports which ports its
//! running instances publish ([`PublishedPort`]).

mod dns;
mod overlay;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ipnet::Ipv4Net;
use kat_netns::{Attachment, NodeNetwork, NodeNetworkConfig};
use kat_runtime::idmap::IdMap;
use kat_runtime::network::{JoinedNamespaces, NetworkNamespaces};
use tokio::sync::watch;

use crate::link::ControlPlane;

pub use kat_netns::host_ports::PublishedPort;

/// What a container on this node is given besides its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSettings {
    /// The node's address on its bridge: the containers' gateway and DNS server.
    pub gateway: Ipv4Addr,
    /// `clusterDomain`, for the search path.
    pub domain: String,
}

/// The node network as the runtime sees it; empty until the node network is up.
#[derive(Default)]
pub struct ContainerNetwork {
    node: RwLock<Option<Arc<NodeNetwork>>>,
}

impl std::fmt::Debug for ContainerNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.current() {
            Some(node) => write!(
                f,
                "node network {} (keeper {})",
                node.subnet(),
                node.keeper_pid()
            ),
            None => write!(f, "node network (not up)"),
        }
    }
}

impl ContainerNetwork {
    fn current(&self) -> Option<Arc<NodeNetwork>> {
        self.node.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, node: Option<Arc<NodeNetwork>>) {
        *self.node.write().unwrap_or_else(|p| p.into_inner()) = node;
    }

    /// What the overlay knows of its peers; empty while the node network is down
    /// (blocking: a small file read).
    pub fn overlay_state(&self) -> Vec<kat_netns::overlay::PeerState> {
        self.current()
            .map(|node| node.overlay_state())
            .unwrap_or_default()
    }
}

struct Joined(Attachment);

impl JoinedNamespaces for Joined {
    fn user(&self) -> PathBuf {
        self.0.user_namespace()
    }
    fn network(&self) -> PathBuf {
        self.0.network_namespace()
    }
    fn parent_user(&self) -> PathBuf {
        self.0.node_user_namespace()
    }
}

impl NetworkNamespaces for ContainerNetwork {
    fn prepare(&self, address: Ipv4Addr, ids: &IdMap) -> Result<Box<dyn JoinedNamespaces>, String> {
        let node = self.current().ok_or_else(|| {
            "the node network is not up yet (it starts once the leader has given this node a subnet)".to_string()
        })?;
        let triples = |ranges: &[kat_runtime::idmap::IdRange]| {
            ranges
                .iter()
                .map(|r| (r.inside, r.outside, r.count))
                .collect()
        };
        node.attach(address, triples(&ids.uids), triples(&ids.gids))
            .map(|a| Box::new(Joined(a)) as Box<dyn JoinedNamespaces>)
            .map_err(|e| e.to_string())
    }
}

/// How this node's network is made.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// This node's name.
    pub node: String,
    /// The node network's directory (holder record, log, saved subnet).
    pub dir: PathBuf,
    /// The agent's own binary (holder and attach helper).
    pub helper: PathBuf,
    /// `clusterCIDR`: the network the nodes' subnets are taken from.
    pub cluster_cidr: Ipv4Net,
    /// The cluster's DNS domain (`clusterDomain`).
    pub domain: String,
    /// An unprivileged agent's subordinate ids `(uid start, count, gid start, count)`; `None`
    /// for root.
    pub subordinate: Option<(u32, u32, u32, u32)>,
    /// Whether containers reach networks outside the cluster (through slirp4netns).
    pub egress: bool,
    /// `wireguardPort`: the overlay's UDP port on the node's addresses.
    pub overlay_port: Option<u16>,
    /// Resolvers for names outside the cluster domain; empty: the host's resolv.conf.
    pub dns_upstreams: Vec<std::net::SocketAddr>,
    /// The holder in a systemd scope of its own (the agent is a systemd service).
    pub systemd_scope: bool,
    /// How often to look for the subnet and DNS records.
    pub poll: Duration,
}

/// Brings the node network up and keeps DNS and published ports served; runs for the
/// agent's life. Failures are logged and retried: containers wait ("the node network is not
/// up yet") rather than start without a network.
pub async fn run(
    config: NetworkConfig,
    network: Arc<ContainerNetwork>,
    control: watch::Receiver<Option<Arc<dyn ControlPlane>>>,
    settings: watch::Sender<Option<NetworkSettings>>,
    published: watch::Receiver<Vec<PublishedPort>>,
) {
    let dir = config.dir.clone();
    let saved = tokio::task::spawn_blocking(move || saved_subnet(&dir))
        .await
        .ok()
        .flatten();
    let subnet = match saved {
        Some(subnet) => subnet,
        None => {
            let subnet = wait_for_subnet(control.clone(), config.poll).await;
            let dir = config.dir.clone();
            // Durable (synced before the rename): off the async threads.
            let _ = tokio::task::spawn_blocking(move || save_subnet(&dir, subnet)).await;
            subnet
        }
    };
    let node = loop {
        let node_config = NodeNetworkConfig {
            dir: config.dir.clone(),
            helper: config.helper.clone(),
            subnet,
            cluster_cidr: config.cluster_cidr,
            subordinate: config.subordinate,
            egress: config.egress,
            overlay_port: config.overlay_port,
            systemd_scope: config.systemd_scope,
        };
        match tokio::task::spawn_blocking(move || NodeNetwork::start(node_config)).await {
            Ok(Ok(node)) => break Arc::new(node),
            Ok(Err(e)) => tracing::error!("{e}; retrying in 10 s"),
            Err(e) => tracing::error!("starting the node network: {e}; retrying in 10 s"),
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    };
    tracing::info!(%subnet, gateway = %node.gateway(), "node network up");
    network.set(Some(node.clone()));
    settings.send_replace(Some(NetworkSettings {
        gateway: node.gateway(),
        domain: config.domain.clone(),
    }));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(dns::serve(
        node.clone(),
        control.clone(),
        config.domain.clone(),
        config.dns_upstreams.clone(),
    ));
    tasks.spawn(kat_netns::host_ports::serve(node.clone(), published));
    tasks.spawn(overlay::keep_peers(
        node.clone(),
        control.clone(),
        config.node.clone(),
    ));
    // Nothing here should end; if the holder goes (killed by hand), say so loudly.
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if !node.is_alive() {
            tracing::error!(
                "the node network holder is gone: containers started from now on wait; restart the agent to make a new one"
            );
            network.set(None);
            settings.send_replace(None);
            tasks.shutdown().await;
            return;
        }
    }
}

/// The control plane, once the node has reached it.
pub(crate) async fn connected(
    control: &mut watch::Receiver<Option<Arc<dyn ControlPlane>>>,
) -> Arc<dyn ControlPlane> {
    loop {
        if let Some(c) = control.borrow_and_update().clone() {
            return c;
        }
        if control.changed().await.is_err() {
            // The node is shutting down.
            std::future::pending::<()>().await;
        }
    }
}

/// The file that keeps the node's subnet: a node's subnet never changes while it is a
/// member, and a rebooted node brings its workloads back (with their addresses) before the
/// control plane answers.
const SUBNET_FILE: &str = "subnet";

/// The node's subnet saved in `dir`, if one was.
pub fn saved_subnet(dir: &std::path::Path) -> Option<Ipv4Net> {
    std::fs::read_to_string(dir.join(SUBNET_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn save_subnet(dir: &std::path::Path, subnet: Ipv4Net) {
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        kat_runtime::state_file::write_atomic(
            &dir.join(SUBNET_FILE),
            format!("{subnet}\n").as_bytes(),
            0o600,
        )
    });
    if let Err(e) = written {
        tracing::warn!("saving this node's subnet in {}: {e}", dir.display());
    }
}

async fn wait_for_subnet(
    mut control: watch::Receiver<Option<Arc<dyn ControlPlane>>>,
    poll: Duration,
) -> Ipv4Net {
    let control = connected(&mut control).await;
    let mut said = false;
    loop {
        match control.subnet().await {
            Ok(Some(text)) => match text.parse::<Ipv4Net>() {
                Ok(net) => return net,
                Err(e) => {
                    tracing::error!(subnet = %text, "the leader gave this node a subnet that is not IPv4: {e}")
                }
            },
            Ok(None) if !said => {
                tracing::info!("waiting for the leader to give this node a subnet");
                said = true;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("reading this node's subnet: {e:#}"),
        }
        tokio::time::sleep(poll).await;
    }
}
