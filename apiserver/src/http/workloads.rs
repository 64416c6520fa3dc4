//! `/v1alpha1/n/{ns}/workloads`: bundles in, metadata and status out; and the instances
//! nodes report (`/v1alpha1/n/{ns}/instances`, `/v1alpha1/instances`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kat_api::wire::{ApplyOutcome, APPLY_OUTCOME_HEADER};
use kat_api::WorkloadKey;
use serde::Deserialize;

use super::hook_reads::{HookRead, Refused, HOOK_READS_AT_ONCE, HOOK_READS_PER_SOURCE};
use super::{read_body, ApiError, ApiState};

/// The workloads of a namespace, with their status.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/workloads",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace")),
        responses((status = 200, description = "Metadata and status of each workload", body = [kat_api::wire::WorkloadObject]), super::openapi::Errors)
    )
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.workloads(&ns).await?))
}

/// One workload: metadata, generation, replicas desired and ready, its instances.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/workloads/{name}",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 200, description = "The workload", body = kat_api::wire::WorkloadObject), super::openapi::Errors)
    )
)]
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
    /// On `PUT`: create the workload if there is none (`katcall apply` in one call).
    #[serde(default)]
    create: bool,
}

fn apply_query(query: Result<Query<ApplyQuery>, QueryRejection>) -> Result<ApplyQuery, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{e} (expected dryRun=true or false, and on PUT create=true or false)"
        ))
    })?;
    Ok(q)
}

/// Create a workload from its Quadlet directory (a tar.gz); with `dryRun=true` only say what the apply would do (`katcall diff`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/n/{ns}/workloads",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("dryRun" = Option<bool>, Query, description = "Check everything, store nothing, answer what the apply would change")),
        request_body(content = super::openapi::Bundle, content_type = "application/gzip", description = "The Quadlet directory as a tar.gz (`katcall apply` packs it)"),
        responses((status = 201, description = "Created", body = kat_api::wire::WorkloadObject), (status = 200, description = "With dryRun: what the apply would do", body = kat_api::wire::ApplyPreview), super::openapi::Errors)
    )
)]
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
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/nodes/{name}/workloads/{ns}",
        tag = "node-agent",
        params(("name" = String, Path, description = "Node name"), ("ns" = String, Path, description = "Namespace")),
        request_body(content = super::openapi::Bundle, content_type = "application/gzip", description = "The Quadlet directory as a tar.gz (`katcall apply` packs it)"),
        responses((status = 201, description = "Created", body = kat_api::wire::PinnedWorkloadAnswer), (status = 200, description = "The same bundle was there", body = kat_api::wire::PinnedWorkloadAnswer), super::openapi::Errors)
    )
)]
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

/// Update a workload from its Quadlet directory: a new generation unless the spec is the same; with `dryRun=true` only say what would change.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        put,
        path = "/v1alpha1/n/{ns}/workloads/{name}",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name"), ("dryRun" = Option<bool>, Query, description = "Check everything, store nothing, answer what the apply would change"), ("create" = Option<bool>, Query, description = "Create the workload if there is none: `katcall apply` in one call, settled in one transaction; the `kat-apply-outcome` header says created, configured or unchanged (not with dryRun)")),
        request_body(content = super::openapi::Bundle, content_type = "application/gzip", description = "The Quadlet directory as a tar.gz (`katcall apply` packs it)"),
        responses((status = 200, description = "The workload after the update (a WorkloadObject); with dryRun what it would change (an ApplyPreview, as the create answers)", body = kat_api::wire::WorkloadObject, headers(("kat-apply-outcome" = String, description = "With create=true: created, configured or unchanged"))), (status = 201, description = "With create=true: created", body = kat_api::wire::WorkloadObject, headers(("kat-apply-outcome" = String, description = "created"))), super::openapi::Errors)
    )
)]
pub async fn update(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
    query: Result<Query<ApplyQuery>, QueryRejection>,
    req: Request,
) -> Result<Response, ApiError> {
    let query = apply_query(query)?;
    if query.dry_run && query.create {
        return Err(ApiError::bad_request(
            "dryRun and create=true together: a dry run of a create is a POST with dryRun=true (`katcall diff`)",
        ));
    }
    let body = bundle_body(&state, req).await?;
    if query.dry_run {
        let preview = state
            .service
            .preview_workload(&ns, Some(&name), body)
            .await?;
        return Ok(Json(preview).into_response());
    }
    let key = WorkloadKey::new(ns, name);
    if query.create {
        let (object, outcome) = state.service.apply_workload(&key, body).await?;
        let status = match outcome {
            ApplyOutcome::Created => StatusCode::CREATED,
            _ => StatusCode::OK,
        };
        return Ok((
            status,
            [(APPLY_OUTCOME_HEADER, outcome.as_str())],
            Json(object),
        )
            .into_response());
    }
    Ok(Json(state.service.update_workload(&key, body).await?).into_response())
}

/// Delete a workload: its containers stop with their grace period.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/n/{ns}/workloads/{name}",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 200, description = "`{\"deleted\": \"NS/NAME\"}`", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    state.service.delete_workload(&key).await?;
    Ok(Json(serde_json::json!({"deleted": key})))
}

/// Re-apply the previous generation's spec as a new generation (the update strategy governs the way back).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/n/{ns}/workloads/{name}/rollback",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 200, description = "The workload at its new generation", body = kat_api::wire::WorkloadObject), super::openapi::Errors)
    )
)]
pub async fn rollback(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    Ok(Json(state.service.rollback_workload(&key).await?))
}

/// `source.git`: resolve the branch or tag again; a new generation if it moved.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/n/{ns}/workloads/{name}/redeploy",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 200, description = "The workload", body = kat_api::wire::WorkloadObject), super::openapi::Errors)
    )
)]
pub async fn redeploy(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    Ok(Json(state.service.redeploy_workload(&key).await?))
}

/// `source.git`: a new push-hook secret, replacing any before it.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/n/{ns}/workloads/{name}/webhook",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 201, description = "The hook's path and secret (shown once)", body = kat_api::wire::WebhookInfo), super::openapi::Errors)
    )
)]
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

/// `source.git`: remove the push-hook secret.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/n/{ns}/workloads/{name}/webhook",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        responses((status = 200, description = "Removed", body = serde_json::Value), super::openapi::Errors)
    )
)]
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

/// The most a push notification may carry: read before it is authenticated, so bounded (a
/// push's payload is a few KiB; one listing GitHub's most, 2,048 commits, about 2 MiB; what
/// KAT reads of it is two fields).
const HOOK_BODY_LIMIT: u64 = 4 << 20;

/// A git server's push notification for a `source.git` workload, signed with its webhook secret.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/hooks/git/{ns}/{name}",
        tag = "workloads",
        security(()),
        params(("X-Hub-Signature-256" = String, Header, description = "sha256=HMAC of the body with the webhook secret"), ("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name")),
        request_body(content = serde_json::Value, description = "A git server's push notification, signed with the webhook secret (`X-Hub-Signature-256`)"),
        responses((status = 200, description = "What the push did", body = serde_json::Value), super::openapi::Errors)
    )
)]
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
    let client = req
        .extensions()
        .get::<super::ClientAddr>()
        .map(|a| a.0)
        .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
    let reading = HookRead::admit(client).map_err(|refused| {
        let why = match refused {
            Refused::Full => format!(
                "{HOOK_READS_AT_ONCE} push notifications are being received already"
            ),
            Refused::SourceFull => format!(
                "{HOOK_READS_PER_SOURCE} push notifications from {client} are being received already"
            ),
        };
        ApiError::new(
            kat_api::wire::ErrorCode::Unavailable,
            format!("{why}; send it again shortly"),
        )
    })?;
    let body = read_body(req, HOOK_BODY_LIMIT).await?;
    drop(reading);
    Ok(Json(
        state
            .service
            .push_hook(&key, signature.as_deref(), delivery.as_deref(), &body)
            .await?,
    ))
}

/// One Quadlet file of the workload, as applied.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/workloads/{name}/files/{file}",
        tag = "workloads",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name"), ("file" = String, Path, description = "File name, e.g. workload.kat")),
        responses((status = 200, description = "The file as applied", content_type = "application/yaml", body = String), super::openapi::Errors)
    )
)]
pub async fn file(
    State(state): State<Arc<ApiState>>,
    Path((ns, name, file)): Path<(String, String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let key = WorkloadKey::new(ns, name);
    let bytes = state.service.workload_file(&key, &file).await?;
    Ok(([(header::CONTENT_TYPE, "application/yaml")], bytes))
}

/// The instances of a namespace, as their nodes report them.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/instances",
        tag = "instances",
        params(("ns" = String, Path, description = "Namespace")),
        responses((status = 200, description = "Instances as their nodes report them", body = [kat_api::wire::InstanceStatus]), super::openapi::Errors)
    )
)]
pub async fn instances(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.reported_instances(Some(&ns)).await?))
}

/// Every instance in the cluster, as their nodes report them.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/instances",
        tag = "instances",
        responses((status = 200, description = "Instances as their nodes report them", body = [kat_api::wire::InstanceStatus]), super::openapi::Errors)
    )
)]
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
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/finished-instances",
        tag = "instances",
        params(("ns" = String, Path, description = "Namespace"), ("workload" = Option<String>, Query, description = "Only this workload's")),
        responses((status = 200, description = "Finished instances, oldest first", body = serde_json::Value), super::openapi::Errors)
    )
)]
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
