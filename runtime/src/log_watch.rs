//! Change notices for followed log directories: one inotify instance per runtime, a watch per
//! directory that someone follows, and a version counter each follower waits on. A `logs -f`
//! is then a task that sleeps until kat-init writes, not a thread (or a poll every 50 ms) for
//! its whole life.
//!
//! One instance for all followers, not one each: the kernel allows a user 128 inotify
//! instances by default, and a node may follow more logs than that. Written here rather than
//! with the `notify` crate, which runs a thread of its own and watches by path; this is one
//! nonblocking descriptor on tokio's reactor.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

type Dirs = Arc<Mutex<HashMap<WatchDescriptor, Watched>>>;

struct Watched {
    version: watch::Sender<u64>,
    followers: usize,
}

/// The runtime's inotify instance and the task that reads it.
pub struct LogWatcher {
    fd: Arc<AsyncFd<Fd>>,
    dirs: Dirs,
    reader: tokio::task::JoinHandle<()>,
}

impl LogWatcher {
    /// A watcher whose reader runs on the current tokio runtime (an error outside one).
    pub fn new() -> io::Result<LogWatcher> {
        tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `Fd` owns the inotify descriptor and never closes or replaces it; it
        // closes only when the `AsyncFd` (its only owner) drops.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }?;
        let fd = Arc::new(fd);
        let dirs: Dirs = Arc::default();
        let reader = tokio::spawn(read_events(fd.clone(), dirs.clone()));
        Ok(LogWatcher { fd, dirs, reader })
    }

    /// Notices of changes in `dir` (a file written, created or renamed into it). The
    /// directory is watched by name without following a symlink there.
    pub fn watch(&self, dir: &Path) -> io::Result<DirWatch> {
        let mask = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_DONT_FOLLOW
            | AddWatchFlags::IN_ONLYDIR;
        // Under the lock: a last follower leaving now cannot remove the watch this call is
        // given (the kernel hands out the same descriptor for the same directory).
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let wd = self.fd.get_ref().0.add_watch(dir, mask)?;
        // The same directory twice is the same descriptor: followers share it.
        let watched = dirs.entry(wd).or_insert_with(|| Watched {
            version: watch::channel(0).0,
            followers: 0,
        });
        watched.followers += 1;
        Ok(DirWatch {
            fd: self.fd.clone(),
            dirs: self.dirs.clone(),
            wd,
            version: watched.version.subscribe(),
        })
    }

    /// How many directories are watched now (for tests).
    pub fn watched(&self) -> usize {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for LogWatcher {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One follower's notices for one directory; the watch goes with its last follower.
pub struct DirWatch {
    fd: Arc<AsyncFd<Fd>>,
    dirs: Dirs,
    wd: WatchDescriptor,
    version: watch::Receiver<u64>,
}

impl DirWatch {
    /// Returns once something changed in the directory since the last call (at once if it
    /// already has: a change between two reads is never missed). Never returns if the
    /// watcher is gone; callers wait beside a timer.
    pub async fn changed(&mut self) {
        if self.version.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(watched) = dirs.get_mut(&self.wd) else {
            return;
        };
        watched.followers -= 1;
        if watched.followers == 0 {
            dirs.remove(&self.wd);
            // Fails harmlessly if the directory is gone (the kernel dropped the watch).
            let _ = self.fd.get_ref().0.rm_watch(self.wd);
        }
    }
}

async fn read_events(fd: Arc<AsyncFd<Fd>>, dirs: Dirs) {
    loop {
        let Ok(mut ready) = fd.readable().await else {
            return;
        };
        let events = match ready.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from))
        {
            Ok(Ok(events)) => events,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read inotify events; followed logs fall back to a timer");
                return;
            }
            Err(_would_block) => continue,
        };
        let dirs = dirs.lock().unwrap_or_else(|p| p.into_inner());
        let overflow = events
            .iter()
            .any(|e| e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW));
        for (wd, watched) in dirs.iter() {
            if overflow || events.iter().any(|e| e.wd == *wd) {
                watched.version.send_modify(|v| *v = v.wrapping_add(1));
            }
        }
    }
}
