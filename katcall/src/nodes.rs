//! `describe node`, `drain`, `uncordon`, `taint`, `label`, `delete node`.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use kat_api::wire::{Event, InstanceStatus, Node, ResourceList, Taint};
use kat_api::workload::TaintEffect;
use kat_client::admin::EventQuery;

use crate::client::Client;
use crate::output::{self, age, structured, table, Format};

/// `key[=value]:Effect`, as `taint` takes it.
pub(crate) fn taint_text(t: &Taint) -> String {
    format!(
        "{}{}:{:?}",
        t.key,
        t.value
            .as_ref()
            .map(|v| format!("={v}"))
            .unwrap_or_default(),
        t.effect
    )
}

fn resources(r: &ResourceList) -> String {
    format!(
        "cpu={}m memory={} pids={}",
        r.cpu_millis,
        output::bytes(r.memory_bytes),
        r.pids
    )
}

/// `katcall describe node NAME`: what the node is (state, role, whether it leads), what it
/// offers and uses, its taints and labels, the instances assigned to it and its recent events.
pub async fn describe(client: &Client, name: &str, format: Format) -> Result<()> {
    let node = client.node(name).await?;
    let all = client.instances(None).await?;
    let instances: Vec<InstanceStatus> = all
        .into_iter()
        .filter(|i| i.node.as_deref() == Some(name))
        .collect();
    let events = client
        .events(&EventQuery {
            resource_type: Some("Node".into()),
            resource_name: Some(name.to_string()),
            limit: Some(15),
            ..Default::default()
        })
        .await?;
    if structured(
        format,
        &serde_json::json!({"node": node, "instances": instances, "events": events}),
    )? {
        return Ok(());
    }
    print!("{}", describe_text(&node, &instances, &events));
    Ok(())
}

/// One GPU: `amd Radeon 8192MB (amd.com/gpu=0)`.
fn gpu_text(g: &kat_api::wire::GpuInfo) -> String {
    let driver = format!("{:?}", g.driver).to_lowercase();
    let model = if g.model.is_empty() {
        String::new()
    } else {
        format!(" {}", g.model)
    };
    let vram = if g.vram_mb > 0 {
        format!(" {}MB", g.vram_mb)
    } else {
        String::new()
    };
    format!("{driver}{model}{vram} ({})", g.device)
}

/// A node's GPUs in one cell: `2×amd 8192MB,nvidia` or `-`.
pub fn gpus_text(gpus: &[kat_api::wire::GpuInfo]) -> String {
    if gpus.is_empty() {
        return "-".into();
    }
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for g in gpus {
        let driver = format!("{:?}", g.driver).to_lowercase();
        let key = if g.vram_mb > 0 {
            format!("{driver} {}MB", g.vram_mb)
        } else {
            driver
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(k, n)| if n == 1 { k } else { format!("{n}×{k}") })
        .collect::<Vec<_>>()
        .join(",")
}

/// `sha256:0123456789ab…` as `sha256:0123456789ab` (as `docker images` shortens ids).
fn short_digest(digest: &str) -> String {
    let (algorithm, hex) = digest.split_once(':').unwrap_or(("", digest));
    let hex: String = hex.chars().take(12).collect();
    if algorithm.is_empty() {
        hex
    } else {
        format!("{algorithm}:{hex}")
    }
}

fn describe_text(node: &Node, instances: &[InstanceStatus], events: &[Event]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{:<13}{value}", format!("{label}:"));
    };
    line("Name", node.metadata.name.clone());
    line("State", format!("{:?}", node.state));
    line(
        "Role",
        kat_api::wire::cluster_role(&node.metadata.labels)
            .unwrap_or("-")
            .to_string(),
    );
    line(
        "Leader",
        match (&node.leader, &node.leader_since) {
            (true, Some(since)) => format!("yes, since {since} ({} ago)", age(Some(*since))),
            (true, None) => "yes".into(),
            (false, _) => "no".into(),
        },
    );
    if let Some(d) = &node.detached {
        line(
            "Detached",
            format!(
                "from {} since {} ({} ago)",
                d.parent_cluster,
                d.since,
                age(Some(d.since))
            ),
        );
    }
    line(
        "Addresses",
        if node.addresses.is_empty() {
            "-".into()
        } else {
            node.addresses.join(", ")
        },
    );
    line("Subnet", node.subnet.clone().unwrap_or_else(|| "-".into()));
    line(
        "Heartbeat",
        match &node.last_heartbeat {
            Some(t) => format!("{t} ({} ago)", age(Some(*t))),
            None => "never".into(),
        },
    );
    line("Capacity", resources(&node.capacity));
    line("Allocatable", resources(&node.allocatable));
    if let Some(approved) = &node.approved_capacity {
        let more = approved.clamp(node.allocatable) != node.allocatable
            || approved.approved_gpus(&node.gpus).len() < node.gpus.len();
        line(
            "Approved",
            if more {
                format!(
                    "{} (it reports more: `katcall approve node {} --capacity` lets the scheduler use it)",
                    resources(&approved.allocatable),
                    node.metadata.name
                )
            } else {
                resources(&approved.allocatable)
            },
        );
    }
    if let Some(u) = &node.usage {
        let disk = match (u.disk_bytes, u.disk_total_bytes) {
            (Some(used), Some(total)) => {
                format!(" disk={}/{}", output::bytes(used), output::bytes(total))
            }
            _ => String::new(),
        };
        line(
            "Usage",
            format!(
                "cpu={}m memory={} pids={}{disk}",
                u.cpu_millis,
                output::bytes(u.memory_bytes),
                u.pids
            ),
        );
    }
    for g in &node.gpus {
        line("GPU", gpu_text(g));
    }
    line(
        "Taints",
        if node.taints.is_empty() {
            "-".into()
        } else {
            node.taints
                .iter()
                .map(taint_text)
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    line(
        "Labels",
        node.metadata
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = writeln!(out, "\nInstances:");
    if instances.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let rows: Vec<Vec<String>> = instances
            .iter()
            .map(|i| {
                vec![
                    format!("{}/{}", i.namespace, i.workload),
                    i.instance_id.to_string(),
                    format!("{:?}", i.state),
                    format!("{:?}", i.health),
                    i.restarts.to_string(),
                    i.ip.map_or_else(|| "-".into(), |ip| ip.to_string()),
                    age(i.started_at),
                    i.container_id.clone().unwrap_or_else(|| "-".into()),
                    i.image_digest
                        .as_deref()
                        .map_or_else(|| "-".into(), short_digest),
                ]
            })
            .collect();
        let header = [
            "WORKLOAD",
            "INSTANCE",
            "STATE",
            "HEALTH",
            "RESTARTS",
            "IP",
            "AGE",
            "CONTAINER",
            "IMAGE",
        ];
        for l in table(&header, &rows).lines() {
            let _ = writeln!(out, "  {l}");
        }
    }
    if !node.overlay.is_empty() {
        let _ = writeln!(out, "\nOverlay peers:");
        let rows: Vec<Vec<String>> = node
            .overlay
            .iter()
            .map(|p| {
                vec![
                    p.node.clone(),
                    p.endpoint.clone(),
                    p.last_peer_sync
                        .map_or_else(|| "never".into(), |t| format!("{} ago", age(Some(t)))),
                    p.handshakes.to_string(),
                    output::bytes(p.tx_bytes),
                    output::bytes(p.rx_bytes),
                ]
            })
            .collect();
        let header = [
            "PEER",
            "ENDPOINT",
            "LAST SYNC",
            "HANDSHAKES",
            "SENT",
            "RECEIVED",
        ];
        for l in table(&header, &rows).lines() {
            let _ = writeln!(out, "  {l}");
        }
    }
    let _ = writeln!(out, "\nEvents:");
    if events.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    format!("{} ago", age(Some(e.timestamp))),
                    format!("{:?}", e.event_type),
                    e.reason.clone(),
                    e.message.clone(),
                ]
            })
            .collect();
        for l in table(&["AGE", "TYPE", "REASON", "MESSAGE"], &rows).lines() {
            let _ = writeln!(out, "  {l}");
        }
    }
    out
}

pub async fn drain(client: &Client, node: &str, undo: bool) -> Result<()> {
    client.drain(node, !undo).await?;
    println!(
        "node {node} {}",
        if undo {
            "uncordoned"
        } else {
            "draining: no new instances; Service instances move elsewhere"
        }
    );
    Ok(())
}

/// `katcall approve node NAME --capacity`: approves what the node claims as this reads it
/// (a claim raised after this look is not approved with it).
pub async fn approve_capacity(client: &Client, node: &str) -> Result<()> {
    let seen = client.node(node).await?;
    if seen.last_heartbeat.is_none() {
        bail!("node {node} has sent no heartbeat yet: there is no capacity to approve; wait for it to report (katcall describe node {node})");
    }
    let approved = kat_api::wire::ApprovedCapacity {
        allocatable: seen.allocatable,
        gpus: seen.gpus,
    };
    let reg = client.approve_capacity(node, &approved).await?;
    if let Some(c) = reg.capacity {
        println!(
            "node {node}: cpu {}m, memory {} MiB, pids {}, {} GPUs approved",
            c.allocatable.cpu_millis,
            c.allocatable.memory_bytes >> 20,
            c.allocatable.pids,
            c.gpus.len()
        );
    }
    Ok(())
}

/// `key[=value]:Effect` adds a taint, `key-` (or `key:Effect-`) removes it.
fn parse_taint(spec: &str) -> Result<(String, Option<Taint>)> {
    if let Some(key) = spec.strip_suffix('-') {
        let key = key.split(':').next().unwrap_or(key);
        return Ok((key.to_string(), None));
    }
    let Some((kv, effect)) = spec.rsplit_once(':') else {
        bail!(
            "taint {spec:?}: expected key[=value]:NoSchedule|PreferNoSchedule, or key- to remove"
        );
    };
    let effect = match effect {
        "NoSchedule" => TaintEffect::NoSchedule,
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        other => bail!("taint {spec:?}: effect {other:?} is not NoSchedule or PreferNoSchedule"),
    };
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (kv.to_string(), None),
    };
    Ok((key.clone(), Some(Taint { key, value, effect })))
}

pub async fn taint(client: &Client, node: &str, specs: &[String]) -> Result<()> {
    let n = client.node(node).await?;
    let mut taints = n.taints;
    for spec in specs {
        let (key, taint) = parse_taint(spec)?;
        taints.retain(|t| t.key != key);
        taints.extend(taint);
    }
    let reg = client.set_taints(node, &taints).await?;
    println!("node {node} taints: {}", reg.taints.len());
    Ok(())
}

/// `key=value` sets a label, `key-` removes it.
pub async fn label(client: &Client, node: &str, specs: &[String]) -> Result<()> {
    let mut changes: BTreeMap<String, Option<String>> = BTreeMap::new();
    for spec in specs {
        if let Some(key) = spec.strip_suffix('-') {
            changes.insert(key.to_string(), None);
        } else if let Some((k, v)) = spec.split_once('=') {
            changes.insert(k.to_string(), Some(v.to_string()));
        } else {
            bail!("label {spec:?}: expected key=value, or key- to remove");
        }
    }
    let reg = client.set_labels(node, &changes).await?;
    println!("node {node} labels: {:?}", reg.labels);
    Ok(())
}

/// Remove a node from the cluster for good.
pub async fn remove(client: &Client, node: &str) -> Result<()> {
    client.delete_node(node).await?;
    println!(
        "node {node} removed: its etcd member left the quorum, its certificate is revoked, its instances move to other nodes; stop kat-agent on it and remove its data directory"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taint_specs() {
        let (k, t) = parse_taint("gpu=yes:NoSchedule").unwrap();
        assert_eq!(k, "gpu");
        let t = t.unwrap();
        assert_eq!(t.value.as_deref(), Some("yes"));
        assert_eq!(t.effect, TaintEffect::NoSchedule);
        assert_eq!(parse_taint("gpu-").unwrap(), ("gpu".into(), None));
        assert!(parse_taint("gpu").is_err());
        assert!(parse_taint("gpu:Sometimes").is_err());
    }

    fn node(name: &str, leader: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": "",
                         "labels": {"kat.dws.rip/cluster-role": "control-plane"}},
            "state": "Ready",
            "capacity": {"cpuMillis": 2000, "memoryBytes": 1u64 << 30},
            "allocatable": {"cpuMillis": 1500, "memoryBytes": 1u64 << 29},
            "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
            "leader": leader,
            "leaderSince": if leader { Some("2025-01-02T03:04:05Z") } else { None },
        }))
        .unwrap()
    }

    #[test]
    fn describe_says_whether_the_node_leads() {
        let text = describe_text(&node("cp1", true), &[], &[]);
        assert!(text.contains("Name:        cp1\n"), "{text}");
        assert!(
            text.contains("Leader:      yes, since 2025-01-02T03:04:05.000Z"),
            "{text}"
        );
        assert!(text.contains("Taints:      gpu=yes:NoSchedule\n"), "{text}");
        assert!(text.contains("Instances:\n  (none)"), "{text}");
        let mut with_peer = node("cp3", false);
        with_peer.overlay = vec![kat_api::wire::OverlayPeerStatus {
            node: "n2".into(),
            endpoint: "10.0.0.2:51820".into(),
            last_peer_sync: None,
            handshakes: 0,
            tx_bytes: 0,
            rx_bytes: 2048,
        }];
        let text = describe_text(&with_peer, &[], &[]);
        assert!(text.contains("Overlay peers:"), "{text}");
        assert!(text.contains("n2    10.0.0.2:51820  never"), "{text}");
        assert_eq!(
            short_digest("sha256:0123456789abcdef"),
            "sha256:0123456789ab"
        );
        let text = describe_text(&node("cp2", false), &[], &[]);
        assert!(text.contains("Leader:      no\n"), "{text}");
        assert_eq!(crate::workloads::leader_mark(&node("cp1", true)), "yes");
        assert_eq!(crate::workloads::leader_mark(&node("cp2", false)), "-");
    }
}
