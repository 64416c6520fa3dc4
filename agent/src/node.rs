//! Bringing a node up: `init` (first time) and `run` (every time after).
//!
//! `init` validates `cluster.kat`, makes the data directory, the PKI and the admin token,
//! and records the node's identity; if the identity is already there it resumes instead of
//! re-initializing. `run` starts the node's base (runtime, network, supervisor) and the role
//! its certificate names (`crate::roles`), then waits for SIGINT or SIGTERM. Containers
//! outlive the process: stopping the agent leaves them running and the next start adopts
//! them.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kat_api::client_config::ClientConfig;
use kat_api::cluster::ClusterConfiguration;
use kat_pki::{self as pki, JoinToken, NodeRole, Pki};

use crate::roles::{self, NodeBase};
use kat_node::layout::{Layout, NodeIdentity};

/// Options shared by `init` and `run`.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub data_dir: PathBuf,
    pub node_name: Option<String>,
    pub advertise_address: Option<IpAddr>,
    pub api_bind: IpAddr,
    pub init_binary: Option<PathBuf>,
    pub insecure_registries: Vec<String>,
    /// `--allow-fetch-from`: networks the outbound policy lets through.
    pub allow_fetch_from: Vec<ipnet::IpNet>,
    pub client_config: Option<PathBuf>,
    pub stop_grace: Duration,
    pub etcd_binary: Option<PathBuf>,
    pub cgroup_parent: Option<String>,
    pub cgroup_manager: kat_runtime::CgroupManager,
    pub pids_limit: u64,
    pub seccomp: bool,
    /// The node DNS's upstream resolvers; empty: the host's /etc/resolv.conf.
    pub dns_upstreams: Vec<SocketAddr>,
    pub image_limits: kat_runtime::image::UnpackLimits,
    /// Set by `init`: the first join token, stored and printed once the store is up.
    pub first_join_token: Option<JoinToken>,
    /// `--parent-cluster-name`: a worker may run detached from this cluster.
    pub parent_cluster: Option<String>,
    /// `--node-type`: the node's `kat.dws.rip/nodeType` label.
    pub node_type: Option<String>,
}

impl NodeOptions {
    /// Where the node connects on a workload's behalf (`kat_outbound`): the allowed networks,
    /// and the registries the admin named.
    pub fn outbound(&self) -> kat_outbound::OutboundPolicy {
        kat_outbound::OutboundPolicy::allow(self.allow_fetch_from.iter().copied())
            .trust_endpoints(self.insecure_registries.iter().cloned())
    }
}

pub(crate) fn read_cluster(path: &Path) -> Result<ClusterConfiguration> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.display().to_string();
    kat_api::parse_cluster(&name, &bytes).map_err(|e| anyhow::anyhow!("{e}"))
}

/// First start of a node: create its state, then run. Resumes an initialized node.
pub async fn init(config: &Path, options: NodeOptions) -> Result<()> {
    let layout = Layout::new(&options.data_dir);
    if layout.identity().exists() {
        eprintln!(
            "kat-agent: {} is already initialized; resuming (init does not re-initialize)",
            layout.root.display()
        );
        return run(options).await;
    }
    let cluster = read_cluster(config)?;
    ensure_root_subids()?;
    layout.create()?;
    std::fs::copy(config, layout.cluster_config())
        .with_context(|| format!("cannot copy {} into the data directory", config.display()))?;
    let node = node_name(&options)?;
    let advertise = options
        .advertise_address
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    Pki::generate(&layout.pki(), &cluster.metadata.name, &node, &[advertise])?;
    let identity = NodeIdentity {
        node_name: node,
        cluster_name: cluster.metadata.name.clone(),
        advertise_address: advertise.to_string(),
        initialized_at: kat_api::wire::Timestamp::now(),
        etcd_initial_cluster: None,
    };
    // Written last: its presence means the node is initialized.
    kat_runtime::state_file::write_atomic(
        &layout.identity(),
        &serde_json::to_vec_pretty(&identity)?,
        0o644,
    )
    .with_context(|| format!("cannot write {}", layout.identity().display()))?;
    eprintln!(
        "kat-agent: initialized {} for cluster {}",
        layout.root.display(),
        cluster.metadata.name
    );
    let mut options = options;
    options.first_join_token = Some(JoinToken::generate()?);
    run(options).await
}

/// A root agent maps containers onto a subordinate range too, so container root is never
/// host root: `init` gives root one (as `setup` does for the `kat` user) when it has none.
fn ensure_root_subids() -> Result<()> {
    if !nix::unistd::geteuid().is_root()
        || kat_runtime::idmap::NodeIdRange::for_current_user().is_ok()
    {
        return Ok(());
    }
    let step = crate::setup::Step::SubIds {
        user: "root".into(),
    };
    eprintln!("kat-agent: {}", step.describe());
    step.apply()
        .context("giving root a subuid/subgid range for its containers")?;
    Ok(())
}

pub fn node_name(options: &NodeOptions) -> Result<kat_api::wire::NodeName> {
    let name = match &options.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()
            .context("reading the hostname")?
            .to_string_lossy()
            .to_lowercase(),
    };
    if let Some(problem) = kat_api::names::dns_label_problem(&name) {
        bail!("node name {name:?}: {problem} (pass --node-name)");
    }
    kat_api::wire::NodeName::parse(name).map_err(|e| anyhow::anyhow!("{e} (pass --node-name)"))
}

/// Run an initialized node until SIGINT or SIGTERM: a control-plane node (an etcd member)
/// or a worker, as its certificate says.
pub async fn run(options: NodeOptions) -> Result<()> {
    if let Some(parent) = &options.parent_cluster {
        check_parent(&options.data_dir, parent)?;
    }
    let mut base = NodeBase::start(&options)?;
    let role = pki::role_of_pem(&base.pki.node_cert_pem).with_context(|| {
        format!(
            "{}: the node certificate names no role this agent knows",
            base.pki.cert_file.display()
        )
    })?;
    let etcd = match role {
        NodeRole::ControlPlane => Some(roles::control_plane::start(&mut base, &options).await?),
        NodeRole::Worker => {
            roles::worker::start(&mut base, &options).await?;
            None
        }
    };
    let node = base.node().to_string();
    crate::sd_notify::notify(&format!("READY=1\nSTATUS=node {node} ({role}) is up"));
    base.tasks.spawn(crate::sd_notify::watchdog());
    base.tasks.spawn(crate::malloc::trim_periodically());

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        Some(ended) = base.tasks.join_next() => {
            tracing::error!(?ended, "a node task ended unexpectedly; shutting down");
        }
    }
    eprintln!("kat-agent: stopping (containers keep running and are adopted at the next start)");
    crate::sd_notify::notify("STOPPING=1");
    base.tasks.shutdown().await;
    if let Some(etcd) = etcd {
        etcd.stop().await;
    }
    Ok(())
}

/// `{data}/identity.json`: what `init` or `join` made this node.
pub(crate) fn read_identity(layout: &Layout) -> Result<NodeIdentity> {
    let path = layout.identity();
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "{} not found: {} is not the data directory of an initialized node (--data-dir)",
            path.display(),
            layout.root.display()
        )
    })?;
    // The node's own identity file, not a stored record.
    #[allow(clippy::disallowed_methods)]
    let identity = serde_json::from_slice(&bytes);
    identity.with_context(|| format!("{} is corrupt", path.display()))
}

/// `--parent-cluster-name` is for a worker of that cluster: checked before anything starts.
fn check_parent(data_dir: &Path, parent: &str) -> Result<()> {
    let layout = Layout::new(data_dir);
    let identity = read_identity(&layout)?;
    if parent != identity.cluster_name {
        bail!(
            "--parent-cluster-name: is {parent:?}, but this node joined cluster {:?} (see {})",
            identity.cluster_name,
            layout.identity().display()
        );
    }
    let pki = Pki::load(&layout.pki())?;
    if pki::role_of_pem(&pki.node_cert_pem) != Some(NodeRole::Worker) {
        bail!("--parent-cluster-name: node {} is a control-plane node (an etcd member); only workers run detached (a member on its own would split the quorum)", identity.node_name);
    }
    Ok(())
}

/// The HTTPS client a node uses towards other nodes: its certificate, the cluster CA only.
pub(crate) fn node_client(pki: &Pki) -> Result<reqwest::Client> {
    kat_client::https::node_to_node(&pki.ca_pem, &pki.node_cert_pem, &pki.node_key_pem)?
        .build()
        .context("the HTTPS client for other nodes")
}

/// The HTTPS client a node uses towards the cluster API (the leader, a restored node): as
/// [`node_client`], and the server must show a control-plane certificate, so a worker's key
/// cannot impersonate the leader (`kat_pki::server_role`).
pub(crate) fn control_plane_client(pki: &Pki) -> Result<reqwest::Client> {
    kat_client::https::node_to_control_plane(&pki.ca_pem, &pki.node_cert_pem, &pki.node_key_pem)?
        .build()
        .context("the HTTPS client for the cluster API")
}

pub(crate) fn write_client_config(path: &Path, config: &ClientConfig) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    pki::write_secret(path, &yaml_serde::to_string(config)?)
}
