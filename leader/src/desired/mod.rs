//! The desired-state writes the API performs: apply, update, rollback and delete of
//! workloads ([`workloads`]), node administration ([`node_admin`]: taints, labels, drain,
//! capacity, removal) and namespaces ([`namespaces`]).
//!
//! Below the controllers: a controller or a leader duty may call these (the departed-node
//! sweep removes a node as `katcall delete node` does), never the other way; nothing here
//! reads a controller's round or memory.

pub mod namespaces;
pub mod node_admin;
pub mod workloads;
