//! Reaping the containers' processes that the runtime adopts as a child subreaper.
//!
//! The runtime is a subreaper so that kat-init becomes its child when the create helper
//! exits ([`crate::create_helper::become_subreaper`]). That also makes it the parent of
//! other orphans: an exec's kat-init runs in our PID namespace and starts its command in the
//! container's, so when that kat-init dies before its command (an OOM kill, a `kill` from the
//! host), the command is reparented to us, not to the container's PID 1. Nobody waits for it.
//! Left a zombie, it does more harm than a process-table entry: the kernel lets a PID
//! namespace's init finish exiting only once every process of the namespace is reaped, so
//! the container's kat-init, killed, hung in its exit for ever. The container looked
//! running, no exit was ever seen and nothing restarted it.
//!
//! So at each SIGCHLD the runtime reaps those of its zombie children that live in a deeper
//! PID namespace than its own and are not PID 1 there. Nothing else waits for such a
//! process: every child the runtime starts itself (helpers, etcd, buildah, an exec's
//! kat-init) lives in its own namespace, and a container's kat-init is PID 1 of its own,
//! which its reaper ([`crate::native`]'s `spawn_reaper`) waits for.
//!
//! Orphans in our own namespace (a helper's children when the helper dies) are left alone:
//! they do not hold a container up, and nothing tells them from a child someone waits for.

use std::path::Path;

/// Reaps adopted orphans while it lives (a task on the tokio runtime it was made on).
pub(crate) struct OrphanReaper(Option<tokio::task::AbortHandle>);

impl Drop for OrphanReaper {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl OrphanReaper {
    /// Starts on the current tokio runtime; outside of one (a runtime used without tokio
    /// runs no exec) it does nothing.
    pub(crate) fn start() -> Self {
        OrphanReaper(spawn())
    }
}

fn spawn() -> Option<tokio::task::AbortHandle> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let task = runtime.spawn(async {
        let mut exits = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        {
            Ok(exits) => exits,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for SIGCHLD; a container whose exec lost its kat-init may not end");
                return;
            }
        };
        loop {
            // Off the async threads: it reads /proc.
            if let Ok(reaped) = tokio::task::spawn_blocking(reap_adopted).await {
                if reaped > 0 {
                    tracing::debug!(reaped, "reaped orphaned container processes");
                }
            }
            if exits.recv().await.is_none() {
                return;
            }
        }
    });
    Some(task.abort_handle())
}

/// Reaps our zombie children that are not PID 1 of a namespace deeper than ours; returns
/// how many. Blocking: reads /proc.
fn reap_adopted() -> usize {
    let Some(our_depth) = read_status(Path::new("/proc/self/status")).map(|s| s.depth) else {
        return 0;
    };
    let mut reaped = 0;
    for pid in children() {
        let Some(status) = read_status(&Path::new("/proc").join(pid.to_string()).join("status"))
        else {
            continue;
        };
        if !(status.zombie && status.depth > our_depth && status.innermost_pid != 1) {
            continue;
        }
        // A zombie is not reused until it is reaped, and nobody else waits for this one: the
        // pid is still the process just read.
        if nix::sys::wait::waitpid(
            nix::unistd::Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        )
        .is_ok_and(|s| s != nix::sys::wait::WaitStatus::StillAlive)
        {
            reaped += 1;
        }
    }
    reaped
}

/// Our children: the `children` list of each of our threads (an orphan goes to one of
/// them), or, on a kernel without those lists, every process whose parent we are.
fn children() -> Vec<i32> {
    let mut pids = Vec::new();
    let mut listed = false;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            listed = true;
            pids.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    if listed {
        return pids;
    }
    let us = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .is_some_and(|p| p.trim() == us)
            })
        })
        .collect()
}

/// What `/proc/PID/status` says about where a process lives and whether it has ended.
struct Status {
    zombie: bool,
    /// How many PID namespaces it has a pid in (`NSpid`'s entries).
    depth: usize,
    /// Its pid in the innermost of them.
    innermost_pid: i32,
}

fn read_status(path: &Path) -> Option<Status> {
    parse_status(&std::fs::read_to_string(path).ok()?)
}

fn parse_status(text: &str) -> Option<Status> {
    let state = text.lines().find_map(|l| l.strip_prefix("State:"))?;
    let pids: Vec<i32> = text
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    Some(Status {
        zombie: state.trim_start().starts_with('Z'),
        depth: pids.len(),
        innermost_pid: *pids.last()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_state_and_namespaces_from_status() {
        let zombie = "Name:\tsleep\nState:\tZ (zombie)\nTgid:\t5301\nPid:\t5301\nPPid:\t5279\n\
                      NSpid:\t5301\t7\n";
        let s = parse_status(zombie).unwrap();
        assert!(s.zombie);
        assert_eq!((s.depth, s.innermost_pid), (2, 7));
        let init = parse_status("State:\tS (sleeping)\nNSpid:\t5288\t1\n").unwrap();
        assert!(!init.zombie);
        assert_eq!((init.depth, init.innermost_pid), (2, 1));
        // A kernel without NSpid (before 4.1) or a line that does not parse: nothing is said.
        assert!(parse_status("State:\tZ (zombie)\n").is_none());
        assert!(parse_status("State:\tZ (zombie)\nNSpid:\tx\n").is_none());
        assert!(parse_status("NSpid:\t1\n").is_none());
    }
}
