//! The etcd server a KAT node owns: started, health-checked, restarted, stopped.
//!
//! The agent runs etcd as a child process rather than embedding it (there is no Rust etcd
//! server). [`EtcdServer::start`] launches the `etcd` binary with the data directory and URLs
//! from `cluster.kat`, waits until `/health` says so, and hands the process to a supervisor
//! task: if etcd dies it is restarted with exponential backoff (200 ms doubling to 10 s,
//! reset after a minute of good health) on the same data directory, so no state is lost.
//! [`EtcdServer::stop`] sends SIGTERM and SIGKILL after a grace period.
//!
//! etcd gets `PR_SET_PDEATHSIG(SIGTERM)`, so it does not outlive a crashed agent and hold the
//! ports and data directory against the agent's restart.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client as ec;
use kat_api::cluster::ClusterSpec;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::EtcdTls;

#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error("cannot start etcd ({binary}): {source}; install it with `apt-get install etcd-server` or set the etcd binary path")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("etcd did not become healthy at {url} within {timeout:?}; see its log at {log}")]
    Unhealthy {
        url: String,
        timeout: Duration,
        log: PathBuf,
    },
    #[error("etcd exited during start-up with {status}; see its log at {log}")]
    Exited { status: String, log: PathBuf },
}

#[derive(Debug, Clone)]
pub struct EtcdServerConfig {
    /// The etcd binary: `etcd` from PATH unless configured.
    pub binary: PathBuf,
    pub name: String,
    pub data_dir: PathBuf,
    /// `http://IP:PORT` clients use.
    pub client_url: String,
    pub peer_url: String,
    /// etcd's own log (stdout and stderr), appended across restarts.
    pub log_file: PathBuf,
    pub start_timeout: Duration,
    pub stop_timeout: Duration,
    /// Mutual TLS on the client and peer ports (KAT always; `None` only for tests and
    /// benchmarks of the store itself).
    pub tls: Option<EtcdTls>,
    /// Joining an existing cluster: its `--initial-cluster` (every member's `name=peerURL`,
    /// this one included). `None` starts a new one-member cluster. Either is read only when
    /// the data directory is empty; afterwards etcd knows its members.
    pub join: Option<String>,
}

impl EtcdServerConfig {
    /// A single-member cluster on `ip` with the ports of `cluster.kat`, mutual TLS with
    /// `tls`, storing its data and log under `state_dir` (`state_dir/etcd`, `etcd.log`).
    pub fn from_cluster(
        spec: &ClusterSpec,
        name: &str,
        ip: &str,
        state_dir: &Path,
        tls: EtcdTls,
    ) -> Self {
        EtcdServerConfig {
            binary: PathBuf::from("etcd"),
            name: name.to_string(),
            data_dir: state_dir.join("etcd"),
            client_url: format!("https://{ip}:{}", spec.etcd_client_port),
            peer_url: format!("https://{ip}:{}", spec.etcd_peer_port),
            log_file: state_dir.join("etcd.log"),
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            tls: Some(tls),
            join: None,
        }
    }

    /// A single-member etcd on loopback with free ports, its data and log under `dir`: for
    /// tests, benchmarks and trying KAT out. The binary is `$ETCD_BIN` or `etcd` from PATH.
    pub fn loopback(name: &str, dir: &Path) -> std::io::Result<Self> {
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
        };
        Ok(EtcdServerConfig {
            binary: std::env::var_os("ETCD_BIN")
                .map_or_else(|| PathBuf::from("etcd"), PathBuf::from),
            name: name.to_string(),
            data_dir: dir.join("etcd"),
            client_url: format!("http://127.0.0.1:{}", port()?),
            peer_url: format!("http://127.0.0.1:{}", port()?),
            log_file: dir.join("etcd.log"),
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(5),
            tls: None,
            join: None,
        })
    }

    /// As [`EtcdServerConfig::loopback`], with mutual TLS.
    pub fn loopback_tls(name: &str, dir: &Path, tls: EtcdTls) -> std::io::Result<Self> {
        let mut c = Self::loopback(name, dir)?;
        c.client_url = c.client_url.replace("http://", "https://");
        c.peer_url = c.peer_url.replace("http://", "https://");
        c.tls = Some(tls);
        Ok(c)
    }

    /// The advertised client URL, and loopback on the same port for the node's own agent.
    fn listen_client_urls(&self) -> String {
        let loopback = self.client_url.rsplit_once(':').map(|(scheme_host, port)| {
            let scheme = scheme_host.split("://").next().unwrap_or("https");
            format!("{scheme}://127.0.0.1:{port}")
        });
        match loopback {
            Some(l) if l != self.client_url => format!("{},{l}", self.client_url),
            _ => self.client_url.clone(),
        }
    }

    fn command(&self) -> Result<Command, EtcdServerError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| EtcdServerError::Io { path, source }
        };
        std::fs::create_dir_all(&self.data_dir).map_err(io(&self.data_dir))?;
        // etcd refuses a data directory readable by others.
        std::fs::set_permissions(
            &self.data_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(io(&self.data_dir))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .map_err(io(&self.log_file))?;
        let log_err = log.try_clone().map_err(io(&self.log_file))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.listen_client_urls())
            .arg("--advertise-client-urls")
            .arg(&self.client_url)
            .arg("--listen-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-cluster")
            .arg(
                self.join
                    .clone()
                    .unwrap_or_else(|| format!("{}={}", self.name, self.peer_url)),
            )
            .arg("--initial-cluster-state")
            .arg(if self.join.is_some() {
                "existing"
            } else {
                "new"
            })
            .arg("--initial-cluster-token")
            .arg(format!("kat-{}", self.name))
            // Keep an hour of history for watchers that resume; older revisions are compacted.
            .arg("--auto-compaction-mode")
            .arg("periodic")
            .arg("--auto-compaction-retention")
            .arg("1h")
            .args(self.tls.iter().flat_map(EtcdTls::server_args))
            .env(
                "ETCD_UNSUPPORTED_ARCH",
                std::env::consts::ARCH
                    .replace("x86_64", "amd64")
                    .replace("aarch64", "arm64"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        Ok(cmd)
    }
}

/// Health and restarts of a supervised etcd, for metrics.
#[derive(Clone)]
pub struct EtcdHealth {
    shared: Arc<Mutex<Shared>>,
    client_url: String,
    tls: Option<EtcdTls>,
}

impl EtcdHealth {
    pub fn restarts(&self) -> u32 {
        self.shared.lock().map(|s| s.restarts).unwrap_or(0)
    }

    /// Whether `/health` reports healthy right now.
    pub async fn is_healthy(&self) -> bool {
        health(&self.client_url, self.tls.as_ref()).await
    }
}

/// A running, supervised etcd.
pub struct EtcdServer {
    config: EtcdServerConfig,
    shared: Arc<Mutex<Shared>>,
    stop_tx: watch::Sender<bool>,
    supervisor: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    pid: Option<u32>,
    restarts: u32,
}

impl EtcdServer {
    /// Start etcd and wait until it is healthy.
    pub async fn start(config: EtcdServerConfig) -> Result<Self, EtcdServerError> {
        let mut child = config
            .command()?
            .spawn()
            .map_err(|source| EtcdServerError::Spawn {
                binary: config.binary.clone(),
                source,
            })?;
        let shared = Arc::new(Mutex::new(Shared {
            pid: child.id(),
            restarts: 0,
        }));
        if let Err(e) = wait_healthy(&config, &mut child).await {
            let _ = child.kill().await;
            return Err(e);
        }
        tracing::info!(url = %config.client_url, data_dir = %config.data_dir.display(), "etcd is healthy");
        let (stop_tx, stop_rx) = watch::channel(false);
        let supervisor = tokio::spawn(supervise(config.clone(), child, shared.clone(), stop_rx));
        Ok(EtcdServer {
            config,
            shared,
            stop_tx,
            supervisor: Some(supervisor),
        })
    }

    pub fn client_url(&self) -> &str {
        &self.config.client_url
    }

    pub fn config(&self) -> &EtcdServerConfig {
        &self.config
    }

    /// The current process id (changes when the supervisor restarts etcd).
    pub fn pid(&self) -> Option<u32> {
        self.shared.lock().map(|s| s.pid).unwrap_or(None)
    }

    /// How many times etcd was restarted after dying.
    pub fn restarts(&self) -> u32 {
        self.shared.lock().map(|s| s.restarts).unwrap_or(0)
    }

    /// A handle that reports this etcd's health and restarts from another task.
    pub fn health_probe(&self) -> EtcdHealth {
        EtcdHealth {
            shared: self.shared.clone(),
            client_url: self.config.client_url.clone(),
            tls: self.config.tls.clone(),
        }
    }

    /// Whether `/health` reports healthy right now.
    pub async fn is_healthy(&self) -> bool {
        health(&self.config.client_url, self.config.tls.as_ref()).await
    }

    /// Wait until etcd is healthy again (e.g. after a restart), up to `timeout`.
    pub async fn wait_until_healthy(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.is_healthy().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Stop etcd: SIGTERM, then SIGKILL after the stop timeout. Waits for the process to exit.
    pub async fn stop(mut self) {
        let _ = self.stop_tx.send(true);
        if let Some(supervisor) = self.supervisor.take() {
            let _ = supervisor.await;
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Without an explicit stop, do not leave etcd running behind us.
        if self.supervisor.is_some() {
            let _ = self.stop_tx.send(true);
            if let Some(pid) = self.pid() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
    }
}

async fn wait_healthy(config: &EtcdServerConfig, child: &mut Child) -> Result<(), EtcdServerError> {
    let deadline = Instant::now() + config.start_timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(EtcdServerError::Exited {
                status: status.to_string(),
                log: config.log_file.clone(),
            });
        }
        if health(&config.client_url, config.tls.as_ref()).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(EtcdServerError::Unhealthy {
                url: config.client_url.clone(),
                timeout: config.start_timeout,
                log: config.log_file.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn supervise(
    config: EtcdServerConfig,
    mut child: Child,
    shared: Arc<Mutex<Shared>>,
    mut stop: watch::Receiver<bool>,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(200);
    const MAX_BACKOFF: Duration = Duration::from_secs(10);
    let mut backoff = MIN_BACKOFF;
    let mut started = Instant::now();
    loop {
        let exited = tokio::select! {
            status = child.wait() => Some(status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())),
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(exited) = exited else {
            terminate(&mut child, config.stop_timeout).await;
            if let Ok(mut s) = shared.lock() {
                s.pid = None;
            }
            return;
        };
        if started.elapsed() > Duration::from_secs(60) {
            backoff = MIN_BACKOFF;
        }
        tracing::warn!(status = %exited, ?backoff, log = %config.log_file.display(), "etcd exited; restarting");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let spawned = config.command().and_then(|mut c| {
            c.spawn().map_err(|source| EtcdServerError::Spawn {
                binary: config.binary.clone(),
                source,
            })
        });
        match spawned {
            Ok(new_child) => {
                child = new_child;
                started = Instant::now();
                if let Ok(mut s) = shared.lock() {
                    s.pid = child.id();
                    s.restarts += 1;
                }
            }
            // The old child is already reaped, so wait() returns at once and we retry.
            Err(e) => tracing::error!(error = %e, "cannot restart etcd; retrying"),
        }
    }
}

async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
        tracing::warn!(pid, "etcd did not stop after SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

/// Whether etcd at `url` serves a linearizable read within 2 s: it is up, reachable with
/// this identity, and part of a quorum with a leader (what `etcdctl endpoint health` checks).
async fn health(url: &str, tls: Option<&EtcdTls>) -> bool {
    let attempt = async {
        let mut options = ec::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(2));
        if let Some(tls) = tls {
            options = options.with_tls(tls.client_options().ok()?);
        }
        let mut client = ec::Client::connect([url], Some(options)).await.ok()?;
        client.get("/kat/health", None).await.ok().map(|_| true)
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
