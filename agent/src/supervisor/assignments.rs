//! What this node must run: its instance records from etcd, with each one's Quadlet files,
//! and the local copy that survives a reboot.
//!
//! A task lists `/kat/instances/{node}/`, fetches the files of each record's generation (from
//! the archive, so an old instance in a rolling update keeps its old spec) and then follows a
//! watch from the listing's revision. Every change produces a full snapshot for the
//! supervisor and rewrites `assignments.json` atomically. When the store cannot be reached
//! at start-up the snapshot comes from that file, so a rebooted node brings its workloads
//! back while etcd or the leader is still down; once the store answers, its listing wins and
//! the supervisor converges to it (adopting containers by instance id, so no duplicates).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::InstanceRecord;
use kat_store::{EventKind, StateStore, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// One assigned instance and the files of the generation it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub record: InstanceRecord,
    pub files: BTreeMap<String, String>,
}

pub type Snapshot = BTreeMap<String, Assignment>;

/// Where a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Store,
    LocalCopy,
}

pub struct Feed {
    store: Arc<dyn StateStore>,
    node: String,
    copy_path: PathBuf,
    files_cache: HashMap<(String, String, u64), BTreeMap<String, String>>,
}

impl Feed {
    pub fn new(store: Arc<dyn StateStore>, node: &str, state_dir: &Path) -> Self {
        Feed {
            store,
            node: node.to_string(),
            copy_path: state_dir.join("assignments.json"),
            files_cache: HashMap::new(),
        }
    }

    /// Run until the receiver is dropped, publishing snapshots into `tx`.
    pub async fn run(mut self, tx: watch::Sender<Option<(Source, Snapshot)>>) {
        let mut first = true;
        let mut delay = Duration::from_millis(200);
        loop {
            match self.follow(&tx).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot follow assignments; retrying");
                    if first {
                        if let Some(copy) = self.load_copy() {
                            tracing::info!(
                                instances = copy.len(),
                                "store unreachable: running from the local copy of assignments"
                            );
                            let _ = tx.send(Some((Source::LocalCopy, copy)));
                        }
                    }
                }
            }
            first = false;
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    async fn follow(
        &mut self,
        tx: &watch::Sender<Option<(Source, Snapshot)>>,
    ) -> Result<(), kat_store::StoreError> {
        let prefix = keys::node_instances(&self.node);
        let listing = tokio::time::timeout(Duration::from_secs(3), self.store.list(&prefix))
            .await
            .map_err(|_| {
                kat_store::StoreError::Unavailable("listing assignments timed out".into())
            })??;
        let mut records: BTreeMap<String, InstanceRecord> = listing
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<InstanceRecord>(&kv.value).ok())
            .map(|r| (r.instance_id.clone(), r))
            .collect();
        let mut watch = self
            .store
            .watch(
                &prefix,
                WatchOptions::prefix().from_revision(listing.revision + 1),
            )
            .await?;
        self.publish(tx, &records).await?;
        while let Some(event) = watch.next().await {
            let event = event?;
            let id = event.kv.key[prefix.len()..].to_string();
            match event.kind {
                EventKind::Put => {
                    if let Ok(r) = serde_json::from_slice::<InstanceRecord>(&event.kv.value) {
                        records.insert(id, r);
                    }
                }
                EventKind::Delete => {
                    records.remove(&id);
                }
            }
            // Take in everything already delivered before publishing once.
            while let Some(more) = watch.try_next() {
                let more = more?;
                let id = more.kv.key[prefix.len()..].to_string();
                match more.kind {
                    EventKind::Put => {
                        if let Ok(r) = serde_json::from_slice::<InstanceRecord>(&more.kv.value) {
                            records.insert(id, r);
                        }
                    }
                    EventKind::Delete => {
                        records.remove(&id);
                    }
                }
            }
            self.publish(tx, &records).await?;
            if tx.is_closed() {
                return Ok(());
            }
        }
        Err(kat_store::StoreError::Unavailable(
            "the assignment watch ended".into(),
        ))
    }

    async fn publish(
        &mut self,
        tx: &watch::Sender<Option<(Source, Snapshot)>>,
        records: &BTreeMap<String, InstanceRecord>,
    ) -> Result<(), kat_store::StoreError> {
        let mut snapshot = Snapshot::new();
        for (id, record) in records {
            let files = self.files_of(record).await?;
            snapshot.insert(
                id.clone(),
                Assignment {
                    record: record.clone(),
                    files,
                },
            );
        }
        self.files_cache.retain(|(ns, name, generation), _| {
            records
                .values()
                .any(|r| &r.namespace == ns && &r.workload == name && r.generation == *generation)
        });
        if let Err(e) = self.save_copy(&snapshot) {
            tracing::warn!(error = %e, path = %self.copy_path.display(), "cannot write the local copy of assignments");
        }
        let _ = tx.send(Some((Source::Store, snapshot)));
        Ok(())
    }

    /// The Quadlet files of `record`'s generation: archived copy first, current files else.
    async fn files_of(
        &mut self,
        record: &InstanceRecord,
    ) -> Result<BTreeMap<String, String>, kat_store::StoreError> {
        let key = (
            record.namespace.clone(),
            record.workload.clone(),
            record.generation,
        );
        if let Some(files) = self.files_cache.get(&key) {
            return Ok(files.clone());
        }
        let archive = format!(
            "{}{:020}/",
            keys::workload_archives(&record.namespace, &record.workload),
            record.generation
        );
        let mut listing = self.store.list(&archive).await?;
        let mut prefix = archive;
        if listing.kvs.is_empty() {
            prefix = keys::workload_manifests(&record.namespace, &record.workload);
            listing = self.store.list(&prefix).await?;
        }
        let files: BTreeMap<String, String> = listing
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    kv.key[prefix.len()..].to_string(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect();
        if !files.is_empty() {
            self.files_cache.insert(key, files.clone());
        }
        Ok(files)
    }

    fn save_copy(&self, snapshot: &Snapshot) -> std::io::Result<()> {
        // Durable: after a power cut the node brings its workloads back from this copy.
        kat_runtime::state_file::write_atomic(
            &self.copy_path,
            &serde_json::to_vec_pretty(snapshot)?,
            0o600,
        )
    }

    fn load_copy(&self) -> Option<Snapshot> {
        read_copy(&self.copy_path)
    }
}

/// The local copy of assignments kept in `state_dir`, if there is a readable one.
pub fn load_copy(state_dir: &Path) -> Option<Snapshot> {
    read_copy(&state_dir.join("assignments.json"))
}

fn read_copy(path: &Path) -> Option<Snapshot> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "the local copy of assignments is unreadable; ignoring it");
            None
        }
    }
}
