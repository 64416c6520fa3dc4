//! `GET /ingress`: the routes of every VirtualLoadBalancer's `spec.ingress`, for an ingress
//! proxy's updater (`kat-ingress`), which reads them with a read-only token.

use kat_api::keys;
use kat_api::wire::{IngressRoute, WorkloadMeta};

use super::{Result, Service};

impl Service {
    /// Every ingress route in the cluster, sorted (host, path, ...) so that an unchanged
    /// cluster gives an unchanged answer.
    pub async fn ingress_routes(&self) -> Result<Vec<IngressRoute>> {
        let listing = self.store.list(keys::all_workloads_desired()).await?;
        let domain = &self.cluster.spec.cluster_domain;
        let mut routes = Vec::new();
        for kv in listing.kvs.iter().filter(|kv| kv.key.ends_with("/meta")) {
            let Some(meta) = kat_store::decode_or_skip::<WorkloadMeta>(kv) else {
                continue;
            };
            let Some(desired) = &meta.desired else {
                continue;
            };
            let Some(lb) = &desired.load_balancer else {
                continue;
            };
            let workload = &desired.workload.metadata;
            for rule in &lb.spec.ingress {
                let Some(port) = rule.container_port(&lb.spec.ports) else {
                    continue;
                };
                routes.push(IngressRoute {
                    host: rule.host.clone(),
                    path: rule.path.clone(),
                    namespace: workload.namespace.clone(),
                    workload: workload.name.clone(),
                    upstream: format!("{}.{}.{domain}:{port}", workload.name, workload.namespace),
                    tls: rule.tls,
                });
            }
        }
        routes.sort();
        Ok(routes)
    }
}
