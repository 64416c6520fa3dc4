//! KAT's HTTP API: the front end of the cluster's state.
//!
//! - [`service`]: typed operations (workloads, namespaces, nodes, events, instances) over the
//!   state store and the leader's desired-state writes, free of HTTP;
//! - [`http`]: the axum router: authentication, rate limits, audit, metrics, and handlers
//!   that only translate between HTTP and the service layer; logs and exec streams;
//! - [`rate_limit`]: token buckets per client (API requests, node heartbeats);
//! - [`serve`]: serving a router over HTTPS (rustls) with bounded connections and deadlines.
//!
//! Dependencies flow `kat-api` ← `kat-store` ← `kat-leader` ← `kat-apiserver` ← `kat-agent`:
//! the controllers know nothing of HTTP, and the agent only assembles and starts what is here.

pub mod http;
pub mod rate_limit;
pub mod serve;
pub mod service;

pub use http::{router, ApiState, ClientAddr, ClientNode, ClientSerial};
pub use service::Service;

/// JSON a client sent (a request body, an exec frame, a git server's push payload) as a
/// `T`. A stored record is never read this way: `kat_store::decode` names its key and is
/// the only other decode clippy.toml allows.
#[allow(clippy::disallowed_methods)]
pub(crate) fn decode_request<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> serde_json::Result<T> {
    serde_json::from_slice(bytes)
}
