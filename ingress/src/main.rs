//! `kat-ingress`: the updater of the ingress recipe (`examples/ingress/`). It runs Caddy as
//! its child, follows the cluster's workload events (`GET /v1alpha1/events?watch=true`: one
//! is written with a workload's record when it is created, updated, rolled back or deleted)
//! and on each reads the
//! ingress routes (`GET /v1alpha1/ingress`, every VirtualLoadBalancer's `spec.ingress`) with
//! a read-only token, and again every `--interval` should an event be missed; when they
//! changed it writes Caddy's configuration and loads it through Caddy's admin endpoint on
//! loopback: a graceful reload, connections under way are not dropped. If Caddy exits, so
//! does the updater (its container restarts under its restartPolicy).
//!
//! It connects as `katcall` does, from a client config file (endpoint, cluster CA, token):
//! give it one with a token from `katcall create token --read-only`, which can read and
//! nothing else.

mod caddy;
mod caddyfile;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use kat_api::client_config::ClientConfig;
use kat_api::wire::{Event, IngressRoute};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Keeps a Caddy configured from the cluster's ingress routes"
)]
struct Args {
    /// A katcall client config (endpoint, caCertificate, token) holding a read-only token
    /// (`katcall create token --read-only`).
    #[arg(
        long,
        env = "KAT_INGRESS_CONFIG",
        value_name = "FILE",
        required_unless_present = "check"
    )]
    config: Option<PathBuf>,
    /// Only check that Caddy answers on its admin endpoint (the recipe's health check):
    /// exit 0 if it does, 1 if not.
    #[arg(long)]
    check: bool,
    /// Caddy's binary.
    #[arg(long, default_value = "/usr/bin/caddy")]
    caddy: PathBuf,
    /// Where the Caddyfile and Caddy's data (its certificates) are kept.
    #[arg(long, default_value = "/var/lib/kat-ingress", value_name = "DIR")]
    dir: PathBuf,
    #[arg(long, default_value_t = 80)]
    http_port: u16,
    #[arg(long, default_value_t = 443)]
    https_port: u16,
    /// Caddy's admin endpoint: keep it on loopback.
    #[arg(long, default_value = "127.0.0.1:2019")]
    admin: String,
    /// How often to read the routes without a workload event saying they may have changed.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    interval: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    if args.check {
        return match caddy::answers(&args.admin).await {
            true => std::process::ExitCode::SUCCESS,
            false => std::process::ExitCode::FAILURE,
        };
    }
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kat-ingress: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let config = args
        .config
        .as_deref()
        .context("--config FILE is required")?;
    let client = client(config, Some(Duration::from_secs(10)))?;
    // The event stream lasts: no deadline for the whole answer.
    let changes = std::sync::Arc::new(tokio::sync::Notify::new());
    tokio::spawn(follow_workload_events(
        client_for_streams(config)?,
        changes.clone(),
    ));
    let listen = caddyfile::Listen {
        http_port: args.http_port,
        https_port: args.https_port,
        admin: args.admin.clone(),
    };
    tokio::fs::create_dir_all(&args.dir)
        .await
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let (first, _) = caddyfile::render(&[], &listen);
    let mut caddy = caddy::Caddy::start(&args.caddy, &args.dir, &first, &args.admin).await?;
    let mut loaded: Option<Vec<IngressRoute>> = Some(Vec::new());
    let mut tick = tokio::time::interval(Duration::from_secs(args.interval.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            exit = caddy.exited() => anyhow::bail!("caddy exited ({exit})"),
            _ = tick.tick() => {}
            _ = changes.notified() => {}
        }
        let routes: Vec<IngressRoute> = match client.get_json(&kat_client::paths::ingress()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ingress routes; keeping the current ones");
                continue;
            }
        };
        if loaded.as_ref() == Some(&routes) {
            continue;
        }
        let (text, shadowed) = caddyfile::render(&routes, &listen);
        for r in &shadowed {
            tracing::warn!(host = %r.host, path = %r.path, workload = %format!("{}/{}", r.namespace, r.workload), "another workload already has this host and path; ignored");
        }
        match caddy.load(&text).await {
            Ok(()) => {
                tracing::info!(routes = routes.len(), "caddy configuration loaded");
                loaded = Some(routes);
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "caddy refused the configuration; keeping the one it runs");
                loaded = None;
            }
        }
    }
}

/// The events that say a workload's desired state (and so its ingress rules) changed.
const CHANGES: [&str; 4] = [
    "WorkloadCreated",
    "WorkloadUpdated",
    "WorkloadDeleted",
    "WorkloadRolledBack",
];

/// Wake `changes` whenever an event says a workload changed (and once each time the stream
/// is opened: events may have been missed while it was not). A stream that ends is opened
/// again 2 s later; one that cannot be opened (the API away, the token refused), after a
/// wait that doubles up to a minute, said once until it works again.
async fn follow_workload_events(
    client: kat_client::Client,
    changes: std::sync::Arc<tokio::sync::Notify>,
) {
    let query = kat_client::admin::EventQuery {
        resource_type: Some("Workload".into()),
        limit: Some(1),
        ..Default::default()
    };
    let mut wait = Duration::from_secs(2);
    let mut failing = false;
    loop {
        match client.watch_events(&query).await {
            Ok(mut stream) => {
                if failing {
                    tracing::info!("following workload events again");
                }
                (failing, wait) = (false, Duration::from_secs(2));
                changes.notify_one();
                let mut pending: Vec<u8> = Vec::new();
                loop {
                    match stream.chunk().await {
                        Ok(Some(chunk)) => {
                            pending.extend_from_slice(&chunk);
                            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = pending.drain(..=end).collect();
                                let event = serde_json::from_slice::<Event>(&line);
                                if event.is_ok_and(|e| CHANGES.contains(&e.reason.as_str())) {
                                    changes.notify_one();
                                }
                            }
                            // A line longer than any event: not an event stream.
                            if pending.len() > 1 << 20 {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "the workload event stream ended");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %format!("{e:#}"), "cannot follow workload events; reading the routes every --interval meanwhile");
                }
                failing = true;
                wait = (wait * 2).min(Duration::from_secs(60));
            }
        }
        tokio::time::sleep(wait).await;
    }
}

/// The API client for streams (no deadline for a whole answer; 5 s to connect).
fn client_for_streams(path: &std::path::Path) -> Result<kat_client::Client> {
    client(path, None)
}

/// The API client from a katcall config file; `timeout` bounds a whole request.
fn client(path: &std::path::Path, timeout: Option<Duration>) -> Result<kat_client::Client> {
    let config = ClientConfig::load(path)?;
    // TCP keepalive: a stream the network dropped without a word is noticed.
    let mut http = kat_client::https::admin(&config.ca_certificate, config.node_api.as_deref())
        .with_context(|| {
            format!(
                "{}: caCertificate is not a usable PEM certificate",
                path.display()
            )
        })?
        .tcp_keepalive(Duration::from_secs(30));
    if let Some(t) = timeout {
        http = http.timeout(t);
    }
    let http = http.build().context("building the HTTPS client")?;
    Ok(kat_client::Client::new(
        http,
        &config.endpoint,
        Some(config.token),
    ))
}
