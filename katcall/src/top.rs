//! `katcall top nodes|instances`: what nodes and running instances use, as their last
//! heartbeats report it (the figures `/metrics` exports too).

use anyhow::Result;
use kat_api::wire::{Node, Usage};

use crate::client::Client;
use crate::output::{self, structured, Format};

pub async fn nodes(client: &Client, format: Format) -> Result<()> {
    let list = client.nodes().await?;
    if structured(format, &list)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list.iter().map(node_row).collect();
    print(
        &[
            "NAME", "CPU", "CPU%", "MEMORY", "MEMORY%", "DISK", "DISK%", "TASKS",
        ],
        &rows,
        "no nodes registered",
    );
    Ok(())
}

fn node_row(n: &Node) -> Vec<String> {
    let name = n.metadata.name.clone();
    let Some(u) = n.usage else {
        let mut row = vec![name];
        row.extend(std::iter::repeat_n("-".to_string(), 7));
        return row;
    };
    vec![
        name,
        cpu(u.cpu_millis),
        percent(u.cpu_millis, n.capacity.cpu_millis),
        output::bytes(u.memory_bytes),
        percent(u.memory_bytes, n.capacity.memory_bytes),
        u.disk_bytes.map_or("-".into(), output::bytes),
        match (u.disk_bytes, u.disk_total_bytes) {
            (Some(used), Some(total)) => percent(used, total),
            _ => "-".into(),
        },
        u.pids.to_string(),
    ]
}

pub async fn instances(client: &Client, ns: Option<&str>, format: Format) -> Result<()> {
    let list = client.instances(ns).await?;
    if structured(format, &list)? {
        return Ok(());
    }
    let mut header = vec![
        "WORKLOAD", "INSTANCE", "NODE", "CPU", "MEMORY", "PIDS", "RESTARTS",
    ];
    if ns.is_none() {
        header.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let u: Option<Usage> = i.usage;
            let mut row = vec![
                i.workload.clone(),
                i.instance_id.to_string(),
                i.node.as_deref().unwrap_or("-").to_string(),
                u.map_or("-".into(), |u| cpu(u.cpu_millis)),
                u.map_or("-".into(), |u| output::bytes(u.memory_bytes)),
                u.map_or("-".into(), |u| u.pids.to_string()),
                i.restarts.to_string(),
            ];
            if ns.is_none() {
                row.insert(0, i.namespace.clone());
            }
            row
        })
        .collect();
    let empty = match ns {
        Some(ns) => format!("no instances reported in namespace {ns}"),
        None => "no instances reported".to_string(),
    };
    print(&header, &rows, &empty);
    Ok(())
}

fn print(header: &[&str], rows: &[Vec<String>], empty: &str) {
    if rows.is_empty() {
        eprintln!("{empty}");
    } else {
        print!("{}", output::table(header, rows));
    }
}

fn cpu(millis: u64) -> String {
    format!("{millis}m")
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{}%", (u128::from(part) * 100 / u128::from(whole)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_row_shows_use_against_capacity() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "", "generation": 0, "resourceVersion": 0}, "state": "Ready",
            "capacity": {"cpuMillis": 2000, "memoryBytes": 4u64 << 30, "pids": 4096},
            "allocatable": {"cpuMillis": 1900, "memoryBytes": 3u64 << 30},
        }))
        .unwrap();
        assert_eq!(node_row(&n)[1..], ["-", "-", "-", "-", "-", "-", "-"]);
        n.usage = Some(Usage {
            cpu_millis: 500,
            memory_bytes: 1 << 30,
            pids: 321,
            disk_bytes: Some(3 << 30),
            disk_total_bytes: Some(12 << 30),
        });
        assert_eq!(
            node_row(&n),
            ["n1", "500m", "25%", "1.0Gi", "25%", "3.0Gi", "25%", "321"]
        );
    }
}
