//! Where a node connects on a user's behalf. A workload names registries and git
//! repositories, and the node (or the leader, resolving a branch at apply time) connects to
//! them with its own network position: without a rule, a namespace token could aim those
//! requests at the node's loopback services (etcd's client port, the agent's own API), at a
//! cloud's link-local metadata service, or at any address the node itself holds.
//!
//! [`OutboundPolicy`] refuses loopback, link-local, unspecified, multicast and the node's own
//! addresses unless an admin allows them (`kat-agent --allow-fetch-from`). The check is on
//! the address actually connected to, never on a name resolved earlier: a DNS answer can
//! change between a check and a connection. reqwest clients get a [`CheckedResolver`];
//! libgit2, which resolves names itself, connects through a [`PinnedProxy`] (HTTPS) or to a
//! URL whose host was replaced by a checked address ([`pin_url`], `git://` and `http://`).

mod policy;
mod proxy;
mod resolver;

pub use policy::{OutboundError, OutboundPolicy};
pub use proxy::{pin_url, PinnedProxy};
pub use resolver::{CheckedResolver, Endpoint};
