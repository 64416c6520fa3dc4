//! Running a command inside a running container: its namespaces, its cgroup, its user and
//! capabilities, with pipes or a pseudo-terminal.
//!
//! KAT joins the container itself, the way `nsenter` does, rather than through libcontainer's
//! tenant builder (which joins the PID namespace before the user namespace, so an
//! unprivileged agent gets EPERM). The agent forks; the child, before it executes anything:
//!
//! 1. moves itself into the container's cgroups (writes `0` to each `cgroup.procs`);
//! 2. joins the container's user namespace first, which gives it every capability there,
//!    then the cgroup, ipc, uts, network, PID and mount namespaces;
//! 3. takes the container's root directory (`/proc/PID/root`) as its root, and its working
//!    directory;
//! 4. becomes the container's user (groups, gid, uid) with the container's capability sets
//!    (read from its PID 1), and sets `no_new_privs`;
//! 5. with a TTY, opens the terminal in the container's own `/dev/pts` (so `tty` works there),
//!    sends its master end to the agent over a socket, and makes it its controlling terminal;
//! 6. executes kat-init with the command, from a descriptor of the host's binary opened
//!    before the fork (`execveat(fd, "", AT_EMPTY_PATH)`), never by a path: every path is
//!    resolved in the container's root by now, and a workload that could put its own program
//!    where kat-init is expected would run it unfiltered in the agent's PID namespace, with
//!    the admin's terminal. Joining a PID namespace only applies to children, so kat-init
//!    starts the command as its child inside the namespace, forwards signals to it, installs
//!    the container's seccomp filter, and exits with the command's code (128+signal when
//!    killed).
//!
//! The child runs only async-signal-safe system calls between fork and exec: everything it
//! needs (namespace fds, paths, ids) is prepared before the fork. It reports the step it is
//! on over a pipe, so a failure says which step failed. Capabilities are therefore raw
//! masks, not the `caps` crate (which sets one set per call, from a `HashSet`): the
//! container's three masks, read from its PID 1 before the fork, go in with one `capset`.
//!
//! Long because both sides of the fork stay together: `prepare` fills the private `Entry` and
//! `Terminal` that the child uses in `enter` and `attach`, and [`exec()`] reads back the child's
//! `STEPS` index and receives the terminal that `attach` sends.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::libc;

use crate::error::{IoContext, Result, RuntimeError};
use crate::spec::INIT_PATH;

/// kat-init's argv and environment as the NULL-terminated pointer arrays `execveat` takes,
/// built before the fork: the child may not allocate.
struct ExecArgs {
    fd: File,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into `_strings`' heap buffers, which live as long as `self` and
// are never written; the arrays are only read, in the forked child.
unsafe impl Send for ExecArgs {}
// SAFETY: as for `Send`: shared references only read the arrays.
unsafe impl Sync for ExecArgs {}

impl ExecArgs {
    fn new(fd: File, argv: &[String], env: &[String]) -> Result<ExecArgs> {
        let nul = |what: &str| RuntimeError::InvalidOption {
            field: what.to_string(),
            reason: "contains a NUL byte".into(),
        };
        let mut strings = Vec::with_capacity(argv.len() + env.len());
        for a in argv {
            strings.push(CString::new(a.as_str()).map_err(|_| nul("command"))?);
        }
        for e in env {
            strings.push(CString::new(e.as_str()).map_err(|_| nul("env"))?);
        }
        let pointers = |from: &[CString]| -> Vec<*const libc::c_char> {
            from.iter()
                .map(|c| c.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        let (a, e) = strings.split_at(argv.len());
        let (argv, envp) = (pointers(a), pointers(e));
        Ok(ExecArgs {
            fd,
            _strings: strings,
            argv,
            envp,
        })
    }

    /// In the forked child: replaces it with kat-init; returns only on failure.
    fn exec(&self) -> std::io::Error {
        // SAFETY: a valid descriptor, an empty path with AT_EMPTY_PATH, and NULL-terminated
        // arrays of pointers to NUL-terminated strings that outlive the call.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
        }
        std::io::Error::last_os_error()
    }
}

/// A running exec'd process.
pub struct ExecHandle {
    /// The host PID of the exec'd kat-init, which runs the command.
    pub pid: i32,
    /// Write end of the process's stdin (no TTY).
    pub stdin: Option<File>,
    /// Read end of the process's stdout (no TTY).
    pub stdout: Option<File>,
    /// Read end of the process's stderr (no TTY).
    pub stderr: Option<File>,
    /// The terminal's master end (TTY): read output from it, write input to it.
    pub pty: Option<File>,
    exit: tokio::sync::oneshot::Receiver<i32>,
}

impl ExecHandle {
    /// A handle with no process behind it, whose `wait` gives what `exit` receives (the fake
    /// runtime's probes). `pid` is 0, so `kill_tree` does nothing.
    #[cfg(feature = "fake")]
    pub fn finished(exit: tokio::sync::oneshot::Receiver<i32>) -> Self {
        ExecHandle {
            pid: 0,
            stdin: None,
            stdout: None,
            stderr: None,
            pty: None,
            exit,
        }
    }

    /// Waits for the process; its exit code, or 128+signal.
    pub async fn wait(&mut self) -> Result<i32> {
        (&mut self.exit).await.map_err(|_| RuntimeError::Container {
            context: format!("waiting for exec process {}", self.pid),
            message: "the process could not be waited for".into(),
        })
    }

    /// Kills the process and everything it started (a probe that timed out). Without a
    /// TTY the exec'd kat-init runs the command as a process group of its own, whose id is
    /// the command's pid: that group goes first, then kat-init.
    pub fn kill_tree(&self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = self.pid;
        // Never kill(0) or kill(-1): those are our own group and every process we may signal.
        if pid <= 0 {
            return;
        }
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(-child), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }

    /// Resizes the TTY.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        let pty = self
            .pty
            .as_ref()
            .ok_or_else(|| RuntimeError::InvalidOption {
                field: "resize".into(),
                reason: "this exec has no TTY".into(),
            })?;
        set_size(pty.as_raw_fd(), rows, cols)
    }
}

/// Resizes the terminal whose master end is `pty` (a clone of [`ExecHandle::pty`]).
pub fn resize_pty(pty: &File, rows: u16, cols: u16) -> Result<()> {
    set_size(pty.as_raw_fd(), rows, cols)
}

nix::ioctl_write_ptr_bad!(
    /// Sets the size of the terminal whose master end is `fd` (`TIOCSWINSZ`).
    tiocswinsz,
    nix::libc::TIOCSWINSZ,
    nix::libc::winsize
);

fn set_size(fd: i32, rows: u16, cols: u16) -> Result<()> {
    let size = nix::libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: fd is an open terminal master owned by the handle; size is a valid winsize.
    unsafe { tiocswinsz(fd, &size) }.map_err(|e| RuntimeError::Io {
        context: "resizing the terminal".into(),
        source: e.into(),
    })?;
    Ok(())
}

/// What the forked child does, in order; it writes each step's index to a pipe before the
/// step, so a failure names the step.
const STEPS: [&str; 11] = [
    "joining the container's cgroups",
    "joining the container's user namespace",
    "joining the container's other namespaces",
    "entering the container's root directory",
    "changing to the working directory",
    "dropping capabilities from the bounding set",
    "becoming the container's user",
    "setting the container's capabilities",
    "setting no_new_privs",
    "attaching the terminal",
    "executing kat-init from the host's binary",
];

/// Capability sets as in `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CapSets {
    /// The inheritable set (`CapInh`).
    pub inheritable: u64,
    /// The permitted set (`CapPrm`).
    pub permitted: u64,
    /// The effective set (`CapEff`).
    pub effective: u64,
    /// The bounding set (`CapBnd`).
    pub bounding: u64,
    /// The ambient set (`CapAmb`).
    pub ambient: u64,
}

/// `CAP_NET_ADMIN`'s bit.
const CAP_NET_ADMIN: u32 = 12;

impl CapSets {
    /// These sets without kat-init's own capability (`CAP_NET_ADMIN`, which it holds for a
    /// moment at start to set the loopback up): an exec that starts before kat-init dropped
    /// it must not get it either.
    pub(crate) fn without_init_only(self) -> CapSets {
        let bit = !(1u64 << CAP_NET_ADMIN);
        CapSets {
            inheritable: self.inheritable & bit,
            permitted: self.permitted & bit,
            effective: self.effective & bit,
            bounding: self.bounding & bit,
            ambient: self.ambient & bit,
        }
    }

    /// Reads the `Cap*` lines of a `/proc/PID/status`.
    pub(crate) fn parse(status: &str) -> Option<CapSets> {
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find_map(|l| l.strip_prefix(name))?;
            u64::from_str_radix(line.trim_start_matches(':').trim(), 16).ok()
        };
        Some(CapSets {
            inheritable: field("CapInh")?,
            permitted: field("CapPrm")?,
            effective: field("CapEff")?,
            bounding: field("CapBnd")?,
            ambient: field("CapAmb").unwrap_or(0),
        })
    }
}

/// Everything the forked child needs, prepared before the fork.
struct Entry {
    cgroup_procs: Vec<File>,
    user_ns: Option<File>,
    namespaces: Vec<(File, libc::c_int)>,
    root: File,
    cwd: CString,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    caps: CapSets,
    last_cap: u32,
    tty: Option<Terminal>,
    steps: OwnedFd,
}

/// A terminal the child opens inside the container (its `/dev/pts`, so that `tty` and
/// `ttyname` work there) and whose master end it sends back over `socket`.
struct Terminal {
    socket: UnixStream,
    size: libc::winsize,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

fn check(ret: libc::c_long) -> std::io::Result<()> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Entry {
    fn step(&self, index: u8) {
        // SAFETY: write(2) of one byte from a live buffer to an fd we own.
        unsafe { libc::write(self.steps.as_raw_fd(), [index].as_ptr().cast(), 1) };
    }

    /// Runs in the forked child: async-signal-safe system calls only, no allocation.
    fn enter(&self) -> std::io::Result<()> {
        // SAFETY: (the whole function) plain system calls on fds and buffers owned by
        // `self`, which outlives the calls.
        unsafe {
            self.step(0);
            for procs in &self.cgroup_procs {
                check(libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) as libc::c_long)?;
            }
            self.step(1);
            if let Some(user) = &self.user_ns {
                check(libc::setns(user.as_raw_fd(), libc::CLONE_NEWUSER).into())?;
            }
            self.step(2);
            for (ns, kind) in &self.namespaces {
                check(libc::setns(ns.as_raw_fd(), *kind).into())?;
            }
            self.step(3);
            check(libc::fchdir(self.root.as_raw_fd()).into())?;
            check(libc::chroot(c".".as_ptr()).into())?;
            self.step(4);
            check(libc::chdir(self.cwd.as_ptr()).into())?;
            self.step(5);
            for cap in 0..=self.last_cap.min(63) {
                if self.caps.bounding & (1 << cap) == 0
                    && libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong) == 1
                {
                    check(libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong).into())?;
                }
            }
            self.step(6);
            // A user namespace mapped without newgidmap denies setgroups; with no
            // supplementary groups to set there is nothing lost.
            let set = libc::setgroups(self.groups.len(), self.groups.as_ptr());
            if set < 0 && !self.groups.is_empty() {
                return Err(std::io::Error::last_os_error());
            }
            check(libc::prctl(libc::PR_SET_KEEPCAPS, 1 as libc::c_ulong).into())?;
            check(libc::setresgid(self.gid, self.gid, self.gid).into())?;
            check(libc::setresuid(self.uid, self.uid, self.uid).into())?;
            self.step(7);
            let header = CapHeader {
                version: CAP_VERSION_3,
                pid: 0,
            };
            let c = self.caps;
            let data = [
                CapData {
                    effective: c.effective as u32,
                    permitted: c.permitted as u32,
                    inheritable: c.inheritable as u32,
                },
                CapData {
                    effective: (c.effective >> 32) as u32,
                    permitted: (c.permitted >> 32) as u32,
                    inheritable: (c.inheritable >> 32) as u32,
                },
            ];
            check(libc::syscall(
                libc::SYS_capset,
                &header as *const CapHeader,
                data.as_ptr(),
            ))?;
            for cap in 0..=self.last_cap.min(63) {
                if c.ambient & (1 << cap) != 0 {
                    check(
                        libc::prctl(
                            libc::PR_CAP_AMBIENT,
                            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                            cap as libc::c_ulong,
                            0 as libc::c_ulong,
                            0 as libc::c_ulong,
                        )
                        .into(),
                    )?;
                }
            }
            self.step(8);
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0).into())?;
            if let Some(terminal) = &self.tty {
                self.step(9);
                terminal.attach()?;
            }
        }
        Ok(())
    }
}

impl Terminal {
    /// In the forked child, inside the container: opens a terminal, sends its master end
    /// to the agent, and makes the other end this process's controlling terminal and stdio.
    fn attach(&self) -> std::io::Result<()> {
        // SAFETY: system calls on fds we open here or own, with stack buffers that outlive
        // them; CMSG_* are computed for a buffer of the right size and alignment.
        unsafe {
            let master = libc::open(
                c"/dev/ptmx".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            check(master.into())?;
            let unlock: libc::c_int = 0;
            check(libc::ioctl(master, libc::TIOCSPTLCK, &unlock).into())?;
            check(libc::ioctl(master, libc::TIOCSWINSZ, &self.size).into())?;
            let slave = libc::ioctl(master, libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY);
            check(slave.into())?;

            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut space = [0u64; 4];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), master);
            check(libc::sendmsg(self.socket.as_raw_fd(), &msg, 0) as libc::c_long)?;
            libc::close(master);

            check(libc::setsid().into())?;
            for fd in 0..3 {
                check(libc::dup2(slave, fd).into())?;
            }
            if slave > 2 {
                libc::close(slave);
            }
            check(libc::ioctl(0, libc::TIOCSCTTY, 0).into())?;
        }
        Ok(())
    }
}

/// Receives the terminal master end the child sent.
fn receive_master(socket: &UnixStream) -> Result<File> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let io = |e: nix::Error| RuntimeError::Io {
        context: "receiving the exec's terminal".into(),
        source: e.into(),
    };
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io)?;
    for cmsg in msg.cmsgs().map_err(io)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(fd) = fds.first() {
                // SAFETY: the kernel just installed this fd in our table for us.
                return Ok(File::from(unsafe { OwnedFd::from_raw_fd(*fd) }));
            }
        }
    }
    Err(RuntimeError::Container {
        context: "exec with a TTY".into(),
        message: "the exec process sent no terminal".into(),
    })
}

fn container_error(id: &str, message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Container {
        context: format!("exec in container {id}"),
        message: message.to_string(),
    }
}

fn open_ns(pid: i64, name: &str) -> Result<File> {
    let path = format!("/proc/{pid}/ns/{name}");
    File::open(&path).context(|| format!("opening {path}"))
}

fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Opens what the child needs to enter the container whose PID 1 is `pid`.
fn prepare(
    id: &str,
    pid: i64,
    process: &oci_spec::runtime::Process,
    cgroup_procs: &[PathBuf],
    cwd: &str,
    tty: Option<Terminal>,
    steps: OwnedFd,
) -> Result<Entry> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context(|| format!("reading the status of {id}'s PID 1"))?;
    let caps = CapSets::parse(&status)
        .ok_or_else(|| container_error(id, "its PID 1 shows no capability sets"))?
        .without_init_only();
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let mut procs = Vec::new();
    for path in cgroup_procs {
        procs.push(
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .context(|| format!("opening {}", path.display()))?,
        );
    }
    let own_user =
        File::open("/proc/self/ns/user").context(|| "opening our user namespace".to_string())?;
    let user = open_ns(pid, "user")?;
    let user_ns = (!same_file(&own_user, &user)).then_some(user);
    let mut namespaces = Vec::new();
    for (name, kind) in [
        ("cgroup", libc::CLONE_NEWCGROUP),
        ("ipc", libc::CLONE_NEWIPC),
        ("uts", libc::CLONE_NEWUTS),
        ("net", libc::CLONE_NEWNET),
        ("pid", libc::CLONE_NEWPID),
        ("mnt", libc::CLONE_NEWNS),
    ] {
        namespaces.push((open_ns(pid, name)?, kind));
    }
    let root_path = format!("/proc/{pid}/root");
    let root = File::open(&root_path).context(|| format!("opening {root_path}"))?;
    let user = process.user();
    Ok(Entry {
        cgroup_procs: procs,
        user_ns,
        namespaces,
        root,
        cwd: CString::new(cwd).map_err(|_| RuntimeError::InvalidOption {
            field: "cwd".into(),
            reason: "contains a NUL byte".into(),
        })?,
        uid: user.uid(),
        gid: user.gid(),
        groups: user.additional_gids().clone().unwrap_or_default(),
        caps,
        last_cap,
        tty,
        steps,
    })
}

/// What KAT reads of libcontainer's `state.json`.
#[derive(serde::Deserialize)]
struct LcState {
    bundle: PathBuf,
    pid: Option<i64>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    serde_json::from_slice(&std::fs::read(path).context(|| format!("reading {what}"))?).map_err(
        |e| RuntimeError::Container {
            context: what.to_string(),
            message: e.to_string(),
        },
    )
}

/// Runs `options.command` in the running container `id`. `cgroup_procs` are the
/// `cgroup.procs` files of its cgroups.
pub async fn exec(
    lib_root: PathBuf,
    init_binary: &Path,
    id: String,
    cgroup_procs: Vec<PathBuf>,
    options: crate::types::ExecOptions,
) -> Result<ExecHandle> {
    if options.command.is_empty() {
        return Err(RuntimeError::InvalidOption {
            field: "command".into(),
            reason: "exec needs a command".into(),
        });
    }
    let state: LcState = read_json(
        &lib_root.join(&id).join("state.json"),
        &format!("the state of {id}"),
    )?;
    let pid = state
        .pid
        .filter(|p| *p > 0)
        .ok_or_else(|| container_error(&id, "the container has no PID 1"))?;
    let config: oci_spec::runtime::Spec = read_json(
        &state.bundle.join("config.json"),
        &format!("the spec of {id}"),
    )?;
    let process = config
        .process()
        .clone()
        .ok_or_else(|| container_error(&id, "its config.json has no process"))?;
    // The same seccomp filter as PID 1: kat-init installs it when the spec asked it to.
    let seccomp = process.args().as_ref().is_some_and(|args| {
        args.windows(2)
            .any(|w| w[0] == "--seccomp" && w[1] == "default")
    });
    let mut env: Vec<String> = process.env().clone().unwrap_or_default();
    for (k, v) in &options.env {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
    // The container's root as its processes see it (one descriptor, mounts included), for
    // a clear "not found".
    let root = crate::tree_dir::TreeDir::open_root_of(pid as i32)
        .map_err(|e| container_error(&id, format!("opening /proc/{pid}/root: {e}")))?;
    crate::rootfs::find_executable(&root, &options.command[0], &env)?;
    let cwd = options
        .cwd
        .clone()
        .unwrap_or_else(|| process.cwd().to_string_lossy().into_owned());

    let (steps_r, steps_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
            context: "creating a pipe".into(),
            source: e.into(),
        })?;
    let (terminal, master_socket) = if options.tty {
        let (rows, cols) = options.size.unwrap_or((24, 80));
        let (ours, theirs) =
            UnixStream::pair().context(|| "creating the terminal socket".to_string())?;
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        (
            Some(Terminal {
                socket: theirs,
                size,
            }),
            Some(ours),
        )
    } else {
        (None, None)
    };
    let entry = prepare(&id, pid, &process, &cgroup_procs, &cwd, terminal, steps_w)?;
    // The host's kat-init, opened here, on the host: the container cannot replace it.
    let init = File::open(init_binary)
        .context(|| format!("opening kat-init at {}", init_binary.display()))?;
    let mut argv: Vec<String> = vec![INIT_PATH.into()];
    if seccomp {
        argv.extend(["--seccomp".into(), "default".into()]);
    }
    argv.push("--".into());
    argv.extend(options.command.iter().cloned());
    let init = ExecArgs::new(init, &argv, &env)?;

    // `Command` forks, sets the stdio up and reports a failure of the child; the child never
    // reaches its own exec of `program`: the pre-exec step execs kat-init by descriptor, or
    // fails. The program named here is never looked up.
    let mut command = Command::new(INIT_PATH);
    let stdio = |piped: bool| if piped { Stdio::piped() } else { Stdio::null() };
    command
        .stdin(stdio(!options.tty))
        .stdout(stdio(!options.tty))
        .stderr(stdio(!options.tty));
    // SAFETY: `enter` and `exec` make only async-signal-safe system calls and do not allocate.
    unsafe {
        command.pre_exec(move || {
            entry.enter()?;
            entry.step(10);
            Err(init.exec())
        })
    };

    let waited_id = id.clone();
    tokio::task::spawn_blocking(move || {
        let spawned = command.spawn();
        // The command (and the child's copy of the step pipe) is gone once spawn returns.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let mut steps = Vec::new();
                let _ = File::from(steps_r).read_to_end(&mut steps);
                let step = steps
                    .last()
                    .and_then(|i| STEPS.get(*i as usize))
                    .copied()
                    .unwrap_or("starting kat-init in the container");
                return Err(container_error(&id, format!("{step}: {e}")));
            }
        };
        let pty = match &master_socket {
            Some(socket) => match receive_master(socket) {
                Ok(master) => Some(master),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            },
            None => None,
        };
        let mut handle = ExecHandle {
            pid: child.id() as i32,
            stdin: child.stdin.take().map(|s| File::from(OwnedFd::from(s))),
            stdout: child.stdout.take().map(|s| File::from(OwnedFd::from(s))),
            stderr: child.stderr.take().map(|s| File::from(OwnedFd::from(s))),
            pty,
            exit: tokio::sync::oneshot::channel().1,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        handle.exit = rx;
        std::thread::Builder::new()
            .name(format!("exec-{}", handle.pid))
            .spawn(move || {
                use std::os::unix::process::ExitStatusExt;
                let code = match child.wait() {
                    Ok(status) => status
                        .code()
                        .or_else(|| status.signal().map(|s| 128 + s))
                        .unwrap_or(255),
                    Err(_) => 255,
                };
                let _ = tx.send(code);
            })
            .context(|| "starting the exec waiter".to_string())?;
        Ok(handle)
    })
    .await
    .map_err(|e| container_error(&waited_id, e))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_capability_sets_from_proc_status() {
        let status = "Name:\tkat-init\nCapInh:\t0000000000000000\nCapPrm:\t00000000a80425fb\n\
                      CapEff:\t00000000a80425fb\nCapBnd:\t00000000a80425fb\nCapAmb:\t0000000000000000\n";
        let caps = CapSets::parse(status).unwrap();
        assert_eq!(caps.bounding, 0xa80425fb);
        assert_eq!(caps.effective, 0xa80425fb);
        assert_eq!(caps.inheritable, 0);
        assert!(CapSets::parse("Name:\tx\n").is_none());
        // kat-init at its start, still holding CAP_NET_ADMIN (0x1000): an exec never gets it.
        let early = "CapInh:\t0000000000000000\nCapPrm:\t00000000000015fb\n\
                     CapEff:\t00000000000015fb\nCapBnd:\t00000000000015fb\nCapAmb:\t0000000000001000\n";
        let caps = CapSets::parse(early).unwrap().without_init_only();
        assert_eq!(
            (caps.permitted, caps.effective, caps.bounding, caps.ambient),
            (0x5fb, 0x5fb, 0x5fb, 0)
        );
    }
}
