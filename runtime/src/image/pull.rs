//! Pulling images from OCI registries (the protocol in [`super::registry`]).
//!
//! OCI and Docker v2 schema 2 manifests are accepted; an index is resolved to this node's
//! platform. Credentials come from the usual auth files (`auth.json` of containers-auth, or
//! Docker's `config.json`); anonymous otherwise. Plain HTTP is used only for registries the
//! node lists as insecure. Every blob is hashed while it is written and checked against its
//! digest before it is unpacked.
//!
//! A registry is untrusted: reading a manifest or a token stops at its cap, reading a blob
//! as soon as it sends more than the size its descriptor declares (a config is also capped
//! at [`MAX_JSON_BLOB`]); connections go only where the node's outbound policy allows
//! (`kat_outbound`: not loopback, link-local or the node's own addresses, unless the
//! registry is one the admin named with `--insecure-registry`); the client gives up
//! on a connection after [`PullTimeouts::connect`], on a silent response after
//! [`PullTimeouts::read`], and on any one manifest or blob after [`PullTimeouts::blob`]
//! even while bytes still trickle in.

use std::path::{Path, PathBuf};

use kat_outbound::OutboundPolicy;
use oci_client::Reference;
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use super::config::{digest_hex, ConfigFile};
use super::limits::{Budget, PullTimeouts, MAX_JSON_BLOB};
use super::registry::{describe, Credentials, Registry};
use super::store::ImageStore;
use crate::error::{IoContext, Result, RuntimeError};
use crate::types::{ImageSummary, PullProgress};

/// Where a pull reports its [`PullProgress`].
pub type ProgressSender = tokio::sync::mpsc::UnboundedSender<PullProgress>;

/// Registries and credentials.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// `host[:port]` of registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// Auth files to read, first match wins. Empty means the usual places.
    pub auth_files: Vec<PathBuf>,
}

impl RegistryConfig {
    fn auth_files(&self) -> Vec<PathBuf> {
        if !self.auth_files.is_empty() {
            return self.auth_files.clone();
        }
        let mut files = Vec::new();
        if let Ok(dir) = std::env::var("XDG_RUNTIME_DIR") {
            files.push(PathBuf::from(dir).join("containers/auth.json"));
        }
        if let Ok(home) = std::env::var("HOME") {
            files.push(PathBuf::from(&home).join(".config/containers/auth.json"));
            files.push(PathBuf::from(&home).join(".docker/config.json"));
        }
        files
    }

    /// The first auth file that exists (the one a build's buildah reads).
    pub fn auth_file(&self) -> Option<PathBuf> {
        self.auth_files().into_iter().find(|f| f.is_file())
    }

    /// Basic credentials for `registry` from the first auth file that has them.
    pub fn credentials_for(&self, registry: &str) -> Credentials {
        for file in self.auth_files() {
            if let Some(credentials) = read_auth_file(&file, registry) {
                return credentials;
            }
        }
        Credentials::Anonymous
    }
}

fn read_auth_file(path: &Path, registry: &str) -> Option<Credentials> {
    use base64::Engine;
    let text = std::fs::read_to_string(path).ok()?;
    let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
    let auths = doc.get("auths")?.as_object()?;
    let entry = auths.iter().find(|(host, _)| {
        let host = host
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        host.split('/').next() == Some(registry)
    })?;
    let encoded = entry.1.get("auth")?.as_str()?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, pass) = decoded.split_once(':')?;
    Some(Credentials::Basic {
        user: user.to_string(),
        password: pass.to_string(),
    })
}

/// Pulls `reference` into `store`. Concurrent pulls of one reference do the work once.
pub async fn pull(
    store: &ImageStore,
    config: &RegistryConfig,
    outbound: &OutboundPolicy,
    reference: &str,
    progress: Option<&ProgressSender>,
) -> Result<ImageSummary> {
    let parsed = super::store::parse_reference(reference)?;
    let whole = parsed.whole();
    let lock = store.locks.get(&format!("pull:{whole}"));
    let _guard = lock.lock().await;

    let timeouts = store.timeouts();
    let registry = Registry::new(&parsed, config, outbound, timeouts)?;
    let (manifest, manifest_digest) =
        tokio::time::timeout(timeouts.blob, registry.image_manifest())
            .await
            .map_err(|_| RuntimeError::Pull {
                reference: whole.clone(),
                message: format!(
                    "the manifest from registry {} did not arrive within {:?}",
                    parsed.resolve_registry(),
                    timeouts.blob
                ),
            })??;
    let config_digest = manifest.config.digest.clone();
    let mut config_text = Vec::new();
    let fetch = Fetch {
        registry: &registry,
        reference: &parsed,
        timeouts,
    };
    fetch
        .blob(&manifest.config, MAX_JSON_BLOB, &mut config_text, |_| {})
        .await?;
    let config_file: ConfigFile =
        serde_json::from_slice(&config_text).map_err(|e| RuntimeError::Pull {
            reference: whole.clone(),
            message: format!("image config is not valid JSON: {e}"),
        })?;
    let send = |p: PullProgress| {
        if let Some(tx) = progress {
            let _ = tx.send(p);
        }
    };
    send(PullProgress::Resolved {
        reference: whole.clone(),
        layers: manifest.layers.len(),
        total_bytes: manifest.layers.iter().map(|l| l.size.max(0) as u64).sum(),
    });

    let mut layers = Vec::new();
    let limits = store.limits();
    let mut budget = Budget::new(&whole, limits);
    // A compressed layer is at most its content plus a tar header and padding per entry
    // (and a little of gzip's framing): a larger one would only fill the disk.
    let max_blob = limits
        .max_bytes
        .saturating_add(limits.max_entries.saturating_mul(1024))
        .saturating_add(1 << 20);
    for layer in &manifest.layers {
        let digest = layer.digest.clone();
        let layer_lock = store.locks.get(&format!("layer:{digest}"));
        let _layer_guard = layer_lock.lock().await;
        if store.has_layer(&digest) {
            store.count_stored_layer(&digest, &mut budget)?;
            send(PullProgress::LayerCached {
                digest: digest.clone(),
                size: layer.size.max(0) as u64,
            });
            layers.push(digest);
            continue;
        }
        // The digest names a file: it must be one.
        let hex = digest_hex(&digest).ok_or_else(|| RuntimeError::Pull {
            reference: whole.clone(),
            message: format!("layer digest {digest:?} is not a sha256 digest"),
        })?;
        let blob = store.tmp_dir().join(format!("blob-sha256-{hex}"));
        let result = download(&fetch, layer, max_blob, &blob, progress).await;
        let result = match result {
            Ok(()) => store.add_layer(&digest, blob.clone(), &mut budget).await,
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_file(&blob).await;
        result?;
        send(PullProgress::LayerDone {
            digest: digest.clone(),
        });
        layers.push(digest);
    }
    let summary = store.register(
        &whole,
        &manifest_digest,
        &config_digest,
        layers,
        config_file.config,
    )?;
    send(PullProgress::Done {
        image_id: summary.id.clone(),
    });
    Ok(summary)
}

/// Downloads a layer blob into `dest`, reporting progress.
async fn download(
    fetch: &Fetch<'_>,
    layer: &oci_client::manifest::OciDescriptor,
    max: u64,
    dest: &Path,
    progress: Option<&ProgressSender>,
) -> Result<()> {
    let mut file = tokio::fs::File::create(dest)
        .await
        .context(|| format!("creating {}", dest.display()))?;
    let total = layer.size.max(0) as u64;
    let mut last_report = 0u64;
    fetch
        .blob(layer, max, &mut file, |downloaded| {
            if downloaded - last_report >= 1 << 20 || downloaded == total {
                last_report = downloaded;
                if let Some(tx) = progress {
                    let _ = tx.send(PullProgress::LayerBytes {
                        digest: layer.digest.clone(),
                        downloaded,
                        total,
                    });
                }
            }
        })
        .await?;
    file.flush()
        .await
        .context(|| format!("writing {}", dest.display()))
}

/// Where blobs come from, and how long one may take.
struct Fetch<'a> {
    registry: &'a Registry,
    reference: &'a Reference,
    timeouts: PullTimeouts,
}

impl Fetch<'_> {
    /// Streams blob `desc` into `out`: no more than the size its descriptor declares (and
    /// than `max`), within the deadline, and checked against its digest. `on_bytes` hears
    /// the bytes received so far.
    async fn blob(
        &self,
        desc: &oci_client::manifest::OciDescriptor,
        max: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
        on_bytes: impl FnMut(u64),
    ) -> Result<()> {
        let deadline = self.timeouts.blob;
        tokio::time::timeout(deadline, self.stream(desc, max, out, on_bytes))
            .await
            .map_err(|_| {
                self.error(
                    desc,
                    format!("not complete within {deadline:?}, the deadline for one blob"),
                )
            })?
    }

    async fn stream(
        &self,
        desc: &oci_client::manifest::OciDescriptor,
        max: u64,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
        mut on_bytes: impl FnMut(u64),
    ) -> Result<()> {
        if digest_hex(&desc.digest).is_none() {
            return Err(self.error(desc, "the digest is not a sha256 digest".into()));
        }
        let size = u64::try_from(desc.size).map_err(|_| {
            self.error(
                desc,
                format!("the descriptor's size {} is negative", desc.size),
            )
        })?;
        if size > max {
            return Err(self.error(
                desc,
                format!("the descriptor says {size} bytes, more than the {max} allowed"),
            ));
        }
        let mut response = self.registry.blob(&desc.digest).await?;
        let too_much =
            || format!("the registry sends more than the {size} bytes its descriptor declares");
        if response.content_length().is_some_and(|len| len > size) {
            return Err(self.error(desc, too_much()));
        }
        let mut hasher = sha2::Sha256::new();
        let mut received = 0u64;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.error(desc, self.failure(&e)))?
        {
            received += chunk.len() as u64;
            // Nothing past the declared size is kept: the stream is dropped right here.
            if received > size {
                return Err(self.error(desc, too_much()));
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|e| self.error(desc, format!("writing it: {e}")))?;
            on_bytes(received);
        }
        if received < size {
            return Err(self.error(
                desc,
                format!("the registry sent {received} of the {size} bytes its descriptor declares"),
            ));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest {
            return Err(RuntimeError::DigestMismatch {
                what: format!(
                    "blob of {} from registry {}",
                    self.reference.whole(),
                    self.reference.resolve_registry()
                ),
                expected: desc.digest.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// Why a download broke off, all of it: reqwest's own text ("error decoding response
    /// body") hides a timeout in its sources.
    fn failure(&self, e: &reqwest::Error) -> String {
        let mut text = format!("download failed: {}", describe(e));
        if e.is_timeout() || text.contains("timed out") {
            text.push_str(&format!(
                " (nothing received for {:?}, the read timeout)",
                self.timeouts.read
            ));
        }
        text
    }

    fn error(&self, desc: &oci_client::manifest::OciDescriptor, message: String) -> RuntimeError {
        RuntimeError::Pull {
            reference: self.reference.whole(),
            message: format!(
                "blob {} from registry {}: {message}",
                desc.digest,
                self.reference.resolve_registry()
            ),
        }
    }
}
