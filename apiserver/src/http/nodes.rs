//! `/v1alpha1/nodes`: read, heartbeat, taints, labels, drain.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::IntoResponse;
use axum::Json;
use kat_api::wire::{NodeHeartbeat, Taint};

use super::{json_body, ApiError, ApiState};

const MAX_BODY: u64 = 1 << 20;

pub async fn list(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(
        state
            .service
            .nodes()
            .await?
            .into_values()
            .collect::<Vec<_>>(),
    ))
}

pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.node(&name).await?))
}

/// Write a node's heartbeat (agents on other nodes; the local agent writes directly).
pub async fn heartbeat(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let hb: NodeHeartbeat = json_body(req, MAX_BODY, "heartbeat body").await?;
    state.service.record_heartbeat(&name, hb).await?;
    Ok(Json(serde_json::json!({"accepted": true})))
}

pub async fn set_taints(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let taints: Vec<Taint> = json_body(
        req,
        MAX_BODY,
        "taints body (a JSON list of {key, value, effect})",
    )
    .await?;
    let reg = state.service.set_node_taints(&name, taints).await?;
    Ok(Json(reg))
}

/// Body: `{"label": "value", "gone": null}`; null removes a label.
pub async fn set_labels(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let changes: BTreeMap<String, Option<String>> = json_body(
        req,
        MAX_BODY,
        "labels body (a JSON object of label to value or null)",
    )
    .await?;
    let reg = state.service.set_node_labels(&name, changes).await?;
    Ok(Json(reg))
}

pub async fn drain(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.drain_node(&name).await?))
}

pub async fn uncordon(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.uncordon_node(&name).await?))
}

/// Remove a node from the cluster (`katcall delete node`).
pub async fn remove(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.remove_node(&name).await?;
    Ok(Json(serde_json::json!({"deleted": name})))
}
