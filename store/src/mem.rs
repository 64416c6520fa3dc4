//! [`MemStore`]: the [`StateStore`] semantics in process memory.
//!
//! It keeps a global revision, per-key create/mod revisions and versions, the full event
//! history since the last compaction (so watches can start in the past), and leases whose
//! deadlines run on tokio's clock: under `tokio::time::pause()` a test advances time and
//! leases expire exactly as they would in etcd, without waiting.
//!
//! Every operation takes one short, non-async lock; watchers get events through unbounded
//! channels so that a slow watcher never blocks a writer (as etcd buffers for slow watchers).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::types::*;
use crate::StateStore;

#[derive(Clone, Default)]
pub struct MemStore {
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    revision: Revision,
    /// History before this revision is gone.
    compacted: Revision,
    kv: BTreeMap<String, KeyValue>,
    history: Vec<WatchEvent>,
    watchers: Vec<Watcher>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: LeaseId,
    /// Transactions still to refuse ([`MemStore::fail_next_txns`]).
    failing_txns: u32,
}

struct Watcher {
    key: String,
    prefix: bool,
    tx: mpsc::UnboundedSender<Result<WatchEvent>>,
}

impl Watcher {
    fn matches(&self, key: &str) -> bool {
        if self.prefix {
            key.starts_with(&self.key)
        } else {
            key == self.key
        }
    }
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses the next `n` transactions as an unreachable etcd would (tests: what a
    /// controller does when its writes do not land).
    pub fn fail_next_txns(&self, n: u32) {
        self.lock().failing_txns = n;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave half-applied state: every mutation
        // below is completed before any call that could panic. Recover the guard.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current revision (for tests and simulations).
    pub fn revision(&self) -> Revision {
        self.lock().revision
    }

    fn spawn_reaper(&self, id: LeaseId) {
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                let deadline = match store.lock().leases.get(&id) {
                    Some(lease) => lease.deadline,
                    None => return, // revoked
                };
                tokio::time::sleep_until(deadline).await;
                let mut state = store.lock();
                match state.leases.get(&id) {
                    Some(lease) if lease.deadline <= Instant::now() => {
                        state.expire(id);
                        return;
                    }
                    Some(_) => continue, // kept alive meanwhile
                    None => return,
                }
            }
        });
    }
}

impl State {
    /// Apply a batch of changes at one new revision and notify watchers.
    /// Apply puts and deletes at one new revision (gets are answered by `txn`, not here).
    fn commit(&mut self, changes: Vec<TxnOp>) -> Revision {
        if changes.is_empty() {
            return self.revision;
        }
        self.revision += 1;
        let rev = self.revision;
        for change in changes {
            let event = match change {
                TxnOp::Put { key, value, lease } => {
                    let prev = self.kv.get(&key).cloned();
                    if let Some(p) = &prev {
                        if p.lease != 0 && Some(p.lease) != lease {
                            if let Some(l) = self.leases.get_mut(&p.lease) {
                                l.keys.remove(&key);
                            }
                        }
                    }
                    if let Some(l) = lease.and_then(|id| self.leases.get_mut(&id)) {
                        l.keys.insert(key.clone());
                    }
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                        mod_revision: rev,
                        version: prev.as_ref().map_or(1, |p| p.version + 1),
                        lease: lease.unwrap_or(0),
                    };
                    self.kv.insert(key, kv.clone());
                    WatchEvent {
                        kind: EventKind::Put,
                        kv,
                        prev,
                    }
                }
                TxnOp::Get { .. } => continue,
                TxnOp::Delete { key } => {
                    let Some(prev) = self.kv.remove(&key) else {
                        continue;
                    };
                    if let Some(l) = self.leases.get_mut(&prev.lease) {
                        l.keys.remove(&key);
                    }
                    let kv = KeyValue {
                        key,
                        value: Vec::new(),
                        create_revision: 0,
                        mod_revision: rev,
                        version: 0,
                        lease: 0,
                    };
                    WatchEvent {
                        kind: EventKind::Delete,
                        kv,
                        prev: Some(prev),
                    }
                }
            };
            self.watchers
                .retain(|w| !w.matches(&event.kv.key) || w.tx.send(Ok(event.clone())).is_ok());
            self.history.push(event);
        }
        rev
    }

    fn expire(&mut self, id: LeaseId) {
        if let Some(lease) = self.leases.remove(&id) {
            let changes = lease
                .keys
                .into_iter()
                .map(|key| TxnOp::Delete { key })
                .collect();
            self.commit(changes);
        }
    }

    fn check_lease(&self, lease: Option<LeaseId>) -> Result<()> {
        match lease {
            Some(id) if !self.leases.contains_key(&id) => Err(StoreError::LeaseNotFound(id)),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl StateStore for MemStore {
    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision> {
        let mut state = self.lock();
        state.check_lease(lease)?;
        Ok(state.commit(vec![TxnOp::Put {
            key: key.to_string(),
            value,
            lease,
        }]))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.lock().kv.get(key).cloned())
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let mut state = self.lock();
        let existed = state.kv.contains_key(key);
        state.commit(vec![TxnOp::Delete {
            key: key.to_string(),
        }]);
        Ok(existed)
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<u64> {
        let mut state = self.lock();
        let keys: Vec<String> = state
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        let n = keys.len() as u64;
        state.commit(keys.into_iter().map(|key| TxnOp::Delete { key }).collect());
        Ok(n)
    }

    async fn list(&self, prefix: &str) -> Result<Listing> {
        let state = self.lock();
        let kvs = state
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        Ok(Listing {
            kvs,
            revision: state.revision,
        })
    }

    async fn watch(&self, key: &str, options: WatchOptions) -> Result<WatchStream> {
        let mut state = self.lock();
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher {
            key: key.to_string(),
            prefix: options.prefix,
            tx,
        };
        if options.start_revision > 0 {
            if options.start_revision < state.compacted {
                // Like etcd: the watch is created, then cancelled with the compaction error.
                let _ = watcher.tx.send(Err(StoreError::Compacted {
                    requested: options.start_revision,
                    compacted: state.compacted,
                }));
                return Ok(WatchStream::new(rx, None));
            }
            // History is in revision order; replay from the first event at or after start.
            let from = state
                .history
                .partition_point(|e| e.revision() < options.start_revision);
            for event in &state.history[from..] {
                if watcher.matches(&event.kv.key) {
                    let _ = watcher.tx.send(Ok(event.clone()));
                }
            }
        }
        state.watchers.push(watcher);
        Ok(WatchStream::new(rx, None))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        txn.check_size()?;
        let mut state = self.lock();
        if state.failing_txns > 0 {
            state.failing_txns -= 1;
            return Err(StoreError::Unavailable("refused by fail_next_txns".into()));
        }
        let succeeded = txn.compares.iter().all(|c| c.holds(state.kv.get(&c.key)));
        let ops = if succeeded { txn.success } else { txn.failure };
        for op in &ops {
            if let TxnOp::Put { lease, .. } = op {
                state.check_lease(*lease)?;
            }
        }
        // Gets see the writes before them in the same transaction, as in etcd; writes are
        // staged on a view and committed together at one revision.
        let mut staged: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
        let mut gets = Vec::new();
        let mut changes = Vec::new();
        let next_rev = state.revision + 1;
        for op in ops {
            match op {
                TxnOp::Get { key } => gets.push(match staged.get(&key) {
                    Some(None) => None,
                    Some(Some(value)) => {
                        let prev = state.kv.get(&key);
                        Some(KeyValue {
                            key: key.clone(),
                            value: value.clone(),
                            create_revision: prev.map_or(next_rev, |p| p.create_revision),
                            mod_revision: next_rev,
                            version: prev.map_or(1, |p| p.version + 1),
                            lease: 0,
                        })
                    }
                    None => state.kv.get(&key).cloned(),
                }),
                TxnOp::Put { key, value, lease } => {
                    staged.insert(key.clone(), Some(value.clone()));
                    changes.push(TxnOp::Put { key, value, lease });
                }
                TxnOp::Delete { key } => {
                    staged.insert(key.clone(), None);
                    changes.push(TxnOp::Delete { key });
                }
            }
        }
        let revision = state.commit(changes);
        Ok(TxnResult {
            succeeded,
            revision,
            gets,
        })
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let ttl = Duration::from_secs(ttl_seconds(ttl) as u64);
        let id = {
            let mut state = self.lock();
            state.next_lease += 1;
            let id = 0x6b61_7400_0000 + state.next_lease;
            state.leases.insert(
                id,
                Lease {
                    ttl,
                    deadline: Instant::now() + ttl,
                    keys: BTreeSet::new(),
                },
            );
            id
        };
        self.spawn_reaper(id);
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut state = self.lock();
        let l = state
            .leases
            .get_mut(&lease)
            .ok_or(StoreError::LeaseNotFound(lease))?;
        if l.deadline <= Instant::now() {
            // Expired but not reaped yet: it is gone all the same.
            state.expire(lease);
            return Err(StoreError::LeaseNotFound(lease));
        }
        l.deadline = Instant::now() + l.ttl;
        Ok(())
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut state = self.lock();
        if !state.leases.contains_key(&lease) {
            return Err(StoreError::LeaseNotFound(lease));
        }
        state.expire(lease);
        Ok(())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut state = self.lock();
        if revision > state.revision {
            return Err(StoreError::InvalidRequest(format!(
                "cannot compact at {revision}, beyond the current revision {}",
                state.revision
            )));
        }
        if revision <= state.compacted {
            return Err(StoreError::Compacted {
                requested: revision,
                compacted: state.compacted,
            });
        }
        let keep_from = state.history.partition_point(|e| e.revision() < revision);
        state.history.drain(..keep_from);
        state.compacted = revision;
        Ok(())
    }
}
