//! `kat-init`: PID 1 of every KAT container.
//!
//! The agent bind-mounts this static binary read-only into the container and runs it as the
//! container's process. It exists so that the agent can die, restart or be upgraded without
//! the workload noticing:
//!
//! - it starts the workload and forwards every catchable signal to it;
//! - it reaps every zombie in the container's PID namespace;
//! - with `--seccomp default` it installs KAT's seccomp filter in itself first, so the
//!   workload inherits it (see [`seccomp`]);
//! - with `--log-dir PATH` it owns the workload's stdout and stderr, writing them to
//!   `stdio.log` in that directory, rotated by size. The path is inside the container: the
//!   agent bind-mounts the container's log directory at `/.kat/log`, so the directory fd
//!   kat-init holds leads nowhere outside the container's root (`..` from a bind mount's
//!   root climbs to its mount point, inside the container). No process outside the container
//!   sits in the log path, so no line is lost and the workload never blocks while the agent
//!   is away;
//! - it makes itself non-dumpable before anything else and replaces the stdio the host gave
//!   it with the container's `/dev/null`: a workload (which holds no `CAP_SYS_PTRACE`) can
//!   neither open `/proc/1/fd`, `/proc/1/cwd`, `/proc/1/root`, `/proc/1/map_files` nor
//!   `/proc/1/exe`, nor ptrace kat-init (the runc CVE-2019-5736 / CVE-2024-21626 classes);
//! - when the workload ends it writes `exit.json` (exit code, signal, finish time, and whether
//!   the container's cgroup counted an OOM kill) to the same directory, atomically, and exits with the workload's code (128+signal when killed).
//!
//! The log format is one record per line, as in the CRI log format:
//!
//! ```text
//! 2026-11-21T10:04:05.123456789Z stdout F hello world
//! 2026-11-21T10:04:05.123501000Z stderr P first 16 KiB of a longer line…
//! ```
//!
//! `F` marks a record that ended with a newline (the newline is not stored); `P` marks a
//! partial record: the line was longer than 16 KiB or the stream ended without a newline,
//! and the text continues in the next record of the same stream.

mod logfile;
mod loopback;
mod oom;
mod options;
mod seccomp;

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{execvp, fork, ForkResult, Pid};

use logfile::{LogFile, Stream};
use options::Options;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("kat-init: {message}");
            eprintln!("usage: kat-init [--log-dir PATH] [--log-max-bytes N] [--log-max-files N] [--seccomp default|unconfined] -- COMMAND [ARG...]");
            return ExitCode::from(2);
        }
    };
    match run(options) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("kat-init: {message}");
            ExitCode::from(127)
        }
    }
}

/// The workload's two output pipes, read ends, while they are open.
struct Pipes {
    out: Option<OwnedFd>,
    err: Option<OwnedFd>,
}

fn run(options: Options) -> Result<u8, String> {
    // First of all: no process in the container may read our memory, fds or exe through
    // /proc or ptrace. Reset by execve, so the workload itself stays dumpable.
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("cannot become non-dumpable: {e}"))?;
    // The container's loopback up, then CAP_NET_ADMIN gone from every set (loopback.rs).
    // Outside a network namespace of its own (tests, debugging) the first may fail: said,
    // not fatal. The second must hold, or the workload does not start.
    if let Err(e) = loopback::bring_up() {
        eprintln!("kat-init: {e}; the container has no loopback");
    }
    loopback::drop_net_admin()?;
    replace_host_stdio(options.log_dir.is_some());
    // Block every signal we handle and read them from a signalfd: blocked signals count as
    // handled for a PID namespace's init, so the agent's SIGTERM reaches us.
    let mut handled = SigSet::all();
    handled.remove(Signal::SIGKILL);
    handled.remove(Signal::SIGSTOP);
    let mut old_mask = SigSet::empty();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled), Some(&mut old_mask))
        .map_err(|e| format!("cannot block signals: {e}"))?;
    // As PID 1 of a container we reap orphans anyway; outside one (tests, debugging), being
    // a subreaper gives the same behaviour.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let signals = SignalFd::with_flags(&handled, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("cannot create a signalfd: {e}"))?;

    let log_dir = match &options.log_dir {
        Some(path) => Some(open_log_dir(path)?),
        None => None,
    };
    let mut log = match &log_dir {
        Some(dir) => Some(
            LogFile::open(dir.as_fd(), options.log_max_bytes, options.log_max_files)
                .map_err(|e| format!("cannot open stdio.log in the log directory: {e}"))?,
        ),
        None => None,
    };

    let (mut pipes, child_ends) = if log.is_some() {
        let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| format!("cannot create the stdout pipe: {e}"))?;
        let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| format!("cannot create the stderr pipe: {e}"))?;
        (
            Pipes {
                out: Some(out_r),
                err: Some(err_r),
            },
            Some((out_w, err_w)),
        )
    } else {
        (
            Pipes {
                out: None,
                err: None,
            },
            None,
        )
    };

    let program = CString::new(options.command[0].as_bytes())
        .map_err(|_| "the command contains a NUL byte".to_string())?;
    let argv: Vec<CString> = options
        .command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| "an argument contains a NUL byte".to_string())?;

    // Filter ourselves, so the workload inherits it and cannot get round it through us.
    if options.seccomp {
        seccomp::install()?;
    }

    // Joined into a running container by `exec` (we are not its PID 1) and without a
    // terminal (a probe, a piped command): the command gets a process group of its own, so
    // signals reach everything it started and the agent can kill the whole tree when a probe
    // times out. With a terminal the command must stay in the terminal's foreground group.
    let own_group = nix::unistd::getpid().as_raw() != 1 && !nix::unistd::isatty(0).unwrap_or(false);

    // SAFETY: we are single-threaded; the child only calls async-signal-safe functions
    // (setpgid, dup2, sigprocmask, execvp, write, _exit) before exec.
    let child = match unsafe { fork() }.map_err(|e| format!("fork failed: {e}"))? {
        ForkResult::Child => {
            if own_group {
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
            }
            if let Some((out_w, err_w)) = &child_ends {
                let _ = nix::unistd::dup2(out_w.as_raw_fd(), 1);
                let _ = nix::unistd::dup2(err_w.as_raw_fd(), 2);
            }
            // The workload starts with every signal at its default action. Rust's runtime
            // ignores SIGPIPE in kat-init, and an ignored signal stays ignored across exec:
            // `producer | consumer` would then spin on EPIPE after the consumer dies (an
            // OOM-killed `tail` left `head` running forever) instead of ending.
            reset_signal_dispositions();
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
            let err = execvp(&program, &argv).unwrap_err();
            let message = format!(
                "kat-init: cannot execute {}: {}\n",
                options.command[0],
                err.desc()
            );
            let _ = nix::unistd::write(std::io::stderr(), message.as_bytes());
            // SAFETY: _exit is async-signal-safe and skips the parent's atexit handlers.
            unsafe { nix::libc::_exit(if err == Errno::ENOENT { 127 } else { 126 }) };
        }
        ForkResult::Parent { child } => child,
    };
    drop(child_ends);

    let mut workload_status: Option<WaitStatus> = None;
    loop {
        if workload_status.is_some() && pipes.out.is_none() && pipes.err.is_none() {
            break;
        }
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        let mut order = Vec::new();
        for (stream, fd) in [(Stream::Stdout, &pipes.out), (Stream::Stderr, &pipes.err)] {
            if let Some(fd) = fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                order.push(stream);
            }
        }
        // Once the workload is gone, a grandchild may still hold a pipe open; drain what is
        // there and stop rather than wait for it forever.
        let timeout = if workload_status.is_some() {
            PollTimeout::ZERO
        } else {
            PollTimeout::NONE
        };
        let ready = match poll(&mut fds, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("poll failed: {e}")),
        };
        let revents: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().map(|r| !r.is_empty()).unwrap_or(false))
            .collect();
        drop(fds);
        if revents[0] {
            while let Ok(Some(info)) = signals.read_signal() {
                let signo = info.ssi_signo as i32;
                if signo == Signal::SIGCHLD as i32 {
                    reap(child, &mut workload_status);
                } else if let Ok(signal) = Signal::try_from(signo) {
                    let target = if own_group {
                        Pid::from_raw(-child.as_raw())
                    } else {
                        child
                    };
                    let _ = kill(target, signal);
                }
            }
        }
        for (i, stream) in order.iter().enumerate() {
            if revents[i + 1] {
                pump(*stream, &mut pipes, log.as_mut());
            }
        }
        if ready == 0 && workload_status.is_some() {
            // Nothing more to read right now and the workload is gone.
            pipes.out = None;
            pipes.err = None;
        }
    }
    if let Some(log) = log.as_mut() {
        log.finish();
    }

    let (code, signal) = match workload_status {
        Some(WaitStatus::Exited(_, code)) => (code, None),
        Some(WaitStatus::Signaled(_, signal, _)) => (128 + signal as i32, Some(signal as i32)),
        _ => (255, None),
    };
    if let Some(dir) = &log_dir {
        // Only a failed workload can have been OOM-killed (a shell may survive the kill of a
        // child and still exit 0).
        let oom_killed = code != 0 && oom::oom_killed();
        if let Err(e) = logfile::write_exit_record(dir.as_fd(), code, signal, oom_killed) {
            eprintln!("kat-init: cannot write exit.json: {e}");
        }
    }
    Ok(code.clamp(0, 255) as u8)
}

/// Opens the log directory inside the container, refusing a symlink in its place.
fn open_log_dir(path: &std::path::Path) -> Result<OwnedFd, String> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("cannot open the log directory {}: {e}", path.display()))?;
    // SAFETY: open just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The runtime starts us with stdio opened on the host (`/dev/null` there): put the
/// container's own `/dev/null` in their place so no fd of ours names a host file. With a log
/// directory, stdout and stderr go nowhere anyway (the workload's go to pipes); without one
/// they are the caller's (tests, `exec`), and stay.
fn replace_host_stdio(logged: bool) {
    let Ok(null) = nix::fcntl::open("/dev/null", OFlag::O_RDWR, nix::sys::stat::Mode::empty())
    else {
        return;
    };
    let targets: &[RawFd] = if logged { &[0, 1, 2] } else { &[] };
    for &fd in targets {
        if null != fd {
            let _ = nix::unistd::dup2(null, fd);
        }
    }
    if null > 2 {
        let _ = nix::unistd::close(null);
    }
}

/// Reaps every exited process; remembers the workload's status.
fn reap(workload: Pid, status: &mut Option<WaitStatus>) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(s) => {
                if s.pid() == Some(workload) {
                    *status = Some(s);
                }
            }
        }
    }
}

/// Moves what is readable on one pipe into the log; closes the pipe at end of stream.
fn pump(stream: Stream, pipes: &mut Pipes, log: Option<&mut LogFile>) {
    let slot = match stream {
        Stream::Stdout => &mut pipes.out,
        Stream::Stderr => &mut pipes.err,
    };
    let Some(fd) = slot else { return };
    let mut buf = [0u8; 16 * 1024];
    match read_fd(fd.as_fd(), &mut buf) {
        Ok(0) | Err(_) => {
            if let Some(log) = log {
                log.end_of_stream(stream);
            }
            *slot = None;
        }
        Ok(n) => {
            if let Some(log) = log {
                log.write(stream, &buf[..n]);
            }
        }
    }
}

fn read_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    loop {
        match nix::unistd::read(fd.as_raw_fd() as RawFd, buf) {
            Err(Errno::EINTR) => continue,
            other => return other,
        }
    }
}

/// Every catchable signal back to its default action (async-signal-safe: only sigaction).
fn reset_signal_dispositions() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for signal in Signal::iterator() {
        if !matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            // SAFETY: installing SIG_DFL runs no handler code.
            let _ = unsafe { sigaction(signal, &default) };
        }
    }
    // The real-time signals too, 32 and 33 included, which glibc's sigaction() refuses
    // (its threads use them; this child has none): straight to the kernel. Its struct is
    // handler, flags, restorer, mask on every architecture KAT builds for.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: 0, // SIG_DFL
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signo in 32..=64 {
        // SAFETY: a valid struct for SIG_DFL; the kernel copies it; no old action is read.
        unsafe {
            nix::libc::syscall(
                nix::libc::SYS_rt_sigaction,
                signo,
                &default as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            );
        }
    }
}
