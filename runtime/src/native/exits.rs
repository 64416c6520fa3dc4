//! How containers end: their status from libcontainer and kat-init's exit record, waits,
//! signals to PID 1, and the reaper that records an exit.

use super::*;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// How often a stop reads the state of a container no reaper of ours waits for.
const ADOPTED_POLL: Duration = Duration::from_millis(100);

impl NativeRuntime {
    pub(super) fn status_of(&self, id: &str, meta: Meta) -> ContainerStatus {
        let container = self.load_container(id);
        let lc_status = container.as_ref().map(|c| c.status());
        let pid = container.as_ref().and_then(|c| c.pid()).map(|p| p.as_raw());
        let read_exit = || read_exit_record(&self.dir(id).join("logs"));
        let mut exit = read_exit();
        if exit.is_none() && lc_status == Some(LcStatus::Stopped) {
            // kat-init died without a record; if our reaper has it, its record is a moment
            // away: the reaper says when it is written.
            self.reaping.wait_until_reaped(id, Duration::from_secs(2));
            exit = read_exit();
        }
        let state = match lc_status {
            Some(LcStatus::Created) | Some(LcStatus::Creating) => ContainerState::Created,
            Some(LcStatus::Running) | Some(LcStatus::Paused) => ContainerState::Running,
            Some(LcStatus::Stopped) => ContainerState::Exited,
            None => ContainerState::Unknown,
        };
        let mut warnings = meta.warnings.clone();
        let (exit_code, signal, finished_at) = match (&exit, state) {
            (Some(e), _) => (
                Some(e.exit_code),
                e.signal,
                crate::logs::parse_time(&e.finished_at),
            ),
            (None, ContainerState::Exited) => {
                warnings.push("kat-init was killed before it could record the exit status".into());
                (Some(137), Some(9), None)
            }
            _ => (None, None, None),
        };
        // An OOM kill counts when the workload failed: kat-init read the counter before the
        // cgroup could go away (systemd removes an empty scope), or the cgroup still has it.
        let oom_killed = state == ContainerState::Exited
            && exit_code != Some(0)
            && (exit.as_ref().is_some_and(|e| e.oom_killed) || self.cgroups.oom_killed(id));
        ContainerStatus {
            id: id.to_string(),
            namespace: meta.options.namespace.clone(),
            workload: meta.options.workload.clone(),
            image: meta.options.image.clone(),
            image_id: meta.image_id.clone(),
            state,
            pid: if state == ContainerState::Running {
                pid
            } else {
                None
            },
            exit_code,
            signal,
            oom_killed,
            created_at: Some(meta.created_at),
            started_at: meta.started_at,
            finished_at,
            labels: meta.options.labels.clone(),
            warnings,
        }
    }

    /// Waits for `id` to stop: woken by its reaper the moment kat-init is reaped; a
    /// container adopted from an earlier agent has no reaper here, so its state is also read
    /// every [`ADOPTED_POLL`].
    pub(super) async fn wait_until_exited(&self, id: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let reaped = self.reaping.reaped();
            tokio::pin!(reaped);
            reaped.as_mut().enable();
            match read_in_place(|| self.load_container(id).map(|c| c.status())) {
                Some(LcStatus::Stopped) | None => return true,
                _ => {}
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::select! {
                () = reaped => {}
                () = tokio::time::sleep(ADOPTED_POLL.min(deadline - now)) => {}
            }
        }
    }
}

/// Sends `signal` to the container's PID 1 (kat-init forwards it to the workload), through
/// libcontainer or, where that fails, directly.
pub(super) fn signal_init(c: &mut Container, signal: i32) {
    let Ok(lc_signal) = LcSignal::try_from(signal) else {
        return;
    };
    if c.kill(lc_signal, false).is_err() {
        if let (Some(pid), Ok(sig)) = (c.pid(), nix::sys::signal::Signal::try_from(signal)) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }
}

/// Reaps kat-init when it is our child, and records its end if kat-init could not
/// (SIGKILL, OOM kill of PID 1).
/// `oom_killed` is asked at once, while the cgroup most likely still exists; `done` runs
/// when the record is written, or when there is none to write.
///
/// A running container costs no thread: a task waits for its process descriptor (`pidfd`)
/// to turn readable, which it does the moment kat-init exits, and only then a blocking
/// thread reaps and writes the record. Where there is no pidfd (Linux before 5.3) or no
/// runtime, a thread waits in `waitpid` instead, as all of them did: ten running containers
/// kept ten threads, their stacks and their allocator caches.
pub(super) fn spawn_reaper(
    pid: i32,
    logs: PathBuf,
    oom_killed: impl FnOnce() -> bool + Send + 'static,
    done: impl Fn() + Send + Sync + 'static,
) {
    let done = std::sync::Arc::new(done);
    let reap = {
        let done = done.clone();
        move || {
            record_end(pid, &logs, oom_killed);
            done();
        }
    };
    let exited = match (tokio::runtime::Handle::try_current(), process_exit(pid)) {
        (Ok(runtime), Ok(exited)) => Some((runtime, exited)),
        _ => None,
    };
    let spawned = match exited {
        Some((runtime, exited)) => {
            runtime.spawn(async move {
                // Readable once the process has exited; an error of the reactor (none is
                // expected) leaves the wait to waitpid, on the blocking thread.
                let _ = exited.readable().await;
                drop(exited);
                let _ = tokio::task::spawn_blocking(reap).await;
            });
            Ok(())
        }
        None => std::thread::Builder::new()
            .name(format!("reap-{pid}"))
            .spawn(reap)
            .map(drop),
    };
    if spawned.is_err() {
        tracing::warn!(
            pid,
            "cannot start a reaper thread; exit codes of a killed kat-init will be approximate"
        );
        // No reaper waits for it: nobody may wait for this one's word, or count on its
        // notice of the exit (the container is then looked at on a clock).
        done();
    }
}

/// A descriptor of process `pid` on the reactor, readable once the process has exited.
fn process_exit(pid: i32) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: the `OwnedFd` is owned by the `AsyncFd` and closes only when it drops.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    Ok(registered?)
}

pub(super) fn record_end(pid: i32, logs: &Path, oom_killed: impl FnOnce() -> bool) {
    use nix::sys::wait::{waitpid, WaitStatus};
    let status = waitpid(nix::unistd::Pid::from_raw(pid), None);
    let exit = logs.join("exit.json");
    if fs::symlink_metadata(&exit).is_ok() {
        return;
    }
    let (code, signal) = match status {
        Ok(WaitStatus::Exited(_, code)) => (code, None),
        Ok(WaitStatus::Signaled(_, sig, _)) => (128 + sig as i32, Some(sig as i32)),
        _ => return,
    };
    let record = ExitRecord {
        exit_code: code,
        signal,
        finished_at: crate::logs::format_time(SystemTime::now()),
        oom_killed: oom_killed(),
    };
    if let Ok(bytes) = serde_json::to_vec(&record) {
        // The directory is the container's: never follow what a workload planted in it.
        let _ = crate::state_file::write_atomic(&exit, &bytes, 0o640);
    }
}

/// `exit.json` of a container's log directory, which its workload can write: read without
/// following links or blocking, bounded, and ignored when it is not a valid record.
pub(super) fn read_exit_record(logs: &Path) -> Option<ExitRecord> {
    let bytes = crate::state_file::read_untrusted(&logs.join("exit.json"), 4096).ok()??;
    serde_json::from_slice(&bytes).ok()
}
