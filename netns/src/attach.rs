//! A container's own user and network namespaces, made under the node's and linked to its
//! bridge, for the container to join (the runtime gives libcontainer their paths).
//!
//! `PROGRAM __kat-netns-attach REQUEST` (single-threaded: it joins a user namespace) enters
//! the node's namespaces, forks a **keeper** that unshares a user and a network namespace,
//! maps the keeper's ids (the workload's slice, translated into node ids), adds a veth pair
//! (the host end on `kat0`, the other as the container's `eth0`) and configures `lo`,
//! `eth0`, its address and the default route inside, by netlink
//! ([`crate::netlink`]). It then prints `ready PID` and holds
//! the namespaces until its standard input closes: by then the container's own processes
//! are in them. The veth pair goes away with the container's network namespace.
//!
//! `eth0`'s MAC is derived from the container's address and the container announces it
//! with gratuitous ARPs once it is up ([`crate::neighbour`]): a replacement instance that
//! takes over an address is reachable at once from the bridge and the node's other
//! containers.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};

use ipnet::Ipv4Net;
use kat_api::id_map::ProcIdMap;
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use crate::holder::{cloexec_pipe, expect, BRIDGE};
use crate::neighbour::{announce_repeatedly, mac_for};
use crate::netlink::{RouteSocket, VethEnd};
use crate::NetError;

/// The first argument that makes a program the attach helper.
pub const ATTACH_ARG: &str = "__kat-netns-attach";

/// `(container id, host id, count)`, as in `/proc/PID/uid_map`.
pub type IdMapping = (u32, u32, u32);

/// What a container's network is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachRequest {
    /// The node namespaces' keeper.
    pub keeper_pid: i32,
    /// The container's id mappings, with host ids.
    pub uid_map: Vec<IdMapping>,
    pub gid_map: Vec<IdMapping>,
    /// The container's address and its subnet's prefix.
    pub address: Ipv4Net,
    pub gateway: Ipv4Addr,
    /// The name of the veth end on the bridge.
    pub host_link: String,
    pub mtu: u32,
}

/// The namespaces of one container, held until dropped (after the container joined them).
pub struct Attachment {
    child: Child,
    stdin: Option<ChildStdin>,
    keeper: i32,
    node_keeper: i32,
}

impl Attachment {
    pub fn user_namespace(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/user", self.keeper))
    }

    pub fn network_namespace(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.keeper))
    }

    /// The node user namespace, parent of the container's.
    pub fn node_user_namespace(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/user", self.node_keeper))
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Starts the attach helper `program` for `request` and waits until the namespaces are
/// ready. Blocking.
pub fn attach(program: &Path, request: &AttachRequest) -> Result<Attachment, NetError> {
    let what = || {
        format!(
            "connecting a container to the node network ({})",
            request.address
        )
    };
    let json = serde_json::to_string(request).map_err(|e| NetError::new(what(), e))?;
    let mut child = Command::new(program)
        .arg(ATTACH_ARG)
        .arg(json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetError::new(what(), format!("running {}: {e}", program.display())))?;
    let stdin = child.stdin.take();
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    let keeper = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse::<i32>().ok());
    match keeper {
        Some(keeper) => Ok(Attachment {
            child,
            stdin,
            keeper,
            node_keeper: request.keeper_pid,
        }),
        None => {
            drop(stdin);
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let status = child.wait();
            Err(NetError::new(
                what(),
                match err.trim() {
                    "" => format!("the attach helper ended ({status:?})"),
                    text => text.to_string(),
                },
            ))
        }
    }
}

/// The attach helper's `main`.
pub(crate) fn main(request: &str) -> ExitCode {
    crate::run_request::<AttachRequest>(ATTACH_ARG, request, run)
}

fn run(r: &AttachRequest) -> Result<(), String> {
    let node = Pid::from_raw(r.keeper_pid);
    let uids = to_node_ids(node, "uid_map", &r.uid_map)?;
    let gids = to_node_ids(node, "gid_map", &r.gid_map)?;
    enter(node, "user", CloneFlags::CLONE_NEWUSER)?;
    enter(node, "net", CloneFlags::CLONE_NEWNET)?;

    let (ready_r, ready_w) = cloexec_pipe()?;
    let (hold_r, hold_w) = cloexec_pipe()?;
    // SAFETY: this helper is single-threaded (a fresh exec that starts no thread).
    let keeper = match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(ready_r);
            drop(hold_w);
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            let code = match unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET) {
                Ok(()) => {
                    let _ = nix::unistd::write(&ready_w, b"u");
                    let mut byte = [0u8; 1];
                    let _ = nix::unistd::read(hold_r.as_raw_fd(), &mut byte);
                    0
                }
                Err(e) => {
                    let _ = nix::unistd::write(&ready_w, format!("unshare: {e}").as_bytes());
                    1
                }
            };
            // SAFETY: leaving the forked child without the parent's destructors.
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_w);
    drop(hold_r);
    let result = (|| {
        expect(&ready_r, "u").map_err(|e| format!("creating the container's namespaces: {e}"))?;
        write_map(keeper, "uid_map", &uids)?;
        write_map(keeper, "gid_map", &gids)?;
        // eth0's MAC follows from its address: a replacement that takes over an address
        // keeps the neighbour entries others hold for it right.
        let bridge = nix::net::if_::if_nametoindex(BRIDGE)
            .map_err(|e| format!("finding the node bridge {BRIDGE}: {e}"))?;
        RouteSocket::open()?.add_veth(
            &VethEnd {
                name: &r.host_link,
                mtu: r.mtu,
                mac: None,
            },
            bridge,
            &VethEnd {
                name: "eth0",
                mtu: r.mtu,
                mac: Some(mac_for(r.address.addr())),
            },
            u32::try_from(keeper.as_raw()).map_err(|e| format!("the keeper's pid: {e}"))?,
        )?;
        enter(keeper, "net", CloneFlags::CLONE_NEWNET)?;
        // A socket opened now talks to the container's namespace.
        let mut inside = RouteSocket::open()?;
        for name in ["lo", "eth0"] {
            let index = nix::net::if_::if_nametoindex(name)
                .map_err(|e| format!("finding {name} in the container's namespace: {e}"))?;
            if name == "eth0" {
                inside.add_address(index, name, r.address)?;
            }
            inside.set_up(index, name)?;
        }
        inside.add_default_route(r.gateway)
    })();
    if let Err(e) = result {
        let _ = kill(keeper, Signal::SIGKILL);
        let _ = waitpid(keeper, None);
        return Err(e);
    }
    println!("ready {}", keeper.as_raw());
    let _ = std::io::stdout().flush();
    // Tell the bridge and the node's other containers who has this address now (this
    // thread is in the container's network namespace, and so is the one it starts).
    let _announcing = announce_repeatedly("eth0".to_string(), r.address.addr());
    // Hold the namespaces until the runtime is done with them.
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(hold_w);
    let _ = kill(keeper, Signal::SIGKILL);
    let _ = waitpid(keeper, None);
    Ok(())
}

fn enter(pid: Pid, kind: &str, flag: CloneFlags) -> Result<(), String> {
    let path = format!("/proc/{}/ns/{kind}", pid.as_raw());
    let file = fs::File::open(&path).map_err(|e| format!("opening {path}: {e}"))?;
    setns(file, flag).map_err(|e| format!("joining {path}: {e}"))
}

fn write_map(pid: Pid, file: &str, ranges: &[IdMapping]) -> Result<(), String> {
    let path = format!("/proc/{}/{file}", pid.as_raw());
    let text: String = ranges
        .iter()
        .map(|(inside, outside, count)| format!("{inside} {outside} {count}\n"))
        .collect();
    fs::write(&path, text).map_err(|e| format!("writing {path}: {e}"))
}

/// The container's mappings with the node user namespace's ids instead of host ids
/// (`/proc/NODE/uid_map`, read from the host, says which node id each host id is).
fn to_node_ids(node: Pid, file: &str, ranges: &[IdMapping]) -> Result<Vec<IdMapping>, String> {
    let path = format!("/proc/{}/{file}", node.as_raw());
    let text = fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let node_map = ProcIdMap::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    ranges
        .iter()
        .map(|&(inside, host, count)| {
            let node_id = node_map.inside_range(host, count).ok_or_else(|| {
                format!(
                    "host ids {host}..+{count} are not mapped in the node user namespace ({path}: {})",
                    text.trim()
                )
            })?;
            Ok((inside, node_id, count))
        })
        .collect()
}

/// A fresh name for a container's end on the bridge (random: the link of a container just
/// gone may linger a moment while the kernel tears its namespace down).
pub fn host_link_name() -> String {
    format!("kv{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_link_names_fit_an_interface_name() {
        let name = super::host_link_name();
        assert!(name.len() <= 15 && name.starts_with("kv"), "{name}");
        assert_ne!(name, super::host_link_name());
    }
}
