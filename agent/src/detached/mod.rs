//! Detached mode (RFC 001 §4.9): a worker started with `--parent-cluster-name` that cannot
//! reach its cluster's leader for `nodeLossTimeoutSeconds` keeps its workloads running and
//! becomes the leader of a one-node cluster of its own ([`local_cluster`]): its API, which
//! otherwise only serves the control plane, takes new workloads from local users (with the
//! token in `{data}/detached/katcall.yaml`), each pinned to this node.
//!
//! Meanwhile it multicasts a signed `REJOIN_REQUEST` on its LAN every 2 s ([`protocol`]).
//! When the parent's leader answers with a signed offer, or the leader has answered the
//! node's ordinary requests again for [`DIRECT_RETURN`], the node rejoins ([`Detacher::rejoin`]):
//! it closes its local API and stops its local instances, submits the workloads it created
//! while detached to the parent (`POST /v1alpha1/nodes/{node}/workloads/{ns}`, with its node
//! certificate; the parent keeps them pinned here), removing each from the local cluster as
//! the parent takes it, and goes on as the parent's worker: the parent's instances of those
//! workloads replace the local ones. A submission that fails half-way leaves the rest in the
//! local cluster, which starts again; a workload the parent refuses for good (a name taken
//! there, a namespace it does not have) is kept as a bundle in `{data}/agent/rejoin-refused/`
//! and named in the log.

pub mod local_cluster;
pub mod protocol;
pub mod uplink;

use kat_client::paths::{self, NodeCall};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use axum::Router;
use kat_api::wire::{ErrorBody, ErrorCode, InstanceId, REJOIN_GROUP};
use kat_apiserver::http::ApiError;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use kat_node::link::{ControlPlane, LeaderLink};
use kat_node::supervisor::assignments::{Snapshot, Source};
use local_cluster::{LocalCluster, LocalWorkload, NodeParts};

/// Between two `REJOIN_REQUEST`s.
const REQUEST_EVERY: Duration = Duration::from_secs(2);
/// A node whose leader answers its ordinary requests again this long (the link healed, but
/// no offer came: a LAN without multicast) rejoins without one.
const DIRECT_RETURN: Duration = Duration::from_secs(20);
/// The longest wait between two failed rejoins.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

pub struct Detacher {
    pub parts: NodeParts,
    pub parent_cluster: String,
    pub link: Arc<LeaderLink>,
    /// The local cluster's instances, merged with the parent's by [`merge_feeds`].
    pub local_feed: watch::Sender<Option<(Source, Snapshot)>>,
    /// The API the node serves: its worker API, or its local cluster's while detached.
    pub routers: watch::Sender<Router>,
    pub worker_router: Router,
    /// The local cluster's link, for the node network's DNS ([`uplink::Uplink`]).
    pub local_link: watch::Sender<Option<Arc<kat_node::link::StoreLink>>>,
}

impl Detacher {
    /// Forever: attached until the leader is lost, detached until the node rejoins.
    pub async fn run(self) {
        let loss = Duration::from_secs(u64::from(
            self.parts.cluster.spec.node_loss_timeout_seconds.max(1),
        ));
        let contact = self.link.contact();
        // Contact counts from the later of the start and the last rejoin.
        let mut attached_since = Instant::now();
        let mut local: Option<LocalCluster> = None;
        // Failed rejoins in a row: each waits longer before the next (the local workloads
        // stop for every attempt).
        let mut failures: u32 = 0;
        loop {
            match local.take() {
                None => {
                    // A node that was detached when its agent stopped (or whose local cluster
                    // stopped) is detached again at once: its state is still there.
                    let state = local_cluster::state_file(&self.parts.root);
                    let unfinished = tokio::fs::try_exists(&state).await.unwrap_or(false);
                    let last =
                        (*contact.borrow()).map_or(attached_since, |t| t.max(attached_since));
                    if unfinished || last.elapsed() >= loss {
                        let why = match unfinished {
                            true => "its local cluster from before is still there".to_string(),
                            false => format!(
                                "the leader of {} has not answered for {} s (nodeLossTimeoutSeconds)",
                                self.parent_cluster,
                                last.elapsed().as_secs()
                            ),
                        };
                        local = self.detach(&why).await;
                        if local.is_none() {
                            tokio::time::sleep(Duration::from_secs(10)).await;
                        }
                    } else {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                Some(mut cluster) => {
                    if let Some(what) = cluster.ended() {
                        tracing::error!(%what, "a task of the local cluster ended; starting the local cluster again");
                        cluster.stop().await;
                        continue;
                    }
                    match self.seek(&contact).await {
                        Some(leader) => match self.rejoin(cluster, &leader).await {
                            Rejoin::Done => {
                                attached_since = Instant::now();
                                failures = 0;
                            }
                            Rejoin::NotNow(back) => {
                                local = back;
                                tokio::time::sleep(REQUEST_EVERY).await;
                            }
                            Rejoin::Failed(back) => {
                                local = back;
                                failures += 1;
                                let wait =
                                    (REQUEST_EVERY * 2u32.pow(failures.min(7))).min(MAX_BACKOFF);
                                tracing::warn!(
                                    failures,
                                    wait_s = wait.as_secs(),
                                    "the rejoin failed; trying again after a while"
                                );
                                tokio::time::sleep(wait).await;
                            }
                        },
                        None => local = Some(cluster),
                    }
                }
            }
        }
    }

    async fn detach(&self, why: &str) -> Option<LocalCluster> {
        // The subnet the node network runs on (saved by it; the leader's word after a
        // restart may not have come yet): the local cluster must use the same.
        let dir = kat_node::layout::Layout::new(&self.parts.root).network();
        let saved = tokio::task::spawn_blocking(move || kat_node::network::saved_subnet(&dir))
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
                self.local_link.send_replace(Some(cluster.link.clone()));
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

    /// Multicast requests for one round (a minute at most): the leader endpoint of a valid
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
                let revoked = self.link.revoked().borrow().clone();
                match protocol::check_offer(
                    &buf[..n],
                    &self.parent_cluster,
                    &self.parts.pki.ca_pem,
                    SystemTime::now(),
                    &nonces,
                    &revoked,
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
    /// worker.
    ///
    /// Nothing runs twice: the local API closes and the local instances stop before their
    /// workloads go to the parent (a few seconds' gap), and each workload leaves the local
    /// store as soon as the parent has it, so a submission cut short starts only the rest
    /// again.
    async fn rejoin(&self, mut local: LocalCluster, leader: &str) -> Rejoin {
        // First, and changing nothing here: the leader must take this node's certificate on
        // one of its own routes (a removed node, a node that does not lead, an endpoint out of
        // reach all fail here).
        let probe = self
            .parts
            .parent_client
            .get(paths::url(
                leader,
                &paths::node_call(&self.parts.node, NodeCall::Dns),
            ))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        match probe {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!(status = %r.status(), %leader, "the offered leader does not take this node now; still detached");
                return Rejoin::Failed(Some(local));
            }
            Err(e) => {
                tracing::warn!(error = %e, %leader, "the offered leader does not answer; still detached");
                return Rejoin::NotNow(Some(local));
            }
        }
        let _ = self
            .routers
            .send_replace(rejoining_router(&self.parts.node));
        local.stop_controllers().await;
        let own: Vec<InstanceId> = self
            .local_feed
            .borrow()
            .as_ref()
            .map(|(_, s)| s.keys().cloned().collect())
            .unwrap_or_default();
        self.local_feed.send_replace(None);
        self.local_link.send_replace(None);
        self.wait_stopped(&own).await;
        let outcome = match local.workloads().await {
            Ok(workloads) => self
                .submit(&local, &workloads, leader)
                .await
                .map(|n| (n, workloads.len())),
            Err(e) => Err(e.context("listing the local cluster's workloads")),
        };
        let dir: PathBuf = local.stop().await;
        match outcome {
            Ok((submitted, total)) => {
                self.link.follow(leader);
                let _ = self.routers.send_replace(self.worker_router.clone());
                if let Err(e) = local_cluster::retire(dir).await {
                    tracing::warn!(error = %format!("{e:#}"), "cannot move the local cluster's state aside");
                }
                eprintln!(
                    "kat-agent: node {} rejoined {} at {leader}: {submitted} of {total} workload(s) created while detached were submitted",
                    self.parts.node, self.parent_cluster
                );
                Rejoin::Done
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), %leader, "cannot rejoin yet; still detached");
                // `None`: the run loop starts it again (its state is still there).
                Rejoin::Failed(self.detach("the rejoin did not go through").await)
            }
        }
    }

    /// Until none of `instances` runs here (at most the stop grace and some).
    async fn wait_stopped(&self, instances: &[InstanceId]) {
        let mut statuses = self.parts.statuses.clone();
        let gone = |s: &kat_node::supervisor::Statuses| {
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

    /// Submit `workloads` to the parent's leader, each removed from the local store once the
    /// parent has it (or refused it for good, its bundle kept); the number it took.
    async fn submit(
        &self,
        local: &LocalCluster,
        workloads: &[LocalWorkload],
        leader: &str,
    ) -> Result<usize> {
        let mut submitted = 0;
        for LocalWorkload {
            namespace: ns,
            name,
            files,
        } in workloads
        {
            let body = kat_api::bundle::pack(files);
            let url = paths::url(
                leader,
                &paths::node_call(&self.parts.node, NodeCall::SubmitWorkload { ns }),
            );
            // A lost answer is asked again: the same bundle twice is no change there.
            let mut tries = 0;
            let response = loop {
                tries += 1;
                let sent = self
                    .parts
                    .parent_client
                    .post(&url)
                    .header("content-type", "application/gzip")
                    .body(body.clone())
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await;
                match sent {
                    Ok(r) => break r,
                    Err(e) if tries >= 3 => {
                        return Err(anyhow::Error::new(e)
                            .context(format!("submitting workload {ns}/{name} to {leader}")))
                    }
                    Err(_) => tokio::time::sleep(REQUEST_EVERY).await,
                }
            };
            let status = response.status();
            if status.is_success() {
                submitted += 1;
            } else {
                let body_of = response.json::<ErrorBody>().await.ok();
                let message = body_of
                    .as_ref()
                    .map_or_else(|| status.to_string(), |b| b.message.clone());
                // Only what says the workload itself is refused is final (its own error
                // codes, not a proxy's or a missing route's: `NoRoute`, and from a parent
                // older than that code a `NotFound` that says "no route"); the rest (the
                // leader busy or gone) is tried again later.
                let final_refusal = body_of.as_ref().is_some_and(|b| {
                    matches!(
                        b.error,
                        ErrorCode::InvalidQuadlet
                            | ErrorCode::BadRequest
                            | ErrorCode::Forbidden
                            | ErrorCode::Conflict
                            | ErrorCode::PayloadTooLarge
                    ) || (b.error == ErrorCode::NotFound && !b.message.starts_with("no route"))
                });
                if !final_refusal {
                    bail!(
                        "the leader could not take workload {ns}/{name} now ({status}: {message})"
                    );
                }
                let kept = self.keep_refused(ns, name, body).await?;
                eprintln!(
                    "kat-agent: the parent refused workload {ns}/{name}, created while detached ({status}: {message}); its bundle is kept at {kept}"
                );
            }
            local
                .forget(ns, name)
                .await
                .with_context(|| format!("removing workload {ns}/{name} from the local cluster"))?;
        }
        Ok(submitted)
    }

    async fn keep_refused(&self, ns: &str, name: &str, body: Vec<u8>) -> Result<String> {
        let dir = self.parts.root.join("agent").join("rejoin-refused");
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let path = dir.join(format!("{ns}.{name}.{stamp}.tar.gz"));
        let shown = path.display().to_string();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            kat_runtime::state_file::write_atomic(&path, &body, 0o600)
        })
        .await?
        .with_context(|| format!("keeping a refused workload's bundle at {shown}"))?;
        Ok(shown)
    }
}

/// What a rejoin came to.
enum Rejoin {
    Done,
    /// The leader was out of reach: nothing changed, try at the next offer.
    NotNow(Option<LocalCluster>),
    /// It refused this node, or the submission failed: wait longer before the next try.
    Failed(Option<LocalCluster>),
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

/// The supervisor's feed: the parent's snapshot, with the local cluster's instances added
/// while the node is detached. With `hold` (a node that was detached when its agent stopped)
/// the parent's snapshot counts as a local copy until the local cluster has spoken, so the
/// supervisor does not take the local instances' containers for strays in between.
pub async fn merge_feeds(
    mut parent: watch::Receiver<Option<(Source, Snapshot)>>,
    mut local: watch::Receiver<Option<(Source, Snapshot)>>,
    out: watch::Sender<Option<(Source, Snapshot)>>,
    mut hold: bool,
) {
    let mut sent_any = false;
    loop {
        let merged = {
            let p = parent.borrow_and_update().clone();
            let l = local.borrow_and_update().clone();
            if l.is_some() {
                hold = false;
            }
            match (p, l) {
                (Some((_, snapshot)), None) if hold => Some((Source::LocalCopy, snapshot)),
                (p @ Some(_), None) => p,
                // The local cluster is gone and the parent has said nothing yet: nothing to run.
                (None, None) if sent_any => Some((Source::Store, Snapshot::new())),
                (None, None) => None,
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
            sent_any = true;
            out.send_replace(merged);
        }
        tokio::select! {
            changed = parent.changed() => if changed.is_err() { return },
            changed = local.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_node::supervisor::assignments::Assignment;

    fn snapshot(ids: &[&str]) -> Snapshot {
        ids.iter()
            .map(|id| {
                let record: kat_api::wire::InstanceRecord = serde_json::from_value(serde_json::json!({
                    "instanceID": id, "namespace": "default", "workload": "w", "node": "laptop",
                    "generation": 1, "specHash": "h", "workloadType": "Service",
                    "requests": {"cpuMillis": 0, "memoryBytes": 0, "pids": 0}, "createdAt": "2026-11-24T00:00:00Z"
                }))
                .unwrap();
                (record.instance_id.clone(), Assignment { record, template: Err("test".into()) })
            })
            .collect()
    }

    type Feed = watch::Sender<Option<(Source, Snapshot)>>;

    async fn merged(
        out: &mut watch::Receiver<Option<(Source, Snapshot)>>,
    ) -> (Source, Vec<String>) {
        out.changed().await.unwrap();
        let (source, s) = out.borrow_and_update().clone().unwrap();
        (source, s.keys().map(ToString::to_string).collect())
    }

    fn feeds(hold: bool) -> (Feed, Feed, watch::Receiver<Option<(Source, Snapshot)>>) {
        let (parent, parent_rx) = watch::channel(None);
        let (local, local_rx) = watch::channel(None);
        let (out, out_rx) = watch::channel(None);
        tokio::spawn(merge_feeds(parent_rx, local_rx, out, hold));
        (parent, local, out_rx)
    }

    #[tokio::test]
    async fn the_local_clusters_instances_join_the_parents_and_leave_with_it() {
        let (parent, local, mut out) = feeds(false);
        parent.send_replace(Some((Source::Store, snapshot(&["p1"]))));
        assert_eq!(
            merged(&mut out).await,
            (Source::Store, vec!["p1".to_string()])
        );
        local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
        assert_eq!(
            merged(&mut out).await,
            (Source::Store, vec!["l1".into(), "p1".into()])
        );
        local.send_replace(None);
        assert_eq!(
            merged(&mut out).await,
            (Source::Store, vec!["p1".to_string()])
        );
    }

    #[tokio::test]
    async fn without_a_parent_snapshot_the_end_of_the_local_cluster_is_an_empty_one() {
        let (_parent, local, mut out) = feeds(false);
        local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
        assert_eq!(merged(&mut out).await.1, vec!["l1".to_string()]);
        local.send_replace(None);
        // Not silence: the supervisor must stop l1.
        assert_eq!(merged(&mut out).await, (Source::Store, vec![]));
    }

    #[tokio::test]
    async fn after_a_restart_while_detached_the_parent_waits_for_the_local_cluster() {
        let (parent, local, mut out) = feeds(true);
        // The parent answers first: its snapshot is only a local copy for now, so the
        // supervisor keeps the local instances' containers.
        parent.send_replace(Some((Source::Store, snapshot(&["p1"]))));
        assert_eq!(
            merged(&mut out).await,
            (Source::LocalCopy, vec!["p1".to_string()])
        );
        local.send_replace(Some((Source::Store, snapshot(&["l1"]))));
        assert_eq!(
            merged(&mut out).await,
            (Source::Store, vec!["l1".into(), "p1".into()])
        );
    }
}
