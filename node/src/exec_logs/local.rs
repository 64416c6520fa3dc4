//! Logs and exec of this node's instances for the API ([`InstanceAccess`] on the local
//! runtime). The instance's newest container is found by its labels.

use std::sync::Arc;
use std::time::Duration;

use super::{AccessError, ExecInput, ExecOutput, ExecSession, InstanceAccess, LogQuery};
use kat_api::wire::{ExecRequest, InstanceRecord, LogLine};
use kat_api::WorkloadKey;
use kat_runtime::async_pipe::AsyncPipe;
use kat_runtime::{ContainerRuntime, ExecOptions, LogOptions, LogStream};
use tokio::sync::mpsc;

use crate::kept_logs::KeptLogs;
use crate::supervisor::builds::{BuildLog, Builds};
use kat_runtime::labels;

/// Logs and exec of the instances this node runs, answered from its runtime.
pub struct LocalAccess {
    /// This node's name: an instance of another node is refused.
    pub node: kat_api::wire::NodeName,
    /// The runtime the instances' containers run in.
    pub runtime: Arc<dyn ContainerRuntime>,
    /// This node's builds, whose output a [`LogQuery`] with `build` reads.
    pub builds: Builds,
    /// Logs of finished instances kept after their containers went ([`crate::kept_logs`]).
    pub kept: Option<KeptLogs>,
}

impl LocalAccess {
    /// The instance's newest container, or with `previous` the one before it.
    async fn container_of(
        &self,
        record: &InstanceRecord,
        previous: bool,
    ) -> Result<String, AccessError> {
        if record.node != self.node {
            return Err(AccessError::Unavailable(format!(
                "instance {} runs on node {}; streams from other nodes are not supported yet",
                record.instance_id, record.node
            )));
        }
        let containers = self
            .runtime
            .list()
            .await
            .map_err(|e| AccessError::Unavailable(e.to_string()))?;
        let mut attempts: Vec<(u32, String)> = containers
            .into_iter()
            .filter(|c| {
                c.labels
                    .get(labels::INSTANCE)
                    .is_some_and(|l| *l == record.instance_id)
            })
            .map(|c| (labels::attempt(&c.labels), c.id))
            .collect();
        attempts.sort_by_key(|a| std::cmp::Reverse(a.0));
        let wanted = attempts.into_iter().nth(usize::from(previous));
        wanted.map(|(_, id)| id).ok_or_else(|| {
            AccessError::NotFound(if previous {
                format!(
                    "instance {} has not been restarted on this node: there is no previous container (drop --previous)",
                    record.instance_id
                )
            } else {
                format!(
                    "instance {} has no container yet (see `katcall describe workload {}`)",
                    record.instance_id, record.workload
                )
            })
        })
    }
}

impl LocalAccess {
    /// The kept log of `record`'s instance, if this node kept one for that workload.
    async fn kept_log(
        &self,
        record: &InstanceRecord,
        options: LogOptions,
    ) -> Option<Result<kat_runtime::logs::LogReceiver, AccessError>> {
        let kept = self.kept.as_ref()?;
        let meta = kept.meta(&record.instance_id).await?;
        if meta.namespace != record.namespace || meta.workload != record.workload {
            return None;
        }
        let stream = kept.stream(&record.instance_id, options)?;
        Some(stream.map_err(|e| AccessError::Failed(e.to_string())))
    }

    /// The output of the newest build of the instance's workload on this node; with
    /// `follow`, until that build ends.
    async fn build_logs(
        &self,
        record: &InstanceRecord,
        query: LogQuery,
    ) -> Result<mpsc::Receiver<LogLine>, AccessError> {
        if record.node != self.node {
            return Err(AccessError::Unavailable(format!(
                "instance {} runs on node {}, not {}",
                record.instance_id, record.node, self.node
            )));
        }
        // Without a build in memory it reads the log directory: blocking.
        let (builds, ns, wl) = (
            self.builds.clone(),
            record.namespace.clone(),
            record.workload.clone(),
        );
        let log = tokio::task::spawn_blocking(move || builds.log_of(&ns, &wl))
            .await
            .map_err(|e| AccessError::Failed(e.to_string()))?
            .ok_or_else(|| {
                AccessError::NotFound(format!(
                    "{}/{} has no build on node {}: its image came from the build cache or was built before this agent started",
                    record.namespace, record.workload, record.node
                ))
            })?;
        let written = tokio::fs::try_exists(&log.path).await.unwrap_or(false);
        if log.phase.is_none() && !written {
            return Err(AccessError::NotFound(format!(
                "the newest build of {}/{} on node {} ran no buildah: its image came from the build cache, or it failed before building (see `katcall describe workload {}`)",
                record.namespace, record.workload, record.node, record.workload
            )));
        }
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(stream_build_log(log, query.follow, query.tail, tx));
        Ok(rx)
    }
}

/// Sends a build log's lines, the last `tail` of them first; with `follow`, what is added
/// until the build ends.
async fn stream_build_log(
    log: BuildLog,
    follow: bool,
    tail: Option<usize>,
    tx: mpsc::Sender<LogLine>,
) {
    let BuildLog { path, mut phase } = log;
    let mut offset = 0u64;
    let mut pending = String::new();
    let mut first = true;
    loop {
        let running = phase.is_some();
        if let Ok(bytes) = read_from(&path, offset).await {
            offset += bytes.len() as u64;
            pending.push_str(&String::from_utf8_lossy(&bytes));
        }
        let mut lines: Vec<String> = Vec::new();
        while let Some(end) = pending.find('\n') {
            lines.push(pending[..end].to_string());
            pending.drain(..=end);
        }
        if !running && !pending.is_empty() {
            lines.push(std::mem::take(&mut pending));
        }
        if first {
            if let Some(n) = tail {
                lines.drain(..lines.len().saturating_sub(n));
            }
            first = false;
        }
        let time = kat_api::wire::Timestamp::now().to_string();
        for text in lines {
            let line = LogLine {
                time: time.clone(),
                stream: "stdout".into(),
                partial: false,
                text,
            };
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if !follow || !running {
            return;
        }
        if let Some(p) = phase.as_mut() {
            tokio::select! {
                changed = p.changed() => if changed.is_err() { phase = None },
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = tx.closed() => return,
            }
        }
    }
}

async fn read_from(path: &std::path::Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).await?;
    Ok(bytes)
}

#[async_trait::async_trait]
impl InstanceAccess for LocalAccess {
    async fn logs(
        &self,
        record: &InstanceRecord,
        query: LogQuery,
    ) -> Result<mpsc::Receiver<LogLine>, AccessError> {
        if query.build {
            return self.build_logs(record, query).await;
        }
        let options = LogOptions {
            follow: query.follow,
            since: query.since,
            tail: query.tail,
        };
        let mut records = match self.container_of(record, query.previous).await {
            Ok(id) => self
                .runtime
                .logs(&id, options)
                .await
                .map_err(|e| AccessError::Failed(e.to_string()))?,
            // No container left: a finished instance whose log was kept.
            Err(AccessError::NotFound(why)) if !query.previous => {
                match self.kept_log(record, options).await {
                    Some(r) => r?,
                    None => return Err(AccessError::NotFound(why)),
                }
            }
            Err(e) => return Err(e),
        };
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            while let Some(r) = records.recv().await {
                let line = LogLine {
                    time: r.time,
                    stream: match r.stream {
                        LogStream::Stdout => "stdout".into(),
                        LogStream::Stderr => "stderr".into(),
                    },
                    partial: r.partial,
                    text: r.text,
                };
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }

    async fn kept(&self, key: &WorkloadKey, id: &str) -> Option<InstanceRecord> {
        let meta = self.kept.as_ref()?.meta(id).await?;
        if meta.namespace != key.namespace || meta.workload != key.name {
            return None;
        }
        // Only what streaming its log reads: which instance, of what, on this node.
        Some(InstanceRecord {
            instance_id: meta.instance_id,
            namespace: meta.namespace,
            workload: meta.workload,
            node: self.node.clone(),
            generation: 0,
            spec_hash: String::new(),
            workload_type: kat_api::workload::WorkloadType::Job,
            requests: Default::default(),
            job_run: None,
            created_at: meta.kept_at,
            ip: None,
            host_ports: vec![],
            gpus: vec![],
        })
    }

    async fn exec(
        &self,
        record: &InstanceRecord,
        request: ExecRequest,
    ) -> Result<ExecSession, AccessError> {
        let id = match self.container_of(record, false).await {
            Ok(id) => id,
            Err(AccessError::NotFound(why)) => {
                let kept = match &self.kept {
                    Some(k) => k.meta(&record.instance_id).await.is_some(),
                    None => false,
                };
                return Err(AccessError::NotFound(if kept {
                    format!(
                        "instance {} has finished: there is no container to exec into (its output: `katcall logs {}/{}`)",
                        record.instance_id, record.workload, record.instance_id
                    )
                } else {
                    why
                }));
            }
            Err(e) => return Err(e),
        };
        let size = match (request.rows, request.cols) {
            (Some(r), Some(c)) => Some((r, c)),
            _ => None,
        };
        let mut handle = self
            .runtime
            .exec(
                &id,
                ExecOptions {
                    command: request.command,
                    tty: request.tty,
                    size,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| AccessError::Failed(e.to_string()))?;
        let (in_tx, mut in_rx) = mpsc::channel::<ExecInput>(64);
        let (out_tx, out_rx) = mpsc::channel::<ExecOutput>(64);

        // Every pipe on the reactor first; if one cannot be, the process goes (it would
        // otherwise run on with nobody reading or writing it).
        let pipes = (|| -> std::io::Result<_> {
            let pty = match handle.pty.take() {
                Some(pty) => Some(Arc::new(AsyncPipe::new(pty)?)),
                None => None,
            };
            let outputs: Vec<(Arc<AsyncPipe>, bool)> = match &pty {
                Some(pty) => vec![(pty.clone(), false)],
                None => [(handle.stdout.take(), false), (handle.stderr.take(), true)]
                    .into_iter()
                    .filter_map(|(f, err)| Some((f?, err)))
                    .map(|(f, err)| Ok((Arc::new(AsyncPipe::new(f)?), err)))
                    .collect::<std::io::Result<_>>()?,
            };
            let stdin: Option<Arc<AsyncPipe>> = match (&pty, handle.stdin.take()) {
                (Some(pty), _) => Some(pty.clone()),
                (None, Some(f)) => Some(Arc::new(AsyncPipe::new(f)?)),
                (None, None) => None,
            };
            Ok((pty, outputs, stdin))
        })();
        let (pty, outputs, mut stdin) = match pipes {
            Ok(pipes) => pipes,
            Err(e) => {
                handle.kill_tree();
                return Err(AccessError::Failed(format!("the exec's pipes: {e}")));
            }
        };
        // Output: a task per stream on the reactor, ending at EOF (a terminal's master
        // reads EIO once the process is gone: the end too, once confirmed).
        let tty = pty.is_some();
        let mut readers = Vec::new();
        for (pipe, is_stderr) in outputs {
            let tx = out_tx.clone();
            readers.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let read = if tty {
                        pipe.read_terminal(&mut buf).await
                    } else {
                        pipe.read(&mut buf).await
                    };
                    match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let chunk = buf[..n].to_vec();
                            let msg = if is_stderr {
                                ExecOutput::Stderr(chunk)
                            } else {
                                ExecOutput::Stdout(chunk)
                            };
                            if tx.send(msg).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }));
        }
        // Input: stdin bytes, close and resize.
        // A write to a process that never reads its stdin waits once the pipe is full: a
        // task waiting for the descriptor to be writable, never a blocked thread.
        tokio::spawn(async move {
            while let Some(input) = in_rx.recv().await {
                match input {
                    ExecInput::Stdin(bytes) => {
                        if let Some(f) = stdin.as_ref() {
                            if f.write_all(&bytes).await.is_err() {
                                stdin = None;
                            }
                        }
                    }
                    ExecInput::CloseStdin => {
                        if tty {
                            // A terminal has no end of input; send ^D instead.
                            if let Some(f) = stdin.as_ref() {
                                let _ = f.write_all(&[4]).await;
                            }
                        } else {
                            stdin = None;
                        }
                    }
                    ExecInput::Resize { rows, cols } => {
                        if let Some(p) = &pty {
                            if let Err(e) = kat_runtime::exec::resize_pty(p.file(), rows, cols) {
                                tracing::debug!(error = %e, "exec resize failed");
                            }
                        }
                    }
                }
            }
        });
        // Exit: after the process ends and its output is drained. A client that goes away
        // (its connection closed, so the session's output is dropped) takes the process and
        // everything it started with it: an exec never outlives its `katcall`.
        tokio::spawn(async move {
            let code = tokio::select! {
                code = handle.wait() => code.unwrap_or(-1),
                () = out_tx.closed() => {
                    tracing::info!(pid = handle.pid, "exec client gone; killing its process tree");
                    handle.kill_tree();
                    handle.wait().await.unwrap_or(-1)
                }
            };
            drop(handle);
            for r in readers {
                let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
            }
            let _ = out_tx.send(ExecOutput::Exit(code)).await;
        });
        Ok(ExecSession {
            input: in_tx,
            output: out_rx,
        })
    }
}
