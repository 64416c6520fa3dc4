//! A namespace's workloads: type, instances ready of desired, generation, rollout.

use axum::http::Method;
use kat_api::wire::WorkloadObject;
use kat_apiserver::service::{Result, Service};
use maud::{html, Markup};

use super::badge;
use crate::pages::Page;
use crate::session::Session;

pub async fn render(service: &Service, session: &Session, ns: &str) -> Result<Markup> {
    let workloads = service.workloads(ns).await?;
    // The namespaces this session may open, to switch between them.
    let namespaces: Vec<String> = if session.credential.may(
        &Method::GET,
        kat_api::routes::Route::ListNamespaces.template(),
    ) {
        service
            .namespaces()
            .await?
            .into_iter()
            .map(|n| n.metadata.name)
            .collect()
    } else {
        vec![ns.to_string()]
    };
    Ok(html! {
        h1 { "Workloads" }
        nav.namespaces aria-label="Namespaces" {
            @for other in &namespaces {
                a href=(Page::Workloads { ns: other.clone() }.href())
                    aria-current=[(other == ns).then_some("page")] { (other) }
            }
        }
        div.scroll {
            table #workloads {
                thead { tr {
                    th { "Name" } th { "Type" } th { "Ready" } th { "Generation" } th { "Rollout" }
                } }
                tbody {
                    @for w in &workloads { (row(ns, w)) }
                }
            }
        }
        @if workloads.is_empty() {
            p.muted { "No workloads in " (ns) ". " code { "katcall apply -f DIR" } " makes one." }
        }
    })
}

fn row(ns: &str, w: &WorkloadObject) -> Markup {
    let name = &w.metadata.name;
    let s = &w.status;
    let page = Page::Workload {
        ns: ns.to_string(),
        name: name.clone(),
    };
    html! {
        tr data-workload=(name) {
            td { a href=(page.href()) { (name) } }
            td { (format!("{:?}", w.workload_type)) }
            td.ready { (s.replicas_ready) "/" (s.replicas_desired) }
            td { (w.metadata.generation) }
            td { (rollout(w)) }
        }
    }
}

/// Where a workload's rollout is: `complete`, `3 of 4 updated`, or stalled with why.
pub fn rollout(w: &WorkloadObject) -> Markup {
    match &w.status.rollout {
        Some(r) if r.stalled => html! {
            (badge("stalled")) " " (r.message.as_deref().unwrap_or(""))
        },
        Some(r) => html! {
            (badge(&format!("{} of {} updated", r.updated, r.total)))
        },
        None if w.status.observed_generation < w.metadata.generation => {
            html! { (badge("pending")) }
        }
        None => html! { (badge("complete")) },
    }
}
