//! This node's etcd member: started (and supervised by `kat_store::EtcdServer`) with mutual
//! TLS from the cluster CA, promoted from learner once it caught up, and, on a node that
//! holds the CA key, the revocation list etcd checks at every new connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::url_host;
use kat_leader::metrics::Metrics;
use kat_pki::{self as pki, Authority};
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, EtcdTls, StateStore};

use crate::layout::{Layout, NodeIdentity};

/// A running member and how to reach it.
pub struct Member {
    /// The supervised etcd process.
    pub server: EtcdServer,
    /// A client of this member only (its one endpoint), over mutual TLS.
    pub store: EtcdStore,
    /// The CA, on a node that holds its key (it signs joins and the revocation list).
    pub authority: Option<Arc<Authority>>,
}

/// One entry of etcd's `--initial-cluster` list: `name=https://IP:PEER_PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    /// The member's name (its node's name).
    pub name: String,
    /// `https://IP` (the peer URL without its port).
    pub host: String,
}

impl InitialMember {
    /// The members of an `--initial-cluster` list; entries that are not `name=URL:PORT` are
    /// skipped (the list was written by the leader that answered the join).
    pub fn parse_list(initial: &str) -> Vec<InitialMember> {
        initial
            .split(',')
            .filter_map(|m| {
                let (name, peer) = m.split_once('=')?;
                let (host, _) = peer.rsplit_once(':')?;
                Some(InitialMember {
                    name: name.to_string(),
                    host: host.to_string(),
                })
            })
            .collect()
    }

    /// Its client URL, on the cluster's client port.
    pub fn client_url(&self, client_port: u32) -> String {
        format!("{}:{client_port}", self.host)
    }
}

/// The etcd binary: `--etcd-binary`, else `$ETCD_BIN`, else `etcd` from PATH.
pub fn binary(configured: Option<PathBuf>) -> PathBuf {
    configured
        .or_else(|| std::env::var_os("ETCD_BIN").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// Start this node's member; a node with workloads to keep (`keep_trying`) retries every
/// 5 s (they run from the local copy meanwhile), any other fails at once and says why. A
/// member that joined as a learner is waited for until promoted.
pub async fn start(
    layout: &Layout,
    identity: &NodeIdentity,
    cluster: &ClusterConfiguration,
    pki: &pki::Pki,
    binary: PathBuf,
    keep_trying: bool,
) -> Result<Member> {
    let node = &identity.node_name;
    let authority = match layout.ca_key().exists() {
        true => Some(Arc::new(Authority::load(&layout.pki())?)),
        false => None,
    };
    // A node that holds the CA keeps the revocation list etcd checks (empty at first).
    let crl_file = layout.crl();
    if let Some(ca) = &authority {
        if !crl_file.exists() {
            kat_runtime::state_file::write_atomic(&crl_file, ca.crl(&[])?.as_bytes(), 0o644)
                .with_context(|| format!("cannot write {}", crl_file.display()))?;
        }
    }
    let tls = EtcdTls {
        ca_file: pki.ca_file.clone(),
        cert_file: pki.cert_file.clone(),
        key_file: pki.key_file.clone(),
        crl_file: authority.is_some().then(|| crl_file.clone()),
        member_name: Some(pki::ETCD_MEMBER_NAME.to_string()),
    };
    let mut config = EtcdServerConfig::from_cluster(
        &cluster.spec,
        node,
        &url_host(&identity.advertise_address),
        &layout.root,
        tls.clone(),
    );
    config.join = identity.etcd_initial_cluster.clone();
    config.binary = binary;
    let server = loop {
        match EtcdServer::start(config.clone()).await {
            Ok(etcd) => break etcd,
            Err(e) if !keep_trying => return Err(anyhow::Error::new(e).context("starting etcd")),
            Err(e) => {
                tracing::error!(error = %e, "etcd does not start; workloads run from the local copy meanwhile; retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    if let Some(initial) = &identity.etcd_initial_cluster {
        wait_for_promotion(initial, node, cluster, &tls).await?;
    }
    let store = EtcdStore::connect(&[server.client_url().to_string()], Some(&tls))
        .await
        .context("connecting to etcd")?;
    Ok(Member {
        server,
        store,
        authority,
    })
}

impl Member {
    /// The member's upkeep while the node runs: learners promoted, the revocation list
    /// rewritten (on a node with the CA), etcd's health for `/metrics`.
    pub fn spawn_upkeep(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        store: Arc<dyn StateStore>,
        crl_file: PathBuf,
        metrics: Arc<Metrics>,
    ) {
        tasks.spawn(promote_learners(self.store.clone()));
        if let Some(ca) = self.authority.clone() {
            tasks.spawn(keep_revocation_list(store, ca, crl_file));
        }
        let probe = self.server.health_probe();
        // Health is a linearizable read from this member, on the member's own client (its
        // only endpoint is this member): no connection, and no TLS handshake, per probe.
        let member = self.store.clone();
        tasks.spawn(async move {
            loop {
                let read = tokio::time::timeout(HEALTH_TIMEOUT, member.get(HEALTH_KEY)).await;
                let healthy = matches!(read, Ok(Ok(_)));
                metrics.set_etcd(healthy, u64::from(probe.restarts()));
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }
}

/// The key etcd's health probe reads (absent: any answer is health) and how long it may take.
const HEALTH_KEY: &str = "/kat/health";
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// How soon a revocation list that could not be read or written is tried again.
const REVOCATION_RETRY: Duration = Duration::from_secs(3);
/// How often the removed nodes are read even without a change (a lost watch).
const REVOCATION_REREAD: Duration = Duration::from_secs(60);

/// How often the members are listed while a learner catches up (or after a failed listing):
/// a join waits for its promotion, and learners exist only while nodes join.
const LEARNER_POLL: Duration = Duration::from_millis(500);
/// With no learner, how often they are listed anyway: a learner added some other way than
/// `join` (`etcdctl member add`), or a lost watch.
const LEARNER_REREAD: Duration = Duration::from_secs(60);

/// Learners (nodes that joined the quorum) become voting members once they caught up. With
/// none, the loop waits for `join` to record one ([`keys::etcd_learners`]) instead of
/// listing the members on a clock.
async fn promote_learners(etcd: EtcdStore) {
    loop {
        // Read before the member list: a learner recorded after this revision wakes the
        // wait below; one recorded before is in the list.
        let revision = match etcd.list(keys::etcd_learners()).await {
            Ok(listing) => Some(listing.revision),
            Err(e) => {
                tracing::debug!(error = %e, "reading the etcd learners");
                None
            }
        };
        let waiting = match etcd.promote_learners().await {
            Ok(promotion) => {
                if !promotion.promoted.is_empty() {
                    let names = &promotion.promoted;
                    tracing::info!(?names, "promoted etcd learners to voting members");
                }
                promotion.waiting
            }
            Err(e) => {
                tracing::debug!(error = %e, "promoting etcd learners");
                1
            }
        };
        match revision {
            Some(revision) if waiting == 0 => {
                kat_store::changes::changed_after(
                    &etcd,
                    keys::etcd_learners(),
                    revision,
                    LEARNER_REREAD,
                )
                .await
            }
            _ => tokio::time::sleep(LEARNER_POLL).await,
        }
    }
}

/// A node that joined the quorum as a learner serves no client until it is promoted: wait
/// for that, asking the other members (the leader promotes learners once they caught up).
async fn wait_for_promotion(
    initial: &str,
    node: &str,
    cluster: &ClusterConfiguration,
    tls: &EtcdTls,
) -> Result<()> {
    let others: Vec<String> = InitialMember::parse_list(initial)
        .into_iter()
        .filter(|m| m.name != node)
        .map(|m| m.client_url(cluster.spec.etcd_client_port))
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
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
        if Instant::now() >= next_word {
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

/// Rewrite the revocation list whenever the set of removed nodes changes; etcd reads it at
/// every new connection. The removed nodes are watched, so a removal is in the list within
/// moments of its write; they are read again at least every [`REVOCATION_REREAD`].
async fn keep_revocation_list(store: Arc<dyn StateStore>, ca: Arc<Authority>, path: PathBuf) {
    let mut written: Option<Vec<String>> = None;
    loop {
        let listing = match store.list(keys::revoked_nodes()).await {
            Ok(listing) => listing,
            Err(e) => {
                tracing::debug!(error = %e, "reading the removed nodes");
                tokio::time::sleep(REVOCATION_RETRY).await;
                continue;
            }
        };
        let mut serials: Vec<String> = listing
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip::<kat_api::wire::RevokedNode>)
            .filter_map(|r| r.serial)
            .collect();
        serials.sort();
        let mut up_to_date = written.as_ref() == Some(&serials);
        if !up_to_date {
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
                    up_to_date = true;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the revocation list"),
                Err(e) => tracing::warn!(error = %e, "cannot write the revocation list"),
            }
        }
        if !up_to_date {
            // The file is behind the store: try again soon, whether or not the list changes.
            tokio::time::sleep(REVOCATION_RETRY).await;
            continue;
        }
        kat_store::changes::changed_after(
            &*store,
            keys::revoked_nodes(),
            listing.revision,
            REVOCATION_REREAD,
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_cluster_lists_parse_into_members_with_client_urls() {
        let members =
            InitialMember::parse_list("n1=https://10.0.0.1:2380,bad,n2=https://[fd00::2]:2380");
        assert_eq!(
            members
                .iter()
                .map(|m| (m.name.as_str(), m.client_url(2379)))
                .collect::<Vec<_>>(),
            vec![
                ("n1", "https://10.0.0.1:2379".to_string()),
                ("n2", "https://[fd00::2]:2379".to_string()),
            ]
        );
    }
}
