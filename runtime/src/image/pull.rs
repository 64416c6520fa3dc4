//! Pulling images from OCI registries with `oci-client`.
//!
//! OCI and Docker v2 schema 2 manifests are accepted; an index is resolved to this node's
//! platform. Credentials come from the usual auth files (`auth.json` of containers-auth, or
//! Docker's `config.json`); anonymous otherwise. Plain HTTP is used only for registries the
//! node lists as insecure. Every blob is hashed while it is written and checked against its
//! digest before it is unpacked.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use super::config::{hex, sha256_digest, ConfigFile};
use super::store::ImageStore;
use crate::error::{IoContext, Result, RuntimeError};
use crate::types::{ImageSummary, PullProgress};

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

    /// Basic credentials for `registry` from the first auth file that has them.
    pub fn auth_for(&self, registry: &str) -> RegistryAuth {
        for file in self.auth_files() {
            if let Some(auth) = read_auth_file(&file, registry) {
                return auth;
            }
        }
        RegistryAuth::Anonymous
    }
}

fn read_auth_file(path: &Path, registry: &str) -> Option<RegistryAuth> {
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
    Some(RegistryAuth::Basic(user.to_string(), pass.to_string()))
}

fn client(config: &RegistryConfig) -> Client {
    Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(config.insecure.clone()),
        ..Default::default()
    })
}

fn pull_error(
    reference: &Reference,
    auth: &RegistryAuth,
    e: oci_client::errors::OciDistributionError,
) -> RuntimeError {
    let text = e.to_string();
    let lowered = text.to_ascii_lowercase();
    let refused = [
        "unauthorized",
        "not authorized",
        "401",
        "authentication required",
        "denied",
    ];
    if refused.iter().any(|r| lowered.contains(r)) {
        let registry = reference.resolve_registry();
        let what_next = match auth {
            RegistryAuth::Anonymous => format!(
                "no credentials for {registry} were found: log in with `podman login {registry}` or add them to $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json or ~/.docker/config.json of the agent's user"
            ),
            _ => format!(
                "the credentials for {registry} in the agent's auth file were refused: check the user name and password"
            ),
        };
        return RuntimeError::Pull {
            reference: reference.whole(),
            message: format!("the registry refused access ({what_next}): {text}"),
        };
    }
    let unknown = [
        "manifest_unknown",
        "manifest unknown",
        "name_unknown",
        "name unknown",
        "not found",
        "404",
    ];
    if unknown.iter().any(|u| lowered.contains(u)) {
        return RuntimeError::ImageNotFound {
            reference: reference.whole(),
            registry: reference.resolve_registry().to_string(),
        };
    }
    RuntimeError::Pull {
        reference: reference.whole(),
        message: text,
    }
}

/// Pulls `reference` into `store`. Concurrent pulls of one reference do the work once.
pub async fn pull(
    store: &ImageStore,
    config: &RegistryConfig,
    reference: &str,
    progress: Option<&ProgressSender>,
) -> Result<ImageSummary> {
    let parsed = super::store::parse_reference(reference)?;
    let whole = parsed.whole();
    let lock = store.locks.get(&format!("pull:{whole}"));
    let _guard = lock.lock().await;

    let client = client(config);
    let auth = config.auth_for(parsed.resolve_registry());
    let (manifest, manifest_digest, config_text) = client
        .pull_manifest_and_config(&parsed, &auth)
        .await
        .map_err(|e| pull_error(&parsed, &auth, e))?;
    let config_digest = manifest.config.digest.clone();
    let actual = sha256_digest(config_text.as_bytes());
    if actual != config_digest {
        return Err(RuntimeError::DigestMismatch {
            what: format!("config of {whole}"),
            expected: config_digest,
            actual,
        });
    }
    let config_file: ConfigFile =
        serde_json::from_str(&config_text).map_err(|e| RuntimeError::Pull {
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
    for layer in &manifest.layers {
        let digest = layer.digest.clone();
        let layer_lock = store.locks.get(&format!("layer:{digest}"));
        let _layer_guard = layer_lock.lock().await;
        if store.has_layer(&digest) {
            send(PullProgress::LayerCached {
                digest: digest.clone(),
            });
            layers.push(digest);
            continue;
        }
        let blob = store
            .tmp_dir()
            .join(format!("blob-{}", digest.replace(':', "-")));
        let result = download(&client, &parsed, &auth, layer, &blob, progress).await;
        let result = match result {
            Ok(()) => store.add_layer(&digest, blob.clone()).await,
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

async fn download(
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
    layer: &oci_client::manifest::OciDescriptor,
    dest: &Path,
    progress: Option<&ProgressSender>,
) -> Result<()> {
    let mut stream = client
        .pull_blob_stream(reference, layer)
        .await
        .map_err(|e| pull_error(reference, auth, e))?;
    let mut file = tokio::fs::File::create(dest)
        .await
        .context(|| format!("creating {}", dest.display()))?;
    let mut hasher = sha2::Sha256::new();
    let total = layer.size.max(0) as u64;
    let mut downloaded = 0u64;
    let mut last_report = 0u64;
    while let Some(chunk) = stream.stream.next().await {
        let chunk = chunk.map_err(|e| RuntimeError::Pull {
            reference: reference.whole(),
            message: format!("downloading layer {}: {e}", layer.digest),
        })?;
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .context(|| format!("writing {}", dest.display()))?;
        downloaded += chunk.len() as u64;
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
    }
    file.flush()
        .await
        .context(|| format!("writing {}", dest.display()))?;
    let actual = format!("sha256:{}", hex(&hasher.finalize()));
    if actual != layer.digest {
        return Err(RuntimeError::DigestMismatch {
            what: format!("layer of {}", reference.whole()),
            expected: layer.digest.clone(),
            actual,
        });
    }
    Ok(())
}
