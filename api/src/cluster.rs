//! `cluster.kat`: immutable cluster-wide parameters, read by `kat-agent init` (RFC 001 §3.9).

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::names::{absolute_path_problem, dns_label_problem, dns_name_problem};
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// A `cluster.kat`: the cluster's name and its immutable parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfiguration {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `ClusterConfiguration`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "ClusterConfiguration")))]
    pub kind: String,
    /// The cluster's name.
    pub metadata: ClusterMetadata,
    /// Cluster-wide parameters, fixed at `kat-agent init`.
    pub spec: ClusterSpec,
}

/// The `metadata` of a `cluster.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterMetadata {
    /// The cluster's name: a DNS label.
    #[cfg_attr(
        feature = "schema",
        schemars(pattern(crate::schema::DNS_LABEL), length(max = 63))
    )]
    pub name: String,
}

/// The `spec` of a `cluster.kat`: networks, ports, paths and timings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// The network instances get addresses from (`10.100.0.0/16`); each node takes a subnet of it.
    #[serde(rename = "clusterCIDR")]
    #[cfg_attr(feature = "schema", schemars(example = "10.100.0.0/16"))]
    pub cluster_cidr: String,
    /// The network of service addresses (`10.200.0.0/16`), apart from `clusterCIDR`.
    #[serde(rename = "serviceCIDR")]
    #[cfg_attr(feature = "schema", schemars(example = "10.200.0.0/16"))]
    pub service_cidr: String,
    /// The prefix length added to `clusterCIDR` for each node's subnet (7: a /23 of a /16).
    #[serde(default = "defaults::node_subnet_bits")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub node_subnet_bits: u32,
    /// The DNS domain of workloads (`web.default.kat.cluster.local`).
    #[serde(default = "defaults::cluster_domain")]
    pub cluster_domain: String,
    /// The TCP port of each agent's own API.
    #[serde(default = "defaults::agent_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub agent_port: u32,
    /// The TCP port of the cluster API on control-plane nodes.
    #[serde(default = "defaults::api_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub api_port: u32,
    /// The TCP port etcd members talk to each other on.
    #[serde(default = "defaults::etcd_peer_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub etcd_peer_port: u32,
    /// The TCP port of etcd's clients.
    #[serde(default = "defaults::etcd_client_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub etcd_client_port: u32,
    /// The UDP port of the WireGuard overlay on every node's addresses.
    #[serde(default = "defaults::wireguard_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub wireguard_port: u32,
    /// The UDP port a detached node's `REJOIN_REQUEST`s go to (multicast on its LAN), where
    /// the control plane listens.
    #[serde(default = "defaults::rejoin_port")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub rejoin_port: u32,
    /// Where nodes keep `simpleClusterStorage` volumes.
    #[serde(default = "defaults::volume_base_path")]
    #[cfg_attr(feature = "schema", schemars(pattern("^/")))]
    pub volume_base_path: String,
    /// Where control-plane nodes write etcd snapshots.
    #[serde(default = "defaults::backup_path")]
    #[cfg_attr(feature = "schema", schemars(pattern("^/")))]
    pub backup_path: String,
    /// Minutes between snapshots.
    #[serde(default = "defaults::backup_interval_minutes")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub backup_interval_minutes: u32,
    /// How many snapshots each node keeps in `backupPath` (the oldest go first).
    #[serde(default = "defaults::backup_retention")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub backup_retention: u32,
    /// Seconds between a node's heartbeats.
    #[serde(default = "defaults::agent_tick_seconds")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub agent_tick_seconds: u32,
    /// Seconds without a heartbeat after which a node is NotReady and its instances are placed elsewhere.
    #[serde(default = "defaults::node_loss_timeout_seconds")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub node_loss_timeout_seconds: u32,
    /// A node without a heartbeat for this long is removed as `katcall delete node` would
    /// (RFC 001 §4.1.4); absent: never (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_remove_after_seconds: Option<u32>,
    /// Host path prefixes a `hostMount` volume may use (see [`crate::host_paths`]).
    #[serde(default = "defaults::host_mount_allowed_paths")]
    pub host_mount_allowed_paths: Vec<String>,
    /// Finished runs kept per workload, with their instances' records, exit codes and logs:
    /// a Job's runs, or the instances of a Service that ended under `restartPolicy: Never`
    /// (each its own run). 0 keeps none.
    #[serde(default = "defaults::finished_run_history")]
    #[cfg_attr(feature = "schema", schemars(range(max = 100)))]
    pub finished_run_history: u32,
    /// How long a finished run is kept at most, in hours.
    #[serde(default = "defaults::finished_run_max_age_hours")]
    pub finished_run_max_age_hours: u32,
}

impl ClusterSpec {
    /// The ports KAT itself listens on, on every node's addresses: a workload's `hostPort`
    /// may not take one (`(port, what it is)`).
    pub fn reserved_ports(&self) -> Vec<(u32, &'static str)> {
        vec![
            (self.api_port, "apiPort"),
            (self.agent_port, "agentPort"),
            (self.etcd_client_port, "etcdClientPort"),
            (self.etcd_peer_port, "etcdPeerPort"),
            (self.wireguard_port, "wireguardPort"),
            (self.rejoin_port, "rejoinPort"),
        ]
    }

    /// The `hostMount` rules this cluster's API enforces at apply: the allow-list, and
    /// never the volume or backup directories. Each node adds its own data directory.
    pub fn host_mount_policy(&self) -> crate::host_paths::HostMountPolicy {
        crate::host_paths::HostMountPolicy {
            allowed: self
                .host_mount_allowed_paths
                .iter()
                .map(Into::into)
                .collect(),
            denied: vec![
                self.volume_base_path.clone().into(),
                self.backup_path.clone().into(),
            ],
        }
    }
}

/// The RFC's defaults for `cluster.kat`.
pub mod defaults {
    /// Where people keep data they share with services: `/srv` (FHS), `/mnt` and `/data`.
    pub fn host_mount_allowed_paths() -> Vec<String> {
        vec!["/srv".into(), "/mnt".into(), "/data".into()]
    }
    /// `nodeSubnetBits`: 7.
    pub fn node_subnet_bits() -> u32 {
        7
    }
    /// `clusterDomain`: `kat.cluster.local`.
    pub fn cluster_domain() -> String {
        "kat.cluster.local".into()
    }
    /// `wireguardPort`: 51820.
    pub fn wireguard_port() -> u32 {
        51820
    }
    /// `agentPort`: 9116.
    pub fn agent_port() -> u32 {
        9116
    }
    /// `rejoinPort`: 9117.
    pub fn rejoin_port() -> u32 {
        9117
    }
    /// `apiPort`: 9115.
    pub fn api_port() -> u32 {
        9115
    }
    /// `etcdPeerPort`: 2380.
    pub fn etcd_peer_port() -> u32 {
        2380
    }
    /// `etcdClientPort`: 2379.
    pub fn etcd_client_port() -> u32 {
        2379
    }
    /// `volumeBasePath`: `/var/lib/kat/volumes`.
    pub fn volume_base_path() -> String {
        "/var/lib/kat/volumes".into()
    }
    /// `backupPath`: `/var/lib/kat/backups`.
    pub fn backup_path() -> String {
        "/var/lib/kat/backups".into()
    }
    /// `backupIntervalMinutes`: 30.
    pub fn backup_interval_minutes() -> u32 {
        30
    }
    /// `backupRetention`: 5 snapshots.
    pub fn backup_retention() -> u32 {
        5
    }
    /// `finishedRunHistory`: 3 runs per workload.
    pub fn finished_run_history() -> u32 {
        3
    }
    /// `finishedRunMaxAgeHours`: 24.
    pub fn finished_run_max_age_hours() -> u32 {
        24
    }
    /// `agentTickSeconds`: 15.
    pub fn agent_tick_seconds() -> u32 {
        15
    }
    /// `nodeLossTimeoutSeconds`: 60.
    pub fn node_loss_timeout_seconds() -> u32 {
        60
    }
}

/// The smallest node subnet that still leaves room for instances: a /28 (IPv4) holds 14 hosts.
const MIN_HOST_BITS: u8 = 4;

impl ClusterSpec {
    /// The parsed `clusterCIDR`, once validated.
    pub fn cluster_net(&self) -> Option<IpNet> {
        self.cluster_cidr.parse().ok()
    }
    /// The parsed `serviceCIDR`, once validated.
    pub fn service_net(&self) -> Option<IpNet> {
        self.service_cidr.parse().ok()
    }
}

impl ClusterConfiguration {
    /// Every rule of `cluster.kat`.
    pub fn validate(&self, s: &mut Scope<'_>) {
        if let Some(p) = dns_label_problem(&self.metadata.name) {
            s.error("metadata.name", p);
        }
        let spec = &self.spec;
        let mut s = s.field("spec");
        let parse = |s: &mut Scope<'_>, field: &str, v: &str| -> Option<IpNet> {
            match v.parse::<IpNet>() {
                Ok(net) if net.trunc() != net => {
                    s.error(
                        field,
                        format!(
                            "{v:?} has host bits set (expected the network address, {})",
                            net.trunc()
                        ),
                    );
                    None
                }
                Ok(net) => Some(net),
                Err(_) => {
                    s.error(
                        field,
                        format!("{v:?} is not a CIDR (expected e.g. 10.100.0.0/16)"),
                    );
                    None
                }
            }
        };
        let cluster = parse(&mut s, "clusterCIDR", &spec.cluster_cidr);
        let service = parse(&mut s, "serviceCIDR", &spec.service_cidr);
        if let (Some(c), Some(sv)) = (cluster, service) {
            if c.addr().is_ipv4() != sv.addr().is_ipv4() {
                s.error("serviceCIDR", format!("{sv} and clusterCIDR {c} are different address families (expected both IPv4 or both IPv6)"));
            } else if c.contains(&sv.network()) || sv.contains(&c.network()) {
                s.error(
                    "serviceCIDR",
                    format!("{sv} overlaps clusterCIDR {c} (expected separate ranges)"),
                );
            }
        }
        if let Some(c) = cluster {
            let node_prefix = (c.prefix_len() as u32).saturating_add(spec.node_subnet_bits);
            let limit = (c.max_prefix_len() - MIN_HOST_BITS) as u32;
            if spec.node_subnet_bits == 0 {
                s.error(
                    "nodeSubnetBits",
                    "0 must be at least 1 (each node needs its own subnet)",
                );
            } else if node_prefix > limit {
                s.error(
                    "nodeSubnetBits",
                    format!(
                        "{} does not fit clusterCIDR {c}: node subnets would be /{node_prefix}, smaller than the /{limit} needed for instances (expected at most {})",
                        spec.node_subnet_bits,
                        limit.saturating_sub(c.prefix_len() as u32)
                    ),
                );
            }
        }
        if let Some(p) = dns_name_problem(&spec.cluster_domain) {
            s.error("clusterDomain", p);
        }
        let mut ports: BTreeMap<u32, &str> = BTreeMap::new();
        for (field, port) in [
            ("agentPort", spec.agent_port),
            ("apiPort", spec.api_port),
            ("etcdPeerPort", spec.etcd_peer_port),
            ("etcdClientPort", spec.etcd_client_port),
            ("wireguardPort", spec.wireguard_port),
            ("rejoinPort", spec.rejoin_port),
        ] {
            if !(1..=65535).contains(&port) {
                s.error(field, format!("{port} is not a port (expected 1-65535)"));
            } else if let Some(other) = ports.insert(port, field) {
                s.error(
                    field,
                    format!("{port} is also {other} (every port must be different)"),
                );
            }
        }
        for (field, path) in [
            ("volumeBasePath", &spec.volume_base_path),
            ("backupPath", &spec.backup_path),
        ] {
            if let Some(p) = absolute_path_problem(path) {
                s.error(field, p);
            }
        }
        for (i, path) in spec.host_mount_allowed_paths.iter().enumerate() {
            let field = format!("hostMountAllowedPaths[{i}]");
            if let Some(p) = absolute_path_problem(path) {
                s.error(&field, p);
            } else if path.trim_end_matches('/').is_empty() {
                s.error(
                    &field,
                    "/ would allow every host path (expected a directory such as /srv)",
                );
            }
        }
        for (field, v) in [
            ("backupIntervalMinutes", spec.backup_interval_minutes),
            ("backupRetention", spec.backup_retention),
            ("agentTickSeconds", spec.agent_tick_seconds),
            ("nodeLossTimeoutSeconds", spec.node_loss_timeout_seconds),
        ] {
            if v == 0 {
                s.error(field, "0 must be at least 1");
            }
        }
        if spec.finished_run_history > 100 {
            s.error(
                "finishedRunHistory",
                format!(
                    "{} is more than 100 (every kept run holds records in etcd and logs on its node)",
                    spec.finished_run_history
                ),
            );
        }
        if !(1..=8760).contains(&spec.finished_run_max_age_hours) {
            s.error(
                "finishedRunMaxAgeHours",
                format!(
                    "{} is not between 1 and 8760 (a year)",
                    spec.finished_run_max_age_hours
                ),
            );
        }
        if let Some(after) = spec.node_remove_after_seconds {
            if after <= spec.node_loss_timeout_seconds {
                s.error(
                    "nodeRemoveAfterSeconds",
                    format!(
                        "{after} must be longer than nodeLossTimeoutSeconds ({}): a node is removed only after it has been NotReady",
                        spec.node_loss_timeout_seconds
                    ),
                );
            }
        }
        if spec.agent_tick_seconds > 0 && spec.node_loss_timeout_seconds <= spec.agent_tick_seconds
        {
            s.error(
                "nodeLossTimeoutSeconds",
                format!(
                    "{} must be longer than agentTickSeconds ({}), or every node would be declared lost between two heartbeats",
                    spec.node_loss_timeout_seconds, spec.agent_tick_seconds
                ),
            );
        }
    }
}
