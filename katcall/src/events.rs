//! `events [--watch]`.

use anyhow::Result;
use kat_api::wire::Event;
use kat_client::admin::EventQuery;

use crate::client::Client;
use crate::output::{structured, table, Format};

pub struct Filter {
    pub namespace: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
}

fn row(e: &Event) -> Vec<String> {
    let o = &e.involved_object;
    let object = match &o.namespace {
        Some(ns) => format!("{}/{ns}/{}", o.kind, o.name),
        None => format!("{}/{}", o.kind, o.name),
    };
    vec![
        e.timestamp.to_string(),
        format!("{:?}", e.event_type),
        e.reason.clone(),
        object,
        e.message.clone(),
    ]
}

const HEADER: [&str; 5] = ["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"];

pub async fn run(client: &Client, filter: Filter, watch: bool, format: Format) -> Result<()> {
    let query = EventQuery {
        namespace: filter.namespace,
        resource_type: filter.kind,
        resource_name: filter.name,
        limit: None,
    };
    if !watch {
        let events = client.events(&query).await?;
        if !structured(format, &events)? {
            let rows: Vec<Vec<String>> = events.iter().map(row).collect();
            print!("{}", table(&HEADER, &rows));
        }
        return Ok(());
    }
    let resp = client.watch_events(&query).await?;
    if matches!(format, Format::Table | Format::Wide) {
        println!("{}", HEADER.join("  "));
    }
    Client::json_lines(resp, |e: Event| {
        match format {
            Format::Json => println!("{}", serde_json::to_string(&e)?),
            Format::Yaml => print!("---\n{}", yaml_serde::to_string(&e)?),
            _ => println!("{}", row(&e).join("  ")),
        }
        Ok(())
    })
    .await
}
