//! A node's assignments as one stream of [`AssignmentUpdate`]s: its instance records now (a
//! snapshot), then every change, in revision order. An etcd member's agent reads it from the
//! store directly; the leader's API serves the same stream to worker nodes, which hold no etcd
//! credentials. Written once here so both see exactly the same sequence.
//!
//! Resuming: a client whose last change seen was at revision `r` asks to resume from `r`.
//! One transaction may change several of a node's records at the same revision and a broken
//! connection may have delivered only some of them, so the stream replays revision `r`
//! itself (puts and deletes are idempotent) and goes on from there. If that history was
//! compacted meanwhile, it starts over with a fresh snapshot (the client replaces what it
//! had), so a resumed client never misses a change.

use std::collections::VecDeque;
use std::sync::Arc;

use kat_api::keys;
use kat_api::wire::{AssignmentUpdate, InstanceId, InstanceRecord};
use kat_store::{EventKind, Result, StateStore, StoreError, WatchEvent, WatchOptions, WatchStream};

pub struct AssignmentWatch {
    store: Arc<dyn StateStore>,
    prefix: String,
    /// Updates already built, delivered before the watch is read again.
    pending: VecDeque<AssignmentUpdate>,
    watch: WatchStream,
    /// Resumed without a snapshot: a compacted history is answered with one.
    resumed: bool,
}

impl AssignmentWatch {
    /// Start `node`'s stream: a snapshot first, or (with `resume`) the changes after it.
    pub async fn start(
        store: Arc<dyn StateStore>,
        node: &str,
        resume: Option<i64>,
    ) -> Result<AssignmentWatch> {
        let prefix = keys::node_instances(node);
        if let Some(revision) = resume.filter(|r| *r > 0) {
            let watch = store
                .watch(&prefix, WatchOptions::prefix().from_revision(revision))
                .await;
            match watch {
                Ok(watch) => {
                    return Ok(AssignmentWatch {
                        store,
                        prefix,
                        pending: VecDeque::new(),
                        watch,
                        resumed: true,
                    })
                }
                Err(StoreError::Compacted { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let (snapshot, watch) = Self::snapshot(&*store, &prefix).await?;
        Ok(AssignmentWatch {
            store,
            prefix,
            pending: VecDeque::from([snapshot]),
            watch,
            resumed: false,
        })
    }

    async fn snapshot(
        store: &dyn StateStore,
        prefix: &str,
    ) -> Result<(AssignmentUpdate, WatchStream)> {
        let listing = store.list(prefix).await?;
        let records = listing
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip::<InstanceRecord>)
            .collect();
        let watch = store
            .watch(
                prefix,
                WatchOptions::prefix().from_revision(listing.revision + 1),
            )
            .await?;
        Ok((
            AssignmentUpdate::Snapshot {
                revision: listing.revision,
                records,
            },
            watch,
        ))
    }

    /// The next update; `None` when the store ended the watch for good.
    pub async fn next(&mut self) -> Option<Result<AssignmentUpdate>> {
        loop {
            if let Some(update) = self.pending.pop_front() {
                return Some(Ok(update));
            }
            let event = self.watch.next().await?;
            if let Some(update) = self.take(event).await {
                return Some(update);
            }
        }
    }

    /// An update that is ready now, without waiting.
    pub fn try_next(&mut self) -> Option<Result<AssignmentUpdate>> {
        if let Some(update) = self.pending.pop_front() {
            return Some(Ok(update));
        }
        loop {
            match self.watch.try_next()? {
                Ok(event) => {
                    if let Some(update) = self.update_of(&event) {
                        return Some(Ok(update));
                    }
                }
                // Errors (a compaction among them) are handled by `next`.
                Err(e) => return Some(Err(e)),
            }
        }
    }

    async fn take(&mut self, event: Result<WatchEvent>) -> Option<Result<AssignmentUpdate>> {
        match event {
            Ok(event) => self.update_of(&event).map(Ok),
            Err(StoreError::Compacted { .. }) if self.resumed => {
                self.resumed = false;
                match Self::snapshot(&*self.store, &self.prefix).await {
                    Ok((snapshot, watch)) => {
                        self.watch = watch;
                        Some(Ok(snapshot))
                    }
                    Err(e) => Some(Err(e)),
                }
            }
            Err(e) => Some(Err(e)),
        }
    }

    fn update_of(&self, event: &WatchEvent) -> Option<AssignmentUpdate> {
        let revision = event.revision();
        match event.kind {
            EventKind::Put => {
                kat_store::decode_or_skip::<InstanceRecord>(&event.kv).map(|record| {
                    AssignmentUpdate::Put {
                        revision,
                        record: Box::new(record),
                    }
                })
            }
            EventKind::Delete => Some(AssignmentUpdate::Delete {
                revision,
                // A key whose last part is no instance id is not one of ours: nothing to delete.
                instance_id: InstanceId::parse(event.kv.key.get(self.prefix.len()..)?).ok()?,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kat_store::MemStore;

    use super::*;

    fn record(node: &str, id: &str) -> InstanceRecord {
        InstanceRecord {
            instance_id: id.parse().unwrap(),
            namespace: "default".into(),
            workload: "web".into(),
            node: node.parse().unwrap(),
            generation: 1,
            spec_hash: "h".into(),
            workload_type: kat_api::workload::WorkloadType::Service,
            requests: Default::default(),
            job_run: None,
            created_at: "2026-01-01T00:00:00Z".parse().unwrap(),
            ip: None,
            host_ports: vec![],
            gpus: vec![],
        }
    }

    async fn put(store: &dyn StateStore, r: &InstanceRecord) -> i64 {
        store
            .put(
                &keys::instance(&r.node, &r.instance_id),
                serde_json::to_vec(r).unwrap(),
                None,
            )
            .await
            .unwrap()
    }

    async fn next(w: &mut AssignmentWatch) -> AssignmentUpdate {
        tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .expect("an update")
            .expect("the stream goes on")
            .expect("no error")
    }

    #[tokio::test]
    async fn a_snapshot_then_changes_of_this_node_only_and_a_resume_misses_nothing() {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        put(&*store, &record("n1", "web-a")).await;
        put(&*store, &record("n2", "web-b")).await;
        let mut w = AssignmentWatch::start(store.clone(), "n1", None)
            .await
            .unwrap();
        let AssignmentUpdate::Snapshot { revision, records } = next(&mut w).await else {
            panic!("a snapshot first")
        };
        assert_eq!(records, vec![record("n1", "web-a")]);
        put(&*store, &record("n2", "web-c")).await;
        let r = put(&*store, &record("n1", "web-d")).await;
        assert_eq!(
            next(&mut w).await,
            AssignmentUpdate::Put {
                revision: r,
                record: Box::new(record("n1", "web-d"))
            }
        );
        drop(w);
        // Changes while the client was away come after a resume, without a snapshot; the
        // revision resumed from is replayed (it may have carried more than one change).
        let gone = store.delete(&keys::instance("n1", "web-a")).await;
        assert!(gone.unwrap());
        let mut w = AssignmentWatch::start(store.clone(), "n1", Some(r))
            .await
            .unwrap();
        assert!(matches!(
            next(&mut w).await,
            AssignmentUpdate::Put { revision, .. } if revision == r
        ));
        assert!(matches!(
            next(&mut w).await,
            AssignmentUpdate::Delete { ref instance_id, .. } if instance_id == "web-a"
        ));
        assert!(revision < r);
    }

    #[tokio::test]
    async fn a_resume_from_compacted_history_starts_over_with_a_snapshot() {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let first = put(&*store, &record("n1", "web-a")).await;
        put(&*store, &record("n1", "web-b")).await;
        let last = put(&*store, &record("n2", "web-c")).await;
        store.compact(last).await.unwrap();
        let mut w = AssignmentWatch::start(store.clone(), "n1", Some(first))
            .await
            .unwrap();
        let AssignmentUpdate::Snapshot { records, .. } = next(&mut w).await else {
            panic!("compacted history gives a snapshot")
        };
        assert_eq!(records.len(), 2);
    }
}
