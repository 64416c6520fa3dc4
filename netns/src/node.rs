//! The agent's handle on its node network ([`crate::holder`]): start the holder or adopt a
//! running one, connect containers to it, and make sockets inside it.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use socket2::{Domain, Socket, Type};

use crate::attach::{attach, host_link_name, AttachRequest, Attachment, IdMapping};
use crate::holder::{
    read_record, HolderRecord, HolderRequest, HOLDER_ARG, LOG_FILE, RECORD_FILE, SOCKETS_FILE,
};
use crate::NetError;

/// The MTU of containers' links.
pub const CONTAINER_MTU: u32 = 1420;

/// How to make a node network.
#[derive(Clone, Debug)]
pub struct NodeNetworkConfig {
    /// The node's network directory (holder record and log).
    pub dir: PathBuf,
    /// The program that serves as holder and attach helper (the agent's own binary, which
    /// calls [`crate::run_if_requested`] first in `main`).
    pub helper: PathBuf,
    pub subnet: Ipv4Net,
    pub cluster_cidr: Ipv4Net,
    /// An unprivileged agent's subordinate ids `(uid start, count, gid start, count)`.
    pub subordinate: Option<(u32, u32, u32, u32)>,
    pub egress: bool,
    /// The overlay's UDP port (`wireguardPort`); `None`: no overlay.
    pub overlay_port: Option<u16>,
    /// Start the holder in a systemd scope of its own (`systemd-run --user --scope`): an
    /// agent that is a systemd service would otherwise take it along when it restarts (the
    /// service's processes are all stopped), and every container would lose its network.
    pub systemd_scope: bool,
}

/// A node network, running.
pub struct NodeNetwork {
    config: NodeNetworkConfig,
    record: HolderRecord,
}

/// The node's own address in `subnet`: its first host address.
pub fn gateway_of(subnet: &Ipv4Net) -> Result<Ipv4Addr, String> {
    subnet
        .hosts()
        .next()
        .ok_or_else(|| format!("subnet {subnet} has no host addresses"))
}

impl NodeNetwork {
    /// Adopts the holder a previous agent started for the same subnet, or starts one.
    /// Blocking (a few exec's).
    pub fn start(config: NodeNetworkConfig) -> Result<NodeNetwork, NetError> {
        let what = || "starting the node network".to_string();
        fs::create_dir_all(&config.dir)
            .and_then(|()| fs::set_permissions(&config.dir, fs::Permissions::from_mode(0o700)))
            .map_err(|e| NetError::new(what(), format!("{}: {e}", config.dir.display())))?;
        let record = match read_record(&config.dir) {
            Some(r)
                if alive(&r)
                    && r.subnet == config.subnet
                    && r.cluster_cidr == config.cluster_cidr =>
            {
                tracing::info!(keeper = r.keeper_pid, "adopted the running node network");
                r
            }
            previous => {
                if let Some(old) = previous.filter(alive) {
                    // Another subnet: the old holder goes (its record first, so it stops).
                    let _ = fs::remove_file(config.dir.join(RECORD_FILE));
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(old.holder_pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                spawn_holder(&config)?
            }
        };
        if let Some(problem) = &record.egress_problem {
            tracing::warn!("containers have no egress: {problem}");
        }
        if let (Some(problem), Some(_)) = (&record.overlay_problem, config.overlay_port) {
            tracing::warn!("no overlay to other nodes: {problem}");
        }
        Ok(NodeNetwork { config, record })
    }

    pub fn subnet(&self) -> Ipv4Net {
        self.config.subnet
    }

    /// The node's address on its bridge: containers' gateway and DNS server.
    pub fn gateway(&self) -> Ipv4Addr {
        gateway_of(&self.config.subnet).unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// Why containers cannot reach outside the cluster, if they cannot.
    pub fn egress_problem(&self) -> Option<&str> {
        self.record.egress_problem.as_deref()
    }

    /// The node's WireGuard public key, when the overlay runs.
    pub fn public_key(&self) -> Option<&str> {
        self.record.public_key.as_deref()
    }

    /// Why there is no overlay, if there is none.
    pub fn overlay_problem(&self) -> Option<&str> {
        self.record.overlay_problem.as_deref()
    }

    /// Tells the overlay which peers there are (blocking: a small file write).
    pub fn set_peers(&self, peers: &[crate::overlay::Peer]) -> std::io::Result<()> {
        crate::overlay::write_peers(&self.config.dir, peers)
    }

    /// What the overlay knows of its peers (blocking: a small file read).
    pub fn overlay_state(&self) -> Vec<crate::overlay::PeerState> {
        crate::overlay::read_state(&self.config.dir)
    }

    /// The process whose namespaces are the node's.
    pub fn keeper_pid(&self) -> i32 {
        self.record.keeper_pid
    }

    /// Whether the holder still runs.
    pub fn is_alive(&self) -> bool {
        alive(&self.record)
    }

    /// Makes a container's namespaces with `address` (in the node's subnet) and the given
    /// id mappings (host ids). Blocking.
    pub fn attach(
        &self,
        address: Ipv4Addr,
        uid_map: Vec<IdMapping>,
        gid_map: Vec<IdMapping>,
    ) -> Result<Attachment, NetError> {
        if !self.config.subnet.contains(&address) || address == self.gateway() {
            return Err(NetError::new(
                "connecting a container to the node network",
                format!(
                    "{address} is not a container address of this node's subnet {}",
                    self.config.subnet
                ),
            ));
        }
        let address = Ipv4Net::new(address, self.config.subnet.prefix_len())
            .map_err(|e| NetError::new("connecting a container", e))?;
        attach(
            &self.config.helper,
            &AttachRequest {
                keeper_pid: self.record.keeper_pid,
                uid_map,
                gid_map,
                address,
                gateway: self.gateway(),
                host_link: host_link_name(),
                mtu: CONTAINER_MTU,
            },
        )
    }

    /// A new socket inside the node network namespace, non-blocking (bind, listen and
    /// connect then work from anywhere: a socket keeps the namespace it was made in).
    pub async fn socket(&self, domain: Domain, ty: Type) -> std::io::Result<Socket> {
        let path = self.config.dir.join(SOCKETS_FILE);
        tokio::task::spawn_blocking(move || crate::node_sockets::request(&path, domain, ty))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Stops the holder and its namespaces (every container loses its network).
    pub fn remove(&self) {
        let _ = fs::remove_file(self.config.dir.join(RECORD_FILE));
    }
}

/// The holder and its keeper still run (checked by their command and parentage, since pids
/// are reused).
fn alive(r: &HolderRecord) -> bool {
    let cmdline = fs::read(format!("/proc/{}/cmdline", r.holder_pid)).unwrap_or_default();
    let is_holder = cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == HOLDER_ARG.as_bytes());
    let keeper_parent = fs::read_to_string(format!("/proc/{}/status", r.keeper_pid))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| {
                    l.strip_prefix("PPid:")
                        .map(|p| p.trim().parse::<i32>().ok())
                })
                .flatten()
        });
    is_holder && keeper_parent == Some(r.holder_pid)
}

fn spawn_holder(config: &NodeNetworkConfig) -> Result<HolderRecord, NetError> {
    let what = || "starting the node network holder".to_string();
    let request = HolderRequest {
        dir: config.dir.clone(),
        subnet: config.subnet,
        cluster_cidr: config.cluster_cidr,
        subordinate: config.subordinate,
        egress: config.egress,
        overlay_port: config.overlay_port,
    };
    let json = serde_json::to_string(&request).map_err(|e| NetError::new(what(), e))?;
    let log_path = config.dir.join(LOG_FILE);
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| NetError::new(what(), format!("{}: {e}", log_path.display())))?;
    let mut command = if config.systemd_scope {
        let mut c = Command::new("systemd-run");
        c.args([
            "--user",
            "--scope",
            "--quiet",
            "--collect",
            "--slice=kat.slice",
        ])
        .arg(format!("--unit=kat-network-{}", std::process::id()))
        .arg("--")
        .arg(&config.helper);
        c
    } else {
        Command::new(&config.helper)
    };
    let mut child = command
        .arg(HOLDER_ARG)
        .arg(json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Its own process group: a signal to the agent's group (Ctrl-C) leaves it running.
        .process_group(0)
        .spawn()
        .map_err(|e| NetError::new(what(), format!("running {}: {e}", config.helper.display())))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    // Reap it whenever it ends (we are its parent while we live).
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    if !line.starts_with("ready ") {
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        let last: Vec<&str> = log.lines().rev().take(3).collect();
        return Err(NetError::new(
            what(),
            format!(
                "{} (log {})",
                last.into_iter().rev().collect::<Vec<_>>().join("; "),
                log_path.display()
            ),
        ));
    }
    // The holder wrote its record before saying ready.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(r) = read_record(&config.dir) {
            return Ok(r);
        }
        if Instant::now() > deadline {
            return Err(NetError::new(
                what(),
                "the holder said ready but wrote no record",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The directory a node keeps its network state in, under its data directory.
pub fn network_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("network")
}
