//! Backups (RFC 001 §5.4): the leader snapshots etcd every `backupIntervalMinutes` through
//! the maintenance API of its own member, into `backupPath` as
//! `kat-{cluster}-{node}-{YYYYMMDDTHHMMSS.mmm}Z.db` with its SHA-256 beside it
//! ([`kat_store::snapshot`]), keeps the newest `backupRetention` there, and records each in
//! the store (`/kat/backups/{name}`: node, path, time, size, checksum) with a `BackupCreated`
//! event in the same transaction. A failure is a `BackupFailed` event and a metric, never
//! silence. The schedule follows the newest record, whoever wrote it, so a new leader carries
//! it on instead of starting over. `katcall backup create` takes one at once ([`take`]), on
//! the node whose API it reaches.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kat_api::keys;
use kat_api::wire::{BackupRecord, EventType, ObjectReference, Timestamp};
use kat_store::{EtcdStore, StateStore, Txn, TxnOp};

use crate::events::{event, EventLog};
use crate::metrics::Metrics;

/// What a node's backups need to know.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    pub cluster: String,
    pub node: String,
    pub dir: PathBuf,
    pub interval: Duration,
    pub retention: usize,
}

/// After a failure, the next attempt comes this soon (or at the interval, if shorter).
const RETRY_AFTER: Duration = Duration::from_secs(300);

/// The object backup events are about: the cluster.
fn cluster_ref(cluster: &str) -> ObjectReference {
    ObjectReference {
        kind: "Cluster".into(),
        name: cluster.to_string(),
        namespace: None,
        uid: None,
    }
}

/// What every snapshot file `node` takes of `cluster` starts with (the node is in the name:
/// copies from several nodes in one place stay apart, and each prunes only its own).
pub fn file_prefix(cluster: &str, node: &str) -> String {
    format!("kat-{cluster}-{node}-")
}

/// The snapshot file `node` takes of `cluster` at `at`: its name sorts by time.
pub fn file_name(cluster: &str, node: &str, at: SystemTime) -> String {
    let stamp: String = Timestamp::from(at)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    format!("{}{stamp}.db", file_prefix(cluster, node))
}

/// Every recorded backup, oldest first.
pub async fn list(store: &dyn StateStore) -> kat_store::Result<Vec<BackupRecord>> {
    let listing = store.list(keys::backups()).await?;
    let mut records: Vec<BackupRecord> = listing
        .kvs
        .iter()
        .filter_map(kat_store::decode_or_skip)
        .collect();
    records.sort_by_key(|r| r.taken_at);
    Ok(records)
}

/// When the next scheduled backup is due: `interval` after the newest one any node took;
/// `None` when there is none.
pub fn next_due(records: &[BackupRecord], interval: Duration) -> Option<SystemTime> {
    records
        .iter()
        .map(|r| r.taken_at.system_time())
        .max()
        .map(|last| last + interval)
}

/// Takes a backup now: the snapshot, its record and event, then this node's older files (and
/// their records) beyond the retention go.
pub async fn take(
    etcd: &EtcdStore,
    store: &dyn StateStore,
    events: &EventLog,
    config: &BackupConfig,
    trigger: &str,
) -> Result<BackupRecord, String> {
    let at = SystemTime::now();
    let name = file_name(&config.cluster, &config.node, at);
    let file = etcd
        .snapshot_to(&config.dir, &name)
        .await
        .map_err(|e| format!("snapshot into {}: {e}", config.dir.display()))?;
    let record = BackupRecord {
        name: name.clone(),
        node: config.node.clone(),
        path: file.path.display().to_string(),
        taken_at: at.into(),
        size_bytes: file.size,
        sha256: file.sha256,
        trigger: trigger.to_string(),
    };
    let mut ops = vec![TxnOp::put_json(keys::backup(&name), &record)
        .map_err(|e| format!("recording backup {name}: {e}"))?];
    ops.extend(events.ops(&event(
        record.taken_at,
        EventType::Normal,
        "BackupCreated",
        cluster_ref(&config.cluster),
        format!(
            "{} on {} ({} bytes, sha256 {})",
            record.path,
            record.node,
            record.size_bytes,
            &record.sha256[..12]
        ),
    )));
    store
        .txn(Txn::new().and_then(ops))
        .await
        .map_err(|e| format!("recording backup {name}: {e}"))?;
    let (dir, prefix, keep) = (
        config.dir.clone(),
        file_prefix(&config.cluster, &config.node),
        config.retention,
    );
    // The backup is written and recorded: old ones that cannot go are a warning, not a
    // failed backup (which would take another at once).
    let pruned =
        tokio::task::spawn_blocking(move || kat_store::snapshot::prune(&dir, &prefix, keep)).await;
    match pruned {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(dir = %config.dir.display(), error = %e, "old backups not removed")
        }
        Err(e) => tracing::warn!(error = %e, "old backups not removed"),
    }
    // The records of this node's backups in this directory whose files are gone: removed
    // just now, or by a run cut short between the files and the records (a leader that
    // lost its lease there), or by hand. Records first, then the files: a record is written
    // after its file, so a backup taken meanwhile is never taken for gone.
    let records: Vec<BackupRecord> = list(store)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| {
            r.node == config.node && Path::new(&r.path).parent() == Some(config.dir.as_path())
        })
        .collect();
    let gone = tokio::task::spawn_blocking(move || {
        records
            .into_iter()
            .filter(|r| {
                matches!(std::fs::symlink_metadata(&r.path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound)
            })
            .map(|r| TxnOp::delete(keys::backup(&r.name)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    if !gone.is_empty() {
        if let Err(e) = store.txn(Txn::new().and_then(gone)).await {
            tracing::warn!(error = %e, "records of removed backups not deleted");
        }
    }
    Ok(record)
}

/// The leader's schedule, until the task is dropped (when leadership ends).
pub async fn run(
    etcd: EtcdStore,
    store: Arc<dyn StateStore>,
    config: BackupConfig,
    metrics: Arc<Metrics>,
) {
    let events = EventLog::new(crate::events::DEFAULT_CAPACITY);
    let mut retry_at: Option<SystemTime> = None;
    loop {
        let now = SystemTime::now();
        let due = match retry_at {
            Some(t) => t,
            None => match list(&*store).await {
                // None yet: the first an interval after this node took the lead.
                Ok(records) => next_due(&records, config.interval).unwrap_or(now + config.interval),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the backup records; trying again in 10 s");
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    continue;
                }
            },
        };
        if let Ok(wait) = due.duration_since(now) {
            tokio::time::sleep(wait).await;
            if retry_at.is_none() {
                // Another node may have taken one meanwhile (`katcall backup create`).
                if let Ok(records) = list(&*store).await {
                    let later = next_due(&records, config.interval)
                        .is_some_and(|d| d > SystemTime::now() + Duration::from_secs(1));
                    if later {
                        continue;
                    }
                }
            }
        }
        match take(&etcd, &*store, &events, &config, "schedule").await {
            Ok(record) => {
                tracing::info!(file = %record.path, bytes = record.size_bytes, "backup written");
                metrics.record_backup(Some(
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                ));
                retry_at = None;
            }
            Err(e) => {
                tracing::error!(error = %e, "backup failed");
                metrics.record_backup(None);
                let failed = event(
                    Timestamp::now(),
                    EventType::Warning,
                    "BackupFailed",
                    cluster_ref(&config.cluster),
                    format!("on {}: {e}", config.node),
                );
                if let Err(e) = store.txn(Txn::new().and_then(events.ops(&failed))).await {
                    tracing::warn!(error = %e, "cannot record the failed backup's event");
                }
                retry_at = Some(SystemTime::now() + RETRY_AFTER.min(config.interval));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time_and_the_schedule_follows_the_newest() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let a = file_name("home", "n1", t0);
        let b = file_name("home", "n1", t0 + Duration::from_millis(1500));
        assert!(a.starts_with("kat-home-n1-") && a.ends_with("Z.db"), "{a}");
        assert!(!a.contains(':') && a < b, "{a} {b}");
        let interval = Duration::from_secs(1800);
        assert_eq!(next_due(&[], interval), None);
        let record = |at: SystemTime| BackupRecord {
            name: file_name("home", "n1", at),
            node: "n1".into(),
            path: String::new(),
            taken_at: at.into(),
            size_bytes: 1,
            sha256: String::new(),
            trigger: "schedule".into(),
        };
        let older = t0 - Duration::from_secs(3000);
        let newer = t0 - Duration::from_secs(600);
        // A new leader: due an interval after the newest, whoever took it.
        assert_eq!(
            next_due(&[record(newer), record(older)], interval),
            Some(newer + interval)
        );
        // Overdue: at once.
        assert!(next_due(&[record(older)], interval).unwrap() < t0);
    }
}
