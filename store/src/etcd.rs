//! [`EtcdStore`]: the [`StateStore`] on a real etcd, through the `etcd-client` crate.
//!
//! The mapping is direct; the care is in errors and watches. A watch runs in a task that
//! forwards events into the [`WatchStream`] channel and ends the stream with an error when
//! etcd cancels it (compaction) or the connection drops, so the caller can resume from the
//! last revision it saw. The task stops when the stream is dropped.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client as ec;
use tokio::sync::mpsc;

use kat_api::keys;

use crate::types::*;
use crate::{EtcdTls, StateStore};

/// What [`EtcdStore::promote_learners`] did: the learners promoted, and how many are left.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Promotion {
    pub promoted: Vec<String>,
    pub waiting: usize,
}

#[derive(Clone)]
pub struct EtcdStore {
    client: ec::Client,
    endpoints: Vec<String>,
    tls: Option<EtcdTls>,
}

impl EtcdStore {
    /// Connect to etcd at `endpoints` (e.g. `https://127.0.0.1:2379`), with this node's TLS
    /// identity where etcd requires one (KAT's always does; plain `http://` is for tests).
    pub async fn connect(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<Self> {
        let mut options = ec::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = tls {
            options = options.with_tls(tls.client_options()?);
        }
        let client = ec::Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot connect to etcd at {}: {e}",
                    endpoints.join(",")
                ))
            })?;
        Ok(EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
            tls: tls.cloned(),
        })
    }

    pub(crate) fn client(&self) -> &ec::Client {
        &self.client
    }

    /// The TLS identity this store connected with, to open more connections like it.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// Add a learner member `name` at `peer_url` (a learner does not count towards the
    /// quorum until it is promoted, so a node that never starts its etcd cannot stall the
    /// cluster). Returns the `--initial-cluster` the new member starts with: every member, as
    /// etcd checks it (by peer URL; a member that has not started yet has no name and gets its
    /// id). Idempotent: a retried join for the same peer URL gets the same answer. Records
    /// the learner under [`keys::etcd_learners`], which wakes the members' promotion loops.
    pub async fn add_learner(&self, name: &str, peer_url: &str) -> Result<String> {
        let mut c = self.client.clone();
        let list = c.member_list().await.map_err(map_err)?;
        let ours = list
            .members()
            .iter()
            .any(|m| m.peer_urls().iter().any(|u| u == peer_url));
        if !ours {
            retry_reconfiguration(|| {
                let mut c = c.clone();
                let url = peer_url.to_string();
                async move {
                    c.member_add([url], Some(ec::MemberAddOptions::new().with_is_learner()))
                        .await
                        .map(|_| ())
                }
            })
            .await?;
        }
        self.put(
            &keys::etcd_learner(name),
            peer_url.as_bytes().to_vec(),
            None,
        )
        .await?;
        let list = c.member_list().await.map_err(map_err)?;
        let mut parts = Vec::new();
        for m in list.members() {
            let is_new = m.peer_urls().iter().any(|u| u == peer_url);
            let member = match m.name() {
                _ if is_new => name.to_string(),
                "" => format!("pending-{:x}", m.id()),
                named => named.to_string(),
            };
            for u in m.peer_urls() {
                parts.push(format!("{member}={u}"));
            }
        }
        Ok(parts.join(","))
    }

    /// Promote every learner that has caught up. A learner still catching up (or not started
    /// yet: it has no name) is left for the next call, and counted in
    /// [`Promotion::waiting`].
    pub async fn promote_learners(&self) -> Result<Promotion> {
        let mut c = self.client.clone();
        let list = c.member_list().await.map_err(map_err)?;
        let mut promotion = Promotion::default();
        for m in list.members().iter().filter(|m| m.is_learner()) {
            if m.name().is_empty() {
                promotion.waiting += 1;
                continue;
            }
            match c.member_promote(m.id()).await {
                Ok(_) => {
                    // Only a wake-up for the loops: a key left behind costs nothing.
                    if let Err(e) = self.delete(&keys::etcd_learner(m.name())).await {
                        tracing::debug!(member = m.name(), error = %e, "forgetting a promoted learner");
                    }
                    promotion.promoted.push(m.name().to_string());
                }
                Err(e) => {
                    promotion.waiting += 1;
                    tracing::debug!(member = m.name(), error = %e, "learner not promoted yet")
                }
            }
        }
        Ok(promotion)
    }

    /// Remove the member named `name` from the quorum; `false` if there is none. Refuses to
    /// remove the last voting member.
    pub async fn remove_member(&self, name: &str) -> Result<bool> {
        let mut c = self.client.clone();
        let list = c.member_list().await.map_err(map_err)?;
        let Some(member) = list.members().iter().find(|m| m.name() == name) else {
            return Ok(false);
        };
        let voters = list.members().iter().filter(|m| !m.is_learner()).count();
        if voters <= 1 && !member.is_learner() {
            return Err(StoreError::InvalidRequest(format!(
                "{name} is the last voting etcd member; the cluster cannot remove it"
            )));
        }
        let id = member.id();
        retry_reconfiguration(|| {
            let mut c = c.clone();
            async move { c.member_remove(id).await.map(|_| ()) }
        })
        .await?;
        Ok(true)
    }

    /// The voting members and learners, as `(name, peer URLs, is_learner)`.
    pub async fn members(&self) -> Result<Vec<(String, Vec<String>, bool)>> {
        let mut c = self.client.clone();
        let list = c.member_list().await.map_err(map_err)?;
        Ok(list
            .members()
            .iter()
            .map(|m| (m.name().to_string(), m.peer_urls().to_vec(), m.is_learner()))
            .collect())
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

/// Run a membership change, retrying (up to a minute) while etcd refuses it for now: it
/// takes one learner at a time, and no change until every member has been connected for a
/// while (a member promoted, restarted or back from a partition a moment ago).
async fn retry_reconfiguration<F, Fut>(mut change: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(), ec::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match change().await {
            Ok(()) => return Ok(()),
            Err(e)
                if (e.to_string().contains("too many learner members")
                    || e.to_string().contains("unhealthy cluster"))
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(map_err(e)),
        }
    }
}

fn map_err(e: ec::Error) -> StoreError {
    match &e {
        ec::Error::GRpcStatus(status) => {
            let msg = status.message();
            if msg.contains("requested lease not found") {
                // The lease id is not in the message; callers attach it.
                StoreError::LeaseNotFound(0)
            } else if msg.contains("required revision has been compacted") {
                StoreError::Compacted {
                    requested: 0,
                    compacted: 0,
                }
            } else if matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ) {
                StoreError::Unavailable(msg.to_string())
            } else {
                StoreError::Backend(format!("{:?}: {msg}", status.code()))
            }
        }
        ec::Error::LeaseKeepAliveError(msg) if msg.contains("lease not found") => {
            StoreError::LeaseNotFound(0)
        }
        ec::Error::TransportError(_) | ec::Error::IoError(_) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

fn lease_err(lease: LeaseId) -> impl Fn(ec::Error) -> StoreError {
    move |e| match map_err(e) {
        StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
        other => other,
    }
}

fn kv(k: &ec::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(k.key()).into_owned(),
        value: k.value().to_vec(),
        create_revision: k.create_revision(),
        mod_revision: k.mod_revision(),
        version: k.version(),
        lease: k.lease(),
    }
}

fn header_revision(h: Option<&ec::ResponseHeader>) -> Revision {
    h.map_or(0, |h| h.revision())
}

fn compare(c: &Compare) -> ec::Compare {
    let op = match c.op {
        CompareOp::Equal => ec::CompareOp::Equal,
        CompareOp::NotEqual => ec::CompareOp::NotEqual,
        CompareOp::Less => ec::CompareOp::Less,
        CompareOp::Greater => ec::CompareOp::Greater,
    };
    match &c.target {
        CompareTarget::Version(v) => ec::Compare::version(c.key.as_str(), op, *v),
        CompareTarget::CreateRevision(r) => ec::Compare::create_revision(c.key.as_str(), op, *r),
        CompareTarget::ModRevision(r) => ec::Compare::mod_revision(c.key.as_str(), op, *r),
        CompareTarget::Value(v) => ec::Compare::value(c.key.as_str(), op, v.clone()),
    }
}

fn txn_op(op: &TxnOp) -> ec::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => ec::TxnOp::put(
            key.as_str(),
            value.clone(),
            lease.map(|l| ec::PutOptions::new().with_lease(l)),
        ),
        TxnOp::Delete { key } => ec::TxnOp::delete(key.as_str(), None),
        TxnOp::Get { key } => ec::TxnOp::get(key.as_str(), None),
    }
}

#[async_trait]
impl StateStore for EtcdStore {
    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        let opts = lease.map(|l| ec::PutOptions::new().with_lease(l));
        let resp = self
            .client
            .kv_client()
            .put(key, value, opts)
            .await
            .map_err(lease_err(lease.unwrap_or(0)))?;
        Ok(header_revision(resp.header()))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self
            .client
            .kv_client()
            .get(key, None)
            .await
            .map_err(map_err)?;
        Ok(resp.kvs().first().map(kv))
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let resp = self
            .client
            .kv_client()
            .delete(key, None)
            .await
            .map_err(map_err)?;
        Ok(resp.deleted() > 0)
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        let resp = self
            .client
            .kv_client()
            .delete(prefix, Some(ec::DeleteOptions::new().with_prefix()))
            .await
            .map_err(map_err)?;
        Ok(resp.deleted() as u64)
    }

    async fn list(&self, prefix: &str) -> Result<Listing> {
        let resp = self
            .client
            .kv_client()
            .get(prefix, Some(ec::GetOptions::new().with_prefix()))
            .await
            .map_err(map_err)?;
        Ok(Listing {
            kvs: resp.kvs().iter().map(kv).collect(),
            revision: header_revision(resp.header()),
        })
    }

    async fn watch(&self, key: &str, options: WatchOptions) -> Result<WatchStream> {
        let mut opts = ec::WatchOptions::new().with_prev_key();
        if options.prefix {
            opts = opts.with_prefix();
        }
        if options.start_revision > 0 {
            opts = opts.with_start_revision(options.start_revision);
        }
        let (watcher, mut stream) = self
            .client
            .watch_client()
            .watch(key, Some(opts))
            .await
            .map_err(map_err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let requested = options.start_revision;
        let task = tokio::spawn(async move {
            let _watcher = watcher; // dropping it would cancel the watch
            loop {
                let resp = match stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => {
                        let _ =
                            tx.send(Err(StoreError::Unavailable("etcd closed the watch".into())));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(map_err(e)));
                        return;
                    }
                };
                if resp.compact_revision() > 0 {
                    let _ = tx.send(Err(StoreError::Compacted {
                        requested,
                        compacted: resp.compact_revision(),
                    }));
                    return;
                }
                for event in resp.events() {
                    let Some(k) = event.kv() else { continue };
                    let kind = match event.event_type() {
                        ec::EventType::Put => EventKind::Put,
                        ec::EventType::Delete => EventKind::Delete,
                    };
                    let mut current = kv(k);
                    if kind == EventKind::Delete {
                        current.value.clear();
                    }
                    let out = WatchEvent {
                        kind,
                        kv: current,
                        prev: event.prev_kv().map(kv),
                    };
                    if tx.send(Ok(out)).is_err() {
                        return; // the stream was dropped
                    }
                }
                if resp.canceled() {
                    let _ = tx.send(Err(StoreError::Unavailable(format!(
                        "etcd cancelled the watch: {}",
                        resp.cancel_reason()
                    ))));
                    return;
                }
            }
        });
        Ok(WatchStream::new(rx, Some(Box::new(AbortOnDrop(task)))))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        txn.check_size()?;
        let request = ec::Txn::new()
            .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.success.iter().map(txn_op).collect::<Vec<_>>())
            .or_else(txn.failure.iter().map(txn_op).collect::<Vec<_>>());
        let resp = self
            .client
            .kv_client()
            .txn(request)
            .await
            .map_err(map_err)?;
        let gets = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                ec::TxnOpResponse::Get(g) => Some(g.kvs().first().map(kv)),
                _ => None,
            })
            .collect();
        Ok(TxnResult {
            succeeded: resp.succeeded(),
            revision: header_revision(resp.header()),
            gets,
        })
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let resp = self
            .client
            .lease_client()
            .grant(ttl_seconds(ttl), None)
            .await
            .map_err(map_err)?;
        Ok(resp.id())
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let (mut keeper, mut stream) = self
            .client
            .lease_client()
            .keep_alive(lease)
            .await
            .map_err(lease_err(lease))?;
        keeper.keep_alive().await.map_err(lease_err(lease))?;
        match stream.message().await.map_err(lease_err(lease))? {
            Some(resp) if resp.ttl() > 0 => Ok(()),
            _ => Err(StoreError::LeaseNotFound(lease)),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.client
            .lease_client()
            .revoke(lease)
            .await
            .map_err(lease_err(lease))?;
        Ok(())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.client
            .kv_client()
            .compact(revision, Some(ec::CompactionOptions::new().with_physical()))
            .await
            .map_err(|e| match map_err(e) {
                StoreError::Compacted { .. } => StoreError::Compacted {
                    requested: revision,
                    compacted: revision,
                },
                other => other,
            })?;
        Ok(())
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
