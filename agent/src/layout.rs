//! Where a node keeps its state: one data directory.
//!
//! ```text
//! {data}/node.json          identity: node name, cluster name (present = initialized)
//! {data}/cluster.kat        the cluster configuration init was given
//! {data}/pki/               ca.crt, ca.key, server.crt, server.key, admin.token (0600)
//! {data}/etcd/, etcd.log    the supervised etcd
//! {data}/runtime/           images, containers, logs (kat-runtime)
//! {data}/agent/             assignments.json: the local copy of this node's assignments
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

/// What `init` decided once; `run` and later `init`s read it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeIdentity {
    pub node_name: String,
    pub cluster_name: String,
    pub advertise_address: String,
    pub initialized_at: String,
    /// A node that joined as an etcd peer: the member list it was given (etcd's
    /// `--initial-cluster`, read only while its etcd data directory is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_initial_cluster: Option<String>,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }
    pub fn identity(&self) -> PathBuf {
        self.root.join("node.json")
    }
    pub fn cluster_config(&self) -> PathBuf {
        self.root.join("cluster.kat")
    }
    pub fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    pub fn runtime(&self) -> PathBuf {
        self.root.join("runtime")
    }
    pub fn agent(&self) -> PathBuf {
        self.root.join("agent")
    }
    /// Default data directory: `/var/lib/kat` for root, `$XDG_DATA_HOME/kat` (or
    /// `~/.local/share/kat`) for others.
    pub fn default_root() -> PathBuf {
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/lib/kat");
        }
        std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .unwrap_or_else(|| PathBuf::from("."))
            .join("kat")
    }
}
