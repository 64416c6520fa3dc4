//! A helper process in a user namespace the agent maps: the handshake both sides follow.
//!
//! Several jobs need to run as root of a user namespace with a chosen mapping: giving
//! files to a workload's ids ([`crate::id_tool`]), unpacking a layer as an id that owns
//! nothing on the host ([`crate::image::unpack_sandbox`]). `unshare(CLONE_NEWUSER)` needs a
//! single-threaded process and the agent runs tokio, so each job is a fresh `exec` of the
//! agent's binary (`PROGRAM HELPER_ARG ...`) that:
//!
//! 1. unshares its user namespace and writes one byte to its stdout ([`enter`]);
//! 2. waits for one byte on its stdin while the agent writes its `uid_map`/`gid_map`
//!    ([`start`]): directly when the agent is root, else with `newuidmap`/`newgidmap`,
//!    which allow only the agent's own id and its subordinate range;
//! 3. does its job; stdout after the first byte and stderr are the job's.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

use crate::idmap::IdRange;

/// Starts `command` (whose program calls [`enter`]) and maps its user namespace; returns
/// it running, with its stdout past the handshake. On an error the child is killed.
pub fn start(
    mut command: Command,
    uids: &[IdRange],
    gids: &[IdRange],
) -> std::result::Result<Child, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            let program = std::path::Path::new(command.get_program());
            format!("cannot run {}: {e}", program.display())
        })?;
    let mapped = (|| -> std::result::Result<(), String> {
        let mut ready = [0u8; 1];
        child
            .stdout
            .as_mut()
            .ok_or("no pipe to the helper")?
            .read_exact(&mut ready)
            .map_err(|e| format!("the helper did not create its user namespace: {e}"))?;
        let pid = child.id();
        write_map(pid, "uid", uids)?;
        write_map(pid, "gid", gids)?;
        child
            .stdin
            .as_mut()
            .ok_or("no pipe to the helper")?
            .write_all(b"g")
            .map_err(|e| format!("cannot signal the helper: {e}"))
    })();
    match mapped {
        Ok(()) => Ok(child),
        Err(message) => {
            let _ = child.kill();
            let stderr = child
                .wait_with_output()
                .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
                .unwrap_or_default();
            Err(if stderr.is_empty() {
                message
            } else {
                format!("{message} ({stderr})")
            })
        }
    }
}

fn write_map(pid: u32, kind: &str, lines: &[IdRange]) -> std::result::Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        // Root may write any mapping itself (CAP_SETUID/CAP_SETGID in the parent namespace).
        let text: String = lines
            .iter()
            .map(|l| format!("{} {} {}\n", l.inside, l.outside, l.count))
            .collect();
        let path = format!("/proc/{pid}/{kind}_map");
        return std::fs::write(&path, text).map_err(|e| format!("writing {path}: {e}"));
    }
    let tool = format!("new{kind}map");
    let mut args = vec![pid.to_string()];
    for l in lines {
        args.extend([l.inside, l.outside, l.count].map(|n| n.to_string()));
    }
    let out = Command::new(&tool)
        .args(&args)
        .output()
        .map_err(|e| format!("cannot run {tool} (install uidmap): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The helper's side: creates the user namespace and returns once the agent has mapped it.
/// Call it while the process has one thread.
pub fn enter() -> std::result::Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("cannot create a user namespace: {e}"))?;
    let mut byte = [0u8; 1];
    std::io::stdout()
        .write_all(b"u")
        .and_then(|_| std::io::stdout().flush())
        .and_then(|_| std::io::stdin().read_exact(&mut byte))
        .map_err(|e| format!("the agent did not map the user namespace: {e}"))
}

/// Becomes root of the (mapped) user namespace with no supplementary groups: from here
/// on the process's host credentials are the ids mapped to 0, whatever it started as. A
/// root agent's helper keeps host uid 0 (unmapped, yet still the owner of the host's files
/// for permission checks) until this runs, so a job that must own nothing calls it first.
pub fn become_root() -> std::result::Result<(), String> {
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresgid(root_gid, root_gid, root_gid).map_err(|e| format!("setresgid: {e}"))?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid).map_err(|e| format!("setresuid: {e}"))
}
