//! Leader election on any [`StateStore`], after etcd's `concurrency.Election`.
//!
//! Each candidate takes a lease and creates `{prefix}{lease id}` attached to it. Candidates
//! are ordered by the create revision of their key: the lowest leads, every other waits for
//! the deletion of the key just before its own (no thundering herd). A leader keeps its
//! lease alive; leadership ends when the lease cannot be refreshed (expired, revoked, or the
//! store unreachable for a whole TTL) or the key is deleted. [`Leadership`] reports that loss
//! so the leader role can stop at once; writes that must only be made by the current leader
//! can be fenced with [`Leadership::fence`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::types::*;
use crate::StateStore;

/// Held by the current leader.
pub struct Leadership {
    store: Arc<dyn StateStore>,
    key: String,
    lease: LeaseId,
    create_revision: Revision,
    lost: watch::Receiver<bool>,
    guard: JoinHandle<()>,
}

impl Leadership {
    /// Resolves when leadership is lost. Cancel-safe; returns at once if already lost.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        let _ = rx.wait_for(|lost| *lost).await;
    }

    pub fn is_leader(&self) -> bool {
        !*self.lost.borrow()
    }

    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// A compare that holds only while this leadership does: add it to a transaction so that
    /// a deposed leader's writes fail instead of racing its successor's.
    pub fn fence(&self) -> Compare {
        Compare::create_revision_is(self.key.clone(), self.create_revision)
    }

    /// Step down: delete the key and revoke the lease, so the next candidate leads at once.
    pub async fn resign(self) -> Result<()> {
        self.guard.abort();
        self.store.delete(&self.key).await?;
        match self.store.revoke_lease(self.lease).await {
            Ok(()) | Err(StoreError::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stop refreshing the lease without resigning, as a crashed process would: the next
    /// candidate takes over when the lease expires. Used by tests and by shutdown paths that
    /// must not hand over early.
    pub fn abandon(self) {
        self.guard.abort();
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.guard.abort();
    }
}

/// Campaign under `prefix` as `candidate` (the value others read as the leader's identity,
/// e.g. its API endpoint). Returns once this candidate leads.
pub async fn campaign(
    store: Arc<dyn StateStore>,
    prefix: &str,
    candidate: &str,
    ttl: Duration,
) -> Result<Leadership> {
    let lease = store.grant_lease(ttl).await?;
    let key = format!("{prefix}{lease:016x}");
    let (lost_tx, lost_rx) = watch::channel(false);
    // Refresh from the start: waiting for a long-lived leader must not expire our key.
    let keeper = tokio::spawn(keep_alive(store.clone(), lease, ttl, lost_tx.clone()));
    let result = async {
        let txn = Txn::new()
            .when([Compare::absent(&key)])
            .and_then([TxnOp::put_leased(&key, candidate, lease)])
            .or_else([TxnOp::get(&key)]);
        store.txn(txn).await?;
        wait_for_turn(&*store, prefix, &key, &lost_rx).await
    }
    .await;
    let create_revision = match result {
        Ok(rev) => rev,
        Err(e) => {
            keeper.abort();
            let _ = store.revoke_lease(lease).await;
            return Err(e);
        }
    };
    // One task guards the leadership: it keeps the lease alive and watches the key.
    keeper.abort();
    let guard = tokio::spawn(guard_leadership(
        store.clone(),
        key.clone(),
        lease,
        ttl,
        create_revision,
        lost_tx,
    ));
    Ok(Leadership {
        store,
        key,
        lease,
        create_revision,
        lost: lost_rx,
        guard,
    })
}

/// The identity of the current leader under `prefix`, if any.
pub async fn current_leader(store: &dyn StateStore, prefix: &str) -> Result<Option<String>> {
    let listing = store.list(prefix).await?;
    Ok(listing
        .kvs
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}

/// Wait until `key` has the lowest create revision under `prefix`; returns its create revision.
async fn wait_for_turn(
    store: &dyn StateStore,
    prefix: &str,
    key: &str,
    lost: &watch::Receiver<bool>,
) -> Result<Revision> {
    loop {
        let listing = store.list(prefix).await?;
        let Some(mine) = listing
            .kvs
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.create_revision)
        else {
            return Err(StoreError::LeaseNotFound(0)); // our lease expired while we waited
        };
        let predecessor = listing
            .kvs
            .iter()
            .filter(|kv| kv.create_revision < mine)
            .max_by_key(|kv| kv.create_revision);
        let Some(predecessor) = predecessor else {
            return Ok(mine);
        };
        let mut events = store
            .watch(
                &predecessor.key,
                WatchOptions::key().from_revision(listing.revision + 1),
            )
            .await?;
        let mut lost = lost.clone();
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(e)) if e.kind == EventKind::Delete => break,
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => break, // re-list and look again
                },
                _ = lost.wait_for(|l| *l) => return Err(StoreError::LeaseNotFound(0)),
            }
        }
    }
}

/// Refresh `lease` every ttl/3. Report loss once the lease is gone, or once no refresh has
/// succeeded for a whole TTL (the store may have expired it without us hearing).
async fn keep_alive(
    store: Arc<dyn StateStore>,
    lease: LeaseId,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let period = ttl / 3;
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match tokio::time::timeout(period, store.keep_alive(lease)).await {
            Ok(Ok(())) => last_ok = Instant::now(),
            Ok(Err(StoreError::LeaseNotFound(_))) => break,
            Ok(Err(_)) | Err(_) => {
                if last_ok.elapsed() >= ttl {
                    break;
                }
            }
        }
    }
    let _ = lost.send(true);
}

async fn guard_leadership(
    store: Arc<dyn StateStore>,
    key: String,
    lease: LeaseId,
    ttl: Duration,
    create_revision: Revision,
    lost: watch::Sender<bool>,
) {
    let deleted = {
        let store = store.clone();
        let key = key.clone();
        async move {
            loop {
                // Watch from our own creation so no deletion can slip between checks.
                let Ok(mut events) = store
                    .watch(&key, WatchOptions::key().from_revision(create_revision))
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                while let Some(event) = events.next().await {
                    match event {
                        Ok(e) if e.kind == EventKind::Delete => return,
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                // The watch broke: if the key is gone (or recreated by someone else), we lost.
                match store.get(&key).await {
                    Ok(Some(kv)) if kv.create_revision == create_revision => continue,
                    Ok(_) => return,
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    };
    let (tx, _rx) = watch::channel(false);
    tokio::select! {
        _ = keep_alive(store.clone(), lease, ttl, tx) => {}
        _ = deleted => {}
    }
    let _ = lost.send(true);
}
