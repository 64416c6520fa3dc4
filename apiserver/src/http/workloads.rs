//! `/v1alpha1/n/{ns}/workloads`: bundles in, metadata and status out; and the instances
//! nodes report (`/v1alpha1/n/{ns}/instances`, `/v1alpha1/instances`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kat_api::WorkloadKey;
use serde::Deserialize;

use super::{read_body, ApiError, ApiState};

pub async fn list(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.workloads(&ns).await?))
}

pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(
        state.service.workload(&WorkloadKey::new(ns, name)).await?,
    ))
}

async fn bundle_body(state: &ApiState, req: Request) -> Result<Vec<u8>, ApiError> {
    let limit = state.service.bundle_limits.max_compressed_bytes;
    Ok(read_body(req, limit).await?.to_vec())
}

/// `?dryRun=true` on a create or an update: check everything and say what would change,
/// store nothing (`katcall diff`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplyQuery {
    #[serde(default)]
    dry_run: bool,
}

fn apply_query(query: Result<Query<ApplyQuery>, QueryRejection>) -> Result<ApplyQuery, ApiError> {
    let Query(q) =
        query.map_err(|e| ApiError::bad_request(format!("{e} (expected dryRun=true or false)")))?;
    Ok(q)
}

pub async fn create(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
    query: Result<Query<ApplyQuery>, QueryRejection>,
    req: Request,
) -> Result<Response, ApiError> {
    let query = apply_query(query)?;
    let body = bundle_body(&state, req).await?;
    if query.dry_run {
        let preview = state.service.preview_workload(&ns, None, body).await?;
        return Ok(Json(preview).into_response());
    }
    let created = state.service.create_workload(&ns, body).await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// A workload a rejoining node created while detached (its node certificate, its own path).
pub async fn submit_pinned(
    State(state): State<Arc<ApiState>>,
    Path((node, ns)): Path<(String, String)>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let body = bundle_body(&state, req).await?;
    let answer = state
        .service
        .accept_pinned_workload(&node, &ns, body)
        .await?;
    let status = match answer.created {
        true => StatusCode::CREATED,
        false => StatusCode::OK,
    };
    Ok((status, Json(answer)))
}

pub async fn update(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
    query: Result<Query<ApplyQuery>, QueryRejection>,
    req: Request,
) -> Result<Response, ApiError> {
    let query = apply_query(query)?;
    let body = bundle_body(&state, req).await?;
    if query.dry_run {
        let preview = state
            .service
            .preview_workload(&ns, Some(&name), body)
            .await?;
        return Ok(Json(preview).into_response());
    }
    let key = WorkloadKey::new(ns, name);
    Ok(Json(state.service.update_workload(&key, body).await?).into_response())
}

pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    state.service.delete_workload(&key).await?;
    Ok(Json(serde_json::json!({"deleted": key})))
}

pub async fn rollback(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    Ok(Json(state.service.rollback_workload(&key).await?))
}

pub async fn redeploy(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    Ok(Json(state.service.redeploy_workload(&key).await?))
}

pub async fn create_webhook(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    Ok((
        StatusCode::CREATED,
        Json(state.service.create_webhook(&key).await?),
    ))
}

pub async fn delete_webhook(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    state.service.delete_webhook(&key).await?;
    Ok(Json(
        serde_json::json!({"deleted": format!("webhook of {key}")}),
    ))
}

/// The most a push notification may carry: read before it is authenticated, so small (a
/// push's payload is a few KiB; one of very many commits is cut short by the git server,
/// and what KAT reads of it is one field).
const HOOK_BODY_LIMIT: u64 = 5 << 20;

pub async fn push_hook(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    let signature = [
        "x-hub-signature-256",
        "x-gitea-signature",
        "x-gogs-signature",
    ]
    .iter()
    .find_map(|h| req.headers().get(*h))
    .and_then(|v| v.to_str().ok())
    .map(str::to_string);
    // The git server's name for this delivery (not signed: for messages only).
    let delivery = [
        "x-github-delivery",
        "x-gitea-delivery",
        "x-gogs-delivery",
        "x-gitlab-event-uuid",
    ]
    .iter()
    .find_map(|h| req.headers().get(*h))
    .and_then(|v| v.to_str().ok())
    .map(|v| v.chars().take(100).collect::<String>());
    let body = read_body(req, HOOK_BODY_LIMIT).await?;
    Ok(Json(
        state
            .service
            .push_hook(&key, signature.as_deref(), delivery.as_deref(), &body)
            .await?,
    ))
}

pub async fn file(
    State(state): State<Arc<ApiState>>,
    Path((ns, name, file)): Path<(String, String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    let bytes = state.service.workload_file(&key, &file).await?;
    Ok(([(header::CONTENT_TYPE, "application/yaml")], bytes))
}

pub async fn instances(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.reported_instances(Some(&ns)).await?))
}

pub async fn all_instances(
    State(state): State<Arc<ApiState>>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.reported_instances(None).await?))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishedParams {
    workload: Option<String>,
}

/// Finished instances kept (`finishedRunHistory`), oldest first: the record, how it ended.
pub async fn finished_instances(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
    params: Result<axum::extract::Query<FinishedParams>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let axum::extract::Query(p) =
        params.map_err(|e| ApiError::bad_request(format!("{e} (expected workload)")))?;
    Ok(Json(
        state
            .service
            .finished_instances(&ns, p.workload.as_deref())
            .await?,
    ))
}
