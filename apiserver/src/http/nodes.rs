//! `/v1alpha1/nodes`: read, heartbeat, taints, labels, drain.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kat_api::wire::{
    AssignmentUpdate, NodeHeartbeat, Taint, TemplateProblem, WireguardKey, REVISION_HEADER,
};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{json_body, ndjson_body, ApiError, ApiState};
use kat_api::node_limits::CHANGE_WAIT_MAX;

const MAX_BODY: u64 = 1 << 20;
/// A heartbeat with hundreds of instances is tens of KiB.
const HEARTBEAT_BODY: u64 = 256 << 10;

/// Every node: state, role, whether it leads, resources, taints, labels, GPUs.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes",
        tag = "nodes",
        responses((status = 200, description = "Every node", body = [kat_api::wire::Node]), super::openapi::Errors)
    )
)]
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

/// One node.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes/{name}",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "The node", body = kat_api::wire::Node), super::openapi::Errors)
    )
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.node(&name).await?))
}

/// A worker's heartbeat (control-plane agents write theirs to etcd directly); the answer
/// lists the control plane's API endpoints.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/status",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = kat_api::wire::NodeHeartbeat),
        responses((status = 200, description = "Accepted; the control plane's endpoints", body = kat_api::wire::HeartbeatAnswer), super::openapi::Errors)
    )
)]
pub async fn heartbeat(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let hb: NodeHeartbeat = json_body(req, HEARTBEAT_BODY, "heartbeat body").await?;
    Ok(Json(state.service.worker_heartbeat(&name, hb).await?))
}

/// `kat-agent rejoin`: a control-plane node's etcd member back into a restored cluster.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/etcd-member",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "The etcd membership to take up", body = kat_api::wire::EtcdMembership), super::openapi::Errors)
    )
)]
pub async fn readmit_etcd_member(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let role = super::client_node(&req).map(|(_, role)| role);
    Ok(Json(state.service.readmit_etcd_member(&name, role).await?))
}

/// A worker's WireGuard public key.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/wireguard",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = kat_api::wire::WireguardKey),
        responses((status = 200, description = "Accepted", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn set_wireguard_key(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let key: WireguardKey = json_body(req, 4096, "wireguard body ({publicKey})").await?;
    state.service.set_wireguard_key(&name, key).await?;
    Ok(Json(serde_json::json!({"accepted": true})))
}

/// The overlay's peers, for a worker.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes/{name}/peers",
        tag = "node-agent",
        params(
            ("name" = String, Path, description = "Node name"),
            ("after" = Option<i64>, Query, description = "The `kat-revision` of an earlier answer: answer once the peers may have changed since"),
            ("wait" = Option<u64>, Query, description = "With `after`: seconds to wait at most (1 to 30, default 30)"),
        ),
        responses((status = 200, description = "The overlay's peers; the header `kat-revision` says the store revision they were read at", body = [kat_api::wire::OverlayPeer]), super::openapi::Errors)
    )
)]
pub async fn overlay_peers(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let after = change_wait(query)?;
    let (peers, revision) = state.service.overlay_peers(&name, after).await?;
    Ok(([(REVISION_HEADER, revision.to_string())], Json(peers)))
}

/// The cluster's DNS records, for a worker's DNS server.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes/{name}/dns",
        tag = "node-agent",
        params(
            ("name" = String, Path, description = "Node name"),
            ("after" = Option<i64>, Query, description = "The `kat-revision` of an earlier answer: answer once the records may have changed since"),
            ("wait" = Option<u64>, Query, description = "With `after`: seconds to wait at most (1 to 30, default 30)"),
        ),
        responses((status = 200, description = "Every DNS record; the header `kat-revision` says the store revision they were read at", body = [kat_api::wire::DnsRecord]), super::openapi::Errors)
    )
)]
pub async fn dns_records(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let after = change_wait(query)?;
    let (records, revision) = state.service.dns_records(&name, after).await?;
    Ok(([(REVISION_HEADER, revision.to_string())], Json(records)))
}

/// A worker's read that waits for a change (a long poll), instead of reading on a clock.
/// Kept as text so that a bad value is refused naming its parameter.
#[derive(Debug, Deserialize)]
pub struct ChangeQuery {
    /// The store revision of the node's last answer (its `kat-revision` header).
    after: Option<String>,
    /// Seconds to wait at most for a change after it.
    wait: Option<String>,
}

/// The revision to wait for a change after, and for how long, from a [`ChangeQuery`].
fn change_wait(
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Option<(i64, Duration)>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))?;
    let max = CHANGE_WAIT_MAX.as_secs();
    let Some(after) = query.after else {
        return match query.wait {
            None => Ok(None),
            Some(_) => Err(ApiError::bad_request(
                "wait: only with after=REVISION (the kat-revision header of an earlier answer)",
            )),
        };
    };
    let after = after.parse::<i64>().ok().filter(|r| *r >= 0).ok_or_else(|| {
        ApiError::bad_request(format!(
            "after: a store revision (0 or more: the kat-revision header of an earlier answer), not {after:?}"
        ))
    })?;
    let wait = match query.wait {
        None => max,
        Some(wait) => wait
            .parse::<u64>()
            .ok()
            .filter(|w| (1..=max).contains(w))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "wait: seconds to wait for a change, 1 to {max}, not {wait:?}"
                ))
            })?,
    };
    Ok(Some((after, Duration::from_secs(wait))))
}

#[derive(Debug, Deserialize)]
pub struct AssignmentQuery {
    /// The last revision the node has seen: the stream resumes after it.
    resume: Option<i64>,
}

/// How often an idle assignment stream says it is alive (and checks it still leads).
const KEEPALIVE: Duration = Duration::from_secs(5);

/// A node's assignments as JSON lines ([`kat_api::wire::AssignmentUpdate`]), for as long as
/// the client reads and this node leads.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes/{name}/assignments",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "JSON lines of AssignmentUpdate", content_type = "application/x-ndjson", body = kat_api::wire::AssignmentUpdate), super::openapi::Errors)
    )
)]
pub async fn assignments(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    query: Result<Query<AssignmentQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("resume: {}", e.body_text())))?;
    let mut watch = state.service.assignments(&name, query.resume).await?;
    // One stream per node: a newer one ends this one at its next keepalive.
    let number = state.service.node_limits.open_stream(&name);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                update = watch.next() => match update {
                    Some(Ok(update)) => {
                        if tx.send(update).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(node = %name, error = %e, "assignment stream ended");
                        return;
                    }
                    None => return,
                },
                () = tokio::time::sleep(KEEPALIVE) => {
                    if !state.service.node_limits.stream_current(&name, number)
                        || state.service.require_leader().await.is_err()
                        || tx.send(AssignmentUpdate::Keepalive).await.is_err()
                    {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson_body(rx))
}

/// The template an instance of the node runs, as stored (the node checks its hash).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/nodes/{name}/templates/{ns}/{workload}/{hash}",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name"), ("ns" = String, Path, description = "Namespace"), ("workload" = String, Path, description = "Workload name"), ("hash" = String, Path, description = "Template hash")),
        responses((status = 200, description = "The typed template, as stored", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn template(
    State(state): State<Arc<ApiState>>,
    Path((name, ns, workload, hash)): Path<(String, String, String, String)>,
) -> Result<Response, ApiError> {
    let body = state
        .service
        .template_for_node(&name, &ns, &workload, &hash)
        .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Instances of the node whose template is unusable: each becomes a `TemplateMissing` event.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/template-problems",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = [kat_api::wire::TemplateProblem]),
        responses((status = 200, description = "Accepted", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn template_problems(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let problems: Vec<TemplateProblem> = json_body(
        req,
        MAX_BODY,
        "template problems body (a JSON list of {instanceID, reason})",
    )
    .await?;
    state.service.template_problems(&name, problems).await?;
    Ok(Json(serde_json::json!({"accepted": true})))
}

/// Replace a node's taints (`katcall taint`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        put,
        path = "/v1alpha1/nodes/{name}/taints",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = [kat_api::wire::Taint]),
        responses((status = 200, description = "The node's registration", body = kat_api::wire::NodeRegistration), super::openapi::Errors)
    )
)]
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
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        put,
        path = "/v1alpha1/nodes/{name}/labels",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = serde_json::Value, description = "`{\"label\": \"value\", \"gone\": null}`"),
        responses((status = 200, description = "The node's registration", body = kat_api::wire::NodeRegistration), super::openapi::Errors)
    )
)]
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

/// Drain a node: no new instances, its instances move (`katcall drain`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/drain",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "The node's registration", body = kat_api::wire::NodeRegistration), super::openapi::Errors)
    )
)]
pub async fn drain(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.drain_node(&name).await?))
}

/// Approve a capacity the scheduler may use on a node (`katcall approve node NAME
/// --capacity` sends what the node claimed when the administrator looked). The body is the
/// capacity approved, exactly: a claim raised since is not approved with it.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/approve-capacity",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        request_body(content = kat_api::wire::ApprovedCapacity),
        responses((status = 200, description = "The node's registration, with its approved capacity", body = kat_api::wire::NodeRegistration), super::openapi::Errors)
    )
)]
pub async fn approve_capacity(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let approved: kat_api::wire::ApprovedCapacity = json_body(
        req,
        MAX_BODY,
        "approved capacity (JSON {allocatable: {cpu, memory, pids}, gpus: [...]}, as the node reports them)",
    )
    .await?;
    Ok(Json(
        state.service.approve_node_capacity(&name, approved).await?,
    ))
}

/// Let a drained node take instances again (`katcall uncordon`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/uncordon",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "The node's registration", body = kat_api::wire::NodeRegistration), super::openapi::Errors)
    )
)]
pub async fn uncordon(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.uncordon_node(&name).await?))
}

/// Remove a node from the cluster (`katcall delete node`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/nodes/{name}",
        tag = "nodes",
        params(("name" = String, Path, description = "Node name")),
        responses((status = 200, description = "`{\"deleted\": NAME}`", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn remove(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.remove_node(&name).await?;
    Ok(Json(serde_json::json!({"deleted": name})))
}
