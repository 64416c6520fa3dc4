//! The HTTP API (RFC 001 §8), as an axum [`Router`] over the [`Service`] layer.
//!
//! Every route but `/healthz`, `/openapi.json`, `/v1alpha1/join` and `/v1alpha1/ca` needs
//! the admin bearer token (or a scoped one), except the dashboard's under [`UI_PREFIX`],
//! which checks its own session (`kat-dashboard`); the token is checked against its SHA-256 in the store, in constant time. Each
//! request passes one middleware that applies the per-client rate limit, checks the token,
//! times the request for `/metrics` and writes an audit line for every mutating request. Errors are always `{"error","message"}`.
//!
//! The rate limit counts a request against the node whose certificate the connection
//! showed, else against its address ([`crate::rate_limit`]): a node's heartbeats never wait behind
//! what its containers send from the same address. Request bodies are read under the
//! deadline the server sets ([`deadline`]); one that misses it is a 408.
//!
//! The router is transport-free: `kat-agent` serves it over rustls. Logs and exec need the
//! node that runs an instance; they go through [`kat_node::exec_logs::InstanceAccess`].

pub mod deadline;
mod error;
mod events;
mod hook_reads;
mod join;
mod namespaces;
mod nodes;
#[cfg(feature = "openapi")]
pub mod openapi;
mod streams;
mod tokens;
mod worker;
mod workloads;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodFilter, MethodRouter};
use axum::Router;
use kat_api::routes::{Access, Method as RouteMethod, Route};
use kat_api::wire::ErrorCode;
use kat_leader::metrics::Metrics;
use kat_pki::NodeRole;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use crate::rate_limit::{Client, RateLimiter};
pub use error::ApiError;
pub use streams::{StreamSource, EXEC_PROTOCOL};
pub use tokens::scope_allows;
pub use worker::{worker_router, TokenAnswers, TokenCheck, WorkerApi};

use crate::service::Service;

/// The address a connection came from, set by the server on every request.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// The node a connection's client certificate names and its role (verified against the
/// cluster CA in the TLS handshake), set by the server on every request; `None` for a client
/// without one.
#[derive(Debug, Clone, Default)]
pub struct ClientNode(pub Option<(String, NodeRole)>);

/// The serial (hex) of the client certificate the connection showed, if any.
#[derive(Debug, Clone, Default)]
pub struct ClientSerial(pub Option<String>);

/// What a (verified, not revoked) node certificate may do on a route (`Access` in
/// `kat_api::routes`): its own node's routes, and a member's relay of an instance's
/// streams. `Err` says why not.
fn node_may(node: &str, role: NodeRole, method: &Method, path: &str) -> Result<(), String> {
    let recognized = RouteMethod::parse(method.as_str()).and_then(|m| Route::recognize(m, path));
    match recognized.map(|(route, params)| (route.access(), params)) {
        Some((Access::OwnNode, params)) => match params.get("name") {
            Some(named) if named == node => Ok(()),
            named => Err(format!(
                "the certificate of node {node} cannot act for node {}",
                named.unwrap_or("?")
            )),
        },
        Some((Access::TokenOrMember, _)) if role == NodeRole::ControlPlane => Ok(()),
        Some((Access::TokenOrMember, _)) => Err(format!(
            "node {node} is a worker: its certificate cannot read logs or exec into instances"
        )),
        _ => Err(format!(
            "{method} {path} needs the admin token; the certificate of node {node} opens its own records only"
        )),
    }
}

/// Everything the handlers share: the service layer and what only HTTP needs.
pub struct ApiState {
    pub service: Service,
    /// SHA-256 of the admin token.
    pub token_sha256: [u8; 32],
    pub access: Arc<dyn kat_node::exec_logs::InstanceAccess>,
    pub metrics: Arc<Metrics>,
    pub limiter: RateLimiter,
}

pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

pub fn router(state: Arc<ApiState>) -> Router {
    router_with_ui(state, None)
}

/// Where a control-plane node serves the web dashboard (`kat-dashboard`): the guard leaves
/// its requests, rate-limited, to the dashboard's own sign-in and session checks.
pub const UI_PREFIX: &str = "/ui";

/// [`router`], with the dashboard's routes under [`UI_PREFIX`] (the dashboard depends on
/// this crate, not the other way round).
pub fn router_with_ui(state: Arc<ApiState>, ui: Option<Router<Arc<ApiState>>>) -> Router {
    // One axum route per path template, with each of its methods' handlers.
    let mut by_path: std::collections::BTreeMap<String, MethodRouter<Arc<ApiState>>> =
        std::collections::BTreeMap::new();
    for route in Route::ALL {
        let methods = by_path
            .remove(&route.axum_template())
            .unwrap_or_default()
            .merge(handler(*route));
        by_path.insert(route.axum_template(), methods);
    }
    let mut root = Router::new();
    for (path, methods) in by_path {
        root = root.route(&path, methods);
    }
    if let Some(ui) = ui {
        root = with_ui(root, ui);
    }
    root.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The handler of `route`, at the route's method (`kat_api::routes` declares both).
fn handler(route: Route) -> MethodRouter<Arc<ApiState>> {
    let on = |r: Route| match r.method() {
        RouteMethod::Get => MethodFilter::GET,
        RouteMethod::Post => MethodFilter::POST,
        RouteMethod::Put => MethodFilter::PUT,
        RouteMethod::Delete => MethodFilter::DELETE,
    };
    let filter = on(route);
    match route {
        Route::Healthz => axum::routing::on(filter, healthz),
        Route::OpenApi => axum::routing::on(filter, openapi_json),
        Route::Metrics => axum::routing::on(filter, events::metrics),
        Route::ListNamespaces => axum::routing::on(filter, namespaces::list),
        Route::CreateNamespace => axum::routing::on(filter, namespaces::create),
        Route::GetNamespace => axum::routing::on(filter, namespaces::get),
        Route::DeleteNamespace => axum::routing::on(filter, namespaces::delete),
        Route::ListWorkloads => axum::routing::on(filter, workloads::list),
        Route::CreateWorkload => axum::routing::on(filter, workloads::create),
        Route::GetWorkload => axum::routing::on(filter, workloads::get),
        Route::UpdateWorkload => axum::routing::on(filter, workloads::update),
        Route::DeleteWorkload => axum::routing::on(filter, workloads::delete),
        Route::WorkloadFile => axum::routing::on(filter, workloads::file),
        Route::Rollback => axum::routing::on(filter, workloads::rollback),
        Route::Redeploy => axum::routing::on(filter, workloads::redeploy),
        Route::CreateWebhook => axum::routing::on(filter, workloads::create_webhook),
        Route::DeleteWebhook => axum::routing::on(filter, workloads::delete_webhook),
        Route::PushHook => axum::routing::on(filter, workloads::push_hook),
        Route::NamespaceInstances => axum::routing::on(filter, workloads::instances),
        Route::AllInstances => axum::routing::on(filter, workloads::all_instances),
        Route::FinishedInstances => axum::routing::on(filter, workloads::finished_instances),
        Route::Logs => axum::routing::on(filter, streams::logs::<ApiState>),
        Route::ExecUpgrade | Route::Exec => axum::routing::on(filter, streams::exec::<ApiState>),
        Route::ListNodes => axum::routing::on(filter, nodes::list),
        Route::GetNode => axum::routing::on(filter, nodes::get),
        Route::RemoveNode => axum::routing::on(filter, nodes::remove),
        Route::Heartbeat => axum::routing::on(filter, nodes::heartbeat),
        Route::Assignments => axum::routing::on(filter, nodes::assignments),
        Route::DnsRecords => axum::routing::on(filter, nodes::dns_records),
        Route::OverlayPeers => axum::routing::on(filter, nodes::overlay_peers),
        Route::WireGuardKey => axum::routing::on(filter, nodes::set_wireguard_key),
        Route::EtcdMember => axum::routing::on(filter, nodes::readmit_etcd_member),
        Route::SubmitPinned => axum::routing::on(filter, workloads::submit_pinned),
        Route::Template => axum::routing::on(filter, nodes::template),
        Route::TemplateProblems => axum::routing::on(filter, nodes::template_problems),
        Route::SetTaints => axum::routing::on(filter, nodes::set_taints),
        Route::SetLabels => axum::routing::on(filter, nodes::set_labels),
        Route::Drain => axum::routing::on(filter, nodes::drain),
        Route::ApproveCapacity => axum::routing::on(filter, nodes::approve_capacity),
        Route::Uncordon => axum::routing::on(filter, nodes::uncordon),
        Route::Events => axum::routing::on(filter, events::list),
        Route::Backups => axum::routing::on(filter, events::backups),
        Route::CreateBackup => axum::routing::on(filter, events::create_backup),
        Route::JoinTokens => axum::routing::on(filter, join::list_tokens),
        Route::CreateJoinToken => axum::routing::on(filter, join::create_token),
        Route::DeleteJoinToken => axum::routing::on(filter, join::delete_token),
        Route::Ingress => axum::routing::on(filter, tokens::ingress_routes),
        Route::ApiTokens => axum::routing::on(filter, tokens::list),
        Route::CreateApiToken => axum::routing::on(filter, tokens::create),
        Route::Whoami => axum::routing::on(filter, tokens::whoami),
        Route::DeleteApiToken => axum::routing::on(filter, tokens::delete),
        Route::Join => axum::routing::on(filter, join::join),
        Route::Ca => axum::routing::on(filter, join::ca),
        Route::ClusterConfig => axum::routing::on(filter, events::cluster_config),
    }
}

/// The dashboard's routes under [`UI_PREFIX`]. The nested router answers `/ui` and
/// `/ui/...`; `/ui/`, what people type, is sent to `/ui`. (Not API routes: no OpenAPI.)
fn with_ui(root: Router<Arc<ApiState>>, ui: Router<Arc<ApiState>>) -> Router<Arc<ApiState>> {
    root.nest(UI_PREFIX, ui).route(
        &format!("{UI_PREFIX}/"),
        get(|| async { axum::response::Redirect::to(UI_PREFIX) }),
    )
}

/// Whether the API answers: `{"status": "ok"}`, no token needed.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/healthz",
        tag = "cluster",
        security(()),
        responses((status = 200, description = "`{\"status\": \"ok\"}`", body = serde_json::Value))
    )
)]
async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// This document (`docs/openapi.json`), no token needed.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/openapi.json",
        tag = "cluster",
        security(()),
        responses((status = 200, description = "OpenAPI 3.1", body = serde_json::Value))
    )
)]
async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

/// The OpenAPI document, as generated from the handlers and checked by `tests/openapi.rs`.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        ErrorCode::NoRoute,
        format!(
            "no route {} {} (see docs/api.md)",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        ErrorCode::BadRequest,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Whether `method path` needs no bearer token: a public route (joining is authenticated
/// by the join token in its body) or a git server's push notification (by the workload's
/// webhook secret, a signature of the body).
fn without_token(method: &Method, path: &str) -> bool {
    RouteMethod::parse(method.as_str())
        .and_then(|m| Route::recognize(m, path))
        .is_some_and(|(route, _)| matches!(route.access(), Access::Public | Access::Signed))
}

/// A streamed response (one whose size is not known: `events --watch`, `logs -f`) is cut
/// when the scoped token that opened it is deleted: it ends with an error, so the
/// connection is aborted and the client cannot take it for a stream that ended. A whole
/// response is left as it is.
fn until_revoked(response: Response, life: crate::service::TokenLife) -> Response {
    use axum::body::HttpBody;
    use futures_util::StreamExt;
    if response.body().size_hint().exact().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let state = (Some(body.into_data_stream()), Box::pin(life.revoked()));
    let stream = futures_util::stream::unfold(state, |(body, mut revoked)| async move {
        let mut body = body?;
        tokio::select! {
            item = body.next() => item.map(|item| (item, (Some(body), revoked))),
            () = &mut revoked => Some((
                Err(axum::Error::new(std::io::Error::other(
                    "the API token that opened this stream was deleted",
                ))),
                (None, revoked),
            )),
        }
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// Rate limit, authentication, metrics and audit for every request.
async fn guard(State(state): State<Arc<ApiState>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // A dry run is audited as one: it changes nothing.
    let dry_run = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "dryRun=true"));
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let client = req
        .extensions()
        .get::<ClientAddr>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0);
    let limited = rate_limit_key(&req, client);
    let response = if path == "/healthz" {
        next.run(req).await
    } else if without_token(&method, &path) || is_ui(&path) {
        // No bearer token (a joining node has none; the dashboard checks its own session),
        // but rate-limited like the rest.
        match state.limiter.check_client(limited) {
            Ok(()) => next.run(req).await,
            Err(retry_after) => rate_limited(retry_after, None),
        }
    } else if let Err(retry_after) = state.limiter.check_client(limited.clone()) {
        rate_limited(retry_after, Some(&limited))
    } else if authorized(&state, &req) {
        req.extensions_mut().insert(tokens::Caller::Admin);
        next.run(req).await
    } else if let Some(token) = bearer(&req).filter(|t| Service::looks_like_api_token(t)) {
        // Followed before it is checked: a deletion from here on ends what it opens.
        let life = Service::api_token_id(token).map(|id| state.service.revocations.follow(&id));
        match state.service.api_token_scope(token).await {
            Ok(Some(scope)) => match tokens::scope_allows(&scope, &method, &path) {
                Ok(()) => {
                    req.extensions_mut().insert(tokens::Caller::Scoped(scope));
                    if let Some(life) = &life {
                        req.extensions_mut().insert(life.clone());
                    }
                    let response = next.run(req).await;
                    match life {
                        Some(life) => until_revoked(response, life),
                        None => response,
                    }
                }
                Err(why) => ApiError::forbidden(why).into_response(),
            },
            Ok(None) => unauthorized().into_response(),
            Err(e) => ApiError::from(e).into_response(),
        }
    } else if let Some((node, role)) = client_node(&req) {
        match node_authorized(&state, &node, role, &method, &path).await {
            Ok(()) => next.run(req).await,
            Err(e) => e.into_response(),
        }
    } else {
        unauthorized().into_response()
    };
    let status = response.status();
    let took = started.elapsed();
    state
        .metrics
        .observe_request(method.as_str(), &route, status.as_u16(), took);
    if is_mutating(&method) || status == StatusCode::UNAUTHORIZED {
        tracing::info!(
            target: "kat::audit",
            client = %client,
            method = %method,
            path = %path,
            dry_run,
            status = status.as_u16(),
            millis = took.as_millis() as u64,
            "api request"
        );
    }
    response
}

/// Whom the rate limit counts a request against: the node whose certificate the connection
/// showed, else the address it came from.
pub(crate) fn rate_limit_key(req: &Request, addr: IpAddr) -> Client {
    match client_node(req) {
        Some((node, _)) => Client::Node(node),
        None => Client::addr(addr),
    }
}

/// A 429 with `Retry-After`; `who`, if said, in the message.
pub(crate) fn rate_limited(retry_after: Duration, who: Option<&Client>) -> Response {
    let message = match who {
        Some(who) => format!(
            "too many requests from {who}; retry in {} ms",
            retry_after.as_millis()
        ),
        None => format!("too many requests; retry in {} ms", retry_after.as_millis()),
    };
    let mut r = ApiError::new(ErrorCode::RateLimited, message).into_response();
    let secs = retry_after.as_secs().max(1).to_string();
    if let Ok(v) = HeaderValue::from_str(&secs) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Whether `path` is the dashboard's.
fn is_ui(path: &str) -> bool {
    path == UI_PREFIX || path.starts_with(&format!("{UI_PREFIX}/"))
}

fn is_mutating(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

pub(crate) fn client_node(req: &Request) -> Option<(String, NodeRole)> {
    req.extensions()
        .get::<ClientNode>()
        .and_then(|n| n.0.clone())
}

pub(crate) fn unauthorized() -> ApiError {
    ApiError::new(
        ErrorCode::Unauthorized,
        "missing or wrong bearer token: pass `Authorization: Bearer TOKEN` (katcall reads it from its config file)",
    )
}

/// A node certificate: refused (401) once `katcall delete node` revoked it, else allowed on
/// the routes its node may use and forbidden (403) everywhere else.
async fn node_authorized(
    state: &ApiState,
    node: &str,
    role: NodeRole,
    method: &Method,
    path: &str,
) -> Result<(), ApiError> {
    // A detached node's local API serves its local users only: the other nodes of its
    // parent cluster have nothing to do there.
    if let Some(own) = &state.service.pin_to_node {
        return Err(ApiError::forbidden(format!(
            "node {own} runs detached: its local API takes its admin token only, not node {node}'s certificate"
        )));
    }
    match state.service.node_revoked(node).await {
        Ok(false) => {}
        Ok(true) => {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                format!("the certificate of node {node} was revoked (the node was removed)"),
            ))
        }
        Err(e) => return Err(e),
    }
    node_may(node, role, method, path).map_err(ApiError::forbidden)
}

/// The bearer token of `req`, if it has one.
pub(crate) fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?;
    value.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

/// Whether `req` carries the admin token.
fn authorized(state: &ApiState, req: &Request) -> bool {
    bearer(req).is_some_and(|token| token_sha256(token).ct_eq(&state.token_sha256).into())
}

/// Read a JSON request body of at most `limit` bytes; a body that does not parse is a 400
/// that starts with `what` (the body and what it should look like).
pub(crate) async fn json_body<T: serde::de::DeserializeOwned>(
    req: Request,
    limit: u64,
    what: &str,
) -> Result<T, ApiError> {
    let body = read_body(req, limit).await?;
    crate::decode_request(&body).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// Read a request body of at most `limit` bytes.
pub(crate) async fn read_body(req: Request, limit: u64) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        )
    };
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit {
            return Err(too_large());
        }
    }
    axum::body::to_bytes(req.into_body(), limit as usize)
        .await
        .map_err(|e| match deadline::missed(&e) {
            Some(missed) => ApiError::new(ErrorCode::RequestTimeout, missed.to_string()),
            None => too_large(),
        })
}

/// A streamed response of JSON lines, one per item `rx` yields, ending when it closes.
pub(crate) fn ndjson_body<T: serde::Serialize + Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let mut line = loop {
            let item = rx.recv().await?;
            match serde_json::to_vec(&item) {
                Ok(line) => break line,
                // Never an empty line in its place: the reader would take it for the end.
                Err(e) => tracing::warn!(error = %e, "a streamed item cannot be encoded; skipped"),
            }
        };
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)),
            rx,
        ))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// A default for the rate limit: generous for people and scripts, a brake for runaway loops.
pub fn default_rate_limiter() -> RateLimiter {
    RateLimiter::new(200, 100.0, Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_certificate_reaches_its_own_records_and_a_member_instance_streams() {
        use NodeRole::{ControlPlane, Worker};
        let streams = [
            (
                Method::GET,
                "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
            ),
            (
                Method::POST,
                "/v1alpha1/n/default/workloads/web/instances/web-1/exec",
            ),
        ];
        for (method, path) in &streams {
            assert!(
                node_may("n1", ControlPlane, method, path).is_ok(),
                "{method} {path}"
            );
            let err = node_may("w1", Worker, method, path).unwrap_err();
            assert!(err.contains("is a worker"), "{err}");
        }
        let own = [
            (Method::POST, "/v1alpha1/nodes/w1/status"),
            (Method::GET, "/v1alpha1/nodes/w1/assignments"),
            (Method::GET, "/v1alpha1/nodes/w1/templates/default/web/abc"),
            (Method::POST, "/v1alpha1/nodes/w1/template-problems"),
        ];
        for (method, path) in &own {
            assert!(
                node_may("w1", Worker, method, path).is_ok(),
                "{method} {path}"
            );
            let err = node_may("w2", Worker, method, path).unwrap_err();
            assert!(err.contains("cannot act for node w1"), "{err}");
        }
        for (method, path) in [
            (Method::GET, "/v1alpha1/n/default/workloads"),
            (Method::DELETE, "/v1alpha1/n/default/workloads/web"),
            (Method::POST, "/v1alpha1/join-tokens"),
            (Method::GET, "/v1alpha1/nodes"),
            (Method::GET, "/v1alpha1/nodes/w1"),
            (Method::DELETE, "/v1alpha1/nodes/w1"),
            (Method::PUT, "/v1alpha1/nodes/w1/taints"),
            (Method::POST, "/v1alpha1/nodes/w1/drain"),
            (Method::GET, "/v1alpha1/nodes/w1/status"),
            (Method::POST, "/v1alpha1/nodes/w1/assignments"),
            (
                Method::DELETE,
                "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
            ),
            (
                Method::GET,
                "/v1alpha1/n/default/workloads/web/instances/web-1/logs/extra",
            ),
            (Method::GET, "/metrics"),
        ] {
            for role in [ControlPlane, Worker] {
                let err = node_may("w1", role, &method, path).unwrap_err();
                assert!(
                    err.contains("needs the admin token"),
                    "{method} {path}: {err}"
                );
            }
        }
    }
}
