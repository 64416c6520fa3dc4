//! Where a node keeps its state: one data directory.
//!
//! ```text
//! {data}/node.json          identity: node name, cluster name (present = initialized)
//! {data}/cluster.kat        the cluster configuration init was given
//! {data}/pki/               ca.crt, ca.key, node.crt, node.key, admin.token (0600), crl.pem
//! {data}/etcd/, etcd.log    the supervised etcd
//! {data}/runtime/           images, containers, logs (kat-runtime)
//! {data}/agent/             assignments.json: the local copy of this node's assignments;
//!                           api-endpoints.json (a worker's known control plane);
//!                           finished-logs/, build-logs/
//! {data}/network/           the node network's holder and state (kat-netns)
//! {data}/detached/          a detached node's own one-node cluster
//! ```
//!
//! Every path under the data directory is named here and nowhere else.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The paths of a node's data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The data directory.
    pub root: PathBuf,
}

/// What `init` decided once; `run` and later `init`s read it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeIdentity {
    /// The node's name.
    pub node_name: kat_api::wire::NodeName,
    /// The name of the cluster it belongs to.
    pub cluster_name: String,
    /// The IP address other nodes and clients reach it at.
    pub advertise_address: String,
    /// When the node was initialized (`init` or `join`).
    pub initialized_at: kat_api::wire::Timestamp,
    /// A node that joined as an etcd peer: the member list it was given (etcd's
    /// `--initial-cluster`, read only while its etcd data directory is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_initial_cluster: Option<String>,
}

impl Layout {
    /// The layout of the data directory `root`.
    pub fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }
    /// The node's identity ([`NodeIdentity`]); its presence means the node is initialized.
    pub fn identity(&self) -> PathBuf {
        self.root.join("node.json")
    }
    /// The cluster configuration (`cluster.kat`).
    pub fn cluster_config(&self) -> PathBuf {
        self.root.join("cluster.kat")
    }
    /// The certificates and keys: CA, node, admin token, revocation list.
    pub fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    /// The runtime's directory: images, containers, logs.
    pub fn runtime(&self) -> PathBuf {
        self.root.join("runtime")
    }
    /// The agent's state: the local copy of the assignments, a worker's API endpoints, the
    /// logs of finished instances and of builds.
    pub fn agent(&self) -> PathBuf {
        self.root.join("agent")
    }
    /// The CA's private key: present on a node that signs joins (a control-plane node).
    pub fn ca_key(&self) -> PathBuf {
        self.pki().join("ca.key")
    }
    /// The revocation list etcd checks, written by a node that holds the CA key.
    pub fn crl(&self) -> PathBuf {
        self.pki().join("crl.pem")
    }
    /// The supervised etcd's data directory.
    pub fn etcd_data(&self) -> PathBuf {
        self.root.join("etcd")
    }
    /// Logs of finished instances, kept after their containers went (`crate::kept_logs`).
    pub fn finished_logs(&self) -> PathBuf {
        self.agent().join("finished-logs")
    }
    /// Logs of builds run on this node.
    pub fn build_logs(&self) -> PathBuf {
        self.agent().join("build-logs")
    }
    /// A worker's list of the control plane's API endpoints.
    pub fn api_endpoints(&self) -> PathBuf {
        self.agent().join("api-endpoints.json")
    }
    /// The node network's directory (`kat_netns::node`).
    pub fn network(&self) -> PathBuf {
        kat_netns::node::network_dir(&self.root)
    }
    /// A detached node's local cluster.
    pub fn detached(&self) -> PathBuf {
        self.root.join("detached")
    }
    /// Bundles of workloads created while detached that the parent refused on rejoining.
    pub fn rejoin_refused(&self) -> PathBuf {
        self.agent().join("rejoin-refused")
    }
    /// Make the data directory of a new node. Searchable, not listable: the root of each
    /// container (a host id of its workload's slice) walks through to its overlay and log
    /// directories under runtime/; PKI, etcd and agent state below are 0700.
    pub fn create(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.root.clone(), self.pki(), self.runtime(), self.agent()] {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        for (dir, mode) in [
            (self.root.clone(), 0o711),
            (self.pki(), 0o700),
            (self.agent(), 0o700),
        ] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
        }
        Ok(())
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
