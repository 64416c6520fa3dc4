//! The cluster's events, newest first.

use kat_api::wire::Event;
use kat_apiserver::service::{Result, Service};
use kat_leader::events::EventFilter;
use maud::{html, Markup};

use super::{badge, when};

/// Events on the events page.
const EVENTS: usize = 200;

pub async fn render(service: &Service) -> Result<Markup> {
    let mut events = service.events(&EventFilter::default(), EVENTS).await?;
    events.reverse();
    Ok(html! {
        h1 { "Events" }
        (table(&events))
    })
}

pub fn table(events: &[Event]) -> Markup {
    html! {
        div.scroll {
            table.events {
                thead { tr { th { "When" } th { "Type" } th { "Reason" } th { "Object" } th { "Message" } } }
                tbody {
                    @for e in events {
                        tr {
                            td { (when(e.timestamp)) }
                            td { (badge(&format!("{:?}", e.event_type))) }
                            td { (e.reason) }
                            td {
                                (e.involved_object.kind) " "
                                @if let Some(ns) = &e.involved_object.namespace { (ns) "/" }
                                (e.involved_object.name)
                            }
                            td { (e.message) }
                        }
                    }
                }
            }
        }
        @if events.is_empty() { p.muted { "No events." } }
    }
}
