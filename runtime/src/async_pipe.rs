//! An exec's pipes and terminal on tokio's reactor: the descriptor is made nonblocking and
//! read or written when epoll says it is ready, so a session's output and input are tasks,
//! not a blocking thread each for its whole life.
//!
//! Neither `tokio::net::unix::pipe` (pipes and FIFOs only: it refuses a terminal's master)
//! nor `tokio::fs::File` (a blocking thread per operation) fits both.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How long a terminal's master end may go on reading `EIO` with nothing arriving before
/// its end is taken as real (see [`AsyncPipe::read_terminal`]).
const TERMINAL_DRAIN: Duration = Duration::from_millis(100);

/// A pipe end or a terminal's master end, read and written on tokio's reactor.
pub struct AsyncPipe {
    fd: AsyncFd<File>,
}

impl AsyncPipe {
    /// Takes `file` (a pipe end or a terminal's master) and makes it nonblocking; every
    /// descriptor duplicated from it shares that. Must be called on a tokio runtime.
    pub fn new(file: File) -> io::Result<AsyncPipe> {
        tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let raw = file.as_raw_fd();
        let flags = OFlag::from_bits_truncate(fcntl(raw, FcntlArg::F_GETFL)?);
        fcntl(raw, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        // SAFETY: the `File` is owned by the `AsyncFd` and closes only when it drops.
        let fd = unsafe {
            AsyncFd::register_with_interest(file, Interest::READABLE | Interest::WRITABLE)
        }?;
        Ok(AsyncPipe { fd })
    }

    /// Reads what is there, waiting until something is; `Ok(0)` at the end.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| fd.get_ref().read(buf)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads a terminal's master end: as [`AsyncPipe::read`], except that the end (`Ok(0)`)
    /// is confirmed rather than taken from the first `EIO`.
    ///
    /// Linux answers `EIO` on the master once every holder of the other end has closed it,
    /// and can do so before the last bytes written there have reached the master (they pass
    /// through the terminal's buffer on a kernel worker): an exec's final line was lost about
    /// once in a few thousand runs on a loaded machine, and read fine 0.3 ms later. So after
    /// an `EIO` we look again, waiting a little longer each time, and call it the end only
    /// once [`TERMINAL_DRAIN`] has passed with nothing new.
    pub async fn read_terminal(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.read(buf).await {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
            other => return other,
        }
        let mut waited = Duration::ZERO;
        let mut step = Duration::from_millis(1);
        while waited < TERMINAL_DRAIN {
            tokio::time::sleep(step).await;
            waited += step;
            step = (step * 2).min(TERMINAL_DRAIN.saturating_sub(waited));
            match self.fd.get_ref().read(buf) {
                Ok(n) => return Ok(n),
                Err(e)
                    if e.raw_os_error() == Some(libc::EIO)
                        || e.kind() == io::ErrorKind::WouldBlock =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        Ok(0)
    }

    /// Writes all of `buf`, waiting while the reader is behind (a process that never reads
    /// its stdin costs a waiting task, nothing more).
    pub async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let mut ready = self.fd.writable().await?;
            match ready.try_io(|fd| fd.get_ref().write(buf)) {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => buf = &buf[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// The descriptor, for what is not I/O (a terminal's size).
    pub fn file(&self) -> &File {
        self.fd.get_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (File, File) {
        let (r, w) = nix::unistd::pipe().unwrap();
        (File::from(r), File::from(w))
    }

    /// Bytes go through, the end reads as 0, and a full pipe makes a writer wait (a task)
    /// until the reader drains it.
    #[tokio::test]
    async fn reads_writes_and_waits_on_a_full_pipe() {
        let (r, w) = pipe();
        let (r, w) = (AsyncPipe::new(r).unwrap(), AsyncPipe::new(w).unwrap());
        let big = vec![7u8; 1 << 20]; // more than a pipe holds
        let writer = tokio::spawn(async move {
            w.write_all(&big).await.unwrap();
        });
        let mut got = 0;
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|b| *b == 7));
            got += n;
        }
        writer.await.unwrap();
        assert_eq!(got, 1 << 20);
    }

    /// A terminal whose other end is gone gives everything written there, then its end:
    /// once, after the drain, and not before.
    #[tokio::test]
    async fn a_terminal_ends_after_its_last_bytes() {
        let pair = nix::pty::openpty(None, None).unwrap();
        let master = AsyncPipe::new(File::from(pair.master)).unwrap();
        let mut slave = File::from(pair.slave);
        slave.write_all(b"last line\n").unwrap();
        drop(slave);
        let started = std::time::Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let n = master.read_terminal(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"last line\r\n");
        let took = started.elapsed();
        assert!(
            took >= TERMINAL_DRAIN && took < TERMINAL_DRAIN * 10,
            "{took:?}"
        );
    }

    /// On a current-thread runtime, a reader waiting on an empty pipe does not stop other
    /// tasks: it is not blocking the only thread.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_reader_blocks_no_thread() {
        let (r, w) = pipe();
        let r = AsyncPipe::new(r).unwrap();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            r.read(&mut buf).await.unwrap()
        });
        // The timer fires although the reader has nothing to read yet.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        (&w).write_all(b"hi").unwrap();
        assert_eq!(reader.await.unwrap(), 2);
    }
}
