//! The node's image store: unpacked layers keyed by digest, image records by reference,
//! and per-image snapshots.
//!
//! ```text
//! ROOT/index.json                  image records (rewritten atomically and durably; a
//!                                  corrupt one is moved aside and the store starts afresh)
//! ROOT/layers/<hex>/               one unpacked layer, keyed by its (compressed) digest
//! ROOT/snapshots/<config hex>/     the image's layers flattened (hard links)
//! ROOT/tmp/                        downloads in flight
//! ```
//!
//! A layer shared by several images is unpacked once. Work on one layer, one snapshot or one
//! reference is serialised by a keyed lock, so concurrent pulls of one image do the work once.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::config::{digest_hex, RunConfig};
use super::layer::{self, Ownership};
use super::limits::{Budget, PullTimeouts, UnpackLimits};
use super::snapshot;
use super::unpack_sandbox::UnpackSandbox;
use crate::error::{IoContext, Result, RuntimeError};
use crate::idmap::IdMap;
use crate::tree_dir::remove_tree;
use crate::types::ImageSummary;

/// One image as the store knows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// The config digest (`sha256:…`).
    pub id: String,
    /// The references (names) that point at it.
    pub references: Vec<String>,
    /// The digest of its manifest.
    pub manifest_digest: String,
    /// The digests of its layers, base first.
    pub layers: Vec<String>,
    /// How the image wants to be run.
    pub config: RunConfig,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexFile {
    images: BTreeMap<String, ImageRecord>,
    layer_sizes: BTreeMap<String, u64>,
    /// Entries of each layer, for the image limits of images that share it. Absent in
    /// stores written before the limits existed (counted as 0).
    #[serde(default)]
    layer_entries: BTreeMap<String, u64>,
}

/// Async locks by name, created on first use and forgotten once nobody holds or waits for
/// them (names are per image and per slice and image: they would pile up for the agent's life).
#[derive(Default)]
pub struct KeyedLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyedLocks {
    /// The lock of `key`, made on first use.
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map has it: no holder, no waiter (each has a clone of the Arc).
        map.retain(|_, lock| Arc::strong_count(lock) > 1);
        map.entry(key.to_string()).or_default().clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The node's image store (see the module).
pub struct ImageStore {
    root: PathBuf,
    ids: IdMap,
    privileged: bool,
    limits: UnpackLimits,
    timeouts: PullTimeouts,
    index: Mutex<()>,
    pub(crate) locks: KeyedLocks,
    /// Unpacks layers as an id that owns nothing; `None`: in this process.
    sandbox: Option<UnpackSandbox>,
}

/// What the API shows of an image: its record and the bytes of its layers.
fn summarize(record: &ImageRecord, index: &IndexFile) -> ImageSummary {
    ImageSummary {
        id: record.id.clone(),
        references: record.references.clone(),
        manifest_digest: record.manifest_digest.clone(),
        layers: record.layers.clone(),
        size: record
            .layers
            .iter()
            .map(|l| index.layer_sizes.get(l).copied().unwrap_or(0))
            .sum(),
    }
}

/// The canonical form of a reference (`127.0.0.1:5000/kat/busybox:latest`,
/// `docker.io/library/alpine:3`), or an error naming it.
pub fn normalize_reference(reference: &str) -> Result<String> {
    Ok(parse_reference(reference)?.whole())
}

pub use super::reference::parse_reference;

impl ImageStore {
    /// Opens the store at `root`, making its directories, with the default limits and timeouts;
    /// removes what a crash left of downloads and unpacks.
    pub fn open(root: &Path, ids: IdMap) -> Result<ImageStore> {
        for sub in ["layers", "snapshots", "tmp"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
            // Only the agent enters: layers and snapshots keep the image's own ids, and each
            // workload's overlay uses its own shifted copy (`slots/`, see the runtime).
            let mode = 0o700;
            fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .context(|| format!("chmod {}", dir.display()))?;
        }
        // Downloads and unpacks interrupted by a crash.
        if let Ok(entries) = fs::read_dir(root.join("tmp")) {
            for e in entries.flatten() {
                let _ = remove_tree(&e.path());
                let _ = fs::remove_file(e.path());
            }
        }
        for sub in ["layers", "snapshots"] {
            if let Ok(entries) = fs::read_dir(root.join(sub)) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().contains(".partial-") {
                        let _ = remove_tree(&e.path());
                    }
                }
            }
        }
        Ok(ImageStore {
            root: root.to_path_buf(),
            privileged: nix::unistd::geteuid().is_root(),
            ids,
            limits: UnpackLimits::default(),
            timeouts: PullTimeouts::default(),
            index: Mutex::new(()),
            locks: KeyedLocks::default(),
            sandbox: None,
        })
    }

    /// The same store unpacking layers in `sandbox` (as an id that owns nothing on the
    /// host); removes what an interrupted sandboxed unpack left.
    pub fn with_sandbox(mut self, sandbox: UnpackSandbox) -> ImageStore {
        if let Ok(entries) = fs::read_dir(self.root.join("layers")) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().contains(".partial-") {
                    if let Err(err) = sandbox.remove(&e.path()) {
                        tracing::warn!(path = %e.path().display(), error = %err, "cannot remove an interrupted unpack");
                    }
                }
            }
        }
        self.sandbox = Some(sandbox);
        self
    }

    /// The same store with other caps on what one image may unpack to.
    pub fn with_limits(mut self, limits: UnpackLimits) -> ImageStore {
        self.limits = limits;
        self
    }

    /// The same store with other registry timeouts.
    pub fn with_timeouts(mut self, timeouts: PullTimeouts) -> ImageStore {
        self.timeouts = timeouts;
        self
    }

    /// What one image may unpack to.
    pub fn limits(&self) -> UnpackLimits {
        self.limits
    }

    /// The registry timeouts of pulls into this store.
    pub fn timeouts(&self) -> PullTimeouts {
        self.timeouts
    }

    /// Where downloads in flight go (`ROOT/tmp`).
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn layer_dir(&self, digest: &str) -> Result<PathBuf> {
        let hex = digest_hex(digest).ok_or_else(|| RuntimeError::BadLayer {
            digest: digest.to_string(),
            reason: "not a sha256 digest".into(),
        })?;
        Ok(self.root.join("layers").join(hex))
    }

    /// Whether the layer `digest` is unpacked in the store.
    pub fn has_layer(&self, digest: &str) -> bool {
        self.layer_dir(digest).map(|d| d.is_dir()).unwrap_or(false)
    }

    /// Counts a layer already in the store against `budget`, from the sizes recorded when
    /// it was unpacked: a layer shared with another image still costs this one.
    pub fn count_stored_layer(&self, digest: &str, budget: &mut Budget) -> Result<()> {
        let index = self.load()?;
        let bytes = index.layer_sizes.get(digest).copied().unwrap_or(0);
        let entries = index.layer_entries.get(digest).copied().unwrap_or(0);
        budget.add_bytes(digest, bytes)?;
        budget.add_entries(digest, entries)
    }

    /// Unpacks a verified layer blob, once, counting it against `budget`. The caller holds
    /// the layer's lock.
    pub async fn add_layer(&self, digest: &str, blob: PathBuf, budget: &mut Budget) -> Result<()> {
        let dest = self.layer_dir(digest)?;
        if dest.is_dir() {
            return self.count_stored_layer(digest, budget);
        }
        let ids = self.ids.clone();
        let privileged = self.privileged;
        let digest_owned = digest.to_string();
        let mut working = budget.clone();
        let sandbox = self.sandbox.clone();
        let (stats, working) = tokio::task::spawn_blocking(move || {
            if let Some(sandbox) = sandbox {
                let stats = sandbox.unpack(&blob, &dest, &digest_owned, &mut working)?;
                return Ok::<_, RuntimeError>((stats, working));
            }
            let file = fs::File::open(&blob).context(|| format!("opening {}", blob.display()))?;
            let ownership = if privileged {
                Ownership::Mapped(&ids)
            } else {
                Ownership::Squashed
            };
            let stats = layer::unpack(file, &dest, ownership, &digest_owned, &mut working)?;
            Ok::<_, RuntimeError>((stats, working))
        })
        .await
        .map_err(|e| RuntimeError::Container {
            context: format!("unpacking layer {digest}"),
            message: e.to_string(),
        })??;
        *budget = working;
        self.update(|index| {
            index.layer_sizes.insert(digest.to_string(), stats.bytes);
            index
                .layer_entries
                .insert(digest.to_string(), stats.entries);
        })?;
        Ok(())
    }

    fn load(&self) -> Result<IndexFile> {
        let path = self.root.join("index.json");
        match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(index) => Ok(index),
                // A torn or damaged index must not stop the node: keep it aside for a
                // look, and start afresh (images are pulled again; layers on disk stay).
                Err(e) => {
                    let aside = self.root.join(format!(
                        "index.json.corrupt-{}",
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0)
                    ));
                    tracing::warn!(path = %path.display(), error = %e, aside = %aside.display(), "the image index is corrupt; moved aside, images will be pulled again");
                    fs::rename(&path, &aside)
                        .context(|| format!("moving {} aside", path.display()))?;
                    Ok(IndexFile::default())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(IndexFile::default()),
            Err(e) => Err(e).context(|| format!("reading {}", path.display())),
        }
    }

    fn update<T>(&self, change: impl FnOnce(&mut IndexFile) -> T) -> Result<T> {
        let _guard = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let mut index = self.load()?;
        let out = change(&mut index);
        let path = self.root.join("index.json");
        let bytes = serde_json::to_vec_pretty(&index).map_err(|e| RuntimeError::Io {
            context: "encoding the image index".into(),
            source: std::io::Error::other(e),
        })?;
        crate::state_file::write_atomic(&path, &bytes, 0o600)
            .context(|| format!("writing {}", path.display()))?;
        Ok(out)
    }

    /// Records an image whose layers are all present, under `reference`. A reference moves
    /// from any image that had it before.
    pub fn register(
        &self,
        reference: &str,
        manifest_digest: &str,
        config_digest: &str,
        layers: Vec<String>,
        config: RunConfig,
    ) -> Result<ImageSummary> {
        for l in &layers {
            if !self.has_layer(l) {
                return Err(RuntimeError::ImageNotPresent(format!(
                    "{reference} (layer {l} missing)"
                )));
            }
        }
        let record = self.update(|index| {
            for other in index.images.values_mut() {
                other.references.retain(|r| r != reference);
            }
            let record = index
                .images
                .entry(config_digest.to_string())
                .or_insert_with(|| ImageRecord {
                    id: config_digest.to_string(),
                    references: Vec::new(),
                    manifest_digest: manifest_digest.to_string(),
                    layers: layers.clone(),
                    config: config.clone(),
                });
            record.references.push(reference.to_string());
            record.references.sort();
            let record = record.clone();
            summarize(&record, index)
        })?;
        Ok(record)
    }

    /// Names image `id` `to`, dropping its name `from`: a cached build pulled under its
    /// cache name is kept under the workload's local name only. By id, so another pull that
    /// moves `from` meanwhile cannot make this fail.
    pub fn rename(&self, id: &str, from: &str, to: &str) -> Result<ImageSummary> {
        let (from, to) = (normalize_reference(from)?, normalize_reference(to)?);
        self.update(|index| {
            for other in index.images.values_mut() {
                other.references.retain(|r| *r != to);
            }
            let record = index.images.get_mut(id)?;
            record.references.retain(|r| *r != from);
            record.references.push(to.clone());
            record.references.sort();
            let record = record.clone();
            Some(summarize(&record, index))
        })?
        .ok_or_else(|| RuntimeError::ImageNotPresent(id.to_string()))
    }

    /// Finds an image by reference or by id (`sha256:…`).
    pub fn resolve(&self, reference: &str) -> Result<ImageRecord> {
        let index = self.load()?;
        if let Some(record) = index.images.get(reference) {
            return Ok(record.clone());
        }
        let wanted = normalize_reference(reference)?;
        index
            .images
            .values()
            .find(|r| r.references.contains(&wanted))
            .cloned()
            .ok_or(RuntimeError::ImageNotPresent(wanted))
    }

    /// Every image in the store, with the bytes of its layers.
    pub fn list(&self) -> Result<Vec<ImageSummary>> {
        let index = self.load()?;
        Ok(index
            .images
            .values()
            .map(|r| summarize(r, &index))
            .collect())
    }

    /// The flattened tree of an image, built on first use.
    pub async fn snapshot(&self, record: &ImageRecord) -> Result<PathBuf> {
        let hex = digest_hex(&record.id)
            .ok_or_else(|| RuntimeError::ImageNotPresent(record.id.clone()))?;
        let dest = self.root.join("snapshots").join(hex);
        let lock = self.locks.get(&format!("snapshot:{hex}"));
        let _guard = lock.lock().await;
        if dest.is_dir() {
            return Ok(dest);
        }
        let layers: Vec<PathBuf> = record
            .layers
            .iter()
            .map(|l| self.layer_dir(l))
            .collect::<Result<_>>()?;
        let root_owner = self
            .privileged
            .then(|| (self.ids.host_uid(0), self.ids.host_gid(0)));
        let target = dest.clone();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&Path> = layers.iter().map(|p| p.as_path()).collect();
            snapshot::build(&refs, &target, root_owner)
        })
        .await
        .map_err(|e| RuntimeError::Container {
            context: format!("building the snapshot of {}", record.id),
            message: e.to_string(),
        })??;
        Ok(dest)
    }

    /// Drops `reference`; the image goes when no reference is left and no container uses
    /// it. Returns the bytes reclaimed.
    pub fn remove(&self, reference: &str, in_use: &[String]) -> Result<u64> {
        let record = self.resolve(reference)?;
        let by_id = record.id == reference;
        let wanted = if by_id {
            String::new()
        } else {
            normalize_reference(reference)?
        };
        let gone = self.update(|index| {
            if let Some(r) = index.images.get_mut(&record.id) {
                if by_id {
                    r.references.clear();
                } else {
                    r.references.retain(|x| *x != wanted);
                }
            }
        });
        gone?;
        if in_use.contains(&record.id) {
            if by_id {
                return Err(RuntimeError::ImageInUse {
                    image: record.id.clone(),
                    containers: "running containers".into(),
                });
            }
            return Ok(0);
        }
        let index = self.load()?;
        if index
            .images
            .get(&record.id)
            .map(|r| r.references.is_empty())
            .unwrap_or(false)
        {
            return self.delete_images(&[record.id]);
        }
        Ok(0)
    }

    /// Removes every image no container uses. Returns the bytes reclaimed.
    pub fn prune(&self, in_use: &[String]) -> Result<u64> {
        let unused: Vec<String> = self
            .load()?
            .images
            .keys()
            .filter(|id| !in_use.contains(id))
            .cloned()
            .collect();
        self.delete_images(&unused)
    }

    fn delete_images(&self, ids: &[String]) -> Result<u64> {
        let doomed_layers = self.update(|index| {
            for id in ids {
                index.images.remove(id);
            }
            let live: std::collections::BTreeSet<&String> = index
                .images
                .values()
                .flat_map(|r| r.layers.iter())
                .collect();
            let doomed: Vec<(String, u64)> = index
                .layer_sizes
                .iter()
                .filter(|(l, _)| !live.contains(l))
                .map(|(l, s)| (l.clone(), *s))
                .collect();
            for (l, _) in &doomed {
                index.layer_sizes.remove(l);
                index.layer_entries.remove(l);
            }
            doomed
        })?;
        for id in ids {
            if let Some(hex) = digest_hex(id) {
                remove_tree(&self.root.join("snapshots").join(hex))
                    .context(|| format!("removing the snapshot of {id}"))?;
            }
        }
        let mut reclaimed = 0;
        for (digest, size) in doomed_layers {
            let dir = self.layer_dir(&digest)?;
            remove_tree(&dir).context(|| format!("removing layer {digest}"))?;
            reclaimed += size;
        }
        Ok(reclaimed)
    }
}

#[cfg(test)]
mod keyed_locks_tests {
    use super::KeyedLocks;

    #[tokio::test]
    async fn a_held_lock_is_kept_and_idle_ones_are_forgotten() {
        let locks = KeyedLocks::default();
        let a = locks.get("a");
        let held = a.lock().await;
        for n in 0..100 {
            drop(locks.get(&format!("idle-{n}")));
        }
        assert_eq!(locks.len(), 2, "a, held, and the last idle one");
        // The same lock for the same name while it is held: a second taker waits.
        assert!(locks.get("a").try_lock().is_err());
        drop(held);
        drop(a);
        drop(locks.get("b"));
        assert_eq!(locks.len(), 1);
    }
}
