//! The one assembly of a control plane on a store, used by a control-plane node (on the
//! cluster's etcd) and by a detached node's local cluster (on its own etcd): the cluster's
//! first state, the system namespaces, this node's registration, its feed and heartbeat
//! through a [`StoreLink`], the election loop with its duties, and the API's state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::Detachment;
use kat_apiserver::http::{self, ApiState};
use kat_apiserver::Service;
use kat_leader::desired::{namespaces, node_admin};
use kat_leader::election::{self, Candidate};
use kat_leader::metrics::Metrics;
use kat_leader::Clock;
use kat_pki::NodeRole;
use kat_store::{Compare, StateStore, StoreError, Txn, TxnOp};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{NetworkStart, NodeWork};
use kat_node::exec_logs::local::LocalAccess;
use kat_node::exec_logs::relay::ClusterAccess;
use kat_node::link::StoreLink;
use kat_node::supervisor::assignments::{Feed, Snapshot, Source};

/// What a control plane is assembled from.
pub struct Assembly {
    pub store: Arc<dyn StateStore>,
    pub cluster: ClusterConfiguration,
    /// This node's address, as registered.
    pub address: String,
    /// The role label this node is registered with.
    pub role: NodeRole,
    /// `--node-type`: the node's `kat.dws.rip/nodeType` label.
    pub node_type: Option<String>,
    /// The admin token the API checks, and whether this node may initialize the store.
    pub admin_token: AdminToken,
    /// The subnet this node keeps, written before the leader first runs (a detached node
    /// keeps the one its parent gave it).
    pub subnet: Option<String>,
    /// Where the feed keeps its local copy of the assignments.
    pub state_dir: PathBuf,
    pub feed: watch::Sender<Option<(Source, Snapshot)>>,
    pub work: NodeWork,
    /// Set on a detached node's local cluster: its heartbeats say so.
    pub detachment: Option<Detachment>,
    /// This node's API, where the leader is found when this node leads.
    pub endpoint: String,
    pub metrics: Arc<Metrics>,
    /// Towards other nodes (logs and exec of their instances).
    pub client: reqwest::Client,
    /// The node network, told about the store link as soon as there is one.
    pub network: Option<NetworkStart>,
}

/// Which admin token the API accepts.
pub enum AdminToken {
    /// The cluster's, as its store keeps it (a hash, written by the first node's init);
    /// `first`: the token this node holds, written as the first state where absent.
    Stored { first: Option<String> },
    /// A token of this node's own (a detached node's local cluster): written as the first
    /// state where absent, and checked as given, whatever the store holds.
    Own(String),
}

/// A running control plane: the node's link to its store and the state its API serves.
pub struct Assembled {
    pub link: Arc<StoreLink>,
    pub api: Arc<ApiState>,
}

impl Assembly {
    /// Write what a fresh store needs, register the node, and start the feed, the heartbeat
    /// and the election loop in `tasks`. `duties` spawns what runs while this node leads;
    /// `service` completes the API's service layer (admission, backups, pinning).
    pub async fn start<D>(
        self,
        tasks: &mut JoinSet<()>,
        duties: D,
        service: impl FnOnce(Service) -> Service,
    ) -> Result<Assembled>
    where
        D: Fn(&mut JoinSet<()>) + Send + 'static,
    {
        let Assembly {
            store,
            cluster,
            address,
            role,
            node_type,
            admin_token,
            subnet,
            state_dir,
            feed,
            work,
            detachment,
            endpoint,
            metrics,
            client,
            network,
        } = self;
        let node = work.node.clone();
        let first = match &admin_token {
            AdminToken::Stored { first } => first.as_deref(),
            AdminToken::Own(token) => Some(token.as_str()),
        };
        if let Some(token) = first {
            first_state(&*store, &cluster, token).await?;
        }
        let clock = Clock::system();
        for ns in kat_api::namespace::SYSTEM_NAMESPACES {
            while_the_store_elects(ns, namespace_store_unavailable, || {
                namespaces::create(&*store, &clock, ns, true)
            })
            .await?;
        }
        let labels = kat_apiserver::service::node_labels(&node, role, node_type.as_deref());
        while_the_store_elects(&node, registration_store_unavailable, || {
            node_admin::register(&*store, &node, vec![address.clone()], labels.clone())
        })
        .await?;
        if let Some(subnet) = subnet {
            // Before the leader first runs, so that it keeps the node's own subnet.
            let key = keys::node_subnet(&node);
            let txn = || {
                Txn::new()
                    .when([Compare::absent(&key)])
                    .and_then([TxnOp::put(&key, subnet.clone().into_bytes())])
            };
            while_the_store_elects(&key, store_unavailable, || store.txn(txn())).await?;
        }

        let link = Arc::new(StoreLink::new(
            store.clone(),
            &node,
            cluster.spec.wireguard_port,
        ));
        if let Some(network) = network {
            network.connect(link.clone());
        }
        tasks.spawn(Feed::new(link.clone(), &state_dir).run(feed));
        tasks.spawn(work.heartbeat(link.clone(), detachment));
        tasks.spawn(election::lead_forever(
            store.clone(),
            Candidate {
                node: node.to_string(),
                endpoint,
                cluster: cluster.clone(),
                metrics: metrics.clone(),
            },
            duties,
        ));

        let token_sha256 = match &admin_token {
            AdminToken::Stored { .. } => stored_token_hash(&*store).await?,
            AdminToken::Own(token) => http::token_sha256(token),
        };
        let events = kat_leader::events::EventLog::new(kat_leader::events::DEFAULT_CAPACITY);
        let api = Arc::new(ApiState {
            service: service(Service::new(store.clone(), events, clock, cluster.clone())),
            token_sha256,
            access: Arc::new(ClusterAccess {
                local: LocalAccess {
                    node,
                    runtime: work.runtime.clone(),
                    builds: work.builds.clone(),
                    kept: work.kept.clone(),
                },
                store,
                api_port: cluster.spec.api_port,
                client,
            }),
            metrics,
            limiter: http::default_rate_limiter(),
        });
        Ok(Assembled { link, api })
    }
}

/// The cluster's first keys, written only where absent (a resumed node changes nothing).
async fn first_state(
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
        let txn = || {
            Txn::new()
                .when([Compare::absent(key)])
                .and_then([TxnOp::put(key, value.clone())])
        };
        while_the_store_elects(key, store_unavailable, || store.txn(txn()))
            .await
            .with_context(|| format!("writing {key}"))?;
    }
    Ok(())
}

/// How long a starting node waits for etcd to have a leader again.
const ELECTION_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `request` until the store answers, while its error says the store is unavailable
/// (`unavailable`), for at most [`ELECTION_PATIENCE`]: a node that starts while another
/// member is lost and etcd elects a new leader gets "request timed out" for a few seconds,
/// and must not give up. Every start-up write is idempotent (written only where absent).
async fn while_the_store_elects<T, E, F, Fut>(
    what: &str,
    unavailable: fn(&E) -> bool,
    mut request: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + ELECTION_PATIENCE;
    let mut pause = Duration::from_millis(200);
    loop {
        match request().await {
            Err(e) if unavailable(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(what, error = %e, "the state store is unavailable (an election?); trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

fn store_unavailable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_))
}

fn namespace_store_unavailable(e: &namespaces::NamespaceError) -> bool {
    matches!(
        e,
        namespaces::NamespaceError::Store(StoreError::Unavailable(_))
    )
}

fn registration_store_unavailable(e: &node_admin::NodeAdminError) -> bool {
    matches!(
        e,
        node_admin::NodeAdminError::Store(StoreError::Unavailable(_))
    )
}

/// The admin token's SHA-256 as the store keeps it (hex).
async fn stored_token_hash(store: &dyn StateStore) -> Result<[u8; 32]> {
    let kv = while_the_store_elects(keys::ADMIN_TOKEN_SHA256, store_unavailable, || {
        store.get(keys::ADMIN_TOKEN_SHA256)
    })
    .await?
    .context("the cluster has no admin token hash")?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(&kv.value, &mut out)
        .context("the stored admin token hash is malformed")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_starting_node_waits_out_an_election_and_no_other_error() {
        let calls = AtomicU32::new(0);
        let answer = while_the_store_elects("k", store_unavailable, || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(StoreError::Unavailable("request timed out".into())),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(answer.ok(), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = while_the_store_elects("k", store_unavailable, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Unavailable("no leader".into()))
        })
        .await;
        assert!(matches!(answer, Err(StoreError::Unavailable(_))));
        let tries = calls.load(Ordering::SeqCst);
        assert!((25..=40).contains(&tries), "gave up after {tries} tries");

        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = while_the_store_elects("k", store_unavailable, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Backend("permission denied".into()))
        })
        .await;
        assert!(answer.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "only unavailability is waited out"
        );
    }
}
