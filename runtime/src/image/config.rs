//! The parts of an OCI image config KAT uses, and the JSON documents around it.

use serde::{Deserialize, Serialize};

/// `config` of an image config file: how the image wants to be run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunConfig {
    /// `User`: `uid[:gid]` or names; empty for root.
    #[serde(rename = "User", default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// `Env`: `NAME=VALUE` entries.
    #[serde(rename = "Env", default, deserialize_with = "null_as_default")]
    pub env: Vec<String>,
    /// `Entrypoint`.
    #[serde(rename = "Entrypoint", default, deserialize_with = "null_as_default")]
    pub entrypoint: Vec<String>,
    /// `Cmd`: the arguments to the entrypoint, or the command without one.
    #[serde(rename = "Cmd", default, deserialize_with = "null_as_default")]
    pub cmd: Vec<String>,
    /// `WorkingDir`; empty for `/`.
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub working_dir: String,
}

/// The image config file (`application/vnd.oci.image.config.v1+json`).
#[derive(Debug, Deserialize)]
pub struct ConfigFile {
    /// The CPU architecture it was built for (`amd64`, `arm64`…).
    #[serde(default)]
    pub architecture: String,
    /// The operating system it was built for (`linux`).
    #[serde(default)]
    pub os: String,
    /// How the image wants to be run.
    #[serde(default, deserialize_with = "null_as_default")]
    pub config: RunConfig,
}

/// An image manifest, OCI or Docker v2 schema 2 (same shape).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The manifest's media type, if it says.
    #[serde(default)]
    pub media_type: Option<String>,
    /// The image config file.
    pub config: Descriptor,
    /// The layers, base first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// An image index (`index.json` of an OCI layout, or a multi-platform manifest list).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// The manifests it lists.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// A reference to a blob: its media type, digest and size.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type.
    #[serde(default)]
    pub media_type: String,
    /// The blob's digest (`sha256:…`).
    pub digest: String,
    /// The blob's size in bytes, as the document declares it.
    #[serde(default)]
    pub size: i64,
    /// Annotations (an OCI layout names its images with `org.opencontainers.image.ref.name`).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The platform of the manifest it points to, in an index.
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform of a manifest in an index.
#[derive(Clone, Debug, Deserialize)]
pub struct Platform {
    /// The CPU architecture (`amd64`, `arm64`…).
    #[serde(default)]
    pub architecture: String,
    /// The operating system (`linux`).
    #[serde(default)]
    pub os: String,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// This node's platform in OCI terms.
pub fn node_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The hex part of a `sha256:` digest, checked so it is safe as a file name.
pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then_some(hex)
}
