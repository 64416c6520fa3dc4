//! `/v1alpha1/nodes`: read, heartbeat, taints, labels, drain.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Request, State};
use axum::response::IntoResponse;
use axum::Json;
use kat_api::keys;
use kat_api::wire::{Node, NodeHeartbeat, NodeRegistration, NodeState, ObjectMeta, Taint};
use kat_store::StateStore;
use serde::de::DeserializeOwned;

use super::{read_body, ApiError, ApiState};
use crate::node_admin;

const MAX_BODY: u64 = 1 << 20;

/// The API's view of a node: registration, last heartbeat, and a state from the heartbeat's age.
pub fn node_object(
    reg: Option<NodeRegistration>,
    hb: Option<NodeHeartbeat>,
    name: &str,
    node_loss_timeout: Duration,
    now: SystemTime,
) -> Node {
    let fresh = hb.as_ref().is_some_and(|hb| {
        humantime::parse_rfc3339(&hb.timestamp)
            .ok()
            .and_then(|t| now.duration_since(t).ok().or(Some(Duration::ZERO)))
            .is_some_and(|age| age <= node_loss_timeout)
    });
    let draining = reg.as_ref().is_some_and(|r| r.draining);
    let state = match (fresh, draining) {
        (false, _) => NodeState::NotReady,
        (true, true) => NodeState::Draining,
        (true, false) => NodeState::Ready,
    };
    let reg = reg.unwrap_or(NodeRegistration {
        name: name.into(),
        addresses: vec![],
        labels: BTreeMap::new(),
        taints: vec![],
        draining: false,
    });
    Node {
        metadata: ObjectMeta {
            name: name.into(),
            labels: reg.labels,
            ..Default::default()
        },
        state,
        addresses: reg.addresses,
        capacity: hb.as_ref().map(|h| h.capacity).unwrap_or_default(),
        allocatable: hb.as_ref().map(|h| h.allocatable).unwrap_or_default(),
        gpus: hb.as_ref().map(|h| h.gpus.clone()).unwrap_or_default(),
        taints: reg.taints,
        last_heartbeat: hb.map(|h| h.timestamp),
    }
}

async fn all_nodes(state: &ApiState) -> Result<BTreeMap<String, Node>, ApiError> {
    let store: &dyn StateStore = &*state.store;
    let regs = store.list(keys::node_registrations()).await?;
    let hbs = store.list(keys::node_statuses()).await?;
    let mut parts: BTreeMap<String, (Option<NodeRegistration>, Option<NodeHeartbeat>)> =
        BTreeMap::new();
    for kv in &regs.kvs {
        let name = kv.key[keys::node_registrations().len()..].to_string();
        parts.entry(name).or_default().0 = serde_json::from_slice(&kv.value).ok();
    }
    for kv in &hbs.kvs {
        let name = kv.key[keys::node_statuses().len()..].to_string();
        parts.entry(name).or_default().1 = serde_json::from_slice(&kv.value).ok();
    }
    let timeout = Duration::from_secs(state.cluster.spec.node_loss_timeout_seconds as u64);
    let now = state.clock.wall();
    Ok(parts
        .into_iter()
        .map(|(name, (reg, hb))| {
            let node = node_object(reg, hb, &name, timeout, now);
            (name, node)
        })
        .collect())
}

pub async fn list(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(
        all_nodes(&state).await?.into_values().collect::<Vec<_>>(),
    ))
}

pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    all_nodes(&state)
        .await?
        .remove(&name)
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!("node {name} not found (see `katcall get nodes`)"))
        })
}

async fn json_body<T: DeserializeOwned>(req: Request, what: &str) -> Result<T, ApiError> {
    let body = read_body(req, MAX_BODY).await?;
    serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// Write a node's heartbeat (agents on other nodes; the local agent writes directly).
pub async fn heartbeat(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let hb: NodeHeartbeat = json_body(req, "heartbeat body").await?;
    if hb.node != name {
        return Err(ApiError::bad_request(format!(
            "heartbeat body: node: is {:?} but the path names node {name:?}",
            hb.node
        )));
    }
    state
        .store
        .put(
            &keys::node_status(&name),
            serde_json::to_vec(&hb).unwrap_or_default(),
            None,
        )
        .await?;
    Ok(Json(serde_json::json!({"accepted": true})))
}

pub async fn set_taints(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let taints: Vec<Taint> =
        json_body(req, "taints body (a JSON list of {key, value, effect})").await?;
    let reg =
        node_admin::set_taints(&*state.store, &state.events, &state.clock, &name, taints).await?;
    Ok(Json(reg))
}

/// Body: `{"label": "value", "gone": null}`; null removes a label.
pub async fn set_labels(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let changes: BTreeMap<String, Option<String>> =
        json_body(req, "labels body (a JSON object of label to value or null)").await?;
    let reg =
        node_admin::set_labels(&*state.store, &state.events, &state.clock, &name, changes).await?;
    Ok(Json(reg))
}

pub async fn drain(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(
        node_admin::drain(&*state.store, &state.events, &state.clock, &name).await?,
    ))
}

pub async fn uncordon(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(
        node_admin::uncordon(&*state.store, &state.events, &state.clock, &name).await?,
    ))
}
