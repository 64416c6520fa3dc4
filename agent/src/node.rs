//! Bringing a node up: `init` (first time) and `run` (every time after).
//!
//! `init` validates `cluster.kat`, makes the data directory, the PKI and the admin token,
//! and records the node's identity; if the identity is already there it resumes instead of
//! re-initializing. `run` then starts and supervises etcd, writes the cluster's first state
//! (only where absent), registers the node, and starts the roles: the supervisor with its
//! assignment feed and heartbeat, the leader loop whenever this node wins the election, and
//! the HTTPS API. Containers outlive the process: stopping the agent leaves them running and
//! the next start adopts them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use kat_api::client_config::ClientConfig;
use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::{rfc3339, url_host};
use kat_apiserver::http::{self, ApiState, WorkerApi};
use kat_apiserver::Service;
use kat_leader::metrics::Metrics;
use kat_leader::{namespaces, node_admin, Clock, Leader, LeaderConfig};
use kat_runtime::image::RegistryConfig;
use kat_runtime::{ContainerRuntime, NativeConfig, NativeRuntime};
use kat_store::{
    campaign, Compare, EtcdServer, EtcdServerConfig, EtcdStore, EtcdTls, StateStore, Txn, TxnOp,
};
use tokio::sync::watch;

use crate::access::LocalAccess;
use crate::control_plane::{ControlPlane, LeaderLink, StoreLink};
use crate::heartbeat;
use crate::layout::{Layout, NodeIdentity};
use crate::network::ContainerNetwork;
use crate::remote_access::ClusterAccess;
use crate::server;
use crate::supervisor::assignments::{self, Feed, Source};
use crate::supervisor::builds::Builds;
use crate::supervisor::{Supervisor, SupervisorConfig};
use crate::usage::UsageMeter;
use kat_pki::{self as pki, Authority, JoinToken, NodeRole, Pki};

/// Where a worker keeps the control plane's API endpoints, in the agent state directory.
pub const API_ENDPOINTS_FILE: &str = "api-endpoints.json";

/// Options shared by `init` and `run`.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub data_dir: PathBuf,
    pub node_name: Option<String>,
    pub advertise_address: Option<IpAddr>,
    pub api_bind: IpAddr,
    pub init_binary: Option<PathBuf>,
    pub insecure_registries: Vec<String>,
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
        initialized_at: rfc3339(SystemTime::now()),
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

pub fn node_name(options: &NodeOptions) -> Result<String> {
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
    Ok(name)
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

/// What every node has once it is up, whatever its role: its files, its runtime and the
/// supervisor with the feed that drives it.
struct NodeBase {
    layout: Layout,
    identity: NodeIdentity,
    cluster: ClusterConfiguration,
    pki: Pki,
    node: String,
    runtime: Arc<dyn ContainerRuntime>,
    /// Logs of finished instances, kept after their containers went.
    kept: crate::kept_logs::KeptLogs,
    tasks: tokio::task::JoinSet<()>,
    feed_tx: watch::Sender<Option<(Source, assignments::Snapshot)>>,
    status_rx: watch::Receiver<crate::supervisor::Statuses>,
    builds: Builds,
    /// A local copy of assignments exists (the node ran workloads before this start).
    has_copy: bool,
    tick: Duration,
    /// The container network, brought up by [`NodeBase::start_network`].
    network: Option<NetworkStart>,
}

/// Where the node network task learns how to reach the control plane (its subnet, the
/// DNS records), once the node's role has made the link.
struct NetworkStart(watch::Sender<Option<Arc<dyn ControlPlane>>>);

impl NetworkStart {
    fn connect(self, control: Arc<dyn ControlPlane>) {
        self.0.send_replace(Some(control));
    }
}

/// Run an initialized node until SIGINT or SIGTERM: a control-plane node (an etcd member)
/// or a worker, as its certificate says.
pub async fn run(options: NodeOptions) -> Result<()> {
    if let Some(parent) = &options.parent_cluster {
        check_parent(&options.data_dir, parent)?;
    }
    let mut base = start_base(&options)?;
    let role = pki::role_of_pem(&base.pki.node_cert_pem).with_context(|| {
        format!(
            "{}: the node certificate names no role this agent knows",
            base.pki.cert_file.display()
        )
    })?;
    let etcd = match role {
        NodeRole::ControlPlane => Some(control_plane(&mut base, &options).await?),
        NodeRole::Worker => {
            worker(&mut base, &options).await?;
            None
        }
    };
    let node = base.node.clone();
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
    serde_json::from_slice(&bytes).with_context(|| format!("{} is corrupt", path.display()))
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

/// The node's files, its runtime, and the supervisor (running from the local copy of
/// assignments until the control plane answers).
fn start_base(options: &NodeOptions) -> Result<NodeBase> {
    let layout = Layout::new(&options.data_dir);
    let identity: NodeIdentity = serde_json::from_slice(
        &std::fs::read(layout.identity()).with_context(|| {
            format!(
                "{} is not an initialized node (run `kat-agent init --config cluster.kat --data-dir {}` first)",
                layout.root.display(),
                layout.root.display()
            )
        })?,
    )
    .with_context(|| format!("{} is corrupt", layout.identity().display()))?;
    let cluster = read_cluster(&layout.cluster_config())?;
    let pki = Pki::load(&layout.pki())?;
    let node = identity.node_name.clone();

    let mut native = NativeConfig::new(layout.runtime(), init_binary(options));
    native.registries = RegistryConfig {
        insecure: options.insecure_registries.clone(),
        auth_files: vec![],
    };
    native.cgroup_parent = options.cgroup_parent.clone();
    native.cgroup_manager = options.cgroup_manager;
    native.seccomp = options.seccomp;
    native.image_limits = options.image_limits;
    let network = Arc::new(ContainerNetwork::default());
    native.network = Some(network.clone());
    // Logs of finished instances outlive their containers (`crate::kept_logs`).
    let kept = crate::kept_logs::KeptLogs::new(
        layout.agent().join("finished-logs"),
        Duration::from_secs(u64::from(cluster.spec.finished_run_max_age_hours) * 3600),
    );
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(crate::kept_logs::KeepingRuntime {
        inner: Arc::new(NativeRuntime::new(native).context("starting the container runtime")?),
        kept: kept.clone(),
    });
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
    tasks.spawn(crate::network::run(
        network_config(
            &layout,
            &node,
            &cluster,
            caps.rootless,
            caps.cgroup_mode == kat_runtime::CgroupMode::Systemd,
            options.dns_upstreams.clone(),
        )?,
        network,
        control_rx,
        settings_tx,
        published_rx,
    ));
    let tick = Duration::from_secs(cluster.spec.agent_tick_seconds.max(1) as u64);
    let builds = Builds::new(layout.agent().join("build-logs"));
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
            },
            runtime.clone(),
            status_tx,
        )
        .run(feed_rx),
    );
    // A rebooted node brings its workloads back from the local copy while the control plane
    // is still coming up.
    let local_copy = assignments::load_copy(&layout.agent());
    let has_copy = local_copy.is_some();
    if let Some(copy) = local_copy {
        let _ = feed_tx.send(Some((Source::LocalCopy, copy)));
    }
    Ok(NodeBase {
        layout,
        identity,
        cluster,
        pki,
        node,
        runtime,
        kept,
        tasks,
        feed_tx,
        status_rx,
        builds,
        has_copy,
        tick,
        network: Some(NetworkStart(control_tx)),
    })
}

/// How this node makes its container network, from `cluster.kat` and who runs the agent.
fn network_config(
    layout: &Layout,
    node: &str,
    cluster: &ClusterConfiguration,
    rootless: bool,
    systemd_scope: bool,
    dns_upstreams: Vec<SocketAddr>,
) -> Result<crate::network::NetworkConfig> {
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
    Ok(crate::network::NetworkConfig {
        node: node.to_string(),
        dir: kat_netns::node::network_dir(&layout.root),
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

/// The etcd binary: `--etcd-binary`, else `$ETCD_BIN`, else `etcd` from PATH.
fn etcd_binary(options: &NodeOptions) -> PathBuf {
    options
        .etcd_binary
        .clone()
        .or_else(|| std::env::var_os("ETCD_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// The HTTPS client a node uses towards other nodes: its certificate, the cluster CA only.
pub(crate) fn node_client(pki: &Pki) -> Result<reqwest::Client> {
    ClusterAccess::client(&pki.ca_pem, &pki.node_cert_pem, &pki.node_key_pem)
        .context("the HTTPS client for other nodes")
}

/// The HTTPS client a node uses towards the cluster API (the leader, a restored node): as
/// [`node_client`], and the server must show a control-plane certificate, so a worker's key
/// cannot impersonate the leader (`kat_pki::server_role`).
pub(crate) fn control_plane_client(pki: &Pki) -> Result<reqwest::Client> {
    let tls = pki::server_role::control_plane_client_tls(
        &pki.ca_pem,
        Some((&pki.node_cert_pem, &pki.node_key_pem)),
    )?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .context("the HTTPS client for the cluster API")
}

/// A worker: the feed and heartbeat through the leader's API, and an API of its own that
/// serves logs and exec of its instances to the control plane.
async fn worker(base: &mut NodeBase, options: &NodeOptions) -> Result<()> {
    let node = base.node.clone();
    let link = Arc::new(LeaderLink::new(
        &node,
        control_plane_client(&base.pki)?,
        base.layout.agent().join(API_ENDPOINTS_FILE),
    )?);
    let leader = link.leader();
    let revoked = link.revoked();
    // A node that may run detached also resolves its local cluster's names meanwhile.
    let (local_link, local_link_rx) = watch::channel(None);
    if let Some(n) = base.network.take() {
        match options.parent_cluster {
            Some(_) => n.connect(Arc::new(crate::detached::uplink::Uplink::new(
                link.clone(),
                local_link_rx,
            ))),
            None => n.connect(link.clone()),
        }
    }
    // A node that may run detached feeds its supervisor the parent's instances and, while
    // detached, its own cluster's.
    let (parent_feed, local_feed) = match options.parent_cluster {
        Some(_) => {
            let (parent_tx, parent_rx) = watch::channel(base.feed_tx.borrow().clone());
            let (local_tx, local_rx) = watch::channel(None);
            let was_detached =
                crate::detached::local_cluster::state_file(&base.layout.root).exists();
            base.tasks.spawn(crate::detached::merge_feeds(
                parent_rx,
                local_rx,
                base.feed_tx.clone(),
                was_detached,
            ));
            (parent_tx, Some(local_tx))
        }
        None => {
            if crate::detached::local_cluster::state_file(&base.layout.root).exists() {
                tracing::warn!(
                    "{} holds the local cluster of a detached node, and this start has no --parent-cluster-name: its workloads do not run until the agent starts with it again and rejoins",
                    crate::detached::local_cluster::dir(&base.layout.root).display()
                );
            }
            (base.feed_tx.clone(), None)
        }
    };
    base.tasks
        .spawn(Feed::new(link.clone(), &base.layout.agent()).run(parent_feed));
    let meter = UsageMeter::new(base.runtime.clone(), base.layout.root.clone());
    base.tasks.spawn(heartbeat::run(
        link.clone(),
        node.clone(),
        base.tick,
        base.status_rx.clone(),
        base.builds.reports(),
        meter,
        None,
    ));

    // The node's own records, for the API's logs and exec.
    let (records_tx, records_rx) = watch::channel(BTreeMap::new());
    let mut snapshots = base.feed_tx.subscribe();
    base.tasks.spawn(async move {
        loop {
            let records = snapshots
                .borrow_and_update()
                .as_ref()
                .map(|(_, s)| {
                    s.iter()
                        .map(|(id, a)| (id.clone(), a.record.clone()))
                        .collect()
                })
                .unwrap_or_default();
            records_tx.send_replace(records);
            if snapshots.changed().await.is_err() {
                return;
            }
        }
    });
    let api = Arc::new(WorkerApi {
        node: node.clone(),
        instances: records_rx,
        leader,
        revoked,
        access: Arc::new(LocalAccess {
            node: node.clone(),
            runtime: base.runtime.clone(),
            builds: base.builds.clone(),
            kept: Some(base.kept.clone()),
        }),
        limiter: http::default_rate_limiter(),
    });
    let bind = SocketAddr::new(options.api_bind, base.cluster.spec.api_port as u16);
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| {
        format!("cannot listen on {bind} (apiPort in cluster.kat; is another agent running?)")
    })?;
    let pki = &base.pki;
    let tls =
        server::tls_config_with_clients(&pki.node_cert_pem, &pki.node_key_pem, Some(&pki.ca_pem))?;
    let worker_router = http::worker_router(api);
    let (routers, routers_rx) = watch::channel(worker_router.clone());
    base.tasks
        .spawn(server::serve_switchable(listener, tls, routers_rx));
    if let (Some(parent), Some(local_feed)) = (&options.parent_cluster, local_feed) {
        base.tasks.spawn(
            crate::detached::Detacher {
                parts: crate::detached::local_cluster::NodeParts {
                    node: node.clone(),
                    root: base.layout.root.clone(),
                    cluster: base.cluster.clone(),
                    pki: Arc::new(base.pki.clone()),
                    advertise: base.identity.advertise_address.clone(),
                    node_type: options.node_type.clone(),
                    etcd_binary: etcd_binary(options),
                    runtime: base.runtime.clone(),
                    builds: base.builds.clone(),
                    statuses: base.status_rx.clone(),
                    tick: base.tick,
                    client: node_client(&base.pki)?,
                    parent_client: control_plane_client(&base.pki)?,
                },
                parent_cluster: parent.clone(),
                link,
                local_feed,
                routers,
                worker_router,
                local_link,
            }
            .run(),
        );
        eprintln!("kat-agent: worker node {node} of {parent} is up; it talks to the leader's API (no etcd here), and runs detached if it loses the leader for {} s", base.cluster.spec.node_loss_timeout_seconds);
    } else {
        eprintln!(
            "kat-agent: worker node {node} is up; it talks to the leader's API (no etcd here)"
        );
    }
    Ok(())
}

/// A control-plane node: its etcd member, the store, the leader role and the full API.
async fn control_plane(base: &mut NodeBase, options: &NodeOptions) -> Result<EtcdServer> {
    if let Ok(address) = base.identity.advertise_address.parse::<IpAddr>() {
        if pki::ensure_member_certificate(&base.layout.pki(), &base.node, &[address])? {
            eprintln!("kat-agent: this node's certificate predates node roles; renewed it (same key) with the name etcd now requires");
            base.pki = Pki::load(&base.layout.pki())?;
        }
    }
    let network = base.network.take();
    let (layout, identity, cluster, pki) = (&base.layout, &base.identity, &base.cluster, &base.pki);
    let node = base.node.clone();
    let tasks = &mut base.tasks;
    // A node that holds the CA keeps the revocation list etcd checks (empty at first).
    let authority = match layout.pki().join("ca.key").exists() {
        true => Some(Arc::new(Authority::load(&layout.pki())?)),
        false => None,
    };
    let crl_file = layout.pki().join("crl.pem");
    if let Some(ca) = &authority {
        if !crl_file.exists() {
            kat_runtime::state_file::write_atomic(&crl_file, ca.crl(&[])?.as_bytes(), 0o644)
                .with_context(|| format!("cannot write {}", crl_file.display()))?;
        }
    }
    let etcd_tls = EtcdTls {
        ca_file: pki.ca_file.clone(),
        cert_file: pki.cert_file.clone(),
        key_file: pki.key_file.clone(),
        crl_file: authority.is_some().then(|| crl_file.clone()),
        member_name: Some(pki::ETCD_MEMBER_NAME.to_string()),
    };
    let mut etcd_config = EtcdServerConfig::from_cluster(
        &cluster.spec,
        &node,
        &url_host(&identity.advertise_address),
        &layout.root,
        etcd_tls.clone(),
    );
    etcd_config.join = identity.etcd_initial_cluster.clone();
    etcd_config.binary = etcd_binary(options);
    let etcd = loop {
        match EtcdServer::start(etcd_config.clone()).await {
            Ok(etcd) => break etcd,
            // Without workloads to keep, fail at once and say why.
            Err(e) if !base.has_copy => return Err(anyhow::Error::new(e).context("starting etcd")),
            Err(e) => {
                tracing::error!(error = %e, "etcd does not start; workloads run from the local copy meanwhile; retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    if let Some(initial) = &identity.etcd_initial_cluster {
        wait_for_promotion(initial, &node, cluster, &etcd_tls).await?;
    }
    let etcd_store = EtcdStore::connect(&[etcd.client_url().to_string()], Some(&etcd_tls))
        .await
        .context("connecting to etcd")?;
    let store: Arc<dyn StateStore> = Arc::new(etcd_store.clone());
    // This node's certificate serial, so that removing the node can revoke it.
    if let Some(serial) = pki::serial_of(&pki.node_cert_pem) {
        store
            .put(&keys::node_certificate(&node), serial.into_bytes(), None)
            .await
            .context("recording this node's certificate")?;
    }
    if let Some(ca) = authority.clone() {
        tasks.spawn(keep_revocation_list(store.clone(), ca, crl_file.clone()));
    }
    // Learners (nodes that joined the quorum) become voting members once they caught up.
    let promoter = etcd_store.clone();
    tasks.spawn(async move {
        loop {
            match promoter.promote_learners().await {
                Ok(names) if !names.is_empty() => {
                    tracing::info!(?names, "promoted etcd learners to voting members")
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "promoting etcd learners"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    let clock = Clock::system();
    if let Some(token) = &pki.token {
        first_state(&*store, cluster, token).await?;
    }
    for ns in kat_api::namespace::SYSTEM_NAMESPACES {
        namespaces::create(&*store, &clock, ns, true).await?;
    }
    node_admin::register(
        &*store,
        &node,
        vec![identity.advertise_address.clone()],
        kat_apiserver::service::node_labels(
            &node,
            NodeRole::ControlPlane,
            options.node_type.as_deref(),
        ),
    )
    .await?;

    let link = Arc::new(StoreLink::new(
        store.clone(),
        &node,
        cluster.spec.wireguard_port,
    ));
    if let Some(n) = network {
        n.connect(link.clone());
    }
    tasks.spawn(Feed::new(link.clone(), &layout.agent()).run(base.feed_tx.clone()));
    let meter = UsageMeter::new(base.runtime.clone(), layout.root.clone());
    tasks.spawn(heartbeat::run(
        link,
        node.clone(),
        base.tick,
        base.status_rx.clone(),
        base.builds.reports(),
        meter,
        None,
    ));

    // Leader role.
    let metrics = Arc::new(Metrics::default());
    let endpoint = format!(
        "https://{}:{}",
        url_host(&identity.advertise_address),
        cluster.spec.api_port
    );
    let rejoin = match identity.advertise_address.parse::<std::net::Ipv4Addr>() {
        Ok(interface) => Some(crate::rejoin_listener::RejoinListener {
            cluster: cluster.metadata.name.clone(),
            pki: Arc::new(pki.clone()),
            store: store.clone(),
            metrics: metrics.clone(),
            endpoint: endpoint.clone(),
            port: cluster.spec.rejoin_port as u16,
            interface,
        }),
        Err(_) => {
            tracing::warn!("the advertise address is not IPv4: detached nodes cannot rejoin through this node (rejoin requests are IPv4 multicast)");
            None
        }
    };
    tasks.spawn(leader_role(
        store.clone(),
        cluster.clone(),
        node.clone(),
        endpoint.clone(),
        metrics.clone(),
        Some((etcd_store.clone(), backup_config(cluster, &node))),
        rejoin,
    ));
    // etcd's health and restarts, for /metrics.
    let (probe, etcd_metrics) = (etcd.health_probe(), metrics.clone());
    tasks.spawn(async move {
        loop {
            etcd_metrics.set_etcd(probe.is_healthy().await, u64::from(probe.restarts()));
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });

    // API.
    let token_sha256 = stored_token_hash(&*store).await?;
    let events = kat_leader::events::EventLog::new(kat_leader::events::DEFAULT_CAPACITY);
    let state = Arc::new(ApiState {
        service: Service {
            admission: authority
                .clone()
                .map(|authority| kat_apiserver::service::Admission {
                    node: node.clone(),
                    authority,
                    etcd: Some(etcd_store.clone()),
                }),
            api_endpoint: Some(endpoint.clone()),
            backups: Some(kat_apiserver::service::BackupTarget {
                etcd: etcd_store.clone(),
                config: backup_config(cluster, &node),
            }),
            ..Service::new(store.clone(), events, clock, cluster.clone())
        },
        token_sha256,
        access: Arc::new(ClusterAccess {
            local: LocalAccess {
                node: node.clone(),
                runtime: base.runtime.clone(),
                builds: base.builds.clone(),
                kept: Some(base.kept.clone()),
            },
            store: store.clone(),
            api_port: cluster.spec.api_port,
            client: node_client(pki)?,
        }),
        metrics,
        limiter: http::default_rate_limiter(),
    });
    let bind = SocketAddr::new(options.api_bind, cluster.spec.api_port as u16);
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| {
        format!("cannot listen on {bind} (apiPort in cluster.kat; is another agent running?)")
    })?;
    let tls =
        server::tls_config_with_clients(&pki.node_cert_pem, &pki.node_key_pem, Some(&pki.ca_pem))?;
    tasks.spawn(server::serve(listener, tls, http::router(state.clone())));

    if let Some(token) = &options.first_join_token {
        announce_join_token(&state.service, token, &endpoint).await?;
    }
    let client_path = options
        .client_config
        .clone()
        .unwrap_or_else(ClientConfig::default_path);
    if let Some(token) = &pki.token {
        write_client_config(
            &client_path,
            &ClientConfig {
                endpoint: format!("https://127.0.0.1:{}", cluster.spec.api_port),
                cluster_name: cluster.metadata.name.clone(),
                ca_certificate: pki.ca_pem.clone(),
                token: token.clone(),
                node_api: None,
            },
        )?;
        eprintln!(
            "kat-agent: katcall config written to {}",
            client_path.display()
        );
    }
    eprintln!("kat-agent: node {node} is up; API at {endpoint}");
    Ok(etcd)
}

/// The cluster's first keys, written only where absent (a resumed node changes nothing).
pub(crate) async fn first_state(
    store: &dyn StateStore,
    cluster: &ClusterConfiguration,
    token: &str,
) -> Result<()> {
    let hash = hex::encode(http::token_sha256(token));
    let puts = [
        (
            keys::CLUSTER_UID,
            format!("{:032x}", rand::random::<u128>()).into_bytes(),
        ),
        (
            keys::SCHEMA_VERSION,
            keys::SCHEMA_VERSION_VALUE.as_bytes().to_vec(),
        ),
        (keys::CLUSTER_CONFIG, serde_json::to_vec(cluster)?),
        (keys::ADMIN_TOKEN_SHA256, hash.into_bytes()),
    ];
    for (key, value) in puts {
        let txn = Txn::new()
            .when([Compare::absent(key)])
            .and_then([TxnOp::put(key, value)]);
        store
            .txn(txn)
            .await
            .with_context(|| format!("writing {key}"))?;
    }
    Ok(())
}

async fn stored_token_hash(store: &dyn StateStore) -> Result<[u8; 32]> {
    let kv = store
        .get(keys::ADMIN_TOKEN_SHA256)
        .await?
        .context("the cluster has no admin token hash")?;
    let text = String::from_utf8_lossy(&kv.value);
    let mut out = [0u8; 32];
    if text.len() != 64 {
        bail!("the stored admin token hash is malformed");
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16)
            .context("the stored admin token hash is malformed")?;
    }
    Ok(out)
}

pub(crate) fn write_client_config(path: &Path, config: &ClientConfig) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    pki::write_secret(path, &yaml_serde::to_string(config)?)
}

/// Campaign for leadership; while leading, run the controllers, and the backup schedule
/// and the rejoin listener when given. Forever.
pub(crate) async fn leader_role(
    store: Arc<dyn StateStore>,
    cluster: ClusterConfiguration,
    node: String,
    endpoint: String,
    metrics: Arc<Metrics>,
    backups: Option<(EtcdStore, kat_leader::backups::BackupConfig)>,
    rejoin: Option<crate::rejoin_listener::RejoinListener>,
) {
    // Short: a killed leader (kill -9, a crash) is replaced within seconds.
    let ttl = Duration::from_secs(3);
    loop {
        let leadership = match campaign(store.clone(), keys::LEADER_ELECTION, &endpoint, ttl).await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "election failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!("this node leads the cluster");
        metrics.set_leader(true);
        // Where the leader's API is (what workers and katcall redirect to) and which node
        // it is (`katcall get nodes`), both under the lease: they go with the leadership.
        let record = kat_api::wire::LeaderRecord {
            node: node.clone(),
            endpoint: endpoint.clone(),
            since: rfc3339(SystemTime::now()),
        };
        let recorded = match serde_json::to_vec(&record) {
            Ok(value) => store
                .txn(kat_store::Txn::new().and_then([
                    kat_store::TxnOp::put_leased(
                        keys::LEADER_ENDPOINT,
                        endpoint.clone().into_bytes(),
                        leadership.lease(),
                    ),
                    kat_store::TxnOp::put_leased(keys::LEADER, value, leadership.lease()),
                ]))
                .await
                .map(|_| ())
                .map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::Error::from(e)),
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot record the leader endpoint");
        }
        let config = LeaderConfig::from_cluster(&cluster.spec);
        // The backup schedule and the rejoin listener run while this node leads.
        let mut duties = tokio::task::JoinSet::new();
        if let Some((etcd, config)) = &backups {
            duties.spawn(kat_leader::backups::run(
                etcd.clone(),
                store.clone(),
                config.clone(),
                metrics.clone(),
            ));
        }
        if let Some(listener) = &rejoin {
            duties.spawn(listener.clone().run());
        }
        match Leader::start(
            store.clone(),
            config,
            Clock::system(),
            Some(leadership.fence()),
        )
        .await
        {
            Ok(leader) => {
                let leader = leader.with_metrics(metrics.clone());
                if let Err(e) = leader
                    .run(
                        &leadership,
                        Duration::from_secs(1),
                        Duration::from_millis(5),
                    )
                    .await
                {
                    tracing::warn!(error = %e, "leader loop ended");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot start the leader"),
        }
        duties.shutdown().await;
        metrics.set_leader(false);
        let _ = leadership.resign().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where and how often this node writes backups, from `cluster.kat`.
fn backup_config(cluster: &ClusterConfiguration, node: &str) -> kat_leader::backups::BackupConfig {
    kat_leader::backups::BackupConfig {
        cluster: cluster.metadata.name.clone(),
        node: node.to_string(),
        dir: PathBuf::from(&cluster.spec.backup_path),
        interval: Duration::from_secs(u64::from(cluster.spec.backup_interval_minutes.max(1)) * 60),
        retention: cluster.spec.backup_retention.max(1) as usize,
    }
}

/// The client URLs of etcd members, from an `--initial-cluster` list (`name=https://IP:PEER`),
/// with the cluster's client port.
fn member_client_urls(initial: &str, client_port: u32) -> Vec<(String, String)> {
    initial
        .split(',')
        .filter_map(|m| {
            let (name, peer) = m.split_once('=')?;
            let (host, _) = peer.rsplit_once(':')?;
            Some((name.to_string(), format!("{host}:{client_port}")))
        })
        .collect()
}

/// A node that joined the quorum as a learner serves no client until it is promoted: wait
/// for that, asking the other members (the leader promotes learners once they caught up).
async fn wait_for_promotion(
    initial: &str,
    node: &str,
    cluster: &ClusterConfiguration,
    tls: &EtcdTls,
) -> Result<()> {
    let others: Vec<String> = member_client_urls(initial, cluster.spec.etcd_client_port)
        .into_iter()
        .filter(|(name, _)| name != node)
        .map(|(_, url)| url)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut next_word = started;
    loop {
        let members = match EtcdStore::connect(&others, Some(tls)).await {
            Ok(s) => s.members().await.map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::Error::from(e)),
        };
        match members {
            Ok(list) => {
                if list
                    .iter()
                    .any(|(name, _, learner)| name == node && !learner)
                {
                    return Ok(());
                }
            }
            Err(e) => tracing::warn!(error = %e, "asking the other etcd members about this node"),
        }
        if std::time::Instant::now() >= next_word {
            let waited = started.elapsed().as_secs();
            if waited == 0 {
                eprintln!(
                    "kat-agent: waiting for this node's etcd member to catch up and be promoted"
                );
            } else {
                // Workloads run meanwhile from the local copy; the API waits for etcd.
                eprintln!(
                    "kat-agent: this node's etcd member is still a learner after {waited} s: the leader promotes it once it has caught up; check the other members (etcdctl member list, their etcd.log) if this goes on"
                );
            }
            next_word += Duration::from_secs(60);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Rewrite the revocation list whenever the set of removed nodes changes (checked every 3 s);
/// etcd reads it at every new connection.
async fn keep_revocation_list(store: Arc<dyn StateStore>, ca: Arc<Authority>, path: PathBuf) {
    let mut written: Option<Vec<String>> = None;
    loop {
        if let Ok(list) = store.list(keys::revoked_nodes()).await {
            let mut serials: Vec<String> = list
                .kvs
                .iter()
                .filter_map(|kv| {
                    serde_json::from_slice::<kat_api::wire::RevokedNode>(&kv.value).ok()
                })
                .filter_map(|r| r.serial)
                .collect();
            serials.sort();
            if written.as_ref() != Some(&serials) {
                let crl = ca.crl(&serials);
                let path2 = path.clone();
                let wrote = tokio::task::spawn_blocking(move || {
                    let crl = crl.map_err(|e| std::io::Error::other(e.to_string()))?;
                    kat_runtime::state_file::write_atomic(&path2, crl.as_bytes(), 0o644)
                })
                .await;
                match wrote {
                    Ok(Ok(())) => {
                        tracing::info!(revoked = serials.len(), "revocation list written");
                        written = Some(serials);
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the revocation list"),
                    Err(e) => tracing::warn!(error = %e, "cannot write the revocation list"),
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Store the first join token (a worker token) and say how to add a node, and how to make
/// a control-plane token for an etcd member.
async fn announce_join_token(service: &Service, token: &JoinToken, endpoint: &str) -> Result<()> {
    let role = kat_api::wire::JoinRole::Worker;
    let stored = service
        .store_join_token(
            token,
            &kat_apiserver::service::JoinTokenOptions {
                role,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("storing the first join token: {e}"))?;
    let api = endpoint.trim_start_matches("https://");
    let hours = role.default_ttl().as_secs() / 3600;
    eprintln!(
        "kat-agent: worker join token (valid {hours} h, any number of worker nodes; `katcall create join-token` makes more):\n  {}\n\
         kat-agent: to add a worker, save the token on the new node in a file only its user can read (e.g. join.token, mode 0600), then run:\n  \
         kat-agent join --leader-api {api} --token-file join.token --ca-pin {} --advertise-address IP\n\
         kat-agent: an etcd member (--etcd-peer) needs a control-plane token: `katcall create join-token --control-plane` (valid 1 h)",
        stored.token, stored.ca_pin
    );
    Ok(())
}
