//! From an instance record and its workload's Quadlet files to the runtime's
//! [`CreateOptions`]: command, args, env, resources, volume mounts, labels.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use kat_api::wire::InstanceRecord;
use kat_api::Template;
use kat_runtime::{labels, CreateOptions, LogConfig, Resources, VolumeMount};

use crate::network::{NetworkSettings, PublishedPort};

/// Every container gets a pids limit so that a fork bomb stays inside it.
pub const DEFAULT_PIDS_LIMIT: u64 = 4096;

/// The container id of `attempt` (0 for the first run) of an instance: `{instance}-{attempt}`,
/// shortened with a hash when that would not be a DNS label (at most 63 characters). The
/// labels keep the full instance id.
pub fn container_id(instance_id: &str, attempt: u32) -> String {
    let id = format!("{instance_id}-{attempt}");
    if id.len() <= 63 {
        return id;
    }
    use sha2::Digest;
    let hash = sha2::Sha256::digest(instance_id.as_bytes());
    let suffix = format!(
        "-{:02x}{:02x}{:02x}{:02x}-{attempt}",
        hash[0], hash[1], hash[2], hash[3]
    );
    let keep = 63 - suffix.len();
    format!("{}{suffix}", instance_id[..keep].trim_end_matches('-'))
}

/// The container's hostname: the instance id, cut to a DNS label.
fn hostname(instance_id: &str) -> String {
    instance_id[..instance_id.len().min(63)]
        .trim_end_matches('-')
        .to_string()
}

/// What the runtime creates for `attempt` of the instance: command, args, env, limits,
/// volume mounts (host paths from `volume_paths`, by volume name) and labels. The network
/// and GPUs are added after ([`connect_options`], [`apply_gpu_edits`]).
pub fn create_options(
    record: &InstanceRecord,
    template: &Template,
    image: &str,
    attempt: u32,
    volume_paths: &BTreeMap<String, PathBuf>,
) -> CreateOptions {
    let spec = &template.workload.spec;
    let c = &spec.container;
    let mut env: BTreeMap<String, String> = BTreeMap::from([
        (
            "KAT_INSTANCE_ID".to_string(),
            record.instance_id.to_string(),
        ),
        ("KAT_NAMESPACE".to_string(), record.namespace.clone()),
        ("KAT_WORKLOAD".to_string(), record.workload.clone()),
    ]);
    for e in &c.env {
        env.insert(e.name.clone(), e.value.clone());
    }
    let parsed = c.resources.as_ref().map(|r| r.parsed()).unwrap_or_default();
    let volumes = c
        .volume_mounts
        .iter()
        .filter_map(|m| {
            Some(VolumeMount {
                name: m.name.clone(),
                source: volume_paths.get(&m.name)?.clone(),
                sub_path: m.sub_path.clone(),
                destination: m.mount_path.clone(),
                read_only: m.read_only,
                owned_by_container: spec
                    .volumes
                    .iter()
                    .any(|v| v.name == m.name && v.simple_cluster_storage.is_some()),
            })
        })
        .collect();
    CreateOptions {
        id: container_id(&record.instance_id, attempt),
        namespace: record.namespace.clone(),
        workload: record.workload.clone(),
        image: image.to_string(),
        hostname: hostname(&record.instance_id),
        command: c.command.clone(),
        args: c.args.clone(),
        env,
        user: String::new(),
        labels: BTreeMap::from([
            (labels::INSTANCE.to_string(), record.instance_id.to_string()),
            (labels::ATTEMPT.to_string(), attempt.to_string()),
            (
                labels::GENERATION.to_string(),
                record.generation.to_string(),
            ),
        ]),
        resources: Resources {
            memory_limit_bytes: parsed.memory_limit.map_or(0, |b| b.0),
            cpu_limit_millis: parsed.cpu_limit.map_or(0, |m| m.0),
            cpu_request_millis: parsed.cpu_request.map_or(0, |m| m.0),
            pids_limit: DEFAULT_PIDS_LIMIT,
        },
        volumes,
        hosts: BTreeMap::new(),
        dns_servers: vec![],
        dns_search: vec![],
        log: LogConfig::default(),
        address: None,
        devices: vec![],
        host_binds: vec![],
        hooks: vec![],
    }
}

/// Put the GPUs' CDI edits in the container: their device nodes, their mounts (read-only
/// when the spec says `ro`), their environment (over the workload's own), their hooks.
pub fn apply_gpu_edits(options: &mut CreateOptions, edits: kat_runtime::gpus::cdi::Edits) {
    options.env.extend(edits.env);
    options.hooks.extend(edits.hooks);
    options.devices.extend(
        edits
            .devices
            .into_iter()
            .map(|(host_path, container_path)| kat_runtime::DeviceNode {
                host_path,
                container_path,
            }),
    );
    options.host_binds.extend(edits.mounts.into_iter().map(
        |(host_path, container_path, read_only)| kat_runtime::HostBind {
            host_path,
            container_path,
            read_only,
        },
    ));
}

/// A container on the node network: its address, the node's DNS, the search path that
/// makes `web` and `web.other` resolve from namespace `ns`.
pub fn connect_options(options: &mut CreateOptions, address: Ipv4Addr, settings: &NetworkSettings) {
    options.address = Some(address);
    options.dns_servers = vec![settings.gateway.to_string()];
    options.dns_search = vec![
        format!("{}.{}", options.namespace, settings.domain),
        settings.domain.clone(),
    ];
}

/// The ports a running instance publishes on its node (`hostPort` of its load balancer's
/// ports), towards its address.
pub fn published_ports(
    record: &InstanceRecord,
    template: Option<&Arc<Template>>,
) -> Vec<PublishedPort> {
    let (Some(template), Some(address)) = (
        template,
        match record.ip {
            Some(std::net::IpAddr::V4(ip)) => Some(ip),
            _ => None,
        },
    ) else {
        return vec![];
    };
    let Some(lb) = &template.load_balancer else {
        return vec![];
    };
    lb.spec
        .ports
        .iter()
        .filter_map(|p| {
            Some(PublishedPort {
                host_port: u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?,
                protocol: p.protocol,
                address,
                container_port: u16::try_from(p.container_port).ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_dns_labels_and_distinct() {
        assert_eq!(container_id("web-0badcafe", 3), "web-0badcafe-3");
        let long = format!("{}-0badcafe", "a".repeat(63));
        let other = format!("{}-0badcafd", "a".repeat(63));
        let id = container_id(&long, 12);
        assert!(id.len() <= 63 && id.ends_with("-12"), "{id}");
        assert_ne!(id, container_id(&other, 12));
        assert_eq!(hostname(&long).len(), 63);
    }
}
