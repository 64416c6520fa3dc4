//! What a node runs, by role. Every node first becomes a [`NodeBase`] (its files, its
//! runtime, its network and the supervisor, running from the local copy of its assignments
//! until the control plane answers); then its certificate's role adds the rest:
//!
//! - [`worker`]: the feed and heartbeat through the leader's API, a small API of its own
//!   for logs and exec, and, with `--parent-cluster-name`, detached mode;
//! - [`control_plane`]: the etcd member ([`kat_node::etcd_member`]) and, over it, the
//!   [`assembly`] shared with a detached node's local cluster, served as the full API.

pub mod assembly;
pub mod control_plane;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kat_api::cluster::ClusterConfiguration;
use kat_pki::Pki;
use kat_runtime::image::RegistryConfig;
use kat_runtime::{ContainerRuntime, NativeConfig, NativeRuntime};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::node::{read_cluster, read_identity, NodeOptions};
use kat_node::kept_logs::KeptLogs;
use kat_node::layout::{Layout, NodeIdentity};
use kat_node::link::ControlPlane;
use kat_node::network::ContainerNetwork;
use kat_node::supervisor::assignments::{self, Source};
use kat_node::supervisor::builds::Builds;
use kat_node::supervisor::{Statuses, Supervisor, SupervisorConfig};

/// What every node has once it is up, whatever its role: its files, its runtime and the
/// supervisor with the feed that drives it.
pub(crate) struct NodeBase {
    pub layout: Layout,
    pub identity: NodeIdentity,
    pub cluster: ClusterConfiguration,
    pub pki: Pki,
    pub work: NodeWork,
    pub tasks: tokio::task::JoinSet<()>,
    pub feed_tx: watch::Sender<Option<(Source, assignments::Snapshot)>>,
    /// A local copy of assignments exists (the node ran workloads before this start).
    pub has_copy: bool,
    /// The container network, brought up by [`NetworkStart::connect`].
    pub network: Option<NetworkStart>,
}

/// The node's own work that the control plane it reports to (the cluster's, or a detached
/// node's local one) reads and drives: its runtime, builds, statuses and kept logs.
#[derive(Clone)]
pub(crate) struct NodeWork {
    pub node: kat_api::wire::NodeName,
    /// The data directory (for the usage meter).
    pub root: PathBuf,
    pub runtime: Arc<dyn ContainerRuntime>,
    pub builds: Builds,
    pub statuses: watch::Receiver<Statuses>,
    /// The heartbeat's period.
    pub tick: Duration,
    /// Logs of finished instances, kept after their containers went.
    pub kept: Option<KeptLogs>,
    /// The container network, for the overlay's state in heartbeats.
    pub overlay: Option<Arc<ContainerNetwork>>,
    /// The heartbeat last sent (a worker's `/metrics`).
    pub last_heartbeat: Arc<watch::Sender<Option<kat_api::wire::NodeHeartbeat>>>,
    /// The node's GPUs, as heartbeats report them.
    pub gpus: Vec<kat_api::wire::GpuInfo>,
}

/// Where the node network task learns how to reach the control plane (its subnet, the
/// DNS records), once the node's role has made the link.
pub(crate) struct NetworkStart(watch::Sender<Option<Arc<dyn ControlPlane>>>);

impl NodeWork {
    /// The node's heartbeat to the control plane behind `link` (with `detachment` while a
    /// detached node reports to its local cluster): run it as a task.
    pub fn heartbeat(
        &self,
        link: Arc<dyn ControlPlane>,
        detachment: Option<kat_api::wire::Detachment>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        kat_node::heartbeat::run(kat_node::heartbeat::Heartbeat {
            link,
            node: self.node.clone(),
            tick: self.tick,
            statuses: self.statuses.clone(),
            builds: self.builds.reports(),
            meter: kat_node::usage::UsageMeter::new(self.runtime.clone(), self.root.clone()),
            detached: detachment,
            overlay: self.overlay.clone(),
            last: self.last_heartbeat.clone(),
            gpus: self.gpus.clone(),
        })
    }
}

impl NetworkStart {
    pub fn connect(self, control: Arc<dyn ControlPlane>) {
        self.0.send_replace(Some(control));
    }
}

impl NodeBase {
    /// The node's files, its runtime, and the supervisor (running from the local copy of
    /// assignments until the control plane answers).
    pub fn start(options: &NodeOptions) -> Result<NodeBase> {
        let layout = Layout::new(&options.data_dir);
        if !layout.identity().exists() {
            anyhow::bail!(
                "{} is not an initialized node (run `kat-agent init --config cluster.kat --data-dir {}` first)",
                layout.root.display(),
                layout.root.display()
            );
        }
        let identity = read_identity(&layout)?;
        let cluster = read_cluster(&layout.cluster_config())?;
        let pki = Pki::load(&layout.pki())?;
        let node = identity.node_name.clone();

        let mut native = NativeConfig::new(layout.runtime(), init_binary(options));
        native.registries = RegistryConfig {
            insecure: options.insecure_registries.clone(),
            auth_files: vec![],
        };
        native.outbound = options.outbound();
        native.cgroup_parent = options.cgroup_parent.clone();
        native.cgroup_manager = options.cgroup_manager;
        native.seccomp = options.seccomp;
        native.image_limits = options.image_limits;
        let network = Arc::new(ContainerNetwork::default());
        native.network = Some(network.clone());
        // Logs of finished instances outlive their containers (`kat_node::kept_logs`).
        let kept = KeptLogs::new(
            layout.finished_logs(),
            Duration::from_secs(u64::from(cluster.spec.finished_run_max_age_hours) * 3600),
        );
        let runtime: Arc<dyn ContainerRuntime> =
            Arc::new(NativeRuntime::new(native).context("starting the container runtime")?);
        if runtime.observe_removals(Arc::new(kept.clone())).is_err() {
            anyhow::bail!("the container runtime already has a removal observer");
        }
        let caps = runtime.capabilities();
        tracing::info!(rootless = caps.rootless, cgroups = ?caps.cgroup_mode, rootfs = ?caps.rootfs, "container runtime ready");
        for note in &caps.notes {
            tracing::warn!("{note}");
        }

        let (status_tx, status_rx) = watch::channel(None);
        let (feed_tx, feed_rx) = watch::channel(None);
        let mut tasks = tokio::task::JoinSet::new();
        let (settings_tx, settings_rx) = watch::channel(None);
        let (published_tx, published_rx) = watch::channel(Vec::new());
        let (control_tx, control_rx) = watch::channel(None);
        // It starts at once: a node whose control plane is down still brings its workloads
        // back, with their addresses, from its local copy.
        tasks.spawn(kat_node::network::run(
            network_config(
                &layout,
                &node,
                &cluster,
                caps.rootless,
                caps.cgroup_mode == kat_runtime::CgroupMode::Systemd,
                options.dns_upstreams.clone(),
            )?,
            network.clone(),
            control_rx,
            settings_tx,
            published_rx,
        ));
        let tick = Duration::from_secs(cluster.spec.agent_tick_seconds.max(1) as u64);
        let builds = Builds::new(layout.build_logs());
        // GPUs are read once, at start: the CDI specifications and what the kernel says of
        // each device (a GPU added later needs an agent restart).
        let gpus = kat_runtime::gpus::Gpus::discover();
        tasks.spawn(
            Supervisor::new(
                SupervisorConfig {
                    node: node.clone(),
                    volume_base: PathBuf::from(&cluster.spec.volume_base_path),
                    host_mounts: host_mount_policy(&cluster, &layout),
                    stop_grace: options.stop_grace,
                    pids_limit: options.pids_limit,
                    network: settings_rx,
                    published: published_tx,
                    builds: builds.clone(),
                    gpus: gpus.clone(),
                },
                runtime.clone(),
                status_tx,
            )
            .run(feed_rx),
        );
        // A rebooted node brings its workloads back from the local copy while the control
        // plane is still coming up.
        let local_copy = assignments::load_copy(&layout.agent());
        let has_copy = local_copy.is_some();
        if let Some(copy) = local_copy {
            let _ = feed_tx.send(Some((Source::LocalCopy, copy)));
        }
        Ok(NodeBase {
            work: NodeWork {
                node,
                root: layout.root.clone(),
                runtime,
                builds,
                statuses: status_rx,
                tick,
                kept: Some(kept),
                overlay: Some(network),
                last_heartbeat: Arc::new(watch::channel(None).0),
                gpus: gpus.found,
            },
            layout,
            identity,
            cluster,
            pki,
            tasks,
            feed_tx,
            has_copy,
            network: Some(NetworkStart(control_tx)),
        })
    }

    pub fn node(&self) -> &kat_api::wire::NodeName {
        &self.work.node
    }

    /// Bind the node's API port (`apiPort` of `cluster.kat`) on `bind`.
    pub async fn api_listener(&self, bind: std::net::IpAddr) -> Result<TcpListener> {
        let bind = SocketAddr::new(bind, self.cluster.spec.api_port as u16);
        TcpListener::bind(bind).await.with_context(|| {
            format!("cannot listen on {bind} (apiPort in cluster.kat; is another agent running?)")
        })
    }

    /// The API's TLS: the node's certificate; clients may show one of the cluster CA's.
    pub fn api_tls(&self) -> Result<Arc<rustls::ServerConfig>> {
        let pki = &self.pki;
        Ok(kat_apiserver::serve::tls_config_with_clients(
            &pki.node_cert_pem,
            &pki.node_key_pem,
            Some(&pki.ca_pem),
        )?)
    }
}

/// The cluster's `hostMount` rules plus this node's own data directory (PKI, etcd data,
/// containers, logs), which no workload may ever mount.
fn host_mount_policy(
    cluster: &ClusterConfiguration,
    layout: &Layout,
) -> kat_api::host_paths::HostMountPolicy {
    let mut policy = cluster.spec.host_mount_policy();
    policy.denied.push(layout.root.clone());
    if let Ok(real) = std::fs::canonicalize(&layout.root) {
        policy.denied.push(real);
    }
    policy
}

/// `kat-init`: `--init-binary`, else beside this program, else `/usr/lib/kat/kat-init`.
fn init_binary(options: &NodeOptions) -> PathBuf {
    if let Some(p) = &options.init_binary {
        return p.clone();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("kat-init")));
    match beside {
        Some(p) if p.exists() => p,
        _ => PathBuf::from("/usr/lib/kat/kat-init"),
    }
}

/// How this node makes its container network, from `cluster.kat` and who runs the agent.
fn network_config(
    layout: &Layout,
    node: &str,
    cluster: &ClusterConfiguration,
    rootless: bool,
    systemd_scope: bool,
    dns_upstreams: Vec<SocketAddr>,
) -> Result<kat_node::network::NetworkConfig> {
    let cluster_cidr = cluster.spec.cluster_cidr.parse().with_context(|| {
        format!(
            "{}: clusterCIDR {:?} is not an IPv4 network",
            layout.cluster_config().display(),
            cluster.spec.cluster_cidr
        )
    })?;
    let subordinate = if rootless {
        let r = kat_runtime::idmap::NodeIdRange::for_current_user().map_err(anyhow::Error::msg)?;
        Some((r.uid_start, r.uid_count, r.gid_start, r.gid_count))
    } else {
        None
    };
    Ok(kat_node::network::NetworkConfig {
        node: node.to_string(),
        dir: layout.network(),
        helper: std::env::current_exe().context("finding this program (the network helper)")?,
        cluster_cidr,
        domain: cluster.spec.cluster_domain.clone(),
        subordinate,
        egress: true,
        overlay_port: u16::try_from(cluster.spec.wireguard_port).ok(),
        systemd_scope,
        dns_upstreams,
        poll: Duration::from_secs(1),
    })
}
