//! The cluster's DNS, served by every node to its containers.
//!
//! Names live under `clusterDomain` (e.g. `cluster.local`):
//!
//! - `{workload}.{namespace}.{domain}`: an address per *ready* instance (healthy, or running
//!   where the workload has no health check), so a client only reaches instances that serve;
//! - `{instanceID}.{workload}.{namespace}.{domain}`: that instance's address while it runs;
//! - short names (`web`, `web.other`) work through the search path the container's
//!   `resolv.conf` carries (`{namespace}.{domain} {domain}`).
//!
//! The data comes from the leader's records (`/kat/dns/`, [`kat_api::wire::DnsRecord`]) as a
//! [`Table`] the agent swaps in whenever they change, so answers follow health within the
//! time a record takes to arrive. Answers carry a short TTL (5 s); a name that does not exist
//! is NXDOMAIN with the zone's SOA in the authority section, so clients cache the negative
//! answer for 5 s as RFC 2308 says. Names outside the domain go to the host's resolvers
//! ([`Forwarder`]), with answers (negative ones included) cached for their TTL.
//!
//! Why not `hickory-server`: its API changes with every release (0.26 renamed most of it),
//! and what a node needs is one in-memory zone and a forwarder. The wire format is
//! `hickory-proto`'s; the serving loop, a few dozen lines, is ours ([`server`]).

mod answer;
mod forward;
pub mod server;
mod table;

pub use answer::{answer, NEGATIVE_TTL, TTL};
pub use forward::{upstreams_from_resolv_conf, Forwarder};
pub use server::DnsServer;
pub use table::{Lookup, Table};

/// Why the DNS server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("clusterDomain {0:?} is not a DNS name")]
    Domain(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
