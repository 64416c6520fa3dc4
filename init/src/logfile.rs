//! The log file kat-init writes: CRI-style records, rotated by size.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;

/// Longest record text; longer lines are split into `P` records.
const MAX_RECORD: usize = 16 * 1024;
const LOG_NAME: &str = "stdio.log";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// `stdio.log` in the log directory, with one pending partial line per stream.
pub struct LogFile<'a> {
    dir: BorrowedFd<'a>,
    file: OwnedFd,
    size: u64,
    max_bytes: u64,
    max_files: u32,
    pending: [Vec<u8>; 2],
}

impl<'a> LogFile<'a> {
    pub fn open(dir: BorrowedFd<'a>, max_bytes: u64, max_files: u32) -> nix::Result<LogFile<'a>> {
        let file = open_log(dir)?;
        let size = nix::sys::stat::fstat(file.as_raw_fd())?.st_size as u64;
        Ok(LogFile {
            dir,
            file,
            size,
            max_bytes,
            max_files,
            pending: [Vec::new(), Vec::new()],
        })
    }

    /// Appends bytes read from one stream; complete lines become `F` records at once.
    pub fn write(&mut self, stream: Stream, mut bytes: &[u8]) {
        let idx = stream as usize;
        while let Some(pos) = bytes.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut self.pending[idx]);
            line.extend_from_slice(&bytes[..pos]);
            self.emit_line(stream, &line);
            bytes = &bytes[pos + 1..];
        }
        self.pending[idx].extend_from_slice(bytes);
        while self.pending[idx].len() >= MAX_RECORD {
            let rest = self.pending[idx].split_off(MAX_RECORD);
            let chunk = std::mem::replace(&mut self.pending[idx], rest);
            self.record(stream, b'P', &chunk);
        }
    }

    /// The stream closed: an unterminated last line is kept as a `P` record.
    pub fn end_of_stream(&mut self, stream: Stream) {
        let rest = std::mem::take(&mut self.pending[stream as usize]);
        if !rest.is_empty() {
            self.record(stream, b'P', &rest);
        }
    }

    pub fn finish(&mut self) {
        self.end_of_stream(Stream::Stdout);
        self.end_of_stream(Stream::Stderr);
        let _ = nix::unistd::fsync(self.file.as_raw_fd());
    }

    fn emit_line(&mut self, stream: Stream, line: &[u8]) {
        let mut chunks = line.chunks(MAX_RECORD).peekable();
        if chunks.peek().is_none() {
            self.record(stream, b'F', b"");
        }
        while let Some(chunk) = chunks.next() {
            let tag = if chunks.peek().is_some() { b'P' } else { b'F' };
            self.record(stream, tag, chunk);
        }
    }

    fn record(&mut self, stream: Stream, tag: u8, text: &[u8]) {
        let mut out = Vec::with_capacity(text.len() + 48);
        out.extend_from_slice(now_rfc3339().as_bytes());
        out.push(b' ');
        out.extend_from_slice(stream.name().as_bytes());
        out.push(b' ');
        out.push(tag);
        out.push(b' ');
        out.extend_from_slice(text);
        out.push(b'\n');
        if self.size > 0 && self.size + out.len() as u64 > self.max_bytes {
            self.rotate();
        }
        if write_all(self.file.as_raw_fd(), &out) {
            self.size += out.len() as u64;
        }
    }

    /// `stdio.log.{n-1}` → `.n` … `stdio.log` → `.1`, dropping the oldest.
    fn rotate(&mut self) {
        let keep = self.max_files.max(1);
        for n in (1..keep).rev() {
            let from = if n == 1 {
                LOG_NAME.to_string()
            } else {
                format!("{LOG_NAME}.{}", n - 1)
            };
            let _ = renameat(
                Some(self.dir.as_raw_fd()),
                from.as_str(),
                Some(self.dir.as_raw_fd()),
                format!("{LOG_NAME}.{n}").as_str(),
            );
        }
        if keep == 1 {
            let _ = nix::unistd::ftruncate(&self.file, 0);
            self.size = 0;
            return;
        }
        if let Ok(file) = open_log(self.dir) {
            self.file = file;
            self.size = 0;
        }
    }
}

fn open_log(dir: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        LOG_NAME,
        OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o640),
    )?;
    // SAFETY: openat just returned this fd and nothing else holds it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: fd is an open file owned by the caller for the duration of the call.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        match nix::unistd::write(borrowed, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Writes `exit.json` atomically: to a temporary name, then renamed into place.
pub fn write_exit_record(
    dir: BorrowedFd<'_>,
    code: i32,
    signal: Option<i32>,
    oom_killed: bool,
) -> nix::Result<()> {
    let signal = signal
        .map(|s| s.to_string())
        .unwrap_or_else(|| "null".into());
    let body = format!(
        "{{\"exitCode\":{code},\"signal\":{signal},\"finishedAt\":\"{}\",\"oomKilled\":{oom_killed}}}\n",
        now_rfc3339()
    );
    let fd = openat(
        Some(dir.as_raw_fd()),
        "exit.json.tmp",
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o640),
    )?;
    // SAFETY: openat just returned this fd and nothing else holds it.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    if !write_all(file.as_raw_fd(), body.as_bytes()) {
        return Err(nix::errno::Errno::EIO);
    }
    nix::unistd::fsync(file.as_raw_fd())?;
    renameat(
        Some(dir.as_raw_fd()),
        "exit.json.tmp",
        Some(dir.as_raw_fd()),
        "exit.json",
    )
}

/// The wall clock as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}
