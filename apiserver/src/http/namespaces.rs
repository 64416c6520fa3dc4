//! `/v1alpha1/namespaces`.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::{json_body, ApiError, ApiState};

pub async fn list(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.namespaces().await?))
}

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

pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.delete_namespace(&ns).await?;
    Ok(Json(serde_json::json!({"deleted": ns})))
}
