//! `katcall backup create` and `katcall get backups`: etcd snapshots the control-plane nodes
//! keep in their `backupPath`.

use anyhow::Result;

use crate::client::Client;
use crate::output::{self, structured, Format};

pub async fn create(client: &Client, format: Format) -> Result<()> {
    let record = client.create_backup().await?;
    if structured(format, &record)? {
        return Ok(());
    }
    println!(
        "backup {} written on node {}: {} ({})",
        record.name,
        record.node,
        record.path,
        output::bytes(record.size_bytes)
    );
    println!("sha256 {}", record.sha256);
    println!("copy it (and {}.sha256) off the node; restore with `kat-agent restore --snapshot FILE` (docs/operations.md)", record.path);
    Ok(())
}

pub async fn list(client: &Client, format: Format) -> Result<()> {
    let list = client.backups().await?;
    if structured(format, &list)? {
        return Ok(());
    }
    if list.is_empty() {
        eprintln!("no backups yet (take one with `katcall backup create`; the leader takes one every backupIntervalMinutes)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.taken_at.to_string(),
                output::bytes(b.size_bytes),
                b.sha256.chars().take(16).collect(),
                b.node.clone(),
                b.trigger.clone(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &["NAME", "TIME", "SIZE", "SHA256", "NODE", "TRIGGER"],
            &rows
        )
    );
    Ok(())
}
