//! `/v1alpha1/namespaces`.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::{json_body, ApiError, ApiState};

/// Every namespace, with its labels.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/namespaces",
        tag = "namespaces",
        responses((status = 200, description = "Every namespace", body = [kat_api::wire::NamespaceObject]), super::openapi::Errors)
    )
)]
pub async fn list(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.namespaces().await?))
}

/// One namespace.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/namespaces/{ns}",
        tag = "namespaces",
        params(("ns" = String, Path, description = "Namespace")),
        responses((status = 200, description = "The namespace", body = kat_api::wire::NamespaceObject), super::openapi::Errors)
    )
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.namespace(&ns).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    metadata: CreateMeta,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateMeta {
    name: String,
}

/// Create a namespace (`katcall create namespace`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/namespaces",
        tag = "namespaces",
        request_body(content = serde_json::Value, description = "`{\"metadata\": {\"name\": \"NAME\"}}`"),
        responses((status = 201, description = "Created", body = kat_api::wire::NamespaceObject), super::openapi::Errors)
    )
)]
pub async fn create(
    State(state): State<Arc<ApiState>>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let parsed: CreateBody = json_body(
        req,
        64 * 1024,
        r#"namespace body (expected {"metadata": {"name": "NAME"}})"#,
    )
    .await?;
    let ns = state
        .service
        .create_namespace(&parsed.metadata.name)
        .await?;
    Ok((StatusCode::CREATED, Json(ns)))
}

/// Delete a namespace without workloads (`kat-core` and `default` stay).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/namespaces/{ns}",
        tag = "namespaces",
        params(("ns" = String, Path, description = "Namespace")),
        responses((status = 200, description = "`{\"deleted\": NS}`", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.delete_namespace(&ns).await?;
    Ok(Json(serde_json::json!({"deleted": ns})))
}
