//! Reading container logs: the files kat-init writes, with tail, since and follow.
//!
//! Format (one record per line, CRI style): `TIME STREAM TAG TEXT`, where TIME is RFC 3339
//! UTC with nanoseconds, STREAM is `stdout` or `stderr`, TAG is `F` (the line ended here) or
//! `P` (partial: split because longer than 16 KiB, or the stream ended without a newline).
//! `stdio.log` is current; `stdio.log.1` … are older, rotated by size.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::Result;
use crate::types::{LogOptions, LogRecord, LogStream};

/// The receiving end of a container's log records ([`crate::ContainerRuntime::logs`]).
pub type LogReceiver = tokio::sync::mpsc::Receiver<LogRecord>;

/// An RFC 3339 time, as in a record's `time`; `None` if it is not one.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(text).ok()
}

/// `t` in RFC 3339 with nanoseconds, UTC, as kat-init writes record times.
pub fn format_time(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// One line of a log file; `None` for a line that is not a record.
pub fn parse_line(line: &str) -> Option<LogRecord> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?.to_string();
    let stream = match parts.next()? {
        "stdout" => LogStream::Stdout,
        "stderr" => LogStream::Stderr,
        _ => return None,
    };
    let partial = match parts.next()? {
        "P" => true,
        "F" => false,
        _ => return None,
    };
    Some(LogRecord {
        time,
        stream,
        partial,
        text: parts.next().unwrap_or("").to_string(),
    })
}

/// `record` as one line of a log file, newline included: what [`parse_line`] reads back.
pub fn format_line(record: &LogRecord) -> String {
    let stream = match record.stream {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
    };
    let tag = if record.partial { "P" } else { "F" };
    format!("{} {stream} {tag} {}\n", record.time, record.text)
}

/// The most read from one log file at once; kat-init rotates far below this, so only a
/// file a workload wrote itself can be larger.
const MAX_READ: u64 = 256 * 1024 * 1024;

fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("stdio.log.")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    files.push(dir.join("stdio.log"));
    files
}

fn keep(record: &LogRecord, since: Option<SystemTime>) -> bool {
    match since {
        None => true,
        Some(since) => parse_time(&record.time).map(|t| t >= since).unwrap_or(true),
    }
}

/// The threads that read log files for followers: a fixed few, however many streams are
/// open, so 200 `logs -f` cost 200 small tasks and these threads, not 200 threads (tokio's
/// blocking pool would grow a thread for each read that finds no idle one).
const READERS: usize = 2;

type ReadJob = Box<dyn FnOnce() + Send>;

fn readers() -> Option<&'static std::sync::mpsc::Sender<ReadJob>> {
    static QUEUE: std::sync::OnceLock<Option<std::sync::mpsc::Sender<ReadJob>>> =
        std::sync::OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<ReadJob>();
            let rx = Arc::new(std::sync::Mutex::new(rx));
            for i in 0..READERS {
                let rx = rx.clone();
                let started = std::thread::Builder::new()
                    .name(format!("kat-log-read-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        match job {
                            // A read that panics loses its answer (the follower ends), not
                            // the thread.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            }
                            Err(_) => return,
                        }
                    });
                if let Err(e) = started {
                    tracing::warn!(error = %e, "cannot start a log reader thread");
                    return None;
                }
            }
            Some(tx)
        })
        .as_ref()
}

/// Runs `f` on one of the [`READERS`] threads (or, if they could not start, on tokio's
/// blocking pool); `None` if it panicked.
async fn read_blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let Some(queue) = readers() else {
        return tokio::task::spawn_blocking(f).await.ok();
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    queue
        .send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .ok()?;
    rx.await.ok()
}

/// How long a follower with change notices waits before it checks anyway whether the
/// container still runs (kat-init's exit record is a change too, so this is a backstop).
const RECHECK: Duration = Duration::from_secs(1);

/// How often a follower without change notices reads again.
const POLL: Duration = Duration::from_millis(50);

/// Streams the records of a log directory. With `follow`, it goes on until `running`
/// says the container has exited and everything written has been sent, or until the
/// receiver is dropped. Following waits on `watcher`'s notices of the directory (or, without
/// one, reads every 50 ms); it runs as a task of the current tokio runtime and holds no
/// thread while it waits.
pub fn stream(
    dir: PathBuf,
    options: LogOptions,
    running: impl Fn() -> bool + Send + Sync + 'static,
    watcher: Option<&crate::log_watch::LogWatcher>,
) -> Result<LogReceiver> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|e| crate::error::RuntimeError::Io {
            context: "starting the log reader".into(),
            source: std::io::Error::other(e),
        })?;
    // Watch before reading the backlog: nothing written in between goes unnoticed.
    let watch = match (options.follow, watcher) {
        (true, Some(w)) => match w.watch(&dir) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "no change notices for this log; reading every 50 ms");
                None
            }
        },
        _ => None,
    };
    runtime.spawn(async move {
        let backlog_dir = dir.clone();
        let (since, follow_on) = (options.since, options.follow);
        let Some((records, current)) = read_blocking(move || backlog(&backlog_dir, &options)).await
        else {
            return;
        };
        for r in records {
            if tx.send(r).await.is_err() {
                return;
            }
        }
        if follow_on {
            let tail = Tail {
                path: dir.join("stdio.log"),
                current,
                pending: String::new(),
                since,
            };
            follow(tail, &tx, Arc::new(running), watch).await;
        }
    });
    Ok(rx)
}

/// The records already written (with `tail` and `since`) and the current file, read to
/// its last whole line.
fn backlog(dir: &Path, options: &LogOptions) -> (Vec<LogRecord>, Option<(File, u64, u64)>) {
    let files = log_files(dir);
    let mut records = Vec::new();
    let mut current: Option<(File, u64, u64)> = None; // (file, inode, offset)
    let last = files.len() - 1;
    for (i, path) in files.iter().enumerate() {
        // The log directory is writable from inside the container: never follow a
        // planted symlink or block on a FIFO, and read a bounded amount.
        let Ok(mut file) = crate::state_file::open_untrusted(path) else {
            continue;
        };
        let mut text = String::new();
        if (&mut file)
            .take(MAX_READ)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        // Only whole lines; a record being written is picked up by follow.
        let complete = text.rfind('\n').map(|p| p + 1).unwrap_or(0);
        records.extend(
            text[..complete]
                .lines()
                .filter_map(parse_line)
                .filter(|r| keep(r, options.since)),
        );
        if i == last {
            let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
            current = Some((file, inode, complete as u64));
        }
    }
    if let Some(n) = options.tail {
        let skip = records.len().saturating_sub(n);
        records.drain(..skip);
    }
    (records, current)
}

/// Where a follower is in the current log file.
struct Tail {
    path: PathBuf,
    current: Option<(File, u64, u64)>, // (file, inode, offset)
    pending: String,
    since: Option<SystemTime>,
}

impl Tail {
    /// Reads what was written since the last call; moves to the new file after a rotation.
    /// Returns the whole records read and whether anything moved.
    fn read(&mut self) -> (Vec<LogRecord>, bool) {
        let mut records = Vec::new();
        if let Some((file, _, offset)) = self.current.as_mut() {
            let mut buf = Vec::new();
            // Bounded: the file is the workload's to write (it shares two reader threads
            // with every other follower on the node).
            if file.seek(SeekFrom::Start(*offset)).is_ok()
                && (&mut *file).take(MAX_READ).read_to_end(&mut buf).is_ok()
                && !buf.is_empty()
            {
                *offset += buf.len() as u64;
                self.pending.push_str(&String::from_utf8_lossy(&buf));
                while let Some(pos) = self.pending.find('\n') {
                    let line: String = self.pending.drain(..=pos).collect();
                    if let Some(r) = parse_line(line.trim_end_matches('\n')) {
                        if keep(&r, self.since) {
                            records.push(r);
                        }
                    }
                }
                return (records, true);
            }
        }
        // Rotation: the name now points at a new file; the old one was read to its end.
        let on_disk = std::fs::symlink_metadata(&self.path).map(|m| m.ino()).ok();
        if on_disk.is_some() && on_disk != self.current.as_ref().map(|c| c.1) {
            if let Ok(file) = crate::state_file::open_untrusted(&self.path) {
                let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
                self.current = Some((file, inode, 0));
                self.pending.clear();
                return (records, true);
            }
        }
        (records, false)
    }
}

async fn follow(
    mut tail: Tail,
    tx: &tokio::sync::mpsc::Sender<LogRecord>,
    running: Arc<dyn Fn() -> bool + Send + Sync>,
    mut watch: Option<crate::log_watch::DirWatch>,
) {
    let mut idle_after_exit = 0;
    // Woken by a change that brought no log line: most often kat-init's exit record, its
    // process a moment from gone. The next check comes soon, not a [`RECHECK`] later.
    let mut changed_without_lines = false;
    loop {
        if tx.is_closed() {
            return;
        }
        let Some((back, records, progressed)) = read_blocking(move || {
            let (records, progressed) = tail.read();
            (tail, records, progressed)
        })
        .await
        else {
            return;
        };
        tail = back;
        for r in records {
            if tx.send(r).await.is_err() {
                return;
            }
        }
        if progressed {
            changed_without_lines = false;
            continue;
        }
        let check = running.clone();
        if !read_blocking(move || check()).await.unwrap_or(false) {
            // One more pass after the exit, for what kat-init wrote last.
            idle_after_exit += 1;
            if idle_after_exit > 1 {
                return;
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        let recheck = if changed_without_lines { POLL } else { RECHECK };
        match watch.as_mut() {
            Some(w) => tokio::select! {
                () = w.changed() => changed_without_lines = true,
                () = tokio::time::sleep(recheck) => changed_without_lines = false,
                () = tx.closed() => return,
            },
            None => tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = tx.closed() => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records() {
        let r = parse_line("2026-11-21T10:04:05.123456789Z stderr P a b  c").unwrap();
        assert_eq!(r.stream, LogStream::Stderr);
        assert!(r.partial);
        assert_eq!(r.text, "a b  c");
        assert_eq!(
            parse_line("2026-11-21T10:04:05Z stdout F").unwrap().text,
            ""
        );
        assert!(parse_line("garbage").is_none());
        assert!(parse_time(&r.time).is_some());
    }
}
