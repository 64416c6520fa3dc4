//! A worker node's own API: logs of and exec into the instances it runs, for the control
//! plane, which proxies `katcall logs` and `katcall exec` here over mutual TLS, and the
//! node's `/metrics` (its usage and instances as of its last heartbeat).
//!
//! A worker holds no cluster state, so it finds instances in its own assignments, and it
//! serves only control-plane certificates that were not revoked (the leader sends the
//! revoked serials with every heartbeat answer): another worker's certificate gets 403 (a
//! compromised worker cannot read its neighbours' logs or run commands in their
//! containers), and every other route answers `not_leader` with where the leader is, so a
//! client pointed at a worker learns where to go. `/metrics` also takes a metrics token
//! (`katcall create token --metrics`: it reads `/metrics` and nothing else), so a Prometheus
//! scrapes every node with one; no other token, not even the admin's, since a worker runs
//! untrusted workloads. Tokens live in the cluster's store, which a worker does not hold, so
//! the leader says what a token is ([`TokenCheck`]); its answer is remembered for
//! [`TOKEN_MEMORY`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use kat_api::wire::{ErrorCode, InstanceRecord};
use kat_api::WorkloadKey;
use kat_pki::NodeRole;
use tokio::sync::watch;

use kat_node::exec_logs::InstanceAccess;

use super::streams::{self, StreamSource};
use super::{
    bearer, client_node, rate_limit_key, rate_limited, unauthorized, ApiError, ClientAddr,
    ClientSerial, RateLimiter,
};

/// How long a worker remembers the leader's answer for a token (a deleted token keeps
/// reading a worker's metrics this long at most); a refusal is remembered a fifth of it.
pub const TOKEN_MEMORY: Duration = Duration::from_secs(30);
/// At most this many tokens remembered; when full the table starts afresh.
const TOKENS_REMEMBERED: usize = 256;

/// The seam between a worker and the leader for bearer tokens: whether `token` is a
/// metrics token (`Ok(false)`: any other or none; `Err`: the leader could not say).
#[async_trait::async_trait]
pub trait TokenCheck: Send + Sync {
    async fn is_metrics_token(&self, token: &str) -> Result<bool, String>;
}

/// The leader's answers about tokens, by the SHA-256 of the token (a worker keeps no
/// token in memory): a metrics token or not, and since when.
#[derive(Default)]
pub struct TokenAnswers {
    answers: Mutex<HashMap<[u8; 32], (bool, Instant)>>,
}

impl TokenAnswers {
    fn lookup(&self, key: &[u8; 32], now: Instant) -> Option<bool> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let (allowed, at) = answers.get(key)?;
        let memory = if *allowed {
            TOKEN_MEMORY
        } else {
            TOKEN_MEMORY / 5
        };
        (now.duration_since(*at) < memory).then_some(*allowed)
    }

    fn remember(&self, key: [u8; 32], allowed: bool, now: Instant) {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if answers.len() >= TOKENS_REMEMBERED {
            // Refusals and expired answers go first: a flood of made-up tokens does not push
            // out a scraper's.
            answers.retain(|_, (allowed, at)| *allowed && now.duration_since(*at) < TOKEN_MEMORY);
            if answers.len() >= TOKENS_REMEMBERED {
                answers.clear();
            }
        }
        answers.insert(key, (allowed, now));
    }

    /// Whether `token` may read this node's metrics (a metrics token): remembered, else
    /// asked of `check`.
    pub async fn allowed(&self, check: &dyn TokenCheck, token: &str) -> Result<bool, String> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(allowed) = self.lookup(&key, Instant::now()) {
            return Ok(allowed);
        }
        let allowed = check.is_metrics_token(token).await?;
        self.remember(key, allowed, Instant::now());
        Ok(allowed)
    }
}

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
    /// Asks the leader about a bearer token on `/metrics`.
    pub tokens: Arc<dyn TokenCheck>,
    pub token_answers: TokenAnswers,
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
        // A metrics token, for the metrics only: the leader says what the token is.
        None if path == "/metrics" => {
            let Some(token) = bearer(&req).map(str::to_string) else {
                return unauthorized().into_response();
            };
            match state.token_answers.allowed(&*state.tokens, &token).await {
                Ok(true) => next.run(req).await,
                Ok(false) => ApiError::new(
                    ErrorCode::Unauthorized,
                    "a worker's /metrics takes a metrics token only (katcall create token --metrics): the leader does not know this one as such",
                )
                .into_response(),
                Err(e) => ApiError::new(
                    ErrorCode::Unavailable,
                    format!("cannot ask the leader about this token: {e}; try again"),
                )
                .into_response(),
            }
        }
        Some((node, NodeRole::Worker)) => ApiError::forbidden(format!(
            "node {node} is a worker: its certificate cannot read logs of or exec into node {}'s instances",
            state.node
        ))
        .into_response(),
        None => unauthorized().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Says yes to "good", no to anything else, and counts the questions.
    #[derive(Default)]
    struct Leader {
        asked: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl TokenCheck for Leader {
        async fn is_metrics_token(&self, token: &str) -> Result<bool, String> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            match token {
                "down" => Err("no leader".into()),
                t => Ok(t == "good"),
            }
        }
    }

    /// The leader is asked once per token while its answer is remembered; an answer that
    /// could not be had is not remembered; the table stays bounded, and a flood of refused
    /// tokens does not push out an allowed one.
    #[tokio::test]
    async fn answers_are_remembered_and_bounded() {
        let (leader, answers) = (Leader::default(), TokenAnswers::default());
        assert_eq!(answers.allowed(&leader, "good").await, Ok(true));
        assert_eq!(answers.allowed(&leader, "good").await, Ok(true));
        assert_eq!(answers.allowed(&leader, "bad").await, Ok(false));
        assert_eq!(answers.allowed(&leader, "bad").await, Ok(false));
        assert_eq!(leader.asked.load(Ordering::SeqCst), 2);
        assert!(answers.allowed(&leader, "down").await.is_err());
        assert!(answers.allowed(&leader, "down").await.is_err());
        assert_eq!(leader.asked.load(Ordering::SeqCst), 4);
        for i in 0..TOKENS_REMEMBERED * 2 {
            let _ = answers.allowed(&leader, &format!("t{i}")).await;
        }
        assert!(answers.answers.lock().unwrap().len() <= TOKENS_REMEMBERED);
        let asked = leader.asked.load(Ordering::SeqCst);
        assert_eq!(answers.allowed(&leader, "good").await, Ok(true));
        assert_eq!(
            leader.asked.load(Ordering::SeqCst),
            asked,
            "good was pushed out"
        );
    }

    /// An answer is remembered for TOKEN_MEMORY (a refusal a fifth of it), then asked again.
    #[test]
    fn answers_expire() {
        let answers = TokenAnswers::default();
        let now = Instant::now();
        answers.remember([1; 32], true, now);
        answers.remember([2; 32], false, now);
        let later = now + TOKEN_MEMORY / 5 + Duration::from_millis(1);
        assert_eq!(answers.lookup(&[1; 32], later), Some(true));
        assert_eq!(answers.lookup(&[2; 32], later), None);
        assert_eq!(answers.lookup(&[1; 32], now + TOKEN_MEMORY), None);
    }
}
