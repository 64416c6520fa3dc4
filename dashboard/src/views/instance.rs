//! One instance: its state as its node reports it, the runs of it that ended, and its
//! output, which follows live below the content (`kat.js` reads the stream).

use kat_api::finished::FinishedInstance;
use kat_api::WorkloadKey;
use kat_apiserver::service::{Result, Service};
use maud::{html, Markup};

use super::{badge, bytes, short, when};
use crate::pages::Page;

pub async fn render(service: &Service, ns: &str, name: &str, id: &str) -> Result<Markup> {
    let key = WorkloadKey::new(ns, name);
    let w = service.workload(&key).await?;
    let status = w
        .status
        .instances
        .iter()
        .find(|i| i.instance_id.as_str() == id);
    let ended: Vec<FinishedInstance> = service
        .finished_instances(ns, Some(name))
        .await?
        .into_iter()
        .filter(|f| f.record.instance_id.as_str() == id)
        .collect();
    let workload = Page::Workload {
        ns: ns.into(),
        name: name.into(),
    };
    Ok(html! {
        h1 { (id) " " span.muted { "of " a href=(workload.href()) { (name) } } }
        @if let Some(i) = status {
            dl.summary {
                dt { "State" } dd #state { (badge(&format!("{:?}", i.state))) }
                dt { "Health" } dd #health { (badge(&format!("{:?}", i.health))) }
                dt { "Node" } dd { (i.node.as_ref().map(|n| n.to_string()).unwrap_or_default()) }
                dt { "IP" } dd { (i.ip.map(|ip| ip.to_string()).unwrap_or_default()) }
                dt { "Restarts" } dd #restarts { (i.restarts) }
                dt { "Last exit code" } dd #exit-code { (i.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".into())) }
                dt { "Generation" } dd { (i.generation) }
                @if let Some(t) = i.started_at { dt { "Started" } dd { (when(t)) } }
                @if let Some(t) = i.finished_at { dt { "Finished" } dd { (when(t)) } }
                @if let Some(reason) = &i.reason { dt { "Reason" } dd { (reason) } }
                @if let Some(pull) = &i.pull { dt { "Image" } dd { (pull.summary()) } }
                @if let Some(digest) = &i.image_digest { dt { "Image digest" } dd { code { (short(digest)) } } }
                @if let Some(u) = &i.usage {
                    dt { "Uses" } dd { (format!("{:.2}", u.cpu_millis as f64 / 1000.0)) " cores, " (bytes(u.memory_bytes)) ", " (u.pids) " processes" }
                }
                @if !i.gpus.is_empty() { dt { "GPUs" } dd { (i.gpus.join(", ")) } }
                @for warning in &i.warnings { dt { "Warning" } dd { (warning) } }
            }
        } @else if ended.is_empty() {
            p.muted { "Its node does not report this instance (any more)." }
        }
        @if !ended.is_empty() {
            h2 { "Ended" }
            div.scroll {
                table #ended {
                    thead { tr { th { "State" } th { "Exit code" } th { "Reason" } th { "Finished" } } }
                    tbody {
                        @for f in &ended {
                            tr {
                                td { (badge(&format!("{:?}", f.state))) }
                                td { (f.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".into())) }
                                td { (f.reason.as_deref().unwrap_or("")) }
                                td { (when(f.finished_at)) }
                            }
                        }
                    }
                }
            }
        }
    })
}

/// The log panel under an instance's page: filled and followed by `kat.js`.
pub fn logs_panel(ns: &str, name: &str, id: &str) -> Markup {
    let page = Page::Instance {
        ns: ns.into(),
        name: name.into(),
        id: id.into(),
    };
    html! {
        section.logs {
            h2 { "Output" }
            label.follow { input #follow type="checkbox" checked; " follow" }
            pre #logs data-source={ (page.href()) "/logs" } aria-live="polite" {}
        }
    }
}
