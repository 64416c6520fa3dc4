//! `logs` and `exec`: streams from an instance.

use std::io::Write;

use anyhow::{bail, Context, Result};
use kat_api::exec_stream::{Decoder, Frame};
use kat_api::wire::{ExecRequest, LogLine, WorkloadObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::Client;

/// `WORKLOAD` or `WORKLOAD/INSTANCE` to (workload, instance); without an instance, the first
/// running one (said on stderr).
async fn resolve(client: &Client, target: &str, ns: &str) -> Result<(String, String)> {
    let (workload, instance) = match target.split_once('/') {
        Some((w, i)) => (w.to_string(), Some(i.to_string())),
        None => (target.to_string(), None),
    };
    if let Some(i) = instance {
        return Ok((workload, i));
    }
    let w = client.workload(ns, &workload).await?;
    let mut instances = w.status.instances;
    instances.sort_by_key(|i| {
        (
            i.state != kat_api::wire::InstanceState::Running,
            i.instance_id.clone(),
        )
    });
    let Some(first) = instances.first() else {
        // Nothing has a record now (a Job between runs): the last run's output, kept.
        let kept = crate::workloads::finished(client, ns, Some(&workload)).await?;
        let Some(last) = kept.last() else {
            bail!("workload {ns}/{workload} has no instances yet, and none that finished is kept (see `katcall describe workload {workload}`)");
        };
        let same_run = kept.iter().filter(|f| f.run() == last.run()).count();
        eprintln!(
            "katcall: {workload} has no instance now; showing {} ({:?}{}, finished {} ago on node {}){}",
            last.record.instance_id,
            last.state,
            last.exit_code
                .map(|c| format!(", exit code {c}"))
                .unwrap_or_default(),
            crate::output::age(Some(last.finished_at)),
            last.record.node,
            if same_run > 1 {
                format!("; its run had {same_run} instances (`katcall get instances --all`)")
            } else {
                String::new()
            }
        );
        return Ok((workload, last.record.instance_id.to_string()));
    };
    if instances.len() > 1 {
        eprintln!(
            "katcall: {} has {} instances; using {} (name one with {workload}/INSTANCE)",
            workload,
            instances.len(),
            first.instance_id
        );
    }
    Ok((workload, first.instance_id.to_string()))
}

/// Which lines `katcall logs` asks for.
pub struct LogFilter {
    pub follow: bool,
    pub since: Option<String>,
    pub tail: Option<usize>,
    pub previous: bool,
    /// The newest build's output instead of the container's.
    pub build: bool,
}

/// For `logs --build WORKLOAD`: an instance on the node of the workload's newest build.
async fn resolve_build(client: &Client, target: &str, ns: &str) -> Result<(String, String)> {
    if target.contains('/') {
        return resolve(client, target, ns).await;
    }
    let w: WorkloadObject = client.workload(ns, target).await?;
    let newest = w
        .status
        .builds
        .iter()
        .max_by(|a, b| a.started_at.cmp(&b.started_at))
        .and_then(|b| b.node.clone());
    let on_node = newest.and_then(|node| {
        w.status
            .instances
            .iter()
            .find(|i| i.node.as_deref() == Some(node.as_str()))
    });
    match on_node {
        Some(i) => Ok((target.to_string(), i.instance_id.to_string())),
        None => resolve(client, target, ns).await,
    }
}

pub async fn logs(client: &Client, target: &str, ns: &str, filter: &LogFilter) -> Result<()> {
    let (workload, instance) = if filter.build {
        resolve_build(client, target, ns).await?
    } else {
        resolve(client, target, ns).await?
    };
    let mut query = vec![("follow", filter.follow.to_string())];
    if filter.previous {
        query.push(("previous", "true".to_string()));
    }
    if filter.build {
        query.push(("build", "true".to_string()));
    }
    if let Some(s) = &filter.since {
        humantime::parse_duration(s)
            .map(|_| ())
            .or_else(|_| humantime::parse_rfc3339_weak(s).map(|_| ()))
            .map_err(|_| {
                anyhow::anyhow!("--since {s:?}: expected a duration like 10m or an RFC 3339 time")
            })?;
        query.push(("since", s.to_string()));
    }
    if let Some(t) = filter.tail {
        query.push(("tail", t.to_string()));
    }
    let resp = client.logs(ns, &workload, &instance, &query).await?;
    let stdout = std::io::stdout();
    Client::json_lines(resp, |l: LogLine| {
        let mut out = stdout.lock();
        out.write_all(l.text.as_bytes())?;
        if !l.partial {
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    })
    .await
}

/// Run a command in an instance; returns its exit code.
pub async fn exec(
    client: &Client,
    target: &str,
    ns: &str,
    command: Vec<String>,
    stdin: bool,
    tty: bool,
) -> Result<i32> {
    let (workload, instance) = resolve(client, target, ns).await?;
    let terminal = tty.then(crate::terminal::RawMode::enter).transpose()?;
    let size = terminal.as_ref().and_then(|_| crate::terminal::size());
    let resp = client.exec(ns, &workload, &instance).await?;
    let upgraded = resp
        .upgrade()
        .await
        .context("the API did not switch to the exec protocol")?;
    let (mut reader, mut writer) = tokio::io::split(upgraded);
    let request = ExecRequest {
        command,
        tty,
        stdin,
        rows: size.map(|s| s.0),
        cols: size.map(|s| s.1),
    };
    writer
        .write_all(&Frame::Start(serde_json::to_vec(&request)?).encode())
        .await?;
    // stdin → frames (a blocking thread: tokio's stdin would keep the process alive).
    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Frame>(16);
    if stdin {
        let tx = in_tx.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 8192];
            let mut input = std::io::stdin();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.blocking_send(Frame::CloseStdin);
                        return;
                    }
                    Ok(n) => {
                        if tx.blocking_send(Frame::Stdin(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        let _ = in_tx.send(Frame::CloseStdin).await;
    }
    if tty {
        let tx = in_tx.clone();
        tokio::spawn(async move {
            let Ok(mut winch) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some((rows, cols)) = crate::terminal::size() {
                    if tx.send(Frame::Resize { rows, cols }).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
    drop(in_tx);
    let writer_task = tokio::spawn(async move {
        while let Some(frame) = in_rx.recv().await {
            if writer.write_all(&frame.encode()).await.is_err() {
                return;
            }
        }
    });
    let mut decoder = Decoder::default();
    let mut buf = vec![0u8; 16 * 1024];
    let code = 'outer: loop {
        while let Some(frame) = decoder.next_frame()? {
            match frame {
                Frame::Stdout(b) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Frame::Stderr(b) => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(&b)?;
                    err.flush()?;
                }
                Frame::Exit(code) => break 'outer Ok(code),
                Frame::Error(message) => break 'outer Err(anyhow::anyhow!("{message}")),
                _ => {}
            }
        }
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            break Err(anyhow::anyhow!(
                "the exec stream ended before the command's exit code"
            ));
        }
        decoder.push(&buf[..n]);
    };
    writer_task.abort();
    drop(terminal);
    code
}
