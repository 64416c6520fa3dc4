//! Detached mode (RFC 001 §4.9): a worker started with `--parent-cluster-name` that cannot
//! reach its cluster's leader for `nodeLossTimeoutSeconds` keeps its workloads running and
//! becomes the leader of a one-node cluster of its own ([`local_cluster`]): its API, which
//! otherwise only serves the control plane, takes new workloads from local users (with the
//! token in `{data}/detached/katcall.yaml`), each pinned to this node.
//!
//! Meanwhile it multicasts a signed `REJOIN_REQUEST` on its LAN every 2 s ([`protocol`]).
//! When the parent's leader answers with a signed offer, or the leader has answered the
//! node's ordinary requests again for [`DIRECT_RETURN`], the node submits the workloads it
//! created while detached to the parent (`POST /v1alpha1/nodes/{node}/workloads/{ns}`, with
//! its node certificate; the parent keeps them pinned here), stops its local cluster and
//! goes on as the parent's worker: the parent's instances of those workloads replace the
//! local ones. A workload the parent refuses (a name taken there, a namespace it does not
//! have) is kept as a bundle in `{data}/agent/rejoin-refused/` and named in the log.

pub mod local_cluster;
pub mod protocol;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use axum::Router;
use kat_api::wire::{ErrorBody, REJOIN_GROUP};
use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::control_plane::{ControlPlane, LeaderLink};
use crate::supervisor::assignments::{Snapshot, Source};
use local_cluster::{LocalCluster, LocalWorkload, NodeParts};

/// Between two `REJOIN_REQUEST`s.
const REQUEST_EVERY: Duration = Duration::from_secs(2);
/// A node whose leader answers its ordinary requests again this long (the link healed, but
/// no offer came: a LAN without multicast) rejoins without one.
const DIRECT_RETURN: Duration = Duration::from_secs(20);

pub struct Detacher {
    pub parts: NodeParts,
    pub parent_cluster: String,
    pub link: Arc<LeaderLink>,
    /// The local cluster's instances, merged with the parent's by [`merge_feeds`].
    pub local_feed: watch::Sender<Option<(Source, Snapshot)>>,
    /// The API the node serves: its worker API, or its local cluster's while detached.
    pub routers: watch::Sender<Router>,
    pub worker_router: Router,
}

impl Detacher {
    /// Forever: attached until the leader is lost, detached until the node rejoins.
    pub async fn run(self) {
        let loss = Duration::from_secs(u64::from(
            self.parts.cluster.spec.node_loss_timeout_seconds.max(1),
        ));
        let started = Instant::now();
        let contact = self.link.contact();
        // A node that was detached when its agent stopped is detached again at once.
        let mut local = match local_cluster::state_file(&self.parts.root).exists() {
            true => self.detach("it was detached when the agent stopped").await,
            false => None,
        };
        loop {
            match local.take() {
                None => {
                    let last = (*contact.borrow()).unwrap_or(started);
                    if last.elapsed() >= loss {
                        let why = format!(
                            "the leader of {} has not answered for {} s (nodeLossTimeoutSeconds)",
                            self.parent_cluster,
                            last.elapsed().as_secs()
                        );
                        local = self.detach(&why).await;
                        if local.is_none() {
                            tokio::time::sleep(Duration::from_secs(10)).await;
                        }
                    } else {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                Some(cluster) => match self.seek(&contact).await {
                    Some(leader) => local = self.rejoin(cluster, &leader).await,
                    None => local = Some(cluster),
                },
            }
        }
    }

    async fn detach(&self, why: &str) -> Option<LocalCluster> {
        // The subnet the node network runs on (saved by it; the leader's word after a
        // restart may not have come yet): the local cluster must use the same.
        let dir = kat_netns::node::network_dir(&self.parts.root);
        let saved = tokio::task::spawn_blocking(move || crate::network::saved_subnet(&dir))
            .await
            .ok()
            .flatten();
        let subnet = match saved {
            Some(s) => Some(s.to_string()),
            None => self.link.subnet().await.ok().flatten(),
        };
        match LocalCluster::start(
            &self.parts,
            &self.parent_cluster,
            subnet,
            self.local_feed.clone(),
        )
        .await
        {
            Ok(cluster) => {
                let _ = self.routers.send_replace(cluster.router.clone());
                eprintln!(
                    "kat-agent: node {} is detached from {} since {}: {why}. Its workloads keep running; new ones go to its own API (KAT_CONFIG={} katcall apply …) and are pinned to it. It rejoins by itself.",
                    self.parts.node,
                    self.parent_cluster,
                    cluster.state.since,
                    cluster.client_config.display()
                );
                Some(cluster)
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "cannot start the local cluster of a detached node; retrying");
                None
            }
        }
    }

    /// Multicast requests for one round (a few seconds): the leader endpoint of a valid
    /// offer, or the current one when the leader has been answering directly for
    /// [`DIRECT_RETURN`].
    async fn seek(&self, contact: &watch::Receiver<Option<Instant>>) -> Option<String> {
        let socket = match UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open a socket for rejoin requests");
                tokio::time::sleep(REQUEST_EVERY).await;
                return None;
            }
        };
        let _ = socket.set_multicast_ttl_v4(1);
        let group = SocketAddr::from((REJOIN_GROUP, self.parts.cluster.spec.rejoin_port as u16));
        let mut outstanding: VecDeque<String> = VecDeque::new();
        let mut back_since: Option<Instant> = None;
        let mut buf = vec![0u8; protocol::MAX_DATAGRAM];
        // One socket for a minute of requests; then a fresh one (the LAN may have changed).
        for _ in 0..30 {
            match protocol::request(
                &self.parent_cluster,
                &self.parts.node,
                &self.parts.pki,
                SystemTime::now(),
            ) {
                Ok(request) => {
                    outstanding.push_back(request.nonce.clone());
                    if outstanding.len() > 5 {
                        outstanding.pop_front();
                    }
                    if let Ok(bytes) = serde_json::to_vec(&request) {
                        if let Err(e) = socket.send_to(&bytes, group).await {
                            tracing::debug!(error = %e, "sending a rejoin request");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot sign a rejoin request"),
            }
            let deadline = tokio::time::Instant::now() + REQUEST_EVERY;
            while let Ok(Ok((n, from))) =
                tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await
            {
                let nonces: Vec<String> = outstanding.iter().cloned().collect();
                match protocol::check_offer(
                    &buf[..n],
                    &self.parent_cluster,
                    &self.parts.pki.ca_pem,
                    SystemTime::now(),
                    &nonces,
                ) {
                    Ok(offer) => {
                        eprintln!(
                            "kat-agent: the leader of {} answered this node's rejoin request from {from}: rejoining at {}",
                            self.parent_cluster, offer.leader
                        );
                        return Some(offer.leader);
                    }
                    Err(why) => {
                        tracing::warn!(%from, %why, "ignored an answer to a rejoin request")
                    }
                }
            }
            let answering = contact
                .borrow()
                .is_some_and(|t| t.elapsed() < Duration::from_secs(5));
            back_since = match (answering, back_since) {
                (true, Some(t)) => Some(t),
                (true, None) => Some(Instant::now()),
                (false, _) => None,
            };
            if back_since.is_some_and(|t| t.elapsed() >= DIRECT_RETURN) {
                if let Some(leader) = self.link.leader().borrow().clone() {
                    eprintln!("kat-agent: the leader of {} answers again (no rejoin offer came): rejoining at {leader}", self.parent_cluster);
                    return Some(leader);
                }
            }
        }
        None
    }

    /// Hand the local cluster's workloads to the parent's leader and go back to being its
    /// worker; `Some` (the local cluster, started again) when that cannot be done now.
    ///
    /// The local instances stop before their workloads go to the parent, whose instances of
    /// them replace them: a workload never runs twice, at the cost of a few seconds' gap.
    async fn rejoin(&self, local: LocalCluster, leader: &str) -> Option<LocalCluster> {
        let workloads = match local.workloads().await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot list the local cluster's workloads; still detached");
                return Some(local);
            }
        };
        let own: Vec<String> = self
            .local_feed
            .borrow()
            .as_ref()
            .map(|(_, s)| s.keys().cloned().collect())
            .unwrap_or_default();
        let dir: PathBuf = local.stop().await;
        self.local_feed.send_replace(None);
        self.wait_stopped(&own).await;
        match self.submit(&workloads, leader).await {
            Ok(submitted) => {
                self.link.follow(leader);
                let _ = self.routers.send_replace(self.worker_router.clone());
                if let Err(e) = local_cluster::retire(dir).await {
                    tracing::warn!(error = %format!("{e:#}"), "cannot move the local cluster's state aside");
                }
                eprintln!(
                    "kat-agent: node {} rejoined {} at {leader}: {submitted} of {} workload(s) created while detached were submitted",
                    self.parts.node,
                    self.parent_cluster,
                    workloads.len()
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), %leader, "cannot rejoin yet; still detached");
                let cluster = self.detach("the rejoin did not go through").await;
                tokio::time::sleep(REQUEST_EVERY).await;
                cluster
            }
        }
    }

    /// Until none of `instances` runs here (at most the stop grace and some).
    async fn wait_stopped(&self, instances: &[String]) {
        let mut statuses = self.parts.statuses.clone();
        let gone = |s: &crate::supervisor::Statuses| {
            s.as_ref().is_none_or(|list| {
                !list.iter().any(|i| {
                    instances.contains(&i.instance_id)
                        && matches!(
                            i.state,
                            kat_api::wire::InstanceState::Running
                                | kat_api::wire::InstanceState::Creating
                                | kat_api::wire::InstanceState::Stopping
                        )
                })
            })
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), statuses.wait_for(gone)).await;
    }

    /// Submit `workloads` to the parent's leader; the number it took.
    async fn submit(&self, workloads: &[LocalWorkload], leader: &str) -> Result<usize> {
        let mut submitted = 0;
        for LocalWorkload {
            namespace: ns,
            name,
            files,
        } in workloads
        {
            let body = kat_api::bundle::pack(files);
            let url = format!(
                "{}/v1alpha1/nodes/{}/workloads/{ns}",
                leader.trim_end_matches('/'),
                self.parts.node
            );
            let response = self
                .parts
                .client
                .post(&url)
                .header("content-type", "application/gzip")
                .body(body.clone())
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .with_context(|| format!("submitting workload {ns}/{name} to {leader}"))?;
            let status = response.status();
            if status.is_success() {
                submitted += 1;
                continue;
            }
            let message = match response.json::<ErrorBody>().await {
                Ok(b) => b.message,
                Err(_) => status.to_string(),
            };
            if status.is_server_error() || matches!(status.as_u16(), 401 | 429) {
                bail!("the leader could not take workload {ns}/{name} now ({status}: {message})");
            }
            // Refused for good: keep the bundle for the user, say where.
            let kept = self.keep_refused(ns, name, body).await;
            eprintln!(
                "kat-agent: the parent refused workload {ns}/{name}, created while detached ({status}: {message}); its bundle is kept at {kept}"
            );
        }
        Ok(submitted)
    }

    async fn keep_refused(&self, ns: &str, name: &str, body: Vec<u8>) -> String {
        let dir = self.parts.root.join("agent").join("rejoin-refused");
        let path = dir.join(format!("{ns}.{name}.tar.gz"));
        let shown = path.display().to_string();
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            kat_runtime::state_file::write_atomic(&path, &body, 0o600)
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            tracing::warn!(path = %shown, "cannot keep a refused workload's bundle");
        }
        shown
    }
}

/// The supervisor's feed: the parent's snapshot, with the local cluster's instances added
/// while the node is detached.
pub async fn merge_feeds(
    mut parent: watch::Receiver<Option<(Source, Snapshot)>>,
    mut local: watch::Receiver<Option<(Source, Snapshot)>>,
    out: watch::Sender<Option<(Source, Snapshot)>>,
) {
    loop {
        let merged = {
            let p = parent.borrow_and_update().clone();
            let l = local.borrow_and_update().clone();
            match (p, l) {
                (p, None) => p,
                (None, Some(l)) => Some(l),
                (Some((ps, mut snapshot)), Some((ls, own))) => {
                    snapshot.extend(own);
                    let source = match (ps, ls) {
                        (Source::LocalCopy, Source::LocalCopy) => Source::LocalCopy,
                        _ => Source::Store,
                    };
                    Some((source, snapshot))
                }
            }
        };
        if merged.is_some() {
            out.send_replace(merged);
        }
        tokio::select! {
            changed = parent.changed() => if changed.is_err() { return },
            changed = local.changed() => if changed.is_err() { return },
        }
    }
}
