//! A worker node's own API: logs of and exec into the instances it runs, for the control
//! plane, which proxies `katcall logs` and `katcall exec` here over mutual TLS, and the
//! node's `/metrics` (its usage and instances as of its last heartbeat).
//!
//! A worker holds no cluster state, so it finds instances in its own assignments, and it
//! serves only control-plane certificates that were not revoked (the leader sends the
//! revoked serials with every heartbeat answer): another worker's certificate gets 403 (a
//! compromised worker cannot read its neighbours' logs or run commands in their
//! containers), the admin token opens nothing here, and every other route answers
//! `not_leader` with where the leader is, so a client pointed at a worker learns where to go.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kat_api::wire::{ErrorCode, InstanceRecord};
use kat_api::WorkloadKey;
use kat_pki::NodeRole;
use tokio::sync::watch;

use super::streams::{self, InstanceAccess, StreamSource};
use super::{
    client_node, rate_limit_key, rate_limited, unauthorized, ApiError, ClientAddr, ClientSerial,
    RateLimiter,
};

pub struct WorkerApi {
    pub node: String,
    /// The node's assignments, by instance id, as its feed last saw them.
    pub instances: watch::Receiver<BTreeMap<kat_api::wire::InstanceId, InstanceRecord>>,
    /// The leader's API endpoint, as the node last learned it.
    pub leader: watch::Receiver<Option<String>>,
    /// Serials of removed nodes' certificates, as the leader last said (each heartbeat).
    pub revoked: watch::Receiver<Arc<HashSet<String>>>,
    pub access: Arc<dyn InstanceAccess>,
    pub limiter: RateLimiter,
    /// The node's own metrics registry, rendered with its last heartbeat at `/metrics`.
    pub metrics: Arc<kat_leader::metrics::Metrics>,
    /// The heartbeat the node last sent.
    pub heartbeat: watch::Receiver<Option<kat_api::wire::NodeHeartbeat>>,
}

#[async_trait::async_trait]
impl StreamSource for WorkerApi {
    async fn instance(&self, key: &WorkloadKey, id: &str) -> Result<InstanceRecord, ApiError> {
        let assigned = self
            .instances
            .borrow()
            .get(id)
            .filter(|r| r.workload_key() == *key)
            .cloned();
        if let Some(r) = assigned {
            return Ok(r);
        }
        // A finished instance: its container is gone, its log kept here.
        if let Some(r) = self.access.kept(key, id).await {
            return Ok(r);
        }
        Err(ApiError::not_found(format!(
            "instance {id} of workload {key} does not run on node {}, and no log of it is kept there",
            self.node
        )))
    }

    fn access(&self) -> Arc<dyn InstanceAccess> {
        self.access.clone()
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

pub fn worker_router(state: Arc<WorkerApi>) -> Router {
    Router::new()
        .route(
            "/v1alpha1/n/:ns/workloads/:name/instances/:id/logs",
            get(streams::logs::<WorkerApi>),
        )
        .route(
            "/v1alpha1/n/:ns/workloads/:name/instances/:id/exec",
            get(streams::exec::<WorkerApi>).post(streams::exec::<WorkerApi>),
        )
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/metrics", get(metrics))
        .fallback(elsewhere)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The node's own usage and instances (from the heartbeat it last sent), in Prometheus text.
async fn metrics(State(state): State<Arc<WorkerApi>>) -> Response {
    let heartbeats: Vec<kat_api::wire::NodeHeartbeat> =
        state.heartbeat.borrow().iter().cloned().collect();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            kat_leader::metrics::CONTENT_TYPE,
        )],
        state.metrics.render(&heartbeats),
    )
        .into_response()
}

/// Every route a worker does not serve: the leader does.
async fn elsewhere(State(state): State<Arc<WorkerApi>>) -> ApiError {
    let leader = state.leader.borrow().clone();
    let mut e = ApiError::not_leader(leader);
    e.message = format!("node {} is a worker; {}", state.node, e.message);
    e
}

async fn guard(State(state): State<Arc<WorkerApi>>, req: Request, next: Next) -> Response {
    let client = req
        .extensions()
        .get::<ClientAddr>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0);
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    // Per node certificate, else per address: the control plane's streams never wait
    // behind what runs on its node.
    if let Err(retry_after) = state.limiter.check_client(rate_limit_key(&req, client)) {
        return rate_limited(retry_after, None);
    }
    let path = req.uri().path();
    let served_here = path == "/metrics"
        || (path.starts_with("/v1alpha1/n/")
            && (path.ends_with("/logs") || path.ends_with("/exec")));
    if !served_here {
        // Not served here: the fallback says where the leader is, whoever asks.
        return next.run(req).await;
    }
    let serial = req
        .extensions()
        .get::<ClientSerial>()
        .and_then(|s| s.0.clone());
    if serial.is_some_and(|s| state.revoked.borrow().contains(&s)) {
        return ApiError::new(
            ErrorCode::Unauthorized,
            "this certificate was revoked (its node was removed from the cluster)",
        )
        .into_response();
    }
    match client_node(&req) {
        Some((_, NodeRole::ControlPlane)) => next.run(req).await,
        Some((node, NodeRole::Worker)) => ApiError::forbidden(format!(
            "node {node} is a worker: its certificate cannot read logs of or exec into node {}'s instances",
            state.node
        ))
        .into_response(),
        None => unauthorized().into_response(),
    }
}
