//! A detached node's own one-node cluster (RFC 001 §4.9): an etcd of its own on loopback,
//! under mutual TLS with a CA made for it alone (`{data}/detached/pki`, never the cluster's),
//! the leader's controllers, and the full API, in which every workload is pinned to this
//! node. Its state lives in `{data}/detached/` and survives an agent restart; the directory
//! goes (kept as `detached.previous`) once the node has rejoined.
//!
//! The workloads the node ran for its parent keep running from the parent's last snapshot;
//! the local cluster's own instances join them (see `kat_node::detached::merge_feeds`). The local cluster
//! is given the node's parent subnet, and sees the parent's containers in the heartbeats, so
//! its addresses never collide with theirs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use kat_api::client_config::ClientConfig;
use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::Detachment;
use kat_apiserver::http;
use kat_apiserver::Service;
use kat_leader::metrics::Metrics;
use kat_leader::Clock;
use kat_pki::{NodeRole, Pki};
use kat_runtime::ContainerRuntime;
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, EtcdTls, StateStore};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::roles::assembly::{AdminToken, Assembled, Assembly};
use crate::roles::NodeWork;
use kat_api::wire::{ErrorCode, InstanceId};
use kat_apiserver::http::ApiError;
use kat_node::detached::{self as detaching, LocalWorkload};
use kat_node::link::StoreLink;
use kat_node::supervisor::assignments::{Snapshot, Source};
use kat_node::supervisor::builds::Builds;
use kat_node::supervisor::Statuses;

/// What the local cluster keeps between agent restarts: `{data}/detached/state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DetachedState {
    pub parent_cluster: String,
    pub since: kat_api::wire::Timestamp,
    pub etcd_client_url: String,
    pub etcd_peer_url: String,
    /// The subnet the parent gave this node, which its bridge and containers use.
    #[serde(default)]
    pub subnet: Option<String>,
}

/// What the node lends its local cluster.
#[derive(Clone)]
pub struct NodeParts {
    pub node: kat_api::wire::NodeName,
    pub root: PathBuf,
    pub cluster: ClusterConfiguration,
    /// The node's certificate and the cluster CA (its API keeps serving with them).
    pub pki: Arc<Pki>,
    pub advertise: String,
    pub node_type: Option<String>,
    pub etcd_binary: PathBuf,
    pub runtime: Arc<dyn ContainerRuntime>,
    pub builds: Builds,
    pub statuses: watch::Receiver<Statuses>,
    pub tick: Duration,
    /// Towards other nodes (the local cluster's own API calls): any node certificate.
    pub client: reqwest::Client,
    /// Where resolving a git branch may connect (`kat-agent --allow-fetch-from`).
    pub outbound: kat_outbound::OutboundPolicy,
}

pub struct LocalCluster {
    pub dir: PathBuf,
    pub state: DetachedState,
    pub store: Arc<dyn StateStore>,
    /// The local cluster's full API (pinning every workload to this node).
    pub router: Router,
    /// Where `katcall` finds the local cluster.
    pub client_config: PathBuf,
    /// The node's link to it (its DNS records).
    pub link: Arc<StoreLink>,
    node: String,
    etcd: EtcdServer,
    tasks: tokio::task::JoinSet<()>,
}

/// `{data}/detached`.
pub fn dir(root: &Path) -> PathBuf {
    kat_node::layout::Layout::new(root).detached()
}

pub fn state_file(root: &Path) -> PathBuf {
    dir(root).join("state.json")
}

impl LocalCluster {
    /// Start (or, after an agent restart, resume) the local cluster; its instances go to
    /// `feed`.
    pub async fn start(
        parts: &NodeParts,
        parent_cluster: &str,
        parent_subnet: Option<String>,
        feed: watch::Sender<Option<(Source, Snapshot)>>,
    ) -> Result<LocalCluster> {
        let dir = dir(&parts.root);
        let state = prepare(&dir, parent_cluster, parent_subnet).await?;
        let pki_dir = dir.join("pki");
        let local_pki = {
            let (pki_dir, node) = (pki_dir.clone(), parts.node.clone());
            tokio::task::spawn_blocking(move || -> Result<Pki> {
                if pki_dir.join("ca.crt").exists() {
                    Pki::load(&pki_dir)
                } else {
                    let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
                    Pki::generate(&pki_dir, &format!("{node} detached"), &node, &[loopback])
                }
            })
            .await??
        };
        let token = local_pki
            .token
            .clone()
            .context("the local cluster's PKI has no admin token")?;
        let tls = EtcdTls {
            ca_file: local_pki.ca_file.clone(),
            cert_file: local_pki.cert_file.clone(),
            key_file: local_pki.key_file.clone(),
            crl_file: None,
            member_name: Some(kat_pki::ETCD_MEMBER_NAME.to_string()),
        };
        let config = |state: &DetachedState| EtcdServerConfig {
            binary: parts.etcd_binary.clone(),
            name: parts.node.to_string(),
            data_dir: dir.join("etcd"),
            client_url: state.etcd_client_url.clone(),
            peer_url: state.etcd_peer_url.clone(),
            log_file: dir.join("etcd.log"),
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            tls: Some(tls.clone()),
            join: None,
        };
        let mut state = state;
        let etcd = match EtcdServer::start(config(&state)).await {
            Ok(etcd) => etcd,
            // Its loopback ports may have been taken since (another local user, after a
            // reboot): new ones, then once more.
            Err(first) => {
                tracing::warn!(error = %first, "the local etcd does not start on its ports; trying new ones");
                state = new_ports(&dir, state).await?;
                EtcdServer::start(config(&state))
                    .await
                    .context("starting the local cluster's etcd")?
            }
        };
        let store: Arc<dyn StateStore> = Arc::new(
            EtcdStore::connect(std::slice::from_ref(&state.etcd_client_url), Some(&tls))
                .await
                .context("connecting to the local cluster's etcd")?,
        );
        let node = &parts.node;
        let mut tasks = tokio::task::JoinSet::new();
        let outbound = parts.outbound.clone();
        let Assembled { link, api } = Assembly {
            store: store.clone(),
            cluster: parts.cluster.clone(),
            address: parts.advertise.clone(),
            role: NodeRole::Worker,
            node_type: parts.node_type.clone(),
            admin_token: AdminToken::Own(token.clone()),
            subnet: state.subnet.clone(),
            state_dir: dir.clone(),
            feed,
            work: NodeWork {
                node: node.clone(),
                root: parts.root.clone(),
                runtime: parts.runtime.clone(),
                builds: parts.builds.clone(),
                statuses: parts.statuses.clone(),
                tick: parts.tick,
                kept: None,
                overlay: None,
                last_heartbeat: Arc::new(tokio::sync::watch::channel(None).0),
                gpus: vec![],
            },
            detachment: Some(Detachment {
                parent_cluster: state.parent_cluster.clone(),
                since: state.since,
            }),
            endpoint: format!("https://127.0.0.1:{}", parts.cluster.spec.api_port),
            metrics: Arc::new(Metrics::default()),
            client: parts.client.clone(),
            network: None,
        }
        // No duties while leading: the local cluster takes no backups and hears no rejoins.
        .start(
            &mut tasks,
            |_| {},
            |service| Service {
                pin_to_node: Some(node.to_string()),
                outbound: outbound.clone(),
                ..service
            },
        )
        .await?;
        let client_config = dir.join("katcall.yaml");
        let config = ClientConfig {
            endpoint: format!(
                "https://{}:{}",
                kat_api::wire::url_host(&parts.advertise),
                parts.cluster.spec.api_port
            ),
            cluster_name: format!("{} (detached {node})", state.parent_cluster),
            ca_certificate: parts.pki.ca_pem.clone(),
            token,
            // Served with this node's own (worker) certificate.
            node_api: Some(node.to_string()),
        };
        let path = client_config.clone();
        tokio::task::spawn_blocking(move || crate::node::write_client_config(&path, &config))
            .await??;
        Ok(LocalCluster {
            dir,
            state,
            store,
            router: http::router(api),
            client_config,
            link,
            node: node.to_string(),
            etcd,
            tasks,
        })
    }

    /// Every workload of the local cluster, with its files as stored.
    pub async fn workloads(&self) -> Result<Vec<LocalWorkload>> {
        let list = self.store.list(keys::all_workloads_desired()).await?;
        let mut out: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>> = BTreeMap::new();
        for kv in list.kvs {
            if let Some(keys::Key::WorkloadManifest { ns, name, file }) = keys::parse(&kv.key) {
                out.entry((ns.to_string(), name.to_string()))
                    .or_default()
                    .insert(file.to_string(), kv.value);
            }
        }
        Ok(out
            .into_iter()
            .map(|((namespace, name), files)| LocalWorkload {
                namespace,
                name,
                files,
            })
            .collect())
    }

    /// What ended among its tasks (the leader, the feed, the heartbeat), if anything did.
    pub fn ended(&mut self) -> Option<String> {
        match self.tasks.try_join_next()? {
            Ok(()) => Some("a task returned".into()),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Stop its leader, its feed and its heartbeat; its store stays up.
    pub async fn stop_controllers(&mut self) {
        self.tasks.shutdown().await;
    }

    /// Remove workload `ns/name` and its instance records from the local store (it has gone
    /// to the parent), so that a local cluster started again never runs it.
    pub async fn forget(&self, ns: &str, name: &str) -> Result<()> {
        let clock = Clock::system();
        let events = kat_leader::events::EventLog::new(16);
        // Gone already (an earlier, cut-short attempt): fine.
        match kat_leader::desired::workloads::delete(&*self.store, &events, &clock, ns, name).await
        {
            Ok(()) | Err(kat_leader::desired::workloads::WorkloadError::NotFound(..)) => {}
            Err(e) => return Err(e.into()),
        }
        let records = self.store.list(&keys::node_instances(&self.node)).await?;
        let ops: Vec<kat_store::TxnOp> = records
            .kvs
            .into_iter()
            .filter(|kv| {
                kat_store::decode_or_skip::<kat_api::wire::InstanceRecord>(kv)
                    .is_some_and(|r| r.namespace == ns && r.workload == name)
            })
            .map(|kv| kat_store::TxnOp::delete(kv.key))
            .collect();
        if !ops.is_empty() {
            self.store.txn(kat_store::Txn::new().and_then(ops)).await?;
        }
        Ok(())
    }

    /// Stop it; its state stays in `{data}/detached` until [`retire`].
    pub async fn stop(mut self) -> PathBuf {
        self.tasks.shutdown().await;
        self.etcd.stop().await;
        self.dir
    }
}

/// After the rejoin: `{data}/detached` becomes `{data}/detached.previous` (the one before it
/// goes), so that nothing of it starts again.
pub async fn retire(dir: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || -> Result<()> {
        let previous = dir.with_file_name("detached.previous");
        let moved = match std::fs::remove_dir_all(&previous) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(anyhow::Error::new(e).context(format!("cannot remove {}", previous.display())))
            }
            _ => std::fs::rename(&dir, &previous).map_err(|e| {
                anyhow::Error::new(e).context(format!("cannot move {} aside", dir.display()))
            }),
        };
        if moved.is_err() {
            // At least its state file goes, or the node would take itself for detached.
            let _ = std::fs::remove_file(dir.join("state.json"));
        }
        moved
    })
    .await?
}

/// Free loopback ports for the local etcd, written to the state file.
async fn new_ports(dir: &Path, state: DetachedState) -> Result<DetachedState> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<DetachedState> {
        let (etcd_client_url, etcd_peer_url) = loopback_urls(&dir)?;
        let state = DetachedState {
            etcd_client_url,
            etcd_peer_url,
            ..state
        };
        write_state(&dir, &state)?;
        Ok(state)
    })
    .await?
}

/// Free loopback client and peer URLs (TLS) for the local etcd.
fn loopback_urls(dir: &Path) -> Result<(String, String)> {
    let ports = EtcdServerConfig::loopback("local", dir)?;
    Ok((
        ports.client_url.replace("http://", "https://"),
        ports.peer_url.replace("http://", "https://"),
    ))
}

fn write_state(dir: &Path, state: &DetachedState) -> Result<()> {
    let file = dir.join("state.json");
    kat_runtime::state_file::write_atomic(&file, &serde_json::to_vec_pretty(state)?, 0o600)
        .with_context(|| format!("cannot write {}", file.display()))
}

/// The directory and its state file: read back after a restart, else new (free loopback
/// ports for the local etcd, which keep from then on).
async fn prepare(
    dir: &Path,
    parent_cluster: &str,
    subnet: Option<String>,
) -> Result<DetachedState> {
    let dir = dir.to_path_buf();
    let parent_cluster = parent_cluster.to_string();
    tokio::task::spawn_blocking(move || -> Result<DetachedState> {
        let file = dir.join("state.json");
        if let Ok(bytes) = std::fs::read(&file) {
            // The local cluster's own state file, not a stored record.
            #[allow(clippy::disallowed_methods)]
            let state = serde_json::from_slice(&bytes);
            return state.with_context(|| {
                format!(
                    "{} is corrupt (move it aside to start the local cluster afresh)",
                    file.display()
                )
            });
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let (etcd_client_url, etcd_peer_url) = loopback_urls(&dir)?;
        let state = DetachedState {
            parent_cluster,
            since: kat_api::wire::Timestamp::now(),
            etcd_client_url,
            etcd_peer_url,
            subnet,
        };
        write_state(&dir, &state)?;
        Ok(state)
    })
    .await?
}

/// What a local cluster changes in the node while it runs: the API the node serves, the
/// supervisor's feed of local instances and the node network's link for DNS.
pub struct NodeSwitches {
    /// The local cluster's instances, merged with the parent's by
    /// `kat_node::detached::merge_feeds`.
    pub local_feed: watch::Sender<Option<(Source, Snapshot)>>,
    /// The API the node serves: its worker API, or its local cluster's while detached.
    pub routers: watch::Sender<Router>,
    /// The node's worker API.
    pub worker_router: Router,
    /// The local cluster's link, for the node network's DNS (`kat_node::detached::uplink`).
    pub local_link: watch::Sender<Option<Arc<StoreLink>>>,
}

/// The agent's local clusters for `kat_node::detached::Detacher`.
pub struct DetachedClusters {
    /// What the node lends them.
    pub parts: NodeParts,
    /// The cluster the node belongs to.
    pub parent_cluster: String,
    /// What they switch.
    pub switches: Arc<NodeSwitches>,
}

/// A running local cluster and what it switched.
pub struct Running {
    cluster: Option<LocalCluster>,
    switches: Arc<NodeSwitches>,
}

#[async_trait::async_trait]
impl detaching::LocalClusters for DetachedClusters {
    type Cluster = Running;

    async fn left_over(&self) -> bool {
        tokio::fs::try_exists(state_file(&self.parts.root))
            .await
            .unwrap_or(false)
    }

    async fn start(&self, subnet: Option<String>, why: &str) -> Result<Running> {
        let cluster = LocalCluster::start(
            &self.parts,
            &self.parent_cluster,
            subnet,
            self.switches.local_feed.clone(),
        )
        .await?;
        let _ = self.switches.routers.send_replace(cluster.router.clone());
        self.switches
            .local_link
            .send_replace(Some(cluster.link.clone()));
        eprintln!(
            "kat-agent: node {} is detached from {} since {}: {why}. Its workloads keep running; new ones go to its own API (KAT_CONFIG={} katcall apply …) and are pinned to it. It rejoins by itself.",
            self.parts.node,
            self.parent_cluster,
            cluster.state.since,
            cluster.client_config.display()
        );
        Ok(Running {
            cluster: Some(cluster),
            switches: self.switches.clone(),
        })
    }

    fn rejoined(&self) {
        let _ = self
            .switches
            .routers
            .send_replace(self.switches.worker_router.clone());
    }

    async fn retire(&self) {
        if let Err(e) = retire(dir(&self.parts.root)).await {
            tracing::warn!(error = %format!("{e:#}"), "cannot move the local cluster's state aside");
        }
    }
}

#[async_trait::async_trait]
impl detaching::LocalCluster for Running {
    fn ended(&mut self) -> Option<String> {
        self.cluster.as_mut()?.ended()
    }

    async fn close(&mut self) -> Vec<InstanceId> {
        if let Some(cluster) = &self.cluster {
            let _ = self
                .switches
                .routers
                .send_replace(rejoining_router(&cluster.node));
        }
        if let Some(cluster) = &mut self.cluster {
            cluster.stop_controllers().await;
        }
        let own: Vec<InstanceId> = self
            .switches
            .local_feed
            .borrow()
            .as_ref()
            .map(|(_, s)| s.keys().cloned().collect())
            .unwrap_or_default();
        self.switches.local_feed.send_replace(None);
        self.switches.local_link.send_replace(None);
        own
    }

    async fn workloads(&self) -> Result<Vec<LocalWorkload>> {
        match &self.cluster {
            Some(cluster) => cluster.workloads().await,
            None => Ok(Vec::new()),
        }
    }

    async fn forget(&mut self, ns: &str, name: &str) -> Result<()> {
        match &self.cluster {
            Some(cluster) => cluster.forget(ns, name).await,
            None => Ok(()),
        }
    }

    async fn stop(mut self) {
        if let Some(cluster) = self.cluster.take() {
            cluster.stop().await;
        }
    }
}

/// The API while the node rejoins: nothing is taken (a workload applied now would be lost).
fn rejoining_router(node: &str) -> Router {
    let message = format!(
        "node {node} is rejoining its parent cluster; apply there in a moment (its workloads move there too)"
    );
    Router::new().fallback(move || {
        let message = message.clone();
        async move { ApiError::new(ErrorCode::Unavailable, message) }
    })
}
