//! A worker's link: the leader's API over mutual TLS with the node's certificate.
//!
//! The worker keeps the control plane's API endpoints (given at join, refreshed by every
//! heartbeat answer, saved in `{data}/agent/api-endpoints.json` so a rebooted worker finds
//! the cluster). It talks to the one it believes leads; a control-plane node that does not
//! lead answers `not_leader` naming the leader, which the worker follows; an endpoint that
//! does not answer is skipped for the next. So after a failover a worker finds the new
//! leader by itself within a request or two.
//!
//! The assignment stream carries a keepalive line every 5 s: 15 s of silence means the
//! leader (or the path to it) is gone, and the feed reconnects, resuming from the last
//! revision it saw.
//!
//! The DNS records and the overlay's peers are read with a long poll: each read names the
//! store revision of the last answer (`?after=`), and the leader answers when they change,
//! or after 30 s. Its answer is kept for the next read, so a change costs one request.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kat_api::wire::{
    AssignmentUpdate, DnsRecord, ErrorCode, InstanceRecord, NodeHeartbeat, OverlayPeer,
    TemplateProblem,
};
use kat_client::node::{AssignmentStream, AtRevision, NodeClient};
use kat_client::ClientError;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{Assignments, ControlPlane};

/// Silence on the assignment stream after which the leader counts as gone (3 keepalives).
const STREAM_SILENCE: Duration = Duration::from_secs(15);
/// After a wait for a change failed, before the caller reads again: a leader that refuses
/// at once does not make the caller spin.
const CHANGE_WAIT_FAILED: Duration = Duration::from_secs(1);

/// A worker's link to the leader's API (see the module's documentation).
pub struct LeaderLink {
    client: NodeClient,
    endpoints: Mutex<Endpoints>,
    file: PathBuf,
    leader: watch::Sender<Option<String>>,
    revoked: watch::Sender<Arc<HashSet<String>>>,
    /// The node's subnet, from the last heartbeat answer that had one.
    subnet: Mutex<Option<String>>,
    /// When the leader last answered (any request); `None` before it ever did.
    contact: watch::Sender<Option<Instant>>,
    /// The answer of the last wait for a change of the DNS records, for the next read.
    fresh_dns: Fresh<Vec<DnsRecord>>,
    /// The same for the overlay's peers.
    fresh_peers: Fresh<Vec<OverlayPeer>>,
}

/// An answer a wait for a change brought (with its revision), kept for the next read.
type Fresh<T> = Mutex<Option<(T, i64)>>;

#[derive(Debug, Clone, Default)]
struct Endpoints {
    list: Vec<String>,
    current: usize,
}

impl Endpoints {
    fn current(&self) -> Option<String> {
        self.list.get(self.current).cloned()
    }
}

impl LeaderLink {
    /// `client` carries the node's certificate and trusts the cluster CA only; `file` holds
    /// the endpoints (written by `join`, kept fresh here).
    pub fn new(client: NodeClient, file: PathBuf) -> Result<Self> {
        let list = read_endpoints(&file)?;
        let (leader, _) = watch::channel(list.first().cloned());
        // As the leader last said, kept across restarts: a detached node checks rejoin
        // offers against it.
        // This node's own cache file, not a stored record.
        #[allow(clippy::disallowed_methods)]
        let known: HashSet<String> = std::fs::read(revoked_file(&file))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let (revoked, _) = watch::channel(Arc::new(known));
        Ok(LeaderLink {
            client,
            endpoints: Mutex::new(Endpoints { list, current: 0 }),
            file,
            leader,
            revoked,
            subnet: Mutex::new(None),
            contact: watch::channel(None).0,
            fresh_dns: Mutex::new(None),
            fresh_peers: Mutex::new(None),
        })
    }

    /// The leader's endpoint as this node last learned it (for the worker's own API, which
    /// sends clients there).
    pub fn leader(&self) -> watch::Receiver<Option<String>> {
        self.leader.subscribe()
    }

    /// When the leader last answered a request.
    pub fn contact(&self) -> watch::Receiver<Option<Instant>> {
        self.contact.subscribe()
    }

    /// Serials of removed nodes' certificates, as the leader last said.
    pub fn revoked(&self) -> watch::Receiver<Arc<HashSet<String>>> {
        self.revoked.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Endpoints> {
        // A panic while holding this lock cannot leave it inconsistent: take it anyway.
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current(&self) -> Option<String> {
        self.lock().current()
    }

    /// The next endpoint after `failed` (if it is still the current one).
    fn skip(&self, failed: &str) {
        let mut e = self.lock();
        if e.current().as_deref() == Some(failed) && !e.list.is_empty() {
            e.current = (e.current + 1) % e.list.len();
        }
    }

    /// Talk to `leader` from now on.
    pub fn follow(&self, leader: &str) {
        let mut e = self.lock();
        match e.list.iter().position(|l| l == leader) {
            Some(i) => e.current = i,
            None => {
                e.list.push(leader.to_string());
                e.current = e.list.len() - 1;
            }
        }
        drop(e);
        self.leader.send_replace(Some(leader.to_string()));
    }

    /// The control plane's endpoints as the leader gave them; saved when they change.
    fn refresh(&self, fresh: Vec<String>) {
        if fresh.is_empty() {
            return;
        }
        let mut e = self.lock();
        let mut list = fresh;
        list.sort();
        let mut old = e.list.clone();
        old.sort();
        if old == list {
            return;
        }
        let current = e.current();
        e.current = current
            .and_then(|c| list.iter().position(|l| *l == c))
            .unwrap_or(0);
        e.list = list.clone();
        drop(e);
        tracing::info!(endpoints = ?list, "the control plane's API endpoints changed");
        if let Err(e) = write_endpoints(&self.file, &list) {
            tracing::warn!(error = %e, "cannot save the control plane's API endpoints");
        }
    }

    /// Make `call` of the leader: endpoints that do not answer are skipped, a `not_leader`
    /// answer is followed to the leader it names.
    async fn send<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: Fn(NodeClient, String) -> Fut,
        Fut: Future<Output = kat_client::Result<T>>,
    {
        let tries = self.lock().list.len() + 2;
        let mut last = String::from("no control-plane endpoint is known (see api-endpoints.json)");
        for _ in 0..tries {
            let Some(base) = self.current() else { break };
            let answer = call(self.client.clone(), base.clone()).await;
            match answer {
                // `not_leader`, or its status from something that is not KAT's API.
                Err(ClientError::Refused {
                    status,
                    code,
                    leader,
                    ..
                }) if code == Some(ErrorCode::NotLeader)
                    || (code.is_none()
                        && status.as_u16() == ErrorCode::NotLeader.http_status()) =>
                {
                    match leader {
                        Some(leader) if leader != base => self.follow(&leader),
                        _ => {
                            last = format!("{base} does not lead and knows no leader yet");
                            self.skip(&base);
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    }
                }
                Err(ClientError::Unreachable { source, .. }) => {
                    last = format!("{base}: {source}");
                    self.skip(&base);
                }
                answer => {
                    // Only a yes counts as the leader being there for this node (a removed
                    // node gets answers too: 401).
                    if answer.is_ok() {
                        self.contact.send_replace(Some(Instant::now()));
                    }
                    if self.leader.borrow().as_deref() != Some(base.as_str()) {
                        self.leader.send_replace(Some(base.clone()));
                    }
                    return answer.with_context(|| format!("{what}: the leader at {base}"));
                }
            }
        }
        anyhow::bail!("{what}: cannot reach the leader ({last})")
    }

    /// The DNS records or overlay peers (`read`), once they may have changed after `after`.
    async fn read_at<T, F, Fut>(
        &self,
        what: &str,
        read: F,
        after: Option<(i64, Duration)>,
    ) -> Result<(T, Option<i64>)>
    where
        F: Fn(NodeClient, String, Option<(i64, Duration)>) -> Fut,
        Fut: Future<Output = kat_client::Result<AtRevision<T>>>,
    {
        self.send(what, |client, base| read(client, base, after))
            .await
    }
}

/// Keeps a wait's answer for the next read. Without one (the wait failed, or the leader
/// gave no revision and so did not wait) it waits a little, as the caller reads next.
async fn keep_fresh<T>(fresh: &Fresh<T>, answer: Result<(T, Option<i64>)>, at_most: Duration) {
    match answer {
        Ok((list, Some(revision))) => {
            *fresh.lock().unwrap_or_else(|p| p.into_inner()) = Some((list, revision));
        }
        Ok((_, None)) => tokio::time::sleep(at_most.min(CHANGE_WAIT_FAILED)).await,
        Err(e) => {
            tracing::debug!("waiting for a change: {e:#}");
            tokio::time::sleep(at_most.min(CHANGE_WAIT_FAILED)).await;
        }
    }
}

/// What `fresh` holds, emptying it.
fn take<T>(fresh: &Fresh<T>) -> Option<(T, i64)> {
    fresh.lock().unwrap_or_else(|p| p.into_inner()).take()
}

async fn dns(
    client: NodeClient,
    base: String,
    after: Option<(i64, Duration)>,
) -> kat_client::Result<AtRevision<Vec<DnsRecord>>> {
    client.dns_records(&base, after).await
}

async fn peers(
    client: NodeClient,
    base: String,
    after: Option<(i64, Duration)>,
) -> kat_client::Result<AtRevision<Vec<OverlayPeer>>> {
    client.overlay_peers(&base, after).await
}

#[async_trait::async_trait]
impl ControlPlane for LeaderLink {
    async fn assignments(&self, resume: Option<i64>) -> Result<Assignments> {
        let stream = self
            .send("assignments", |client, base| async move {
                client.assignments(&base, resume).await
            })
            .await?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(read_stream(stream, tx));
        Ok(rx)
    }

    async fn template(&self, record: &InstanceRecord) -> Result<Option<Vec<u8>>> {
        self.send("template", |client, base| async move {
            client.template(&base, record).await
        })
        .await
    }

    async fn heartbeat(&self, heartbeat: &NodeHeartbeat) -> Result<()> {
        let answer = self
            .send("heartbeat", |client, base| async move {
                client.heartbeat(&base, heartbeat).await
            })
            .await?;
        self.refresh(answer.api_endpoints);
        if answer.subnet.is_some() {
            *self.subnet.lock().unwrap_or_else(|p| p.into_inner()) = answer.subnet;
        }
        let revoked: HashSet<String> = answer.revoked_serials.into_iter().collect();
        if **self.revoked.borrow() != revoked {
            let mut sorted: Vec<&String> = revoked.iter().collect();
            sorted.sort();
            // A list of strings always encodes; the file is only a cache for the next start.
            let path = revoked_file(&self.file);
            let saved = match serde_json::to_vec(&sorted) {
                Ok(bytes) => tokio::task::spawn_blocking(move || {
                    kat_runtime::state_file::write_atomic(&path, &bytes, 0o600)
                })
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(anyhow::Error::from)),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = saved {
                tracing::warn!(error = %e, "cannot save the revoked certificates the leader named");
            }
            self.revoked.send_replace(Arc::new(revoked));
        }
        Ok(())
    }

    async fn subnet(&self) -> Result<Option<String>> {
        Ok(self
            .subnet
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }

    async fn dns_records(&self) -> Result<Vec<DnsRecord>> {
        Ok(self.dns_records_at().await?.0)
    }

    async fn dns_records_at(&self) -> Result<(Vec<DnsRecord>, Option<i64>)> {
        if let Some((records, revision)) = take(&self.fresh_dns) {
            return Ok((records, Some(revision)));
        }
        self.read_at("DNS records", dns, None).await
    }

    async fn dns_records_changed(&self, revision: i64, at_most: Duration) {
        let answer = self
            .read_at("DNS records", dns, Some((revision, at_most)))
            .await;
        keep_fresh(&self.fresh_dns, answer, at_most).await;
    }

    async fn publish_wireguard_key(&self, key: &str) -> Result<()> {
        self.send("WireGuard key", |client, base| async move {
            client.publish_wireguard_key(&base, key).await
        })
        .await
    }

    async fn overlay_peers(&self) -> Result<Vec<OverlayPeer>> {
        Ok(self.overlay_peers_at().await?.0)
    }

    async fn overlay_peers_at(&self) -> Result<(Vec<OverlayPeer>, Option<i64>)> {
        if let Some((peers, revision)) = take(&self.fresh_peers) {
            return Ok((peers, Some(revision)));
        }
        self.read_at("overlay peers", peers, None).await
    }

    async fn overlay_peers_changed(&self, revision: i64, at_most: Duration) {
        let answer = self
            .read_at("overlay peers", peers, Some((revision, at_most)))
            .await;
        keep_fresh(&self.fresh_peers, answer, at_most).await;
    }

    async fn template_problems(&self, problems: Vec<TemplateProblem>) -> Result<()> {
        let problems = &problems;
        self.send("template problems", |client, base| async move {
            client.template_problems(&base, problems).await
        })
        .await
    }
}

/// Updates from the leader into `tx`, keepalives dropped, until the stream ends, sends no
/// byte for [`STREAM_SILENCE`], or the receiver goes.
async fn read_stream(mut stream: AssignmentStream, tx: mpsc::Sender<Result<AssignmentUpdate>>) {
    loop {
        let next = tokio::select! {
            next = stream.next(STREAM_SILENCE) => next,
            () = tx.closed() => return,
        };
        let update = match next {
            Ok(Some(AssignmentUpdate::Keepalive)) => continue,
            Ok(Some(update)) => Ok(update),
            Ok(None) => Err(anyhow::anyhow!("the leader ended the assignment stream")),
            Err(e) => Err(anyhow::Error::new(e)),
        };
        let failed = update.is_err();
        if tx.send(update).await.is_err() || failed {
            return;
        }
    }
}

/// Beside the endpoints file: the serials of removed nodes' certificates.
fn revoked_file(endpoints: &std::path::Path) -> PathBuf {
    endpoints.with_file_name("revoked-serials.json")
}

/// The endpoints a worker knows: written by `join`, refreshed by heartbeats.
pub fn read_endpoints(file: &std::path::Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(file).with_context(|| {
        format!(
            "cannot read {} (the control plane's API endpoints this worker was given at join)",
            file.display()
        )
    })?;
    // This node's own file, not a stored record.
    #[allow(clippy::disallowed_methods)]
    let list: Vec<String> = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a JSON list of endpoints", file.display()))?;
    if list.is_empty() {
        bail!("{} lists no endpoint", file.display());
    }
    Ok(list)
}

/// Save `list`, the control plane's API endpoints a worker knows, in `file` (JSON, mode 0600).
pub fn write_endpoints(file: &std::path::Path, list: &[String]) -> Result<()> {
    kat_runtime::state_file::write_atomic(file, &serde_json::to_vec_pretty(list)?, 0o600)
        .with_context(|| format!("cannot write {}", file.display()))
}
