//! `GET /ingress`: every route the cluster's VirtualLoadBalancers ask for (`spec.ingress`),
//! resolved to an upstream: what an ingress proxy needs, and nothing else.

use serde::{Deserialize, Serialize};

/// One ingress route: a host and path prefix, and the workload that serves them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct IngressRoute {
    /// The DNS name clients ask for.
    pub host: String,
    /// Requests under this path prefix (`/` for all).
    pub path: String,
    /// The namespace of the workload.
    pub namespace: String,
    /// The workload that serves the route.
    pub workload: String,
    /// `<workload>.<namespace>.<clusterDomain>:<containerPort>`: resolved by the cluster DNS
    /// to the workload's ready instances.
    pub upstream: String,
    /// Serve over HTTPS (a certificate from the proxy: ACME for a public name, its own CA
    /// otherwise).
    pub tls: bool,
}

/// A workload's claim on one of its routes: since when the workload has existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteClaim {
    /// The route claimed.
    pub route: IngressRoute,
    /// The workload's creation time; `None` (a record from before it was kept) counts as
    /// the oldest.
    pub since: Option<crate::timestamp::Timestamp>,
}

/// The routes a stored workload claims (its desired VirtualLoadBalancer's `spec.ingress`,
/// rules whose port resolves), upstreams in the cluster domain `domain`.
pub fn claims_of(meta: &super::WorkloadMeta, domain: &str) -> Vec<RouteClaim> {
    let Some(desired) = &meta.desired else {
        return Vec::new();
    };
    let Some(lb) = &desired.load_balancer else {
        return Vec::new();
    };
    let workload = &desired.workload.metadata;
    lb.spec
        .ingress
        .iter()
        .filter_map(|rule| {
            let port = rule.container_port(&lb.spec.ports)?;
            Some(RouteClaim {
                route: IngressRoute {
                    host: rule.host.clone(),
                    path: rule.path.clone(),
                    namespace: workload.namespace.clone(),
                    workload: workload.name.clone(),
                    upstream: format!("{}.{}.{domain}:{port}", workload.name, workload.namespace),
                    tls: rule.tls,
                },
                since: meta.metadata.creation_timestamp,
            })
        })
        .collect()
}

/// A host and path as a proxy matches them: the host in lower case without a final dot, the
/// path with repeated slashes collapsed and no trailing slash (`/` for the whole host).
/// Ownership compares these, so `HELLO.example.com` or `//` is no new route.
pub fn canonical_route(host: &str, path: &str) -> (String, String) {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let mut canonical = String::with_capacity(path.len());
    for part in path.split('/').filter(|p| !p.is_empty()) {
        canonical.push('/');
        canonical.push_str(part);
    }
    if canonical.is_empty() {
        canonical.push('/');
    }
    (host, canonical)
}

/// The routes as the ingress serves them, in their canonical form ([`canonical_route`]).
/// A host belongs to one namespace, the one whose workload claimed it first (the oldest
/// creation time, then the lower namespace and name); within it each path belongs to the
/// workload that claimed it first. A later workload, or one whose name sorts first, never
/// takes over a host or a path: applying one that another holds is refused, and a conflict
/// stored anyway (two applies at once, a record from before the rule) leaves the owner in
/// place. Returns the routes served, sorted, and each shadowed route with its owner's.
pub fn route_owners(
    mut claims: Vec<RouteClaim>,
) -> (Vec<IngressRoute>, Vec<(IngressRoute, IngressRoute)>) {
    for c in &mut claims {
        (c.route.host, c.route.path) = canonical_route(&c.route.host, &c.route.path);
    }
    claims.sort_by(|a, b| {
        (
            a.since,
            &a.route.namespace,
            &a.route.workload,
            &a.route.host,
            &a.route.path,
        )
            .cmp(&(
                b.since,
                &b.route.namespace,
                &b.route.workload,
                &b.route.host,
                &b.route.path,
            ))
    });
    let mut hosts: std::collections::HashMap<String, IngressRoute> = Default::default();
    let mut paths: std::collections::HashMap<(String, String), IngressRoute> = Default::default();
    let mut served = Vec::new();
    let mut shadowed = Vec::new();
    for RouteClaim { route, .. } in claims {
        if let Some(owner) = hosts.get(&route.host) {
            if owner.namespace != route.namespace {
                shadowed.push((route, owner.clone()));
                continue;
            }
        }
        let key = (route.host.clone(), route.path.clone());
        match paths.get(&key) {
            // The same workload naming a route twice: one route.
            Some(owner) if owner.workload == route.workload => continue,
            Some(owner) => shadowed.push((route, owner.clone())),
            None => {
                hosts
                    .entry(route.host.clone())
                    .or_insert_with(|| route.clone());
                paths.insert(key, route.clone());
                served.push(route);
            }
        }
    }
    served.sort();
    (served, shadowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn claim(ns: &str, name: &str, host: &str, at_secs: Option<u64>) -> RouteClaim {
        RouteClaim {
            route: IngressRoute {
                host: host.into(),
                path: "/".into(),
                namespace: ns.into(),
                workload: name.into(),
                upstream: format!("{name}.{ns}.kat.cluster.local:80"),
                tls: false,
            },
            since: at_secs
                .map(|s| crate::timestamp::Timestamp::from(UNIX_EPOCH + Duration::from_secs(s))),
        }
    }

    #[test]
    fn the_oldest_claim_owns_a_route_whatever_the_names() {
        let (served, shadowed) = route_owners(vec![
            claim("default", "hello", "hello.example.com", Some(100)),
            // The reported takeover: a later workload named to sort first.
            claim("attacker", "0", "hello.example.com", Some(200)),
            claim("default", "other", "other.example.com", Some(300)),
        ]);
        assert_eq!(
            served
                .iter()
                .map(|r| r.workload.as_str())
                .collect::<Vec<_>>(),
            ["hello", "other"]
        );
        assert_eq!(shadowed.len(), 1);
        assert_eq!(
            (
                shadowed[0].0.workload.as_str(),
                shadowed[0].1.workload.as_str()
            ),
            ("0", "hello")
        );
        // Other spellings of the same route, and a path on a host another namespace holds.
        let mut spelled = claim("attacker", "0", "HELLO.example.com.", Some(200));
        spelled.route.path = "//".into();
        let mut sub = claim("attacker", "1", "hello.example.com", Some(200));
        sub.route.path = "/login".into();
        let mut own = claim("default", "login", "hello.example.com", Some(300));
        own.route.path = "/login/".into();
        let (served, shadowed) = route_owners(vec![
            spelled,
            sub,
            own,
            claim("default", "hello", "hello.example.com", Some(100)),
        ]);
        assert_eq!(
            served
                .iter()
                .map(|r| (r.workload.as_str(), r.path.as_str()))
                .collect::<Vec<_>>(),
            [("hello", "/"), ("login", "/login")]
        );
        assert_eq!(shadowed.len(), 2);
        assert_eq!(
            canonical_route("A.b.", "/x//y/"),
            ("a.b".into(), "/x/y".into())
        );
        // Same age: the lower namespace and name, whatever the input order.
        let (served, _) = route_owners(vec![
            claim("b", "web", "x.example.com", Some(5)),
            claim("a", "web", "x.example.com", Some(5)),
        ]);
        assert_eq!(served[0].namespace, "a");
    }
}
