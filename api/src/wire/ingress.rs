//! `GET /ingress`: every route the cluster's VirtualLoadBalancers ask for (`spec.ingress`),
//! resolved to an upstream: what an ingress proxy needs, and nothing else.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct IngressRoute {
    /// The DNS name clients ask for.
    pub host: String,
    /// Requests under this path prefix (`/` for all).
    pub path: String,
    pub namespace: String,
    pub workload: String,
    /// `<workload>.<namespace>.<clusterDomain>:<containerPort>`: resolved by the cluster DNS
    /// to the workload's ready instances.
    pub upstream: String,
    /// Serve over HTTPS (a certificate from the proxy: ACME for a public name, its own CA
    /// otherwise).
    pub tls: bool,
}
