//! The etcd key schema (RFC 001 §5.2), in one place.
//!
//! Every key KAT reads or writes is built here, so a reader can see the whole layout at once
//! and a typo cannot create a second, silently different key. Prefix functions end in `/` so
//! that a prefix for `web` never matches `web2`.

/// The prefix of every key KAT writes.
pub const ROOT: &str = "/kat/";
/// The version of this key schema the store was created with.
pub const SCHEMA_VERSION: &str = "/kat/schema_version";
/// The schema version this build writes: `v1.0`.
pub const SCHEMA_VERSION_VALUE: &str = "v1.0";
/// A random id (32 hex digits) written once, when the cluster is created.
pub const CLUSTER_UID: &str = "/kat/config/cluster_uid";
/// The `cluster.kat` the cluster was created with, as JSON.
pub const CLUSTER_CONFIG: &str = "/kat/config/cluster";
/// The API endpoint of the node that leads (`https://IP:PORT`), under the leader's lease.
pub const LEADER_ENDPOINT: &str = "/kat/config/leader_endpoint";
/// Who leads, as a [`crate::wire::LeaderRecord`] (node name, endpoint, since when), written
/// with the leader's lease so it goes when the leadership does.
pub const LEADER: &str = "/kat/config/leader";
/// SHA-256 (hex) of the admin bearer token: the API checks tokens against it, and etcd never
/// holds the token itself.
pub const ADMIN_TOKEN_SHA256: &str = "/kat/config/admin_token_sha256";
/// The prefix the leader election campaigns under.
pub const LEADER_ELECTION: &str = "/kat/leader_election/";
/// The prefix of every event (see [`event`]).
pub const EVENTS: &str = "/kat/events/";

/// A namespace ([`crate::wire::NamespaceObject`]).
pub fn namespace(name: &str) -> String {
    format!("/kat/namespaces/{name}")
}
/// The prefix of every namespace.
pub fn namespaces() -> &'static str {
    "/kat/namespaces/"
}

/// Join tokens by id: the SHA-256 of the secret, when it expires (`JoinTokenRecord`).
pub fn join_token(id: &str) -> String {
    format!("/kat/join_tokens/{id}")
}
/// The prefix of every join token.
pub fn join_tokens() -> &'static str {
    "/kat/join_tokens/"
}

/// A scoped API token (`katcall create token`): its scope and the SHA-256 of its secret.
pub fn api_token(id: &str) -> String {
    format!("/kat/api_tokens/{id}")
}
/// The prefix of every scoped API token.
pub fn api_tokens() -> &'static str {
    "/kat/api_tokens/"
}

/// The serial of each node's certificate (hex), recorded by the node when it starts.
pub fn node_certificate(node: &str) -> String {
    format!("/kat/nodes/certificates/{node}")
}

/// Nodes removed from the cluster: their certificate serial, refused from then on
/// (`RevokedNode`).
pub fn revoked_node(node: &str) -> String {
    format!("/kat/nodes/revoked/{node}")
}
/// The prefix of every revoked node.
pub fn revoked_nodes() -> &'static str {
    "/kat/nodes/revoked/"
}

/// A node's registration ([`crate::wire::NodeRegistration`]).
pub fn node_registration(node: &str) -> String {
    format!("/kat/nodes/registration/{node}")
}
/// The prefix of every node's registration.
pub fn node_registrations() -> &'static str {
    "/kat/nodes/registration/"
}
/// Dynamic node status; written under the agent's lease so it vanishes with the agent.
pub fn node_status(node: &str) -> String {
    format!("/kat/nodes/status/{node}")
}
/// The prefix of every node's status.
pub fn node_statuses() -> &'static str {
    "/kat/nodes/status/"
}

/// Everything desired about one workload (manifest files and meta).
pub fn workload_desired(ns: &str, name: &str) -> String {
    format!("/kat/workloads/desired/{ns}/{name}/")
}
/// Every workload's desired state, in all namespaces.
pub fn all_workloads_desired() -> &'static str {
    "/kat/workloads/desired/"
}
/// The desired state of every workload of a namespace.
pub fn workloads_desired(ns: &str) -> String {
    format!("/kat/workloads/desired/{ns}/")
}
/// One Quadlet file of a workload, as applied.
pub fn workload_manifest(ns: &str, name: &str, file: &str) -> String {
    format!("/kat/workloads/desired/{ns}/{name}/manifest/{file}")
}
/// The prefix of a workload's Quadlet files.
pub fn workload_manifests(ns: &str, name: &str) -> String {
    format!("/kat/workloads/desired/{ns}/{name}/manifest/")
}
/// Generation and spec hash of the desired state.
pub fn workload_meta(ns: &str, name: &str) -> String {
    format!("/kat/workloads/desired/{ns}/{name}/meta")
}
/// The status the leader keeps for a workload ([`crate::wire::WorkloadStatus`]).
pub fn workload_status(ns: &str, name: &str) -> String {
    format!("/kat/workloads/status/{ns}/{name}")
}
/// The prefix of every workload status of a namespace.
pub fn workload_statuses(ns: &str) -> String {
    format!("/kat/workloads/status/{ns}/")
}
/// An etcd learner the cluster added (its peer URL), until it is promoted: what the members'
/// promotion loops watch for, instead of listing the members on a clock.
pub fn etcd_learner(name: &str) -> String {
    format!("/kat/etcd-learners/{name}")
}
/// The prefix of every etcd learner.
pub fn etcd_learners() -> &'static str {
    "/kat/etcd-learners/"
}

/// A backup (etcd snapshot) some node took: where, when, its size and checksum.
pub fn backup(name: &str) -> String {
    format!("/kat/backups/{name}")
}
/// The prefix of every backup.
pub fn backups() -> &'static str {
    "/kat/backups/"
}

/// The secret a git server signs a workload's push notifications with (`katcall webhook`).
pub fn workload_webhook(ns: &str, name: &str) -> String {
    format!("/kat/workloads/webhooks/{ns}/{name}")
}
/// A push notification the workload's hook accepted, by the SHA-256 of its signed body
/// (hex): a second one with the same body is a replay. Leased: gone after the replay window.
pub fn workload_hook_delivery(ns: &str, name: &str, digest: &str) -> String {
    format!("/kat/workloads/hook-deliveries/{ns}/{name}/{digest}")
}
/// The prefix of the push notifications a workload's hook accepted.
pub fn workload_hook_deliveries(ns: &str, name: &str) -> String {
    format!("/kat/workloads/hook-deliveries/{ns}/{name}/")
}
/// Quadlet files of an earlier generation, kept for rollback.
pub fn workload_archive(ns: &str, name: &str, generation: u64, file: &str) -> String {
    format!("/kat/workloads/archive/{ns}/{name}/{generation:020}/{file}")
}
/// The prefix of every archived generation of a workload.
pub fn workload_archives(ns: &str, name: &str) -> String {
    format!("/kat/workloads/archive/{ns}/{name}/")
}

/// The template of one generation's instances, by its hash: immutable, kept while an
/// instance or a rollback target uses it (see `crate::template`).
pub fn template(ns: &str, name: &str, hash: &str) -> String {
    format!("/kat/workloads/templates/{ns}/{name}/{hash}")
}
/// The prefix of every template, in all namespaces.
pub fn all_templates() -> &'static str {
    "/kat/workloads/templates/"
}

/// The prefix of every instance record, on all nodes.
pub fn all_instances() -> &'static str {
    "/kat/instances/"
}
/// Instances assigned to a node: the agent watches this prefix.
pub fn node_instances(node: &str) -> String {
    format!("/kat/instances/{node}/")
}
/// The record of one instance on a node ([`crate::wire::InstanceRecord`]): the instruction to run it.
pub fn instance(node: &str, instance_id: &str) -> String {
    format!("/kat/instances/{node}/{instance_id}")
}

/// The subnet of `clusterCIDR` the leader gave a node (e.g. `10.100.2.0/23`).
pub fn node_subnet(node: &str) -> String {
    format!("/kat/network/nodes/{node}/subnet")
}
/// A node's WireGuard public key (base64); its endpoint is its address and `wireguardPort`.
pub fn wireguard_key(node: &str) -> String {
    format!("/kat/network/nodes/{node}/wg_pubkey")
}
/// The prefix of every node's network keys (subnet and WireGuard key).
pub fn node_subnets() -> &'static str {
    "/kat/network/nodes/"
}
/// An instance's address, beside the one in its record (RFC 001 §5.2).
pub fn ip_allocation(instance_id: &str) -> String {
    format!("/kat/network/allocations/{instance_id}/ip")
}
/// One DNS record of a workload: `record_type` `A` or `AAAA`, `value` the instance's address.
pub fn dns_record(ns: &str, workload: &str, record_type: &str, value: &str) -> String {
    format!("/kat/dns/{ns}/{workload}/{record_type}/{value}")
}
/// The prefix of every DNS record.
pub fn dns_records() -> &'static str {
    "/kat/dns/"
}

/// The prefix of a Job workload's runs.
pub fn job_runs(ns: &str, workload: &str) -> String {
    format!("/kat/jobs/runs/{ns}/{workload}/")
}
/// Run ids start with a zero-padded number so runs sort by age.
pub fn job_run(ns: &str, workload: &str, run_id: &str) -> String {
    format!("/kat/jobs/runs/{ns}/{workload}/{run_id}")
}

/// A finished instance kept for its exit code and logs ([`crate::finished::FinishedInstance`]).
pub fn finished_instance(ns: &str, workload: &str, id: &str) -> String {
    format!("/kat/finished/{ns}/{workload}/{id}")
}
/// The prefix of a workload's finished instances.
pub fn finished_instances(ns: &str, workload: &str) -> String {
    format!("/kat/finished/{ns}/{workload}/")
}
/// The prefix of every finished instance of a namespace.
pub fn finished_in_namespace(ns: &str) -> String {
    format!("/kat/finished/{ns}/")
}
/// The prefix of every finished instance.
pub fn all_finished() -> &'static str {
    "/kat/finished/"
}

/// An event: the writer's clock in microseconds (fixed-width hex, so events sort by time),
/// then the writer's random id, so writers never collide (see `kat_leader::events`).
pub fn event(micros: u64, writer: u64) -> String {
    format!("/kat/events/{micros:016x}-{writer:016x}")
}

/// A key of the schema, parsed. Keys KAT does not know parse to `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// `/kat/workloads/desired/{ns}/{name}/meta`.
    WorkloadMeta {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
    },
    /// `/kat/workloads/desired/{ns}/{name}/manifest/{file}`.
    WorkloadManifest {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
        /// The Quadlet file's name.
        file: &'a str,
    },
    /// `/kat/workloads/status/{ns}/{name}`.
    WorkloadStatus {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
    },
    /// `/kat/nodes/registration/{node}`.
    NodeRegistration {
        /// The node.
        node: &'a str,
    },
    /// `/kat/nodes/status/{node}`.
    NodeStatus {
        /// The node.
        node: &'a str,
    },
    /// `/kat/network/nodes/{node}/wg_pubkey`.
    WireguardKey {
        /// The node.
        node: &'a str,
    },
    /// `/kat/network/nodes/{node}/subnet`.
    NodeSubnet {
        /// The node.
        node: &'a str,
    },
    /// `/kat/dns/{ns}/{workload}/{type}/{value}`.
    DnsRecord,
    /// `/kat/instances/{node}/{id}`.
    Instance {
        /// The node.
        node: &'a str,
        /// The instance id.
        id: &'a str,
    },
    /// `/kat/jobs/runs/{ns}/{name}/{run}`.
    JobRun {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
        /// The run id.
        run: &'a str,
    },
    /// `/kat/finished/{ns}/{name}/{id}`.
    FinishedInstance {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
        /// The instance id.
        id: &'a str,
    },
    /// `/kat/namespaces/{name}`.
    Namespace {
        /// The namespace.
        name: &'a str,
    },
    /// `/kat/workloads/templates/{ns}/{name}/{hash}`.
    Template {
        /// The namespace.
        ns: &'a str,
        /// The workload.
        name: &'a str,
        /// The template hash.
        hash: &'a str,
    },
    /// `/kat/events/{id}`.
    Event,
}

/// Parses a key of the schema; `None` for a key KAT does not know.
pub fn parse(key: &str) -> Option<Key<'_>> {
    let rest = key.strip_prefix(ROOT)?;
    let parts: Vec<&str> = rest.split('/').collect();
    Some(match parts.as_slice() {
        ["workloads", "desired", ns, name, "meta"] => Key::WorkloadMeta { ns, name },
        ["workloads", "desired", ns, name, "manifest", file] => {
            Key::WorkloadManifest { ns, name, file }
        }
        ["workloads", "status", ns, name] => Key::WorkloadStatus { ns, name },
        ["workloads", "templates", ns, name, hash] => Key::Template { ns, name, hash },
        ["nodes", "registration", node] => Key::NodeRegistration { node },
        ["nodes", "status", node] => Key::NodeStatus { node },
        ["network", "nodes", node, "subnet"] => Key::NodeSubnet { node },
        ["network", "nodes", node, "wg_pubkey"] => Key::WireguardKey { node },
        ["dns", _, _, _, _] => Key::DnsRecord,
        ["instances", node, id] => Key::Instance { node, id },
        ["jobs", "runs", ns, name, run] => Key::JobRun { ns, name, run },
        ["finished", ns, name, id] => Key::FinishedInstance { ns, name, id },
        ["namespaces", name] => Key::Namespace { name },
        ["events", _] => Key::Event,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_do_not_collide() {
        assert!(!workload_manifest("default", "web2", "workload.kat")
            .starts_with(&workload_desired("default", "web")));
        assert!(workload_manifest("default", "web", "workload.kat")
            .starts_with(&workload_desired("default", "web")));
        assert!(instance("n1", "abc").starts_with(&node_instances("n1")));
        assert!(!instance("n10", "abc").starts_with(&node_instances("n1")));
    }

    #[test]
    fn every_builder_parses_back() {
        assert_eq!(
            parse(&workload_meta("ns", "w")),
            Some(Key::WorkloadMeta {
                ns: "ns",
                name: "w"
            })
        );
        assert_eq!(
            parse(&workload_manifest("ns", "w", "job.kat")),
            Some(Key::WorkloadManifest {
                ns: "ns",
                name: "w",
                file: "job.kat"
            })
        );
        assert_eq!(
            parse(&workload_status("ns", "w")),
            Some(Key::WorkloadStatus {
                ns: "ns",
                name: "w"
            })
        );
        assert_eq!(
            parse(&node_registration("n")),
            Some(Key::NodeRegistration { node: "n" })
        );
        assert_eq!(
            parse(&node_status("n")),
            Some(Key::NodeStatus { node: "n" })
        );
        assert_eq!(
            parse(&node_subnet("n")),
            Some(Key::NodeSubnet { node: "n" })
        );
        assert!(node_subnet("n1").starts_with(node_subnets()));
        assert_eq!(
            parse(&dns_record("ns", "w", "A", "10.0.0.1")),
            Some(Key::DnsRecord)
        );
        assert_eq!(
            parse(&instance("n", "i")),
            Some(Key::Instance { node: "n", id: "i" })
        );
        assert_eq!(
            parse(&job_run("ns", "w", "r")),
            Some(Key::JobRun {
                ns: "ns",
                name: "w",
                run: "r"
            })
        );
        assert_eq!(parse(&namespace("a")), Some(Key::Namespace { name: "a" }));
        assert_eq!(parse(&event(7, 9)), Some(Key::Event));
        assert_eq!(
            parse(&finished_instance("ns", "w", "w-1")),
            Some(Key::FinishedInstance {
                ns: "ns",
                name: "w",
                id: "w-1"
            })
        );
        assert!(finished_instance("ns", "w", "w-1").starts_with(&finished_instances("ns", "w")));
        assert!(!finished_instance("ns", "w2", "x").starts_with(&finished_instances("ns", "w")));
        assert_eq!(
            parse(&template("ns", "w", "ab12")),
            Some(Key::Template {
                ns: "ns",
                name: "w",
                hash: "ab12"
            })
        );
        assert_eq!(parse(&workload_archive("ns", "w", 1, "f")), None);
        assert_eq!(parse("/other/x"), None);
    }

    #[test]
    fn archive_and_event_keys_sort_numerically() {
        assert!(workload_archive("d", "w", 9, "f") < workload_archive("d", "w", 10, "f"));
        assert!(event(99, u64::MAX) < event(100, 0));
        assert!(event(0xff, 0) < event(0x100, 0));
    }
}
