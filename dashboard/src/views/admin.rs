//! What only the admin token sees: backups and join tokens (listed; made with katcall).

use kat_apiserver::service::{Result, Service};
use maud::{html, Markup};

use super::{bytes, short, when};

pub async fn backups(service: &Service) -> Result<Markup> {
    let mut backups = service.backups().await?;
    backups.sort_by_key(|b| std::cmp::Reverse(b.taken_at));
    Ok(html! {
        h1 { "Backups" }
        div.scroll {
            table #backups {
                thead { tr { th { "Snapshot" } th { "Node" } th { "Taken" } th { "Size" } th { "Trigger" } th { "SHA-256" } } }
                tbody {
                    @for b in &backups {
                        tr {
                            td { code { (b.name) } }
                            td { (b.node) }
                            td { (when(b.taken_at)) }
                            td { (bytes(b.size_bytes)) }
                            td { (b.trigger) }
                            td { code { (short(&b.sha256)) } }
                        }
                    }
                }
            }
        }
        @if backups.is_empty() { p.muted { "No snapshots yet. " code { "katcall backup create" } " takes one." } }
    })
}

pub async fn join_tokens(service: &Service) -> Result<Markup> {
    let tokens = service.join_tokens().await?;
    Ok(html! {
        h1 { "Join tokens" }
        div.scroll {
            table #join-tokens {
                thead { tr { th { "ID" } th { "Role" } th { "Created" } th { "Expires" } th { "Used by" } th { "Uses left" } } }
                tbody {
                    @for t in &tokens {
                        tr {
                            td { code { (t.id) } }
                            td { (format!("{:?}", t.role)) }
                            td { (when(t.created_at)) }
                            td { time datetime=(t.expires_at.to_string()) { (t.expires_at.to_string()) } }
                            td { (t.used_by.join(", ")) }
                            td { (t.max_uses.map(|m| m.saturating_sub(t.used_by.len() as u32).to_string()).unwrap_or_else(|| "any".into())) }
                        }
                    }
                }
            }
        }
        @if tokens.is_empty() { p.muted { "No join tokens. " code { "katcall create join-token" } " makes one." } }
    })
}
