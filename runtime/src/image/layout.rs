//! Importing an image from an OCI layout directory (what `buildah push oci:DIR` writes, and
//! what KAT's build pipeline hands over).

use std::path::{Path, PathBuf};

use super::config::{digest_hex, node_architecture, sha256_digest, ConfigFile, Index, Manifest};
use super::limits::{Budget, MAX_JSON_BLOB};
use super::store::{normalize_reference, ImageStore};
use crate::error::{Result, RuntimeError};
use crate::types::ImageSummary;

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

fn bad(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::BadLayout {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    let hex =
        digest_hex(digest).ok_or_else(|| bad(dir, format!("{digest:?} is not a sha256 digest")))?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// Reads a JSON blob (index, manifest, config) and checks it against its digest.
fn read_blob(dir: &Path, digest: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let path = blob_path(dir, digest)?;
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_JSON_BLOB + 1).read_to_end(&mut bytes))
        .map_err(|e| bad(dir, format!("blob {digest}: {e}")))?;
    if bytes.len() as u64 > MAX_JSON_BLOB {
        return Err(bad(
            dir,
            format!("blob {digest} is larger than {MAX_JSON_BLOB} bytes, too large for JSON"),
        ));
    }
    let actual = sha256_digest(&bytes);
    if actual != digest {
        return Err(RuntimeError::DigestMismatch {
            what: format!("blob {} in {}", digest, dir.display()),
            expected: digest.to_string(),
            actual,
        });
    }
    Ok(bytes)
}

/// Imports the image of `dir` tagged `reference`. With several images in the layout, the
/// one annotated with `reference`'s tag is taken.
pub async fn import(store: &ImageStore, dir: &Path, reference: &str) -> Result<ImageSummary> {
    let whole = normalize_reference(reference)?;
    let tag = whole
        .rsplit_once(':')
        .map(|(_, t)| t)
        .unwrap_or("latest")
        .to_string();
    let index_bytes =
        std::fs::read(dir.join("index.json")).map_err(|e| bad(dir, format!("index.json: {e}")))?;
    let index: Index =
        serde_json::from_slice(&index_bytes).map_err(|e| bad(dir, format!("index.json: {e}")))?;
    let mut descriptor = match index.manifests.as_slice() {
        [] => return Err(bad(dir, "index.json lists no manifests")),
        [only] => only.clone(),
        many => many
            .iter()
            .find(|d| {
                d.annotations
                    .get("org.opencontainers.image.ref.name")
                    .map(|n| n == &tag || n.ends_with(&format!(":{tag}")))
                    .unwrap_or(false)
            })
            .cloned()
            .ok_or_else(|| {
                bad(
                    dir,
                    format!("{} manifests and none is tagged {tag:?}", many.len()),
                )
            })?,
    };
    // A nested index: pick this node's platform.
    for _ in 0..2 {
        if !INDEX_TYPES.contains(&descriptor.media_type.as_str()) {
            break;
        }
        let nested: Index = serde_json::from_slice(&read_blob(dir, &descriptor.digest)?)
            .map_err(|e| bad(dir, format!("index {}: {e}", descriptor.digest)))?;
        descriptor = nested
            .manifests
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .map(|p| p.os == "linux" && p.architecture == node_architecture())
                    .unwrap_or(false)
            })
            .cloned()
            .ok_or_else(|| {
                bad(
                    dir,
                    format!("no manifest for linux/{}", node_architecture()),
                )
            })?;
    }
    let manifest: Manifest = serde_json::from_slice(&read_blob(dir, &descriptor.digest)?)
        .map_err(|e| bad(dir, format!("manifest {}: {e}", descriptor.digest)))?;
    let config: ConfigFile = serde_json::from_slice(&read_blob(dir, &manifest.config.digest)?)
        .map_err(|e| bad(dir, format!("config {}: {e}", manifest.config.digest)))?;

    let mut layers = Vec::new();
    let mut budget = Budget::new(&whole, store.limits());
    for layer in &manifest.layers {
        let lock = store.locks.get(&format!("layer:{}", layer.digest));
        let _guard = lock.lock().await;
        if store.has_layer(&layer.digest) {
            store.count_stored_layer(&layer.digest, &mut budget)?;
        } else {
            // Verify by hashing the file as it is, then unpack that same file.
            let path = blob_path(dir, &layer.digest)?;
            let digest = layer.digest.clone();
            let check = path.clone();
            let actual = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
                use sha2::Digest;
                let mut file = std::fs::File::open(&check)?;
                let mut hasher = sha2::Sha256::new();
                std::io::copy(&mut file, &mut hasher)?;
                Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
            })
            .await
            .map_err(|e| bad(dir, e.to_string()))?
            .map_err(|e| bad(dir, format!("blob {digest}: {e}")))?;
            if actual != digest {
                return Err(RuntimeError::DigestMismatch {
                    what: format!("layer in {}", dir.display()),
                    expected: digest,
                    actual,
                });
            }
            store.add_layer(&layer.digest, path, &mut budget).await?;
        }
        layers.push(layer.digest.clone());
    }
    store.register(
        &whole,
        &descriptor.digest,
        &manifest.config.digest,
        layers,
        config.config,
    )
}
