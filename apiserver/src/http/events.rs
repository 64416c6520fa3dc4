//! `/v1alpha1/events`, `/v1alpha1/backups`, `/v1alpha1/config/cluster` and `/metrics`.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kat_leader::events::EventFilter;
use serde::Deserialize;

use super::{ApiError, ApiState};

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

/// The cluster's events (`katcall events`), filtered; with `watch` a stream.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/events",
        tag = "events",
        params(("resourceType" = Option<String>, Query, description = "Workload, Node, Namespace…"), ("resourceName" = Option<String>, Query, description = "Its name"), ("namespace" = Option<String>, Query, description = "Namespace"), ("limit" = Option<usize>, Query, description = "Newest events (default 100)"), ("watch" = Option<bool>, Query, description = "Stream new events as JSON lines")),
        responses((status = 200, description = "Events, newest last; with watch: JSON lines", body = [kat_api::wire::Event]), super::openapi::Errors)
    )
)]
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
    let limit = q.limit.unwrap_or(100);
    if q.watch {
        let rx = state.service.watch_events(filter, limit).await?;
        Ok(super::ndjson_body(rx))
    } else {
        Ok(Json(state.service.events(&filter, limit).await?).into_response())
    }
}

/// The cluster configuration (`cluster.kat`, no secrets in it).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/config/cluster",
        tag = "cluster",
        responses((status = 200, description = "cluster.kat, parsed", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn cluster_config(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    // cluster.kat holds no secrets; the token and keys live elsewhere.
    Json(state.service.cluster.clone())
}

/// Prometheus metrics: every node's heartbeat, the API's requests.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/metrics",
        tag = "cluster",
        responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String), super::openapi::Errors)
    )
)]
pub async fn metrics(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    let heartbeats = state.service.heartbeats().await?;
    Ok((
        [(header::CONTENT_TYPE, kat_leader::metrics::CONTENT_TYPE)],
        state.metrics.render(&heartbeats),
    ))
}

/// The etcd snapshots taken (`katcall get backups`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/backups",
        tag = "backups",
        responses((status = 200, description = "Snapshots taken", body = [kat_api::wire::BackupRecord]), super::openapi::Errors)
    )
)]
pub async fn backups(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.backups().await?))
}

/// Take an etcd snapshot now (`katcall backup`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/backups",
        tag = "backups",
        responses((status = 201, description = "The snapshot", body = kat_api::wire::BackupRecord), super::openapi::Errors)
    )
)]
pub async fn create_backup(
    State(state): State<Arc<ApiState>>,
) -> Result<impl IntoResponse, ApiError> {
    Ok((
        axum::http::StatusCode::CREATED,
        Json(state.service.create_backup().await?),
    ))
}
