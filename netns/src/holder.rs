//! The node network holder: the process that owns a node's network namespaces.
//!
//! An unprivileged agent has no network of its own to give containers, so it makes one (the
//! shape of rootlesskit's "detached network namespace", checked step by step in
//! `docs/networking.md`): a **node user namespace** (the agent's uid is root there, its
//! subordinate ids are `1..`; a root agent maps every id to itself) and in it a **node
//! network namespace** with the bridge `kat0` carrying the node's address, forwarding on,
//! and `slirp4netns` for egress. Every container's own user and network namespaces are then
//! created as children of the node user namespace ([`crate::attach`]), so the agent, owner of
//! their ancestor, may join and configure them without any privilege.
//!
//! Two processes hold it, started by the agent and outliving it (a restarted agent adopts
//! them, so running containers keep their network):
//! - the **keeper** (a fork that made the namespaces and then only waits), whose
//!   `/proc/PID/ns/{user,net}` are the node namespaces;
//! - the **holder** (`PROGRAM __kat-netns-holder REQUEST`, single-threaded), which maps the
//!   keeper's ids, configures the namespace, runs and restarts `slirp4netns`, and exits,
//!   taking the keeper with it, once its record (`holder.json`) is gone or names another
//!   holder: removing the node's data directory is enough to stop it.

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use crate::ip::{in_namespaces, run_ip_batch};
use crate::overlay::{Overlay, MTU, TUN_DEVICE};

/// The first argument that makes a program the holder.
pub const HOLDER_ARG: &str = "__kat-netns-holder";

/// The bridge every container of the node is attached to.
pub const BRIDGE: &str = "kat0";
/// slirp4netns's device in the node network namespace.
pub const EGRESS_DEVICE: &str = "tap0";
/// MTU of the egress device (slirp4netns is fastest with a large one).
const EGRESS_MTU: u32 = 65520;

/// What the agent asks of a holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderRequest {
    /// Where the holder keeps its record and log.
    pub dir: PathBuf,
    /// The node's subnet; its first address goes on the bridge.
    pub subnet: Ipv4Net,
    /// The whole cluster network: containers' traffic to anything else is NATed out.
    pub cluster_cidr: Ipv4Net,
    /// An unprivileged agent's subordinate ids `(uid start, count, gid start, count)`,
    /// mapped from 1 in the node user namespace; `None` for a root agent (identity).
    pub subordinate: Option<(u32, u32, u32, u32)>,
    /// Egress through slirp4netns.
    pub egress: bool,
    /// The overlay's UDP port on the host (`wireguardPort`); `None`: no overlay.
    #[serde(default)]
    pub overlay_port: Option<u16>,
}

/// What a running holder wrote (`holder.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderRecord {
    pub holder_pid: i32,
    /// The process whose namespaces are the node's.
    pub keeper_pid: i32,
    pub subnet: Ipv4Net,
    pub cluster_cidr: Ipv4Net,
    /// Why there is no egress, if there is none.
    pub egress_problem: Option<String>,
    /// The node's WireGuard public key (base64), when the overlay runs.
    #[serde(default)]
    pub public_key: Option<String>,
    /// Why there is no overlay, if there is none.
    #[serde(default)]
    pub overlay_problem: Option<String>,
}

pub(crate) const RECORD_FILE: &str = "holder.json";
pub(crate) const LOG_FILE: &str = "holder.log";
/// The keeper's socket service ([`crate::node_sockets`]).
pub(crate) const SOCKETS_FILE: &str = "node-sockets.sock";

/// The holder's `main`.
pub(crate) fn main(request: &str) -> ExitCode {
    crate::run_request::<HolderRequest>(HOLDER_ARG, request, run)
}

fn run(request: &HolderRequest) -> Result<(), String> {
    let socket_path = request.dir.join(SOCKETS_FILE);
    let _ = fs::remove_file(&socket_path);
    let keeper = make_keeper(&socket_path)?;
    let (mut slirp, mut overlay) = match set_up(request, &keeper) {
        Ok(parts) => parts,
        Err(e) => {
            let _ = kill(keeper.pid, Signal::SIGKILL);
            let _ = waitpid(keeper.pid, None);
            return Err(e);
        }
    };
    // The agent waits for this line (the record is then complete).
    println!("ready {}", keeper.pid.as_raw());
    let _ = std::io::stdout().flush();
    let record_path = request.dir.join(RECORD_FILE);
    let me = std::process::id() as i32;
    let mut slirp_restarts: Vec<Instant> = Vec::new();
    let mut last_check = Instant::now();
    loop {
        match overlay.as_mut() {
            Some(o) => o.step(Duration::from_millis(100)),
            None => std::thread::sleep(Duration::from_millis(500)),
        }
        if last_check.elapsed() < Duration::from_millis(500) {
            continue;
        }
        last_check = Instant::now();
        let ours = read_record(&request.dir).is_some_and(|r| r.holder_pid == me);
        if !ours {
            eprintln!(
                "the record {} is gone or names another holder: stopping",
                record_path.display()
            );
            break;
        }
        if let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(keeper.pid, Some(WaitPidFlag::WNOHANG))
        {
            eprintln!("the namespace keeper {} ended: stopping", keeper.pid);
            let _ = fs::remove_file(&record_path);
            break;
        }
        if let Some(child) = slirp.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                // Restart, but not in a tight loop: at most 5 times a minute.
                slirp_restarts.retain(|t| t.elapsed() < Duration::from_secs(60));
                eprintln!("slirp4netns ended ({status}); restarting");
                slirp = None;
                if slirp_restarts.len() < 5 {
                    slirp_restarts.push(Instant::now());
                    slirp = start_slirp(keeper.pid).map_err(|e| eprintln!("{e}")).ok();
                }
            }
        }
    }
    if let Some(mut child) = slirp {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = kill(keeper.pid, Signal::SIGKILL);
    let _ = waitpid(keeper.pid, None);
    let _ = fs::remove_file(&socket_path);
    Ok(())
}

/// The keeper, as its parent sees it.
struct Keeper {
    pid: Pid,
    /// The keeper's messages ("u": namespaces made, "s": serving sockets, else an error).
    from: OwnedFd,
    /// One byte here says the keeper's ids are mapped.
    to: OwnedFd,
}

/// Forks the keeper: it unshares a user and a network namespace, says so, waits until its
/// ids are mapped, then serves sockets made in its namespaces on `socket_path`
/// ([`crate::node_sockets`]) until the holder goes (the parent-death signal).
fn make_keeper(socket_path: &Path) -> Result<Keeper, String> {
    let (from_r, from_w) = cloexec_pipe()?;
    let (to_r, to_w) = cloexec_pipe()?;
    // SAFETY: the holder is single-threaded (a fresh exec of the agent's binary that starts
    // no thread before this), so the child may run any code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(from_r);
            drop(to_w);
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            if let Err(e) = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET) {
                let _ = nix::unistd::write(&from_w, format!("unshare: {e}").as_bytes());
                // SAFETY: leaving the forked child without the parent's destructors.
                unsafe { nix::libc::_exit(1) }
            }
            let _ = nix::unistd::write(&from_w, b"u");
            let mut byte = [0u8; 1];
            if nix::unistd::read(to_r.as_raw_fd(), &mut byte) != Ok(1) {
                // SAFETY: as above.
                unsafe { nix::libc::_exit(1) }
            }
            match std::os::unix::net::UnixListener::bind(socket_path) {
                Ok(listener) => {
                    let _ = nix::unistd::write(&from_w, b"s");
                    drop(from_w);
                    crate::node_sockets::serve(listener)
                }
                Err(e) => {
                    let message = format!("binding {}: {e}", socket_path.display());
                    let _ = nix::unistd::write(&from_w, message.as_bytes());
                    // SAFETY: as above.
                    unsafe { nix::libc::_exit(1) }
                }
            }
        }
        ForkResult::Parent { child } => {
            drop(from_w);
            drop(to_r);
            let keeper = Keeper {
                pid: child,
                from: from_r,
                to: to_w,
            };
            if let Err(e) = expect(&keeper.from, "u") {
                let _ = waitpid(child, None);
                return Err(format!(
                    "creating the node's user and network namespaces: {e}"
                ));
            }
            Ok(keeper)
        }
    }
}

/// Reads one message from a forked helper and checks it is `expected`.
pub(crate) fn expect(from: &OwnedFd, expected: &str) -> Result<(), String> {
    let mut buffer = [0u8; 512];
    let n = nix::unistd::read(from.as_raw_fd(), &mut buffer).unwrap_or(0);
    match std::str::from_utf8(&buffer[..n]).unwrap_or("?") {
        m if m == expected => Ok(()),
        "" => Err("the process ended".into()),
        m => Err(m.to_string()),
    }
}

/// Maps the keeper's ids, configures its network namespace, starts egress and the overlay,
/// lets the keeper serve sockets and writes the record. Returns slirp4netns and the
/// overlay, those that run.
fn set_up(
    request: &HolderRequest,
    keeper: &Keeper,
) -> Result<(Option<Child>, Option<Overlay>), String> {
    let pid = keeper.pid;
    map_ids(pid, request.subordinate)?;
    nix::unistd::write(&keeper.to, b"m").map_err(|e| format!("telling the keeper: {e}"))?;
    expect(&keeper.from, "s")?;
    let gateway = crate::node::gateway_of(&request.subnet)?;
    run_ip_batch(
        Some(pid),
        &[
            "link set lo up".to_string(),
            format!(
                // A fixed hardware address (a bridge without one takes the lowest of its
                // ports' addresses, so a container's veth coming or going would change the
                // gateway's MAC under every other container).
                "link add {BRIDGE} address {} type bridge",
                crate::neighbour::format_mac(crate::neighbour::mac_for(gateway))
            ),
            format!(
                "addr add {gateway}/{} dev {BRIDGE}",
                request.subnet.prefix_len()
            ),
            format!("link set {BRIDGE} up"),
        ],
    )?;
    // Per-namespace sysctls: forwarding for the containers, and no port is privileged in
    // the node namespace (the agent serves DNS on port 53 there).
    in_namespaces(
        pid,
        "sh",
        &[
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start",
        ],
    )?;
    let (slirp, egress_problem) = if request.egress {
        match start_egress(request, pid) {
            Ok(child) => (Some(child), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, Some("egress is off".to_string()))
    };
    let (overlay, public_key, overlay_problem) = match request.overlay_port {
        Some(port) => match start_overlay(request, pid, port) {
            Ok((overlay, key)) => (Some(overlay), Some(key), None),
            Err(e) => (None, None, Some(e)),
        },
        None => (None, None, Some("the overlay is off".to_string())),
    };
    let record = HolderRecord {
        holder_pid: std::process::id() as i32,
        keeper_pid: pid.as_raw(),
        subnet: request.subnet,
        cluster_cidr: request.cluster_cidr,
        egress_problem,
        public_key,
        overlay_problem,
    };
    let json = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
    let path = request.dir.join(RECORD_FILE);
    let tmp = request.dir.join(format!("{RECORD_FILE}.tmp"));
    fs::write(&tmp, json)
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok((slirp, overlay))
}

/// The overlay's TUN device (made by the keeper, in the node namespace), its route, the
/// node's key pair and the UDP socket.
fn start_overlay(
    request: &HolderRequest,
    keeper: Pid,
    port: u16,
) -> Result<(Overlay, String), String> {
    let tun = crate::node_sockets::request_tun(&request.dir.join(SOCKETS_FILE)).map_err(|e| {
        format!("creating the overlay's TUN device (is /dev/net/tun usable by this user?): {e}")
    })?;
    run_ip_batch(
        Some(keeper),
        &[
            format!("link set {TUN_DEVICE} mtu {MTU} up"),
            format!("route add {} dev {TUN_DEVICE}", request.cluster_cidr),
        ],
    )?;
    let (_, public) = crate::overlay::load_or_make_key(&request.dir)?;
    let overlay = Overlay::new(&request.dir, request.subnet, tun, port)?;
    Ok((overlay, crate::overlay::encode_key(&public)))
}

/// Writes the node user namespace's maps: everything to itself for a root agent; else the
/// agent's own ids to 0 and its subordinate ranges from 1, with newuidmap/newgidmap.
fn map_ids(keeper: Pid, subordinate: Option<(u32, u32, u32, u32)>) -> Result<(), String> {
    let pid = keeper.as_raw().to_string();
    match subordinate {
        None => {
            for file in ["uid_map", "gid_map"] {
                let path = format!("/proc/{pid}/{file}");
                fs::write(&path, "0 0 4294967295\n").map_err(|e| format!("writing {path}: {e}"))?;
            }
            Ok(())
        }
        Some((uid_start, uid_count, gid_start, gid_count)) => {
            let uid = nix::unistd::geteuid().as_raw().to_string();
            let gid = nix::unistd::getegid().as_raw().to_string();
            for (tool, own, start, count) in [
                ("newuidmap", &uid, uid_start, uid_count),
                ("newgidmap", &gid, gid_start, gid_count),
            ] {
                let output = Command::new(tool)
                    .args([pid.as_str(), "0", own, "1", "1"])
                    .arg(start.to_string())
                    .arg(count.to_string())
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("running {tool} (package uidmap): {e}"))?;
                if !output.status.success() {
                    return Err(format!(
                        "{tool} for the node user namespace: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    ));
                }
            }
            Ok(())
        }
    }
}

/// NAT for containers' traffic leaving the cluster network, then slirp4netns.
fn start_egress(request: &HolderRequest, keeper: Pid) -> Result<Child, String> {
    let cidr = request.cluster_cidr.to_string();
    in_namespaces(
        keeper,
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            &cidr,
            "!",
            "-d",
            &cidr,
            "-o",
            EGRESS_DEVICE,
            "-j",
            "MASQUERADE",
        ],
    )
    .map_err(|e| format!("{e} (egress needs iptables and the kernel's NAT)"))?;
    start_slirp(keeper)
}

/// The flags that confine slirp4netns itself, those the installed one knows: it parses every
/// packet containers send out, so a flaw in it must not reach the host. `--enable-sandbox`:
/// its own mount namespace with only what it needs (`/etc`, `/run` read-only), no
/// capabilities; `--enable-seccomp`: a syscall filter (Seccomp: 2 in its
/// `/proc/PID/status`). Both exist since slirp4netns 0.4 (Debian 12 ships 1.2.0).
fn slirp_hardening() -> &'static [&'static str] {
    static FLAGS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    FLAGS.get_or_init(|| {
        let help = Command::new("slirp4netns")
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .map(|o| {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text
            })
            .unwrap_or_default();
        let flags: Vec<&'static str> = ["--enable-sandbox", "--enable-seccomp"]
            .into_iter()
            .filter(|f| help.contains(f))
            .collect();
        if flags.len() < 2 {
            eprintln!(
                "slirp4netns does not offer --enable-sandbox and --enable-seccomp (only {flags:?}): egress runs less confined; install slirp4netns 0.4 or later"
            );
        }
        flags
    })
}

/// slirp4netns on the node namespace: `tap0` with 10.0.2.100 and the default route; the
/// host's loopback is not reachable through it (a container must not reach the agent's or
/// etcd's loopback listeners). Confined by [`slirp_hardening`]; should it fail to start so
/// (a host where it cannot make its mount namespace), it starts without, and says so in the
/// holder's log, rather than leave containers without egress.
fn start_slirp(keeper: Pid) -> Result<Child, String> {
    let hardening = slirp_hardening();
    match spawn_slirp(keeper, hardening) {
        Err(e) if !hardening.is_empty() => {
            eprintln!(
                "slirp4netns failed with {hardening:?} ({e}); starting it without its sandbox and seccomp filter"
            );
            spawn_slirp(keeper, &[])
        }
        result => result,
    }
}

fn spawn_slirp(keeper: Pid, hardening: &[&str]) -> Result<Child, String> {
    let pid = keeper.as_raw();
    let (ready_r, ready_w) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let mut child = Command::new("slirp4netns")
        .args([
            "--configure",
            &format!("--mtu={EGRESS_MTU}"),
            "--disable-host-loopback",
        ])
        .args(hardening)
        .args([
            &format!("--ready-fd={}", ready_w.as_raw_fd()),
            // By the keeper's pid (its user and network namespaces are the node's), not by
            // namespace paths: an unprivileged slirp4netns sets up its sandbox as root of
            // the target's user namespace, which it finds only from a pid (with
            // `--netns-type=path` it fails with "setegid(0)").
            &pid.to_string(),
            EGRESS_DEVICE,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting slirp4netns (package slirp4netns) for egress: {e}"))?;
    drop(ready_w);
    // slirp4netns writes "1" once tap0 is configured; EOF means it ended.
    let mut answer = [0u8; 1];
    let got = nix::unistd::read(ready_r.as_raw_fd(), &mut answer).unwrap_or(0);
    if got != 1 || answer[0] != b'1' {
        let status = child.wait().map_err(|e| e.to_string())?;
        return Err(format!(
            "slirp4netns ended ({status}) before its device was up (is /dev/net/tun usable by this user? `kat-agent setup --dry-run` checks)"
        ));
    }
    Ok(child)
}

/// A pipe whose ends a program we start does not inherit (a fork still does).
pub(crate) fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))
}

/// Reads a holder's record, if there is one.
pub(crate) fn read_record(dir: &Path) -> Option<HolderRecord> {
    fs::read(dir.join(RECORD_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}
