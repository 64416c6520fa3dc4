//! Snapshots of etcd for backups: the maintenance API's `Snapshot` (a consistent copy of the
//! member's backend, which etcd ends with its own SHA-256), streamed into
//! `{dir}/{name}.tmp`, synced and renamed into place, with `{name}.sha256` beside it in
//! `sha256sum` format so that `sha256sum -c` checks it too. A restore checks that file
//! first ([`verify`]).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::types::{Result, StoreError};
use crate::EtcdStore;

/// A snapshot on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    pub path: PathBuf,
    pub size: u64,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}

/// Where the checksum of snapshot `db` is kept.
pub fn checksum_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    db.with_file_name(name)
}

fn io(what: &Path, e: std::io::Error) -> StoreError {
    StoreError::Backend(format!("{}: {e}", what.display()))
}

impl EtcdStore {
    /// Streams a snapshot of the member this store talks to into `dir/name` (created 0700
    /// if missing; the file is 0600: it holds every secret of the cluster).
    pub async fn snapshot_to(&self, dir: &Path, name: &str) -> Result<SnapshotFile> {
        use std::os::unix::fs::DirBuilderExt;
        if name.contains('/') || name.starts_with('.') {
            return Err(StoreError::Backend(format!(
                "{name:?} is not a snapshot file name"
            )));
        }
        let d = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
        })
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?
        .map_err(|e| io(dir, e))?;
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .await
            .map_err(|e| io(&tmp, e))?;
        let written = self.stream_snapshot(&mut file, &tmp).await;
        let (size, sha256) = match written {
            Ok(done) => done,
            Err(e) => {
                drop(file);
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        file.sync_all().await.map_err(|e| io(&tmp, e))?;
        drop(file);
        // The checksum first: a snapshot is never in place without it.
        let sum = checksum_path(&path);
        let sum_tmp = dir.join(format!("{name}.sha256.tmp"));
        let placed = async {
            tokio::fs::write(&sum_tmp, format!("{sha256}  {name}\n"))
                .await
                .map_err(|e| io(&sum_tmp, e))?;
            tokio::fs::rename(&sum_tmp, &sum)
                .await
                .map_err(|e| io(&sum, e))?;
            tokio::fs::rename(&tmp, &path)
                .await
                .map_err(|e| io(&path, e))
        };
        if let Err(e) = placed.await {
            for leftover in [&tmp, &sum_tmp, &sum] {
                let _ = tokio::fs::remove_file(leftover).await;
            }
            return Err(e);
        }
        let d = dir.to_path_buf();
        let _ =
            tokio::task::spawn_blocking(move || std::fs::File::open(d).and_then(|f| f.sync_all()))
                .await;
        Ok(SnapshotFile { path, size, sha256 })
    }

    async fn stream_snapshot(
        &self,
        file: &mut tokio::fs::File,
        path: &Path,
    ) -> Result<(u64, String)> {
        let mut maintenance = self.client().maintenance_client();
        let mut stream = maintenance
            .snapshot()
            .await
            .map_err(|e| StoreError::Unavailable(format!("etcd snapshot: {e}")))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = stream
            .message()
            .await
            .map_err(|e| StoreError::Unavailable(format!("etcd snapshot stream: {e}")))?
        {
            let blob = chunk.blob();
            hasher.update(blob);
            size += blob.len() as u64;
            file.write_all(blob).await.map_err(|e| io(path, e))?;
        }
        if size == 0 {
            return Err(StoreError::Unavailable(
                "etcd sent an empty snapshot".into(),
            ));
        }
        Ok((size, hex::encode(hasher.finalize())))
    }
}

/// Checks snapshot `db` against the checksum beside it; its SHA-256 when they agree.
/// Blocking (reads the whole file): call it from a blocking context.
pub fn verify(db: &Path) -> std::result::Result<String, String> {
    let sum_file = checksum_path(db);
    let text = std::fs::read_to_string(&sum_file).map_err(|e| {
        format!(
            "{}: {e} (a KAT backup has its checksum beside it; without one the snapshot cannot be trusted)",
            sum_file.display()
        )
    })?;
    let expected = text
        .split_whitespace()
        .next()
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{}: expected `SHA256  NAME`", sum_file.display()))?
        .to_ascii_lowercase();
    let mut file = std::fs::File::open(db).map_err(|e| format!("{}: {e}", db.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: {e}", db.display()))?;
    let actual = hex::encode(hasher.finalize());
    if actual != expected {
        return Err(format!(
            "{}: SHA-256 is {actual}, but {} says {expected}: the file is damaged or not this backup",
            db.display(),
            sum_file.display()
        ));
    }
    Ok(actual)
}

/// Whether `name` is `{prefix}{stamp}.db` with a time stamp (`20261124T143600.123Z`) and
/// nothing else: the prefix of node `cp1` must not take in the files of node `cp1-b`.
fn is_snapshot_of(name: &str, prefix: &str) -> bool {
    let Some(stamp) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(".db"))
    else {
        return false;
    };
    let b = stamp.as_bytes();
    b.len() == 20
        && b[8] == b'T'
        && b[15] == b'.'
        && b[19] == b'Z'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 8 | 15 | 19) || c.is_ascii_digit())
}

/// The snapshots in `dir` named `{prefix}{stamp}.db`, oldest first (the names carry the
/// time, so they sort by it).
pub fn list(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| is_snapshot_of(n, prefix))
        })
        .collect();
    found.sort();
    found
}

/// Deletes all but the newest `keep` snapshots named `prefix…` in `dir` (and their
/// checksums); what was deleted. Blocking.
/// A file already gone (another backup pruning at the same time) is no error. Temporary
/// files of the prefix an hour old (a snapshot cut short) go too.
pub fn prune(dir: &Path, prefix: &str, keep: usize) -> std::io::Result<Vec<PathBuf>> {
    let all = list(dir, prefix);
    let old = all.len().saturating_sub(keep.max(1));
    let mut removed = Vec::new();
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    for db in &all[..old] {
        gone(std::fs::remove_file(db))?;
        gone(std::fs::remove_file(checksum_path(db)))?;
        removed.push(db.clone());
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(3600));
            if name.starts_with(prefix) && name.ends_with(".tmp") && stale {
                gone(std::fs::remove_file(e.path()))?;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_and_prune() {
        let dir = tempfile::tempdir().unwrap();
        for (i, body) in ["a", "bb", "ccc"].iter().enumerate() {
            let db = dir.path().join(format!("kat-x-2026112{i}T000000.000Z.db"));
            std::fs::write(&db, body).unwrap();
            let sum = hex::encode(Sha256::digest(body.as_bytes()));
            std::fs::write(checksum_path(&db), format!("{sum}  name\n")).unwrap();
            assert_eq!(verify(&db).unwrap(), sum);
        }
        let newest = dir.path().join("kat-x-20261122T000000.000Z.db");
        std::fs::write(&newest, "cCc").unwrap();
        let e = verify(&newest).unwrap_err();
        assert!(e.contains("damaged"), "{e}");
        std::fs::remove_file(checksum_path(&newest)).unwrap();
        assert!(verify(&newest).unwrap_err().contains("checksum"));
        std::fs::write(dir.path().join("other.db"), "x").unwrap();
        // Another node whose name starts like this one's: its files are not this node's.
        let neighbour = dir.path().join("kat-x-b-20261101T000000.000Z.db");
        std::fs::write(&neighbour, "x").unwrap();
        let removed = prune(dir.path(), "kat-x-", 2).unwrap();
        assert_eq!(removed, [dir.path().join("kat-x-20261120T000000.000Z.db")]);
        assert_eq!(list(dir.path(), "kat-x-").len(), 2);
        assert!(dir.path().join("other.db").exists() && neighbour.exists());
    }
}
