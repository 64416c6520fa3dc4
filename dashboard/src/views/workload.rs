//! One workload: what its spec says, its instances, its events and its revisions, with a
//! rollback button for a session whose token may roll back.

use std::collections::BTreeMap;

use axum::http::Method;
use kat_api::keys;
use kat_api::wire::{InstanceStatus, WorkloadMeta, WorkloadObject};
use kat_api::WorkloadKey;
use kat_apiserver::service::{Result, Service};
use kat_leader::desired::workloads::{archived, ARCHIVED_COMMIT};
use kat_leader::events::EventFilter;
use kat_store::JsonStore;
use maud::{html, Markup};

use super::{badge, short, when};
use crate::pages::Page;
use crate::session::Session;

/// Events shown on a workload's page.
const EVENTS: usize = 20;

pub async fn render(service: &Service, session: &Session, ns: &str, name: &str) -> Result<Markup> {
    let key = WorkloadKey::new(ns, name);
    let w = service.workload(&key).await?;
    let meta = service
        .store
        .get_json::<WorkloadMeta>(&keys::workload_meta(ns, name))
        .await?
        .map(|(m, _)| m);
    let revisions = archived(&*service.store, ns, name)
        .await
        .map_err(kat_apiserver::service::Error::from)?;
    let filter = EventFilter {
        resource_type: Some("Workload".into()),
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
    };
    // The API gives events to tokens that may read them all: a namespace's token gets none.
    let may_read_events = session
        .credential
        .may(&Method::GET, kat_api::routes::Route::Events.template());
    let mut events = if may_read_events {
        service.events(&filter, EVENTS).await?
    } else {
        Vec::new()
    };
    events.reverse();
    let rollback_path = kat_api::routes::Route::Rollback.path(&[ns, name]);
    let may_roll_back = session.credential.may(&Method::POST, &rollback_path);
    let earlier = revisions.keys().any(|g| *g < w.metadata.generation);
    Ok(html! {
        h1 { (name) " " span.muted { (ns) } }
        (summary(&w, meta.as_ref()))
        h2 { "Instances" }
        (instances(ns, name, &w))
        h2 { "Revisions" }
        (history(&w, &revisions))
        @if may_roll_back && earlier {
            form.actions method="post" action={ (Page::Workload { ns: ns.into(), name: name.into() }.href()) "/rollback" } {
                input type="hidden" name="csrf" value=(session.csrf);
                button #rollback type="submit" { "Roll back to the previous spec" }
            }
        }
        @if may_read_events {
            h2 { "Events" }
            (super::events::table(&events))
        }
    })
}

fn summary(w: &WorkloadObject, meta: Option<&WorkloadMeta>) -> Markup {
    let spec = meta.and_then(|m| m.desired.as_ref());
    let s = &w.status;
    html! {
        dl.summary {
            dt { "Type" } dd { (format!("{:?}", w.workload_type)) }
            dt { "Ready" } dd #ready { (s.replicas_ready) " of " (s.replicas_desired) }
            dt { "Generation" } dd #generation { (w.metadata.generation) }
            dt { "Rollout" } dd #rollout { (super::workloads::rollout(w)) }
            @if let Some(spec) = spec {
                @if let Some(image) = &spec.workload.spec.source.image {
                    dt { "Image" } dd #image { code { (image) } }
                }
                dt { "Restart" } dd { (format!("{:?}", spec.workload.spec.restart_policy.condition)) }
                @if let Some(u) = &spec.workload.spec.update_strategy {
                    dt { "Updates" } dd { (format!("{:?}", u.strategy_type)) }
                }
            }
            @if let Some(commit) = &w.commit {
                dt { "Commit" } dd { code { (short(commit)) } }
            }
            @if let Some(message) = &s.message {
                dt { "Message" } dd { (message) }
            }
        }
        @if let Some(spec) = spec {
            details {
                summary { "Effective spec" }
                pre.spec { (yaml_serde::to_string(spec).unwrap_or_default()) }
            }
        }
        @for build in &s.builds {
            p.build { (badge(&format!("{:?}", build.state))) " build of " code { (short(&build.commit)) } ": " (build.message) }
        }
    }
}

fn instances(ns: &str, name: &str, w: &WorkloadObject) -> Markup {
    html! {
        div.scroll {
            table #instances {
                thead { tr {
                    th { "Instance" } th { "State" } th { "Health" } th { "Node" } th { "IP" }
                    th { "Restarts" } th { "Started" } th { "Spec" }
                } }
                tbody {
                    @for i in &w.status.instances { (instance_row(ns, name, w, i)) }
                }
            }
        }
        @if w.status.instances.is_empty() {
            p.muted { "No instances." }
        }
    }
}

fn instance_row(ns: &str, name: &str, w: &WorkloadObject, i: &InstanceStatus) -> Markup {
    let page = Page::Instance {
        ns: ns.into(),
        name: name.into(),
        id: i.instance_id.to_string(),
    };
    let current = i.template_hash.as_deref() == Some(w.template_hash.as_str());
    html! {
        tr data-instance=(i.instance_id) {
            td { a href=(page.href()) { (i.instance_id) } }
            td {
                (badge(&format!("{:?}", i.state)))
                @if let Some(pull) = &i.pull { br; span.muted { (pull.summary()) } }
                @else if let Some(reason) = &i.reason { br; span.muted { (reason) } }
            }
            td { (badge(&format!("{:?}", i.health))) }
            td { (i.node.as_ref().map(|n| n.to_string()).unwrap_or_default()) }
            td { (i.ip.map(|ip| ip.to_string()).unwrap_or_default()) }
            td { (i.restarts) @if let Some(code) = i.exit_code { " (exit " (code) ")" } }
            td { @if let Some(t) = i.started_at { (when(t)) } }
            td { @if current { "current" } @else { span.muted { "old" } } }
        }
    }
}

fn history(w: &WorkloadObject, revisions: &BTreeMap<u64, BTreeMap<String, Vec<u8>>>) -> Markup {
    html! {
        div.scroll {
            table #revisions {
                thead { tr { th { "Generation" } th { "Image" } th { "Commit" } th { "Files" } } }
                tbody {
                    @for (generation, files) in revisions.iter().rev() {
                        tr {
                            td {
                                (generation)
                                @if *generation == w.metadata.generation { " " span.badge.good { "current" } }
                            }
                            td { @if let Some(image) = archived_image(files) { code { (image) } } }
                            td { @if let Some(c) = files.get(ARCHIVED_COMMIT) { code { (short(&String::from_utf8_lossy(c))) } } }
                            td.muted { (files.keys().filter(|f| *f != ARCHIVED_COMMIT).cloned().collect::<Vec<_>>().join(", ")) }
                        }
                    }
                }
            }
        }
    }
}

/// The image an archived generation's `workload.kat` names, read for display only (the
/// archive was validated when it was applied).
fn archived_image(files: &BTreeMap<String, Vec<u8>>) -> Option<String> {
    let doc: serde_json::Value = yaml_serde::from_slice(files.get("workload.kat")?).ok()?;
    Some(doc.pointer("/spec/source/image")?.as_str()?.to_string())
}
