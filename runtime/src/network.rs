//! The seam between the runtime and the node network.
//!
//! A container with an address ([`crate::CreateOptions::address`]) does not get a fresh user
//! and network namespace from libcontainer: the node network (kat-netns, wired in by the
//! agent) makes both under the node's own user namespace, already mapped to the workload's
//! id slice and linked to the node's bridge, and the container joins them by path. The
//! runtime only says which ids and which address; it knows nothing of bridges.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::idmap::IdMap;

/// Makes the namespaces a container joins.
pub trait NetworkNamespaces: Send + Sync + std::fmt::Debug {
    /// A user namespace mapping `ids` (container → host) and a network namespace owned by it
    /// with `address`, held until the returned value is dropped. Blocking.
    fn prepare(&self, address: Ipv4Addr, ids: &IdMap) -> Result<Box<dyn JoinedNamespaces>, String>;
}

/// Namespaces made for one container, held while it is created.
pub trait JoinedNamespaces: Send {
    /// The path of the user namespace.
    fn user(&self) -> PathBuf;
    /// The path of the network namespace.
    fn network(&self) -> PathBuf;
    /// The user namespace both were made under. An unprivileged agent's create helper
    /// enters it first: libcontainer refuses to build a rootless container that neither
    /// creates a user namespace nor runs inside one (it is root there, as podman's runtime
    /// is inside its pause process's namespace).
    fn parent_user(&self) -> PathBuf;
}
