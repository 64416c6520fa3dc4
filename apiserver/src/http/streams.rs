//! Logs and exec: streams from the node that runs an instance.
//!
//! The service layer finds the instance's record and hands the stream to [`InstanceAccess`]. On a
//! one-node cluster the agent implements it with its own runtime; with more nodes it will
//! proxy to the owning agent. Logs are JSON lines ([`LogLine`]); exec runs over an HTTP
//! upgrade with the framing of [`kat_api::exec_stream`].

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use kat_api::exec_stream::{Decoder, Frame};
use kat_api::wire::{ErrorCode, ExecRequest, InstanceRecord};
use kat_api::WorkloadKey;
use kat_node::exec_logs::{
    AccessError, ExecInput, ExecOutput, ExecSession, InstanceAccess, LogQuery,
};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ApiError, ApiState};

/// The protocol name in the `Upgrade` header of an exec request.
pub const EXEC_PROTOCOL: &str = kat_api::exec_stream::PROTOCOL;

impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> Self {
        let code = match e {
            AccessError::NotFound(_) => ErrorCode::NotFound,
            AccessError::Unavailable(_) => ErrorCode::Unavailable,
            AccessError::Failed(_) => ErrorCode::BadRequest,
        };
        ApiError::new(code, e.to_string())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    #[serde(default)]
    follow: bool,
    /// RFC 3339 time or a duration back from now (`10m`, `1h30m`).
    since: Option<String>,
    tail: Option<usize>,
    #[serde(default)]
    previous: bool,
    #[serde(default)]
    build: bool,
}

fn parse_since(text: &str, now: SystemTime) -> Result<SystemTime, ApiError> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(t);
    }
    humantime::parse_duration(text)
        .map(|d| now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
        .map_err(|_| {
            ApiError::bad_request(format!(
                "since: {text:?} is neither an RFC 3339 time nor a duration like 10m"
            ))
        })
}

/// Where the stream routes find an instance and reach the node that runs it: the full API
/// (the cluster store) or a worker's own API (the node's assignments).
#[async_trait::async_trait]
pub trait StreamSource: Send + Sync + 'static {
    async fn instance(&self, key: &WorkloadKey, id: &str) -> Result<InstanceRecord, ApiError>;
    fn access(&self) -> Arc<dyn InstanceAccess>;
    fn now(&self) -> SystemTime;
}

#[async_trait::async_trait]
impl StreamSource for ApiState {
    async fn instance(&self, key: &WorkloadKey, id: &str) -> Result<InstanceRecord, ApiError> {
        self.service.instance(key, id).await
    }

    fn access(&self) -> Arc<dyn InstanceAccess> {
        self.access.clone()
    }

    fn now(&self) -> SystemTime {
        self.service.clock.wall()
    }
}

/// An instance's output as JSON lines (`katcall logs`), from the node that runs it.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/n/{ns}/workloads/{name}/instances/{id}/logs",
        tag = "instances",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name"), ("id" = String, Path, description = "Instance id"), ("follow" = Option<bool>, Query, description = "Keep streaming"), ("since" = Option<String>, Query, description = "RFC 3339 time or a duration such as 10m"), ("tail" = Option<usize>, Query, description = "Last lines only"), ("previous" = Option<bool>, Query, description = "The previous attempt's output"), ("build" = Option<bool>, Query, description = "The newest build's output (source.git)")),
        responses((status = 200, description = "JSON lines of LogLine", content_type = "application/x-ndjson", body = kat_api::wire::LogLine), super::openapi::Errors)
    )
)]
pub async fn logs<S: StreamSource>(
    State(state): State<Arc<S>>,
    Path((ns, name, id)): Path<(String, String, String)>,
    params: Result<Query<LogsParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| {
        ApiError::bad_request(format!(
            "{e} (expected follow, since, tail, previous, build)"
        ))
    })?;
    let since = p
        .since
        .as_deref()
        .map(|s| parse_since(s, state.now()))
        .transpose()?;
    let record = state.instance(&WorkloadKey::new(ns, name), &id).await?;
    let rx = state
        .access()
        .logs(
            &record,
            LogQuery {
                follow: p.follow,
                since,
                tail: p.tail,
                previous: p.previous,
                build: p.build,
            },
        )
        .await?;
    Ok(super::ndjson_body(rx))
}

/// A command in an instance (`katcall exec`): an HTTP upgrade to `kat-exec.v1`, then frames.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        method(get, post),
        path = "/v1alpha1/n/{ns}/workloads/{name}/instances/{id}/exec",
        tag = "instances",
        params(("ns" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Workload name"), ("id" = String, Path, description = "Instance id")),
        responses((status = 101, description = "Switching to kat-exec.v1 frames (docs/api.md); the first frame is an ExecRequest"), super::openapi::Errors)
    )
)]
pub async fn exec<S: StreamSource>(
    State(state): State<Arc<S>>,
    Path((ns, name, id)): Path<(String, String, String)>,
    mut req: Request,
) -> Result<Response, ApiError> {
    let wants_upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(EXEC_PROTOCOL));
    if !wants_upgrade {
        return Err(ApiError::bad_request(format!(
            "exec needs `Connection: upgrade` and `Upgrade: {EXEC_PROTOCOL}` (use `katcall exec`)"
        )));
    }
    let record = state.instance(&WorkloadKey::new(ns, name), &id).await?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    let access = state.access();
    // A session opened with a scoped token ends when the token is deleted.
    let life = req.extensions().get::<crate::service::TokenLife>().cloned();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let revoked = async move {
                    match life {
                        Some(life) => life.revoked().await,
                        None => std::future::pending().await,
                    }
                };
                if let Err(e) = bridge(TokioIo::new(upgraded), access, record, revoked).await {
                    tracing::debug!(error = %e, "exec session ended with an error");
                }
            }
            Err(e) => tracing::warn!(error = %e, "exec upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(EXEC_PROTOCOL));
    Ok(response)
}

/// Carry frames between the client's connection and the exec session.
/// `revoked` resolves when the API token that opened the session is deleted: the client
/// then gets an Error frame, its connection is closed and the process killed.
async fn bridge<S>(
    stream: S,
    access: Arc<dyn InstanceAccess>,
    record: InstanceRecord,
    revoked: impl std::future::Future<Output = ()>,
) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::pin!(revoked);
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut decoder = Decoder::default();
    let mut buf = vec![0u8; 16 * 1024];
    // The first frame says what to run.
    let request: ExecRequest = loop {
        match decoder.next_frame() {
            Ok(Some(Frame::Start(json))) => match crate::decode_request(&json) {
                Ok(r) => break r,
                Err(e) => {
                    let msg = format!("exec request: {e}");
                    return writer.write_all(&Frame::Error(msg).encode()).await;
                }
            },
            Ok(Some(_)) => {
                let msg = "exec: the first frame must be Start".to_string();
                return writer.write_all(&Frame::Error(msg).encode()).await;
            }
            Ok(None) => {}
            Err(e) => {
                return writer
                    .write_all(&Frame::Error(e.to_string()).encode())
                    .await
            }
        }
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        decoder.push(&buf[..n]);
    };
    if request.command.is_empty() {
        let msg = "exec request: command: is empty (expected the program and its arguments)";
        return writer
            .write_all(&Frame::Error(msg.to_string()).encode())
            .await;
    }
    let session = match access.exec(&record, request).await {
        Ok(s) => s,
        Err(e) => {
            return writer
                .write_all(&Frame::Error(e.to_string()).encode())
                .await
        }
    };
    let ExecSession { input, mut output } = session;
    // Client → session. Ends `true` when the client is gone (its side of the connection
    // closed: katcall never half-closes, it sends CloseStdin frames).
    let mut pump_in = tokio::spawn(async move {
        loop {
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(_) => return false,
                };
                let msg = match frame {
                    Frame::Stdin(bytes) => ExecInput::Stdin(bytes),
                    Frame::CloseStdin => ExecInput::CloseStdin,
                    Frame::Resize { rows, cols } => ExecInput::Resize { rows, cols },
                    _ => continue,
                };
                if input.send(msg).await.is_err() {
                    return false;
                }
            }
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = input.send(ExecInput::CloseStdin).await;
                    return true;
                }
                Ok(n) => decoder.push(&buf[..n]),
            }
        }
    });
    // Session → client, until the process exits or the client goes; dropping `output` then
    // tells the node to kill the process tree (an exec never outlives its client).
    let mut listening = true;
    loop {
        let out = tokio::select! {
            out = output.recv() => out,
            () = &mut revoked => {
                tracing::info!("exec session ended: its API token was deleted");
                pump_in.abort();
                let msg = "the API token that opened this session was deleted".to_string();
                let _ = writer.write_all(&Frame::Error(msg).encode()).await;
                let _ = writer.shutdown().await;
                return Ok(());
            }
            gone = &mut pump_in, if listening => {
                listening = false;
                if gone.unwrap_or(true) {
                    return Ok(());
                }
                continue;
            }
        };
        let Some(out) = out else { break };
        let (frame, last) = match out {
            ExecOutput::Stdout(b) => (Frame::Stdout(b), false),
            ExecOutput::Stderr(b) => (Frame::Stderr(b), false),
            ExecOutput::Exit(code) => (Frame::Exit(code), true),
        };
        writer.write_all(&frame.encode()).await?;
        if last {
            break;
        }
    }
    writer.flush().await?;
    let _ = writer.shutdown().await;
    pump_in.abort();
    Ok(())
}
