//! `events [--watch]`.

use anyhow::Result;
use kat_api::wire::Event;
use reqwest::Method;

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
        e.timestamp.clone(),
        format!("{:?}", e.event_type),
        e.reason.clone(),
        object,
        e.message.clone(),
    ]
}

const HEADER: [&str; 5] = ["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"];

pub async fn run(client: &Client, filter: Filter, watch: bool, format: Format) -> Result<()> {
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(ns) = filter.namespace {
        query.push(("namespace", ns));
    }
    if let Some(k) = filter.kind {
        query.push(("resourceType", k));
    }
    if let Some(n) = filter.name {
        query.push(("resourceName", n));
    }
    if !watch {
        let events: Vec<Event> = crate::workloads::json(
            client
                .send(client.request(Method::GET, "/events").query(&query))
                .await?,
        )
        .await?;
        if !structured(format, &events)? {
            let rows: Vec<Vec<String>> = events.iter().map(row).collect();
            print!("{}", table(&HEADER, &rows));
        }
        return Ok(());
    }
    query.push(("watch", "true".into()));
    let resp = client
        .send(client.request(Method::GET, "/events").query(&query))
        .await?;
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
