//! The file `katcall` reads to reach a cluster, as `kat-agent init` writes it.
//!
//! YAML with the API endpoint, the cluster CA certificate (PEM, inline so the file is
//! self-contained) and the admin bearer token. It holds a secret: written with mode 0600.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The contents of the file: where the API is and how to trust and authenticate to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    /// e.g. `https://127.0.0.1:9115`
    pub endpoint: String,
    /// The name of the cluster this file reaches.
    pub cluster_name: String,
    /// The cluster CA certificate, PEM, inline.
    pub ca_certificate: String,
    /// The bearer token `katcall` authenticates with.
    pub token: String,
    /// Set for a detached node's local API, which that node serves with its own (worker)
    /// certificate: the client then takes that node's certificate, and no other node's.
    /// Unset, only a control-plane certificate serves the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_api: Option<String>,
}

/// Why the client config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    /// The file could not be read.
    #[error("cannot read the client config {path}: {source} (create one with `kat-agent init`, or pass --config / set KAT_CONFIG)")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid client config.
    #[error("client config {path} is not valid: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

impl ClientConfig {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ClientConfigError> {
        let bytes = std::fs::read(path).map_err(|source| ClientConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        yaml_serde::from_slice(&bytes).map_err(|e| ClientConfigError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Where `katcall` looks by default: `$XDG_CONFIG_HOME/kat/config.yaml`, else
    /// `~/.config/kat/config.yaml`.
    pub fn default_path() -> PathBuf {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("kat").join("config.yaml")
    }
}
