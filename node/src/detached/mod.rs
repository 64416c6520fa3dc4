//! Detached mode (RFC 001 §4.9): a worker started with `--parent-cluster-name` that cannot
//! reach its cluster's leader for `nodeLossTimeoutSeconds` keeps its workloads running and
//! becomes the leader of a one-node cluster of its own ([`LocalClusters`], which the agent
//! provides: it owns the local etcd and API): that API takes new workloads from local users,
//! each pinned to this node.
//!
//! Meanwhile the node sends a signed `REJOIN_REQUEST` every 2 s ([`protocol`], multicast on
//! its LAN: [`multicast::Multicast`]). When the parent's leader answers with a signed offer
//! ([`listener`] is that side), or the leader has answered the node's ordinary requests again
//! for [`DIRECT_RETURN`], the node rejoins: its local cluster takes no more workloads and its
//! local instances stop, then it submits the workloads created while detached to the parent
//! ([`Parent::submit`], with its node certificate; the parent keeps them pinned here),
//! removing each from the local cluster as the parent takes it, and goes on as the parent's
//! worker: the parent's instances of those workloads replace the local ones. A submission
//! that fails half-way leaves the rest in the local cluster, which starts again; a workload
//! the parent refuses for good (a name taken there, a namespace it does not have) is kept as
//! a bundle in `{data}/agent/rejoin-refused/` and named in the log.
//!
//! [`Detacher`] decides all of this through three seams, so it is tested on fakes with
//! simulated time (`tests.rs`): the parent ([`Parent`], the leader link in production), the
//! rejoin transport ([`RejoinTransport`]) and the local cluster ([`LocalClusters`]).

pub mod listener;
pub mod multicast;
pub mod parent;
pub mod protocol;
pub mod uplink;

// Tests read back what they wrote.
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use kat_api::wire::{ErrorCode, InstanceId, InstanceState};
use kat_client::ClientError;
use kat_pki::Pki;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::layout::Layout;
use crate::supervisor::assignments::{Snapshot, Source};
use crate::supervisor::Statuses;

/// Between two `REJOIN_REQUEST`s.
pub const REQUEST_EVERY: Duration = Duration::from_secs(2);
/// A node whose leader answers its ordinary requests again this long (the link healed, but
/// no offer came: a LAN without multicast) rejoins without one.
pub const DIRECT_RETURN: Duration = Duration::from_secs(20);
/// The longest wait between two failed rejoins.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Requests sent on one channel before a fresh one is opened (the LAN may have changed).
const REQUESTS_PER_CHANNEL: usize = 30;

/// The parent cluster as a detachable worker sees it.
#[async_trait::async_trait]
pub trait Parent: Send + Sync {
    /// When the parent's leader last answered this node; `None` before it ever did.
    fn contact(&self) -> watch::Receiver<Option<Instant>>;
    /// The leader's endpoint as this node last learned it.
    fn leader(&self) -> Option<String>;
    /// Serials of removed nodes' certificates, as the leader last said.
    fn revoked(&self) -> Arc<HashSet<String>>;
    /// This node's subnet, as the leader last gave it.
    async fn subnet(&self) -> Option<String>;
    /// Whether the control-plane endpoint `leader` takes this node's certificate now.
    async fn probe(&self, leader: &str) -> kat_client::Result<()>;
    /// Submits a workload created while detached (a bundle) to `leader`, pinned to this node.
    async fn submit(&self, leader: &str, ns: &str, bundle: Vec<u8>) -> kat_client::Result<()>;
    /// Talk to `leader` from now on.
    fn follow(&self, leader: &str);
}

/// How rejoin requests reach the parent's control plane and its offers come back.
#[async_trait::async_trait]
pub trait RejoinTransport: Send + Sync {
    /// A channel for one round of requests.
    async fn open(&self) -> std::io::Result<Box<dyn RejoinChannel>>;
}

/// One round's channel of a [`RejoinTransport`].
#[async_trait::async_trait]
pub trait RejoinChannel: Send {
    /// Sends a request.
    async fn send(&mut self, datagram: &[u8]) -> std::io::Result<()>;
    /// The next answer into `buf`: its length and who sent it.
    async fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, String)>;
}

/// Where a detached node's own cluster comes from: the agent, which runs its etcd and API.
#[async_trait::async_trait]
pub trait LocalClusters: Send + Sync {
    /// A running local cluster.
    type Cluster: LocalCluster;
    /// Whether a local cluster from before is still there (the node was detached when its
    /// agent stopped): the node is detached again at once.
    async fn left_over(&self) -> bool;
    /// Starts (or resumes) the local cluster on `subnet` and serves its API in place of the
    /// node's; `why` says why the node detaches, for the operator.
    async fn start(&self, subnet: Option<String>, why: &str) -> Result<Self::Cluster>;
    /// The node's API is its worker API again: it rejoined.
    fn rejoined(&self);
    /// After a rejoin: the stopped local cluster's state is moved aside for good, so that
    /// nothing of it starts again.
    async fn retire(&self);
}

/// A detached node's running local cluster.
#[async_trait::async_trait]
pub trait LocalCluster: Send {
    /// What ended, if a task of the local cluster did (it is started again).
    fn ended(&mut self) -> Option<String>;
    /// Takes no more workloads (its API says the node is rejoining) and stops its
    /// controllers; its instances leave the supervisor's feed. The ids of those instances.
    async fn close(&mut self) -> Vec<InstanceId>;
    /// The workloads created in it.
    async fn workloads(&self) -> Result<Vec<LocalWorkload>>;
    /// Removes a workload the parent has taken.
    async fn forget(&mut self, ns: &str, name: &str) -> Result<()>;
    /// Stops it; its state stays, to start again or to be retired
    /// ([`LocalClusters::retire`]).
    async fn stop(self);
}

/// A workload created on the node while it was detached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalWorkload {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its Quadlet files, by name.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// A detachable worker's loop: attached until the leader is lost, detached until the node
/// rejoins (see the module's documentation).
pub struct Detacher<L: LocalClusters> {
    /// This node.
    pub node: String,
    /// The cluster it belongs to (`--parent-cluster-name`).
    pub parent_cluster: String,
    /// The parent's `nodeLossTimeoutSeconds`: silence from the leader this long detaches.
    pub node_loss: Duration,
    /// The node's certificate and key (requests are signed with them) and the cluster CA
    /// (offers are checked against it).
    pub pki: Arc<Pki>,
    /// The parent.
    pub parent: Arc<dyn Parent>,
    /// How requests and offers travel.
    pub transport: Arc<dyn RejoinTransport>,
    /// The local cluster while detached.
    pub local: L,
    /// The supervisor's instance states (a rejoin waits for the local instances to stop).
    pub statuses: watch::Receiver<Statuses>,
    /// The node's files (its network's saved subnet, refused bundles).
    pub layout: Layout,
}

/// What a rejoin came to.
enum Rejoin<C> {
    Done,
    /// The leader was out of reach: nothing changed, try at the next offer.
    NotNow(Option<C>),
    /// It refused this node, or the submission failed: wait longer before the next try.
    Failed(Option<C>),
}

impl<L: LocalClusters> Detacher<L> {
    /// Forever: attached until the leader is lost, detached until the node rejoins.
    pub async fn run(self) {
        let loss = self.node_loss.max(Duration::from_secs(1));
        let contact = self.parent.contact();
        // Contact counts from the later of the start and the last rejoin.
        let mut attached_since = Instant::now();
        let mut local: Option<L::Cluster> = None;
        // Failed rejoins in a row: each waits longer before the next (the local workloads
        // stop for every attempt).
        let mut failures: u32 = 0;
        loop {
            match local.take() {
                None => {
                    let left_over = self.local.left_over().await;
                    let last =
                        (*contact.borrow()).map_or(attached_since, |t| t.max(attached_since));
                    if left_over || last.elapsed() >= loss {
                        let why = match left_over {
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

    async fn detach(&self, why: &str) -> Option<L::Cluster> {
        // The subnet the node network runs on (saved by it; the leader's word after a
        // restart may not have come yet): the local cluster must use the same.
        let dir = self.layout.network();
        let saved = tokio::task::spawn_blocking(move || crate::network::saved_subnet(&dir))
            .await
            .ok()
            .flatten();
        let subnet = match saved {
            Some(s) => Some(s.to_string()),
            None => self.parent.subnet().await,
        };
        match self.local.start(subnet, why).await {
            Ok(cluster) => Some(cluster),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "cannot start the local cluster of a detached node; retrying");
                None
            }
        }
    }

    /// Requests for one round (a minute at most): the leader endpoint of a valid offer, or
    /// the current one when the leader has been answering directly for [`DIRECT_RETURN`].
    async fn seek(&self, contact: &watch::Receiver<Option<Instant>>) -> Option<String> {
        // Without a channel the round still watches for the leader answering directly.
        let mut channel = match self.transport.open().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open a channel for rejoin requests");
                None
            }
        };
        let mut outstanding: VecDeque<String> = VecDeque::new();
        let mut back_since: Option<Instant> = None;
        for _ in 0..REQUESTS_PER_CHANNEL {
            let deadline = Instant::now() + REQUEST_EVERY;
            if let Some(channel) = channel.as_mut() {
                if let Some(leader) = self.ask(channel, &mut outstanding, deadline).await {
                    return Some(leader);
                }
            }
            tokio::time::sleep_until(deadline).await;
            let answering = contact
                .borrow()
                .is_some_and(|t| t.elapsed() < Duration::from_secs(5));
            back_since = match (answering, back_since) {
                (true, Some(t)) => Some(t),
                (true, None) => Some(Instant::now()),
                (false, _) => None,
            };
            if back_since.is_some_and(|t| t.elapsed() >= DIRECT_RETURN) {
                if let Some(leader) = self.parent.leader() {
                    eprintln!("kat-agent: the leader of {} answers again (no rejoin offer came): rejoining at {leader}", self.parent_cluster);
                    return Some(leader);
                }
            }
        }
        None
    }

    /// Send one request on `channel` and read the answers until `deadline`: the leader
    /// endpoint of a valid offer, if one came.
    async fn ask(
        &self,
        channel: &mut Box<dyn RejoinChannel>,
        outstanding: &mut VecDeque<String>,
        deadline: Instant,
    ) -> Option<String> {
        match protocol::request(
            &self.parent_cluster,
            &self.node,
            &self.pki,
            SystemTime::now(),
        ) {
            Ok(request) => {
                outstanding.push_back(request.nonce.clone());
                if outstanding.len() > 5 {
                    outstanding.pop_front();
                }
                if let Ok(bytes) = serde_json::to_vec(&request) {
                    if let Err(e) = channel.send(&bytes).await {
                        tracing::debug!(error = %e, "sending a rejoin request");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot sign a rejoin request"),
        }
        let mut buf = vec![0u8; protocol::MAX_DATAGRAM];
        while let Ok(Ok((n, from))) =
            tokio::time::timeout_at(deadline, channel.receive(&mut buf)).await
        {
            let nonces: Vec<String> = outstanding.iter().cloned().collect();
            let revoked = self.parent.revoked();
            match protocol::check_offer(
                &buf[..n],
                &self.parent_cluster,
                &self.pki.ca_pem,
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
        None
    }

    /// Hand the local cluster's workloads to the parent's leader and go back to being its
    /// worker.
    ///
    /// Nothing runs twice: the local API closes and the local instances stop before their
    /// workloads go to the parent (a few seconds' gap), and each workload leaves the local
    /// store as soon as the parent has it, so a submission cut short starts only the rest
    /// again.
    async fn rejoin(&self, mut local: L::Cluster, leader: &str) -> Rejoin<L::Cluster> {
        // First, and changing nothing here: the leader must take this node's certificate on
        // one of its own routes (a removed node, a node that does not lead, an endpoint out of
        // reach all fail here).
        match self.parent.probe(leader).await {
            Ok(()) => {}
            Err(e @ ClientError::Refused { .. }) => {
                tracing::warn!(error = %e, %leader, "the offered leader does not take this node now; still detached");
                return Rejoin::Failed(Some(local));
            }
            Err(e) => {
                tracing::warn!(error = %e, %leader, "the offered leader does not answer; still detached");
                return Rejoin::NotNow(Some(local));
            }
        }
        let own = local.close().await;
        self.wait_stopped(&own).await;
        let outcome = match local.workloads().await {
            Ok(workloads) => self
                .submit(&mut local, &workloads, leader)
                .await
                .map(|n| (n, workloads.len())),
            Err(e) => Err(e.context("listing the local cluster's workloads")),
        };
        match outcome {
            Ok((submitted, total)) => {
                local.stop().await;
                self.parent.follow(leader);
                self.local.rejoined();
                self.local.retire().await;
                eprintln!(
                    "kat-agent: node {} rejoined {} at {leader}: {submitted} of {total} workload(s) created while detached were submitted",
                    self.node, self.parent_cluster
                );
                Rejoin::Done
            }
            Err(e) => {
                local.stop().await;
                tracing::warn!(error = %format!("{e:#}"), %leader, "cannot rejoin yet; still detached");
                // `None`: the run loop starts it again (its state is still there).
                Rejoin::Failed(self.detach("the rejoin did not go through").await)
            }
        }
    }

    /// Until none of `instances` runs here (at most the stop grace and some).
    async fn wait_stopped(&self, instances: &[InstanceId]) {
        let mut statuses = self.statuses.clone();
        let gone = |s: &Statuses| {
            s.as_ref().is_none_or(|list| {
                !list.iter().any(|i| {
                    instances.contains(&i.instance_id)
                        && matches!(
                            i.state,
                            InstanceState::Running
                                | InstanceState::Creating
                                | InstanceState::Stopping
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
        local: &mut L::Cluster,
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
            // A lost answer is asked again: the same bundle twice is no change there.
            let mut tries = 0;
            let answer = loop {
                tries += 1;
                match self.parent.submit(leader, ns, body.clone()).await {
                    Err(ClientError::Unreachable { .. }) if tries < 3 => {
                        tokio::time::sleep(REQUEST_EVERY).await
                    }
                    answer => break answer,
                }
            };
            match answer {
                Ok(()) => submitted += 1,
                Err(e) if refused_for_good(&e) => {
                    let kept = self.keep_refused(ns, name, body).await?;
                    eprintln!(
                        "kat-agent: the parent refused workload {ns}/{name}, created while detached ({e}); its bundle is kept at {kept}"
                    );
                }
                Err(e @ ClientError::Unreachable { .. }) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("submitting workload {ns}/{name} to {leader}")))
                }
                Err(e) => bail!("the leader could not take workload {ns}/{name} now ({e})"),
            }
            local
                .forget(ns, name)
                .await
                .with_context(|| format!("removing workload {ns}/{name} from the local cluster"))?;
        }
        Ok(submitted)
    }

    async fn keep_refused(&self, ns: &str, name: &str, body: Vec<u8>) -> Result<String> {
        let dir = self.layout.rejoin_refused();
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

/// Whether the parent refused a submitted workload itself, for good: its own error codes
/// about the workload (not a proxy's answer, a missing route, or a leader busy or gone,
/// which are tried again later).
fn refused_for_good(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(
            ErrorCode::InvalidQuadlet
                | ErrorCode::BadRequest
                | ErrorCode::Forbidden
                | ErrorCode::Conflict
                | ErrorCode::PayloadTooLarge
                | ErrorCode::NotFound
        )
    )
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
