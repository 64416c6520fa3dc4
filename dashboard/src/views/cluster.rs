//! The cluster: its nodes with state, role, leadership, usage against capacity, and GPUs.

use kat_api::wire::{cluster_role, Node};
use kat_apiserver::service::{Result, Service};
use maud::{html, Markup};

use super::{ago, badge, bytes, meter};

pub async fn render(service: &Service) -> Result<Markup> {
    let nodes = service.nodes().await?;
    let ready = nodes
        .values()
        .filter(|n| n.state == kat_api::wire::NodeState::Ready)
        .count();
    Ok(html! {
        h1 { "Cluster " span.muted { (service.cluster.metadata.name) } }
        p.summary { (ready) " of " (nodes.len()) " nodes ready" }
        div.scroll {
            table #nodes {
                thead { tr {
                    th { "Node" } th { "State" } th { "Role" } th { "CPU" } th { "Memory" }
                    th { "Disk" } th { "GPUs" } th { "Heartbeat" }
                } }
                tbody {
                    @for (name, node) in &nodes { (row(name, node)) }
                }
            }
        }
        @if nodes.is_empty() {
            p.muted { "No node has registered yet." }
        }
    })
}

fn row(name: &str, node: &Node) -> Markup {
    let usage = node.usage.unwrap_or_default();
    let cpu = node.capacity.cpu_millis;
    let memory = node.capacity.memory_bytes;
    let disk = usage.disk_total_bytes.unwrap_or(0);
    html! {
        tr data-node=(name) {
            td {
                (name)
                @if node.leader { " " span.badge.leader title="runs the controllers and the scheduler" { "leader" } }
                @if let Some(address) = node.addresses.first() { br; span.muted { (address) } }
            }
            td { (badge(&format!("{:?}", node.state))) }
            td { (cluster_role(&node.metadata.labels).unwrap_or("—")) }
            td { (meter(usage.cpu_millis, cpu, format!("{:.2} of {:.1} cores", usage.cpu_millis as f64 / 1000.0, cpu as f64 / 1000.0))) }
            td { (meter(usage.memory_bytes, memory, format!("{} of {}", bytes(usage.memory_bytes), bytes(memory)))) }
            td { (meter(usage.disk_bytes.unwrap_or(0), disk, format!("{} of {}", bytes(usage.disk_bytes.unwrap_or(0)), bytes(disk)))) }
            td {
                @for gpu in &node.gpus {
                    div {
                        @if gpu.model.is_empty() { (format!("{:?}", gpu.driver)) } @else { (gpu.model) }
                        " · " (gpu.vram_mb / 1024) " GiB"
                    }
                }
                @if node.gpus.is_empty() { span.muted { "—" } }
            }
            td { @if let Some(t) = node.last_heartbeat { (ago(t)) " ago" } @else { "never" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_row_shows_role_usage_and_its_gpus() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1", "uid": "u", "labels": {"kat.dws.rip/cluster-role": "worker"}},
            "state": "Ready",
            "addresses": ["192.0.2.7"],
            "capacity": {"cpuMillis": 4000, "memoryBytes": 8589934592u64, "pids": 1000},
            "allocatable": {"cpuMillis": 4000, "memoryBytes": 8589934592u64, "pids": 1000},
            "gpus": [{"driver": "amd", "vramMB": 8192, "model": "Kat <Test> GPU", "device": "kat.test/gpu=0"}],
            "usage": {"cpuMillis": 1500, "memoryBytes": 2147483648u64, "pids": 12, "diskBytes": 10, "diskTotalBytes": 100},
        }))
        .expect("a node");
        let html = row("gpu-1", &node).into_string();
        for wanted in [
            "worker",
            "192.0.2.7",
            "1.50 of 4.0 cores",
            "2.0Gi of 8.0Gi",
            "Kat &lt;Test&gt; GPU · 8 GiB",
            "<meter",
        ] {
            assert!(html.contains(wanted), "{wanted} in {html}");
        }
        assert!(!html.contains("leader"), "not the leader: {html}");
    }
}
