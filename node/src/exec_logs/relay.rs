//! Logs and exec of instances on *other* nodes: this node's API proxies to the API of the
//! node that runs the instance, over mutual TLS (this node's certificate, the cluster CA as
//! the only trusted root). The other node accepts a node certificate for exactly these two
//! routes (the route table's `Access::OwnNode`) and answers from its own runtime, so TTY,
//! resize, stdin, exit codes and `logs -f` behave as on one node.

use kat_client::paths::{self, Stream};
use kat_client::{Client, ClientError};
use reqwest::{Method, StatusCode};
use std::sync::Arc;

use super::{AccessError, ExecInput, ExecOutput, ExecSession, InstanceAccess, LogQuery};
use kat_api::exec_stream::{Decoder, Frame};
use kat_api::keys;
use kat_api::wire::{ExecRequest, InstanceRecord, LogLine, NodeRegistration};
use kat_store::StateStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::LocalAccess;

/// Logs and exec of any instance of the cluster: answered here for this node's, relayed to
/// the API of the node that runs the others.
pub struct ClusterAccess {
    /// Answers for the instances this node runs.
    pub local: LocalAccess,
    /// The cluster state, where the other nodes' registrations (their addresses) are read.
    pub store: Arc<dyn StateStore>,
    /// The port every node's API listens on (`apiPort`).
    pub api_port: u32,
    /// HTTPS with this node's certificate, trusting the cluster CA only.
    pub client: reqwest::Client,
}

impl ClusterAccess {
    /// A request for `record`'s `stream` to the node that runs it.
    async fn request(
        &self,
        record: &InstanceRecord,
        method: Method,
        stream: Stream,
    ) -> Result<(Client, reqwest::RequestBuilder), AccessError> {
        let kv = self
            .store
            .get(&keys::node_registration(&record.node))
            .await
            .map_err(|e| AccessError::Unavailable(e.to_string()))?
            .ok_or_else(|| {
                AccessError::Unavailable(format!("node {} is not registered", record.node))
            })?;
        let reg: NodeRegistration = kat_store::decode(&kv)
            .map_err(|e| AccessError::Unavailable(format!("node {}: {e}", record.node)))?;
        let address = reg.addresses.first().ok_or_else(|| {
            AccessError::Unavailable(format!("node {} has no address", record.node))
        })?;
        let base = format!(
            "https://{}:{}",
            kat_api::wire::url_host(address),
            self.api_port
        );
        let path = paths::instance_stream(
            &record.namespace,
            &record.workload,
            &record.instance_id,
            stream,
        );
        let client = Client::new(self.client.clone(), &base, None);
        let request = client.request(method, &path);
        Ok((client, request))
    }
}

fn unreachable(node: &str, e: impl std::fmt::Display) -> AccessError {
    AccessError::Unavailable(format!("cannot reach node {node}: {e}"))
}

/// Why the other node gave no stream.
fn refused(node: &str, e: ClientError) -> AccessError {
    let message = match &e {
        ClientError::Refused {
            message,
            code: Some(_),
            ..
        } => message.clone(),
        // Not KAT's answer (a proxy's, an empty body): its status says more than its body.
        ClientError::Refused { status, .. } => status.to_string(),
        e => e.to_string(),
    };
    match e {
        ClientError::Unreachable { .. } => unreachable(node, e),
        e if e.status() == Some(StatusCode::NOT_FOUND) => AccessError::NotFound(message),
        e if e.status() == Some(StatusCode::BAD_REQUEST) => AccessError::Failed(message),
        _ => AccessError::Unavailable(format!("node {node}: {message}")),
    }
}

#[async_trait::async_trait]
impl InstanceAccess for ClusterAccess {
    async fn kept(&self, key: &kat_api::WorkloadKey, id: &str) -> Option<InstanceRecord> {
        self.local.kept(key, id).await
    }

    async fn logs(
        &self,
        record: &InstanceRecord,
        query: LogQuery,
    ) -> Result<mpsc::Receiver<LogLine>, AccessError> {
        if record.node == self.local.node {
            return self.local.logs(record, query).await;
        }
        let mut params: Vec<(&str, String)> = vec![
            ("follow", query.follow.to_string()),
            ("previous", query.previous.to_string()),
            ("build", query.build.to_string()),
        ];
        if let Some(tail) = query.tail {
            params.push(("tail", tail.to_string()));
        }
        if let Some(since) = query.since {
            params.push(("since", humantime::format_rfc3339_nanos(since).to_string()));
        }
        let (client, request) = self.request(record, Method::GET, Stream::Logs).await?;
        let response = client
            .send(request.query(&params))
            .await
            .map_err(|e| refused(&record.node, e))?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let mut response = response;
            let mut pending: Vec<u8> = Vec::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    // A line of another node's answer, not a stored record.
                    #[allow(clippy::disallowed_methods)]
                    let decoded = serde_json::from_slice::<LogLine>(&line);
                    if let Ok(l) = decoded {
                        if tx.send(l).await.is_err() {
                            return; // the client went: dropping the response ends the stream
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    async fn exec(
        &self,
        record: &InstanceRecord,
        request: ExecRequest,
    ) -> Result<ExecSession, AccessError> {
        if record.node == self.local.node {
            return self.local.exec(record, request).await;
        }
        let (client, upgrade) = self.request(record, Method::POST, Stream::Exec).await?;
        let response = client
            .send(
                upgrade
                    .header("connection", "upgrade")
                    .header("upgrade", kat_api::exec_stream::PROTOCOL),
            )
            .await
            .map_err(|e| refused(&record.node, e))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(AccessError::Unavailable(format!(
                "node {} answered an exec with {}, not an upgrade",
                record.node,
                response.status()
            )));
        }
        let upgraded = response
            .upgrade()
            .await
            .map_err(|e| unreachable(&record.node, e))?;
        let (mut reader, mut writer) = tokio::io::split(upgraded);
        let start = serde_json::to_vec(&request)
            .map_err(|e| AccessError::Failed(format!("exec request: {e}")))?;
        writer
            .write_all(&Frame::Start(start).encode())
            .await
            .map_err(|e| unreachable(&record.node, e))?;
        let (in_tx, mut in_rx) = mpsc::channel::<ExecInput>(64);
        let (out_tx, out_rx) = mpsc::channel::<ExecOutput>(64);
        // Session input → frames to the other node; ends when the session's sender goes.
        tokio::spawn(async move {
            while let Some(input) = in_rx.recv().await {
                let frame = match input {
                    ExecInput::Stdin(b) => Frame::Stdin(b),
                    ExecInput::CloseStdin => Frame::CloseStdin,
                    ExecInput::Resize { rows, cols } => Frame::Resize { rows, cols },
                };
                if writer.write_all(&frame.encode()).await.is_err() {
                    return;
                }
            }
            let _ = writer.shutdown().await;
        });
        // Frames from the other node → session output, until Exit, an error or the close.
        // When the client goes, `out_tx` fails and the task ends, which closes the connection:
        // the other node then kills the process tree (an exec never outlives its client).
        tokio::spawn(async move {
            let mut decoder = Decoder::default();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                while let Ok(Some(frame)) = decoder.next_frame() {
                    let out = match frame {
                        Frame::Stdout(b) => ExecOutput::Stdout(b),
                        Frame::Stderr(b) => ExecOutput::Stderr(b),
                        Frame::Exit(code) => {
                            let _ = out_tx.send(ExecOutput::Exit(code)).await;
                            return;
                        }
                        Frame::Error(message) => {
                            let _ = out_tx.send(ExecOutput::Stderr(message.into_bytes())).await;
                            let _ = out_tx.send(ExecOutput::Exit(126)).await;
                            return;
                        }
                        _ => continue,
                    };
                    if out_tx.send(out).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    read = reader.read(&mut buf) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => decoder.push(&buf[..n]),
                    },
                    // The client is gone while the command is silent.
                    () = out_tx.closed() => return,
                }
            }
        });
        Ok(ExecSession {
            input: in_tx,
            output: out_rx,
        })
    }
}
