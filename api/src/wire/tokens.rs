//! Scoped API tokens (`katcall create token`): bearer tokens weaker than the admin token,
//! for the ingress updater, dashboards and scripts.

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// What a scoped token may do: read only (GET, no exec), only one namespace's workloads, or
/// both; or only read `/metrics` (`metrics`, with `readOnly`), on any node, the one token a
/// worker node takes; or only the ingress routes (`ingress`, with `readOnly`). A token restricted by none would be the admin token again, so none is
/// made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TokenScope {
    /// Only reads: GET requests, no exec.
    #[serde(default)]
    pub read_only: bool,
    /// Only this namespace's workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Only `/metrics`, on any node (with `readOnly`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metrics: bool,
    /// The ingress updater's token (with `readOnly`): the route table
    /// (`GET /v1alpha1/ingress`) and the event stream that says when to read it again;
    /// no workload files, no logs, no nodes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ingress: bool,
}

/// `GET /v1alpha1/whoami`: who the bearer token of the request is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// The admin token.
    #[serde(default)]
    pub admin: bool,
    /// A scoped token's scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<TokenScope>,
}

/// `POST /tokens`: what the new token may do, and a note saying what it is for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateApiToken {
    /// Only reads: GET requests, no exec.
    #[serde(default)]
    pub read_only: bool,
    /// Only this namespace's workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `/metrics` only (implies `readOnly`; not with `namespace`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metrics: bool,
    /// The ingress routes and the event stream only (implies `readOnly`; not with
    /// `namespace` or `metrics`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ingress: bool,
    /// A note saying what the token is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A token as listed (`katcall get tokens`): no hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApiTokenInfo {
    /// The token's id (12 hex digits): its public part.
    pub id: String,
    /// What it may do.
    #[serde(flatten)]
    pub scope: TokenScope,
    /// The note given when it was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When it was made.
    pub created_at: Timestamp,
}

/// A token as stored: what is listed, and the SHA-256 of its secret (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApiTokenRecord {
    /// What is listed.
    #[serde(flatten)]
    pub info: ApiTokenInfo,
    /// The SHA-256 of the token's secret (hex).
    pub secret_sha256: String,
}

/// `POST /tokens`: the new token; `token` is shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NewApiToken {
    /// The whole token, as a client sends it.
    pub token: String,
    /// What is listed.
    #[serde(flatten)]
    pub info: ApiTokenInfo,
}
