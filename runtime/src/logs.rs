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
use std::time::{Duration, SystemTime};

use crate::error::Result;
use crate::types::{LogOptions, LogRecord, LogStream};

pub type LogReceiver = tokio::sync::mpsc::Receiver<LogRecord>;

pub fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(text).ok()
}

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

/// Streams the records of a log directory. With `follow`, it goes on until `running`
/// says the container has exited and everything written has been sent, or until the
/// receiver is dropped.
pub fn stream(
    dir: PathBuf,
    options: LogOptions,
    running: impl Fn() -> bool + Send + 'static,
) -> Result<LogReceiver> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    std::thread::Builder::new()
        .name("kat-logs".into())
        .spawn(move || {
            let files = log_files(&dir);
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
            for r in records {
                if tx.blocking_send(r).is_err() {
                    return;
                }
            }
            if !options.follow {
                return;
            }
            follow(&dir, current, &tx, options.since, running);
        })
        .map_err(|e| crate::error::RuntimeError::Io {
            context: "starting the log reader".into(),
            source: e,
        })?;
    Ok(rx)
}

fn follow(
    dir: &Path,
    mut current: Option<(File, u64, u64)>,
    tx: &tokio::sync::mpsc::Sender<LogRecord>,
    since: Option<SystemTime>,
    running: impl Fn() -> bool,
) {
    let path = dir.join("stdio.log");
    let mut pending = String::new();
    let mut idle_after_exit = 0;
    loop {
        if tx.is_closed() {
            return;
        }
        let mut progressed = false;
        if let Some((file, _, offset)) = current.as_mut() {
            let mut buf = Vec::new();
            if file.seek(SeekFrom::Start(*offset)).is_ok()
                && file.read_to_end(&mut buf).is_ok()
                && !buf.is_empty()
            {
                *offset += buf.len() as u64;
                pending.push_str(&String::from_utf8_lossy(&buf));
                progressed = true;
                while let Some(pos) = pending.find('\n') {
                    let line: String = pending.drain(..=pos).collect();
                    if let Some(r) = parse_line(line.trim_end_matches('\n')) {
                        if keep(&r, since) && tx.blocking_send(r).is_err() {
                            return;
                        }
                    }
                }
            }
        }
        // Rotation: the name now points at a new file; the old one was read to its end.
        let on_disk = std::fs::metadata(&path).map(|m| m.ino()).ok();
        if !progressed && on_disk.is_some() && on_disk != current.as_ref().map(|c| c.1) {
            if let Ok(file) = crate::state_file::open_untrusted(&path) {
                let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
                current = Some((file, inode, 0));
                pending.clear();
                continue;
            }
        }
        if !progressed {
            if !running() {
                // One more pass after the exit, for what kat-init wrote last.
                idle_after_exit += 1;
                if idle_after_exit > 1 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
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
