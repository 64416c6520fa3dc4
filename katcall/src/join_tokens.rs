//! `katcall create|get|delete join-token`: the tokens new nodes join with.

use anyhow::Result;
use kat_api::wire::{JoinTokenInfo, NewJoinToken};
use reqwest::Method;

use crate::client::Client;
use crate::output::{self, structured, Format};
use crate::workloads::json;

pub async fn create(client: &Client, ttl: &str, uses: Option<u32>, format: Format) -> Result<()> {
    let req = client
        .request(Method::POST, "/join-tokens")
        .header("content-type", "application/json")
        .body(serde_json::json!({ "ttl": ttl, "maxUses": uses }).to_string());
    let token: NewJoinToken = json(client.send(req).await?).await?;
    if structured(format, &token)? {
        return Ok(());
    }
    let limit = match uses {
        Some(n) => format!(", for {n} node{}", if n == 1 { "" } else { "s" }),
        None => String::new(),
    };
    println!(
        "join token {} (valid until {}{limit}):",
        token.id, token.expires_at
    );
    println!("  {}", token.token);
    println!("on the new node (add --etcd-peer to make it a member of the etcd quorum):");
    println!(
        "  kat-agent join --leader-api HOST:PORT --token {} --ca-pin {} --advertise-address IP",
        token.token, token.ca_pin
    );
    Ok(())
}

pub async fn list(client: &Client, format: Format) -> Result<()> {
    let list: Vec<JoinTokenInfo> = client.get_json("/join-tokens").await?;
    if structured(format, &list)? {
        return Ok(());
    }
    if list.is_empty() {
        eprintln!("no join tokens (create one with `katcall create join-token`)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.expires_at.clone(),
                if t.used_by.is_empty() {
                    "-".into()
                } else {
                    t.used_by.join(",")
                },
                match t.max_uses {
                    Some(n) => format!("{}/{n}", t.used_by.len()),
                    None => format!("{}/-", t.used_by.len()),
                },
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(&["ID", "EXPIRES", "USED BY", "USES"], &rows)
    );
    Ok(())
}

pub async fn delete(client: &Client, id: &str) -> Result<()> {
    client
        .send(client.request(Method::DELETE, &format!("/join-tokens/{id}")))
        .await?;
    println!("join token {id} deleted");
    Ok(())
}
