//! `/v1alpha1/join-tokens`, `/v1alpha1/join` and `/v1alpha1/ca`.
//!
//! `join` and `ca` need no bearer token: a joining node has only its join token, and the CA
//! certificate is public (the joining node checks it against its pin before trusting it).
//! A join is judged with the address its connection came from ([`ClientAddr`]).

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use kat_api::wire::{ErrorCode, JoinRequest, JoinRole};
use serde::Deserialize;

use super::{json_body, read_body, ApiError, ApiState, ClientAddr};
use crate::service::JoinTokenOptions;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateBody {
    /// What it admits: `worker` (the default) or `control-plane`.
    #[serde(default)]
    role: JoinRole,
    /// How long the token is valid: `24h`, `30m`, `7d`; default 24 h for a worker token,
    /// 1 h for a control-plane token.
    #[serde(default)]
    ttl: Option<String>,
    /// How many nodes it may admit; none: any number until it expires.
    #[serde(default, rename = "maxUses")]
    max_uses: Option<u32>,
    /// Addresses a joining node may advertise besides the one it joins from.
    #[serde(default)]
    addresses: Vec<String>,
}

/// A join token for new nodes (`katcall create join-token`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/join-tokens",
        tag = "join",
        request_body(content = serde_json::Value, description = "`{\"role\": \"worker\" or \"control-plane\", \"ttl\": \"24h\", \"maxUses\": 1, \"addresses\": [\"10.0.0.5\"]}`, every field optional"),
        responses((status = 201, description = "The token (shown once)", body = kat_api::wire::NewJoinToken), super::openapi::Errors)
    )
)]
pub async fn create_token(
    State(state): State<Arc<ApiState>>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let body = read_body(req, 4096).await?;
    let parsed: CreateBody = if body.is_empty() {
        CreateBody::default()
    } else {
        crate::decode_request(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "join token body: {e} (expected {{\"role\": \"worker\" or \"control-plane\", \"ttl\": \"24h\", \"maxUses\": 1, \"addresses\": [\"10.0.0.5\"]}})"
            ))
        })?
    };
    let ttl = match parsed.ttl.as_deref() {
        None => None,
        Some(t) => Some(humantime::parse_duration(t).map_err(|_| {
            ApiError::bad_request(format!("ttl: {t:?} is not a duration (e.g. 24h, 30m, 7d)"))
        })?),
    };
    let addresses = parsed
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.parse().map_err(|_| {
                ApiError::bad_request(format!("addresses[{i}]: {a:?} is not an IP address"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let token = state
        .service
        .create_join_token(&JoinTokenOptions {
            role: parsed.role,
            ttl,
            max_uses: parsed.max_uses,
            addresses,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// The join tokens (`katcall get join-tokens`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/join-tokens",
        tag = "join",
        responses((status = 200, description = "Join tokens, without their secrets", body = [kat_api::wire::JoinTokenInfo]), super::openapi::Errors)
    )
)]
pub async fn list_tokens(
    State(state): State<Arc<ApiState>>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.join_tokens().await?))
}

/// Revoke a join token.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/join-tokens/{id}",
        tag = "join",
        params(("id" = String, Path, description = "Token id")),
        responses((status = 200, description = "`{\"deleted\": ID}`", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn delete_token(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.delete_join_token(&id).await?;
    Ok(Json(serde_json::json!({"deleted": id})))
}

/// Join the cluster with a join token: a node's certificate for its key.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/join",
        tag = "join",
        security(()),
        request_body(content = kat_api::wire::JoinRequest),
        responses((status = 200, description = "The node's certificate and what it needs to run", body = kat_api::wire::JoinResponse), super::openapi::Errors)
    )
)]
pub async fn join(
    State(state): State<Arc<ApiState>>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let source = req.extensions().get::<ClientAddr>().map(|c| c.0).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Internal,
            "the server did not record where this connection comes from; a join cannot be judged without it",
        )
    })?;
    let request: JoinRequest = json_body(
        req,
        64 * 1024,
        "join body (expected token, nodeName, csr, address, etcdPeer)",
    )
    .await?;
    Ok(Json(state.service.join(request, source).await?))
}

/// The cluster CA certificate (PEM): public; what a joining node pins.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/ca",
        tag = "join",
        security(()),
        responses((status = 200, description = "PEM", content_type = "application/x-pem-file", body = String), super::openapi::Errors)
    )
)]
pub async fn ca(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    let ca = state
        .service
        .admission
        .as_ref()
        .map(|a| a.authority.ca_pem())
        .ok_or_else(|| {
            ApiError::not_found("this node does not serve the CA; ask a node of the etcd quorum")
        })?;
    Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], ca))
}
