//! `GET /ingress`: the routes of every VirtualLoadBalancer's `spec.ingress`, for an ingress
//! proxy's updater (`kat-ingress`), which reads them with its ingress token. One owner per
//! host and path ([`kat_api::wire::route_owners`]): a route another workload
//! claims too is left out.

use kat_api::keys;
use kat_api::wire::{claims_of, route_owners};
use kat_api::wire::{IngressRoute, WorkloadMeta};

use super::{Result, Service};

impl Service {
    /// Every ingress route in the cluster, one owner each, sorted (host, path, ...) so that
    /// an unchanged cluster gives an unchanged answer.
    pub async fn ingress_routes(&self) -> Result<Vec<IngressRoute>> {
        let listing = self.store.list(keys::all_workloads_desired()).await?;
        let domain = &self.cluster.spec.cluster_domain;
        let claims = listing
            .kvs
            .iter()
            .filter(|kv| kv.key.ends_with("/meta"))
            .filter_map(kat_store::decode_or_skip::<WorkloadMeta>)
            .flat_map(|meta| claims_of(&meta, domain))
            .collect();
        Ok(route_owners(claims).0)
    }
}
