//! `/v1alpha1/events`, `/v1alpha1/config/cluster` and `/metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kat_api::keys;
use kat_api::wire::{Event, NodeHeartbeat};
use serde::Deserialize;

use super::{ApiError, ApiState};
use crate::events::{self, EventFilter};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventsQuery {
    resource_type: Option<String>,
    resource_name: Option<String>,
    namespace: Option<String>,
    /// Newest events to return (default 100).
    limit: Option<usize>,
    /// Keep the response open and stream new events as JSON lines.
    #[serde(default)]
    watch: bool,
}

pub async fn list(
    State(state): State<Arc<ApiState>>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{e} (expected resourceType, resourceName, namespace, limit, watch)"
        ))
    })?;
    let filter = EventFilter {
        resource_type: q.resource_type,
        name: q.resource_name,
        namespace: q.namespace,
    };
    let listing = state.store.list(keys::EVENTS).await?;
    // Keys sort by time; readers never see more than the cap (see `crate::events`).
    let mut kvs: Vec<_> = listing.kvs.iter().collect();
    kvs.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let newest = kvs.len().saturating_sub(state.events.capacity() as usize);
    let mut matching: Vec<Event> = kvs[newest..]
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Event>(&kv.value).ok())
        .filter(|e| filter.matches(e))
        .collect();
    let limit = q.limit.unwrap_or(100);
    if matching.len() > limit {
        matching.drain(..matching.len() - limit);
    }
    if !q.watch {
        return Ok(Json(matching).into_response());
    }
    // The backlog first, then what is written from now on, through one channel.
    let mut live = events::watch(&*state.store, filter, listing.revision + 1).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for event in matching {
            if tx.send(event).await.is_err() {
                return;
            }
        }
        while let Some(event) = live.recv().await {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    Ok(super::ndjson_body(rx))
}

pub async fn cluster_config(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    // cluster.kat holds no secrets; the token and keys live elsewhere.
    Json(state.cluster.clone())
}

pub async fn metrics(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for kv in state.store.list(keys::node_statuses()).await?.kvs {
        if let Ok(hb) = serde_json::from_slice::<NodeHeartbeat>(&kv.value) {
            for i in hb.instances {
                *counts.entry(format!("{:?}", i.state)).or_default() += 1;
            }
        }
    }
    Ok((
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.render(&counts),
    ))
}
