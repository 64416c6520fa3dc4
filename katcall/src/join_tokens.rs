//! `katcall create|get|delete join-token`: the tokens new nodes join with.

use std::net::IpAddr;

use anyhow::Result;
use kat_api::wire::{JoinRole, NewJoinToken};

use crate::client::Client;
use crate::output::{self, structured, Format};

/// What `katcall create join-token` asks the cluster for.
pub struct CreateRequest {
    pub control_plane: bool,
    /// `None`: the role's default (24h for a worker token, 1h for a control-plane token).
    pub ttl: Option<String>,
    pub uses: Option<u32>,
    pub addresses: Vec<IpAddr>,
}

impl CreateRequest {
    /// The body of `POST /join-tokens`.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "role": if self.control_plane { JoinRole::ControlPlane } else { JoinRole::Worker },
        });
        if let Some(ttl) = &self.ttl {
            body["ttl"] = ttl.clone().into();
        }
        if let Some(uses) = self.uses {
            body["maxUses"] = uses.into();
        }
        if !self.addresses.is_empty() {
            body["addresses"] = self
                .addresses
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .into();
        }
        body
    }
}

pub async fn create(client: &Client, request: &CreateRequest, format: Format) -> Result<()> {
    let token = client.create_join_token(&request.body()).await?;
    if structured(format, &token)? {
        return Ok(());
    }
    print!("{}", instructions(&token, request.uses));
    Ok(())
}

/// What to do with a new token: the token on a line of its own, and the join command that
/// reads it from a file (a token on a command line is visible to every local user in `ps`).
fn instructions(token: &NewJoinToken, uses: Option<u32>) -> String {
    let limit = match uses {
        Some(n) => format!(", for {n} node{}", if n == 1 { "" } else { "s" }),
        None => String::new(),
    };
    let (what, flag) = match token.role {
        JoinRole::ControlPlane => (
            "control-plane join token (it makes etcd members, which get the cluster CA's key: keep it secret, delete it once used)",
            " --etcd-peer",
        ),
        JoinRole::Worker => ("worker join token", ""),
    };
    let mut out = format!(
        "{what} {} (valid until {}{limit}):\n  {}\n",
        token.id, token.expires_at, token.token
    );
    if !token.addresses.is_empty() {
        out.push_str(&format!(
            "a node joining with it may advertise: {} (or the address it joins from)\n",
            token.addresses.join(", ")
        ));
    }
    out.push_str(&format!(
        "on the new node, save it in a file only the agent's user can read (e.g. join.token, mode 0600), then:\n  \
         kat-agent join --leader-api HOST:PORT --token-file join.token --ca-pin {} --advertise-address IP{flag}\n",
        token.ca_pin
    ));
    if token.role == JoinRole::Worker {
        out.push_str("(a member of the etcd quorum needs a control-plane token: `katcall create join-token --control-plane`)\n");
    }
    out
}

pub async fn list(client: &Client, format: Format) -> Result<()> {
    let list = client.join_tokens().await?;
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
                t.role.to_string(),
                t.expires_at.to_string(),
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
        output::table(&["ID", "ROLE", "EXPIRES", "USED BY", "USES"], &rows)
    );
    Ok(())
}

pub async fn delete(client: &Client, id: &str) -> Result<()> {
    client.delete_join_token(id).await?;
    println!("join token {id} deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_token(role: JoinRole) -> NewJoinToken {
        NewJoinToken {
            token: "katjoin.0123456789ab.0123456789abcdef0123456789abcdef".into(),
            id: "0123456789ab".into(),
            role,
            expires_at: "2026-01-01T01:00:00Z".parse().unwrap(),
            addresses: vec![],
            ca_pin: "sha256:00".into(),
        }
    }

    #[test]
    fn the_flags_make_the_body_and_a_worker_token_is_the_default() {
        let plain = CreateRequest {
            control_plane: false,
            ttl: None,
            uses: None,
            addresses: vec![],
        };
        // No ttl: the cluster applies the role's default (24h, or 1h for control plane).
        assert_eq!(plain.body(), serde_json::json!({"role": "worker"}));
        let full = CreateRequest {
            control_plane: true,
            ttl: Some("30m".into()),
            uses: Some(1),
            addresses: vec!["192.0.2.7".parse().unwrap()],
        };
        assert_eq!(
            full.body(),
            serde_json::json!({"role": "control-plane", "ttl": "30m", "maxUses": 1, "addresses": ["192.0.2.7"]})
        );
    }

    #[test]
    fn the_instructions_keep_the_token_off_the_command_line() {
        let worker = instructions(&new_token(JoinRole::Worker), None);
        assert!(worker.contains("--token-file join.token"), "{worker}");
        assert!(!worker.contains("--token katjoin"), "{worker}");
        assert!(!worker.contains("--etcd-peer"), "{worker}");
        assert!(worker.contains("--control-plane"), "{worker}");
        let cp = instructions(&new_token(JoinRole::ControlPlane), Some(1));
        assert!(cp.contains("--etcd-peer"), "{cp}");
        assert!(cp.starts_with("control-plane join token"), "{cp}");
        assert!(cp.contains("for 1 node"), "{cp}");
    }
}
