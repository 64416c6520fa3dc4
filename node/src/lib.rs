//! What a KAT node does, whichever role it has: the work below `kat-agent`, which only
//! composes it.
//!
//! - [`supervisor`]: converges this node's containers on its assignments (pulls, builds,
//!   volumes, health checks, restarts);
//! - [`join`]: a machine joining a cluster as a node (the CA checked against its pin);
//! - [`heartbeat`]: capacity, usage and instance states to the control plane, every tick and
//!   on change; [`usage`]: what containers and the node use;
//! - [`link`]: the node's link to the control plane, the one seam between this crate's work
//!   and where cluster state lives (its own etcd member, or the leader's API);
//! - [`exec_logs`]: logs and exec of this node's instances, and of other nodes' (relayed);
//!   [`kept_logs`]: output kept after a container is gone;
//! - [`network`]: the node's container network (kat-netns) driven from the control plane's
//!   subnet, DNS records and overlay peers;
//! - [`detached`]: a worker that lost its leader runs a one-node cluster of its own and
//!   rejoins when the parent's leader answers (and a leader's side of that);
//! - [`etcd_member`]: a control-plane node's etcd member, joined and supervised;
//! - [`layout`]: the node's files under its data directory.
//!
//! Tested like the controllers: on `MemStore` and the fake runtime with simulated time
//! (`supervisor`'s tests), the real kernel in the agent's end-to-end suites.

#![warn(missing_docs)]

pub mod detached;
pub mod etcd_member;
pub mod exec_logs;
pub mod heartbeat;
pub mod join;
pub mod kept_logs;
pub mod layout;
pub mod link;
pub mod network;
pub mod supervisor;
pub mod usage;
