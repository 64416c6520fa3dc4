//! The `buildah` subprocess of a build: its command line, the namespaces it runs in,
//! and what its output says about progress.
//!
//! buildah runs as root of a user namespace that maps only the node's build id slice (the
//! last one of its subordinate range, never given to a workload): it can write its storage
//! and the OCI layout in the workspace, which an ACL opens to that slice's root, and nothing
//! of the agent's own, whose files it sees as "other" (the data directory and PKI are 0700
//! and 0600). `RUN` steps use chroot isolation inside that namespace (there is no runc or
//! crun), which adds only a mount and a UTS namespace and a chroot. So `buildah bud`, whose
//! `RUN` steps run the repository's code, is contained further ([`Contain::Build`]):
//!
//! - **its own pid namespace and a fresh `/proc`**: the sandbox forks a small init as PID 1
//!   of a new pid namespace, which mounts a new proc on `/proc` (chroot isolation
//!   bind-mounts `/proc` from buildah's mount namespace into each `RUN`), so a `RUN` step
//!   sees the build's own processes only: not the host's command lines, not another build's
//!   `/proc/PID/root`;
//! - **its own network namespace**: with `network: egress` (the default) a `slirp4netns` of
//!   its own, started by the agent with `--disable-host-loopback` (see [`super::egress`]),
//!   so `RUN` steps reach the outside world but never a listener on the host's loopback
//!   (etcd, the agent's API); with `network: none` only `lo`. Base images are pulled before,
//!   with the host's network ([`Contain::UserOnly`]: the node's registry may be on its
//!   loopback, and no Dockerfile code runs then), and `buildah bud` runs with
//!   `--pull=never`;
//! - **no other build's workspace**: every build's buildah runs as the same host uid (the
//!   slice's root: one slice of 65,536 ids cannot be cut into one per concurrent build),
//!   and chroot isolation is no wall for that root (`chroot` with `CAP_SYS_CHROOT`, or
//!   `/proc/1/root` of buildah itself, same uid), so an ACL that opens each workspace to
//!   that uid would let one build's `RUN` read a concurrent build's workspace once it learns
//!   its name (from cgroup directory names, say). In the build's own mount namespace the
//!   sandbox therefore mounts an empty tmpfs over the workspaces' directory and binds only
//!   its own workspace back: whatever a `RUN` step escapes to, that mount namespace (all the
//!   build's processes are in it, and nothing outside its pid namespace is visible) has no
//!   path to another workspace.
//!
//! Long because it holds both ends of the sandbox's handshake (the private `READY` line, the
//! `--contain`, `--workspace` and `--resolv` options): the sandbox process, from
//! [`run_if_requested`] to `build_init`, and [`Sandbox::spawn`]; and buildah's arguments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use kat_api::build_definition::BuildNetwork;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How buildah is started: the namespace's id maps and where it keeps its state.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// The build slice's first host uid and gid, and its size.
    pub host_uid: u32,
    /// The build slice's first host gid.
    pub host_gid: u32,
    /// How many ids the slice has.
    pub count: u32,
    /// The build's workspace (absolute, no symbolic links): the one directory of its
    /// parent that a contained build sees.
    pub workspace: PathBuf,
    /// `{workspace}/state`: buildah's storage (and, unless `private` says otherwise, its
    /// home and temporary files).
    pub state: PathBuf,
    /// Where buildah's `HOME`, `TMPDIR` and `XDG_RUNTIME_DIR` are made: `state` for the
    /// build; a directory the build never saw for the cache push, which holds credentials
    /// (a `containers.conf` the build planted in its home would otherwise be read).
    pub private: Option<PathBuf>,
    /// `{workspace}/conf`: registries configuration (and the auth file), the agent's.
    pub conf: PathBuf,
    /// A command that runs the rest in a limited scope (`systemd-run …`), if any.
    pub prefix: Vec<String>,
    /// The program that serves as the sandbox ([`SANDBOX_ARG`]): the agent itself.
    pub helper: PathBuf,
    /// Environment for buildah besides what the sandbox sets (the outbound proxy of a pull
    /// or push).
    pub env: Vec<(String, String)>,
}

/// How far a buildah command is contained besides its user namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contain {
    /// The host's pid and network namespaces: pulls, pushes and removing the storage,
    /// where no code from the repository runs and the node's registries (perhaps on its
    /// loopback) must be reachable.
    UserOnly,
    /// `buildah bud`: its own pid (fresh `/proc`), mount and network namespaces, with this
    /// network, and no other build's workspace (see the module's documentation).
    Build(BuildNetwork),
}

/// A started sandbox: the process, its stdout after the handshake, and the build's egress
/// (ended when this is dropped).
pub struct Spawned {
    /// The sandbox process.
    pub child: tokio::process::Child,
    /// Its stdout, after the handshake.
    pub stdout: BufReader<tokio::process::ChildStdout>,
    /// The build's slirp4netns, if its network has egress.
    pub egress: Option<super::egress::Egress>,
}

/// What the sandbox's process says, with its pid, once it is in its new namespaces,
/// waiting for its id maps.
const READY: &str = "kat-sandbox-ready";

/// The first argument that makes a program the build sandbox (see [`run_if_requested`]).
pub const SANDBOX_ARG: &str = "__kat-build-sandbox";

/// The sandbox's options, before the command.
#[derive(Debug, Default)]
struct SandboxOptions {
    /// `--contain=egress|none`: the [`Contain::Build`] namespaces.
    contain: Option<BuildNetwork>,
    /// `--workspace=PATH`: the one workspace left visible.
    workspace: Option<PathBuf>,
    /// `--resolv=PATH`: bound over `/etc/resolv.conf` (slirp4netns's DNS forwarder: the
    /// host's resolver may be on its loopback, out of reach).
    resolv: Option<PathBuf>,
}

/// When this process was started as the build sandbox (`PROGRAM __kat-build-sandbox
/// [--contain=egress|none --workspace=PATH [--resolv=PATH]] COMMAND ARGS…`): a new user
/// namespace (with `--contain` new mount, pid and network namespaces too), [`READY`] and its
/// pid on stdout, one byte from stdin once the agent wrote its id maps (and started its
/// egress), then root there and exec of the command, which so starts with its capabilities
/// in the namespace; contained, after the mounts of [`contain`], through a small init that
/// is PID 1 of the new pid namespace. A fresh process: `unshare(CLONE_NEWUSER)` needs a
/// single thread, and the agent cannot wait on a child between fork and exec.
pub fn run_if_requested() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SANDBOX_ARG)) {
        return None;
    }
    let mut options = SandboxOptions::default();
    let mut program = None;
    for arg in args.by_ref() {
        let text = arg.to_string_lossy();
        if let Some(v) = text.strip_prefix("--contain=") {
            options.contain = match v {
                "egress" => Some(BuildNetwork::Egress),
                "none" => Some(BuildNetwork::None),
                other => {
                    eprintln!("{SANDBOX_ARG}: --contain={other}: expected egress or none");
                    return Some(std::process::ExitCode::from(2));
                }
            };
        } else if let Some(v) = text.strip_prefix("--workspace=") {
            options.workspace = Some(PathBuf::from(v));
        } else if let Some(v) = text.strip_prefix("--resolv=") {
            options.resolv = Some(PathBuf::from(v));
        } else {
            program = Some(arg);
            break;
        }
    }
    let Some(program) = program else {
        eprintln!("usage: PROGRAM {SANDBOX_ARG} [--contain=egress|none --workspace=PATH [--resolv=PATH]] COMMAND [ARGS...]");
        return Some(std::process::ExitCode::from(2));
    };
    let rest: Vec<std::ffi::OsString> = args.collect();
    match sandbox(&options, &program, &rest) {
        Ok(code) => Some(code),
        Err(e) => {
            eprintln!("{e}");
            Some(std::process::ExitCode::FAILURE)
        }
    }
}

fn sandbox(
    options: &SandboxOptions,
    program: &std::ffi::OsStr,
    args: &[std::ffi::OsString],
) -> Result<std::process::ExitCode, String> {
    use nix::sched::CloneFlags;
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    let contained = options.contain.is_some();
    let workspace = match (&options.workspace, contained) {
        (Some(w), true) if w.is_absolute() => Some(w.clone()),
        (_, true) => return Err("a contained build needs --workspace=ABSOLUTE_PATH".into()),
        (_, false) => None,
    };
    let mut flags = CloneFlags::CLONE_NEWUSER;
    if contained {
        // One call: the mount, pid and network namespaces are owned by the new user
        // namespace, and the network namespace exists before the agent starts the egress.
        flags |= CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNET;
    }
    nix::sched::unshare(flags)
        .map_err(|e| format!("cannot create the build's namespaces ({flags:?}): {e}"))?;
    let mut byte = [0u8; 1];
    let mut out = std::io::stdout();
    if out
        .write_all(format!("{READY} {}\n", std::process::id()).as_bytes())
        .and_then(|()| out.flush())
        .is_err()
        || std::io::stdin().read_exact(&mut byte).is_err()
    {
        return Err("the agent did not map the build's user namespace".into());
    }
    let root = nix::unistd::Uid::from_raw(0);
    let group = nix::unistd::Gid::from_raw(0);
    nix::unistd::setgroups(&[])
        .and_then(|()| nix::unistd::setresgid(group, group, group))
        .and_then(|()| nix::unistd::setresuid(root, root, root))
        .map_err(|e| format!("becoming root of the build's user namespace: {e}"))?;
    let command = || {
        let mut c = std::process::Command::new(program);
        c.args(args).stdin(Stdio::null());
        c
    };
    let Some(workspace) = workspace else {
        let e = command().exec();
        return Err(format!("running {}: {e}", program.to_string_lossy()));
    };
    contain(&workspace, options.resolv.as_deref())?;
    // The caller stays in the old pid namespace: its first child is PID 1 of the new one.
    // SAFETY: this process is single-threaded (a fresh sandbox process, see above).
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => build_init(command()),
        nix::unistd::ForkResult::Parent { child } => Ok(wait_exit(child)),
    }
}

/// In the build's own mount namespace (still root of its user namespace, in the old pid
/// namespace): mounts private; an empty tmpfs over the workspaces' directory with only this
/// workspace bound back; `/etc/resolv.conf` for the egress; `lo` up.
fn contain(workspace: &Path, resolv: Option<&Path>) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use std::os::fd::AsRawFd;
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("making the build's mounts private: {e}"))?;
    let (Some(parent), Some(name)) = (workspace.parent(), workspace.file_name()) else {
        return Err(format!("{} is not a workspace", workspace.display()));
    };
    // The workspace, opened while its path is still reachable (an ACL lets this uid in).
    let own = nix::fcntl::open(
        workspace,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("opening the workspace {}: {e}", workspace.display()))?;
    // SAFETY: `open` returned a new descriptor that nothing else owns.
    let own = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(own) };
    mount(
        Some("tmpfs"),
        parent,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0711,size=64k,nr_inodes=16"),
    )
    .map_err(|e| {
        format!(
            "hiding the other workspaces under {}: {e}",
            parent.display()
        )
    })?;
    let target = parent.join(name);
    std::fs::create_dir(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    mount(
        Some(format!("/proc/self/fd/{}", own.as_raw_fd()).as_str()),
        &target,
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )
    .map_err(|e| format!("binding the workspace back at {}: {e}", target.display()))?;
    drop(own);
    if let Some(resolv) = resolv {
        let etc = Path::new("/etc/resolv.conf");
        if etc.exists() {
            mount(Some(resolv), etc, none, MsFlags::MS_BIND, none)
                .map_err(|e| format!("binding {} over {}: {e}", resolv.display(), etc.display()))?;
        }
    }
    loopback_up()
}

/// PID 1 of the build's pid namespace: a fresh `/proc`, then the command as its child;
/// reaps every orphan and ends with the command's status (which ends every process left
/// in the namespace). Dies with its parent.
fn build_init(mut command: std::process::Command) -> ! {
    use nix::mount::{mount, MsFlags};
    use std::os::unix::process::CommandExt;
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let none: Option<&str> = None;
    if let Err(e) = mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        none,
    ) {
        eprintln!("mounting the build's /proc: {e}");
        std::process::exit(1);
    }
    // SAFETY: single-threaded, as the sandbox was.
    match unsafe { nix::unistd::fork() } {
        Err(e) => {
            eprintln!("fork: {e}");
            std::process::exit(1)
        }
        Ok(nix::unistd::ForkResult::Child) => {
            let e = command.exec();
            eprintln!("running {:?}: {e}", command.get_program());
            std::process::exit(127)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => loop {
            use nix::sys::wait::WaitStatus;
            match nix::sys::wait::waitpid(None, None) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => std::process::exit(code),
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == child => {
                    std::process::exit(128 + signal as i32)
                }
                Err(nix::errno::Errno::ECHILD) => std::process::exit(1),
                _ => {}
            }
        },
    }
}

/// Waits for `child` and passes its status on.
fn wait_exit(child: nix::unistd::Pid) -> std::process::ExitCode {
    use nix::sys::wait::WaitStatus;
    loop {
        match nix::sys::wait::waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => {
                return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
            }
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                return std::process::ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(1))
            }
            Err(nix::errno::Errno::EINTR) | Ok(_) => continue,
            Err(e) => {
                eprintln!("waiting for the build's init: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
}

/// `lo` up in the build's network namespace (slirp4netns does it too; with `network: none`
/// it is the only interface). As kat-init does for containers.
fn loopback_up() -> Result<(), String> {
    use nix::libc;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    #[repr(C)]
    struct IfReqFlags {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a valid, open descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: SIOCGIFFLAGS reads a NUL-terminated name and writes the flags into `req`,
    // which is as large as the kernel's struct ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(format!(
            "reading lo's flags: {}",
            std::io::Error::last_os_error()
        ));
    }
    req.flags |= libc::IFF_UP as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(format!(
            "setting lo up: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

impl Sandbox {
    /// Starts `program args` as root of a new user namespace that maps only the build
    /// slice (with [`Contain::Build`], in its own mount, pid and network namespaces too):
    /// the sandbox makes the namespaces, says so with its pid on stdout and waits; we write
    /// its id maps (directly as root, with newuidmap/newgidmap unprivileged, which check
    /// /etc/subuid) and start its egress; then it becomes root there and `sh` makes
    /// buildah's directories and execs the program. Its stdout comes back after the
    /// handshake line; `procs` are cgroups it joins before anything runs. Under systemd the
    /// scope's `systemd-run` comes first and execs the sandbox.
    pub async fn spawn(
        &self,
        program: &str,
        args: &[String],
        procs: Vec<PathBuf>,
        contain: Contain,
    ) -> std::io::Result<Spawned> {
        let script = concat!(
            "umask 022 && export HOME=\"$KAT_BUILD_HOME\" TMPDIR=\"$KAT_BUILD_TMP\" ",
            "XDG_RUNTIME_DIR=\"$KAT_BUILD_RUN\" && ",
            "mkdir -p \"$HOME\" \"$TMPDIR\" \"$XDG_RUNTIME_DIR\" && exec \"$@\""
        );
        let mut c = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = tokio::process::Command::new(first);
                // `/proc/self/exe` would be systemd-run itself once it execs: the agent's
                // own binary through its pid (still there if the file was replaced).
                let helper = if self.helper == Path::new("/proc/self/exe") {
                    PathBuf::from(format!("/proc/{}/exe", std::process::id()))
                } else {
                    self.helper.clone()
                };
                c.args(rest).arg(helper);
                c
            }
            None => tokio::process::Command::new(&self.helper),
        };
        c.arg(SANDBOX_ARG);
        if let Contain::Build(network) = contain {
            c.arg(match network {
                BuildNetwork::Egress => "--contain=egress",
                BuildNetwork::None => "--contain=none",
            })
            .arg(format!("--workspace={}", self.workspace.display()));
            if network == BuildNetwork::Egress {
                c.arg(format!(
                    "--resolv={}",
                    self.conf.join("resolv.conf").display()
                ));
            }
        }
        c.arg("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(program)
            .args(args);
        c.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("KAT_BUILD_HOME", self.private().join("home"))
            .env("KAT_BUILD_TMP", self.private().join("tmp"))
            .env("KAT_BUILD_RUN", self.private().join("run-user"))
            .env("BUILDAH_ISOLATION", "chroot");
        // systemd-run finds the agent's systemd instance through these.
        for var in ["XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"] {
            if let Some(v) = std::env::var_os(var) {
                c.env(var, v);
            }
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        crate::cgroups::join_on_exec(c.as_std_mut(), procs);
        let mut child = c.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut stdout = BufReader::new(stdout);
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let mut line = String::new();
        stdout.read_line(&mut line).await?;
        // The sandbox's own pid: under systemd-run it is not necessarily our child's.
        let pid = match line.trim().strip_prefix(READY).map(str::trim) {
            Some(pid) => pid.parse::<u32>().ok(),
            None => None,
        };
        let Some(pid) = pid else {
            let _ = child.kill().await;
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err).await;
            }
            return Err(std::io::Error::other(format!(
                "the build's user namespace: {}{}",
                line.trim(),
                err.trim()
            )));
        };
        if let Err(e) = self.map_ids(pid).await {
            let _ = child.kill().await;
            return Err(e);
        }
        let egress = match contain {
            Contain::Build(BuildNetwork::Egress) => match super::egress::start(pid).await {
                Ok(e) => Some(e),
                Err(e) => {
                    let _ = child.kill().await;
                    return Err(e);
                }
            },
            _ => None,
        };
        stdin.write_all(b"g").await?;
        drop(stdin);
        Ok(Spawned {
            child,
            stdout,
            egress,
        })
    }

    /// Runs `program args` in the sandbox ([`Contain::UserOnly`]) to the end; its exit
    /// status and output.
    pub async fn output(&self, program: &str, args: &[String]) -> std::io::Result<(bool, String)> {
        let Spawned {
            mut child,
            mut stdout,
            ..
        } = self
            .spawn(program, args, Vec::new(), Contain::UserOnly)
            .await?;
        let mut out = String::new();
        let mut err = String::new();
        let mut stderr = child.stderr.take();
        let (a, b) = tokio::join!(stdout.read_to_string(&mut out), async {
            match stderr.as_mut() {
                Some(e) => e.read_to_string(&mut err).await,
                None => Ok(0),
            }
        });
        a?;
        b?;
        let status = child.wait().await?;
        Ok((status.success(), format!("{out}{err}")))
    }

    async fn map_ids(&self, pid: u32) -> std::io::Result<()> {
        let root = nix::unistd::geteuid().is_root();
        for (file, tool, host) in [
            ("uid_map", "newuidmap", self.host_uid),
            ("gid_map", "newgidmap", self.host_gid),
        ] {
            if root {
                tokio::fs::write(
                    format!("/proc/{pid}/{file}"),
                    format!("0 {host} {}\n", self.count),
                )
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("writing {file}: {e}")))?;
            } else {
                let out = tokio::process::Command::new(tool)
                    .arg(pid.to_string())
                    .args(["0", &host.to_string(), &self.count.to_string()])
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("running {tool} (package uidmap): {e}"),
                        )
                    })?;
                if !out.status.success() {
                    return Err(std::io::Error::other(format!(
                        "{tool}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            }
        }
        Ok(())
    }

    /// buildah's global options: storage and configuration inside the workspace.
    fn private(&self) -> &Path {
        self.private.as_deref().unwrap_or(&self.state)
    }

    /// buildah's global options: `--root`, `--runroot`, the vfs driver and the registries
    /// configuration, all inside the workspace.
    pub fn global_args(&self) -> Vec<String> {
        let s = |p: &str| self.state.join(p).display().to_string();
        let c = |p: &str| self.conf.join(p).display().to_string();
        vec![
            "--root".into(),
            s("storage"),
            "--runroot".into(),
            s("runroot"),
            "--storage-driver".into(),
            "vfs".into(),
            "--registries-conf".into(),
            c("registries.conf"),
            "--registries-conf-dir".into(),
            c("registries.d"),
        ]
    }
}

/// What one build asks of buildah.
#[derive(Clone, Debug, Default)]
pub struct BudOptions {
    /// The build context directory.
    pub context: PathBuf,
    /// The Dockerfile (`-f`).
    pub dockerfile: PathBuf,
    /// Build arguments (`--build-arg NAME=VALUE`).
    pub build_args: BTreeMap<String, String>,
    /// The Dockerfile stage to build (`--target`).
    pub target: Option<String>,
    /// The platform to build for (`--platform`).
    pub platform: Option<String>,
    /// Where buildah writes the built image's id (`--iidfile`).
    pub iid_file: PathBuf,
    /// The auth file buildah reads (`--authfile`), if any.
    pub auth_file: Option<PathBuf>,
}

/// `buildah bud …` (after the global options).
pub fn bud_args(o: &BudOptions) -> Vec<String> {
    let mut a = vec![
        "bud".to_string(),
        "--isolation".into(),
        "chroot".into(),
        "--layers=false".into(),
        // The base images were pulled before, with the node's network (see [`pull_args`]);
        // bud runs where the host's loopback, and so perhaps the registry, is out of reach.
        "--pull=never".into(),
        "--iidfile".into(),
        o.iid_file.display().to_string(),
        "-f".into(),
        o.dockerfile.display().to_string(),
    ];
    for (k, v) in &o.build_args {
        a.push("--build-arg".into());
        a.push(format!("{k}={v}"));
    }
    if let Some(t) = &o.target {
        a.push("--target".into());
        a.push(t.clone());
    }
    if let Some(p) = &o.platform {
        a.push("--platform".into());
        a.push(p.clone());
    }
    if let Some(f) = &o.auth_file {
        a.push("--authfile".into());
        a.push(f.display().to_string());
    }
    a.push(o.context.display().to_string());
    a
}

/// `buildah pull` of one base image (after the global options), with the build's platform
/// (or the one its `FROM --platform=` names) and auth file.
pub fn pull_args(
    image: &super::dockerfile::BaseImage,
    platform: Option<&str>,
    auth_file: Option<&Path>,
) -> Vec<String> {
    let mut a = vec!["pull".to_string()];
    if let Some(p) = image.platform.as_deref().or(platform) {
        a.push("--platform".into());
        a.push(p.to_string());
    }
    if let Some(f) = auth_file {
        a.push("--authfile".into());
        a.push(f.display().to_string());
    }
    a.push(image.reference.clone());
    a
}

/// `registries.conf` for the build: the node's plain-HTTP registries marked insecure (as
/// the image store treats them), no short-name search.
pub fn registries_conf(insecure: &[String]) -> String {
    let mut text =
        String::from("unqualified-search-registries = []\nshort-name-mode = \"disabled\"\n");
    for host in insecure {
        text.push_str(&format!(
            "\n[[registry]]\nlocation = {}\ninsecure = true\n",
            toml_string(host)
        ));
    }
    text
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `registries.d/default.yaml`: signatures kept in the workspace (buildah running as root
/// of its namespace would otherwise look in `/var/lib/containers/sigstore`).
pub fn registries_d(state: &Path) -> String {
    format!(
        "default-docker:\n  lookaside: file://{}\n",
        state.join("sigstore").display()
    )
}

/// A step of the build, from a line of buildah's output: `STEP 2/5: RUN make` or, in a
/// multi-stage build, `[1/2] STEP 2/5: RUN make`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// (stage, stages) in a multi-stage build.
    pub stage: Option<(u32, u32)>,
    /// This step's number, from 1.
    pub step: u32,
    /// How many steps there are (in this stage).
    pub steps: u32,
    /// The Dockerfile instruction, as buildah prints it.
    pub instruction: String,
}

/// The step a line of buildah's output announces; `None` for any other line.
pub fn parse_step(line: &str) -> Option<Step> {
    let line = line.trim();
    let (stage, rest) = match line.strip_prefix('[') {
        Some(r) => {
            let (inner, rest) = r.split_once(']')?;
            let (a, b) = inner.split_once('/')?;
            (Some((a.parse().ok()?, b.parse().ok()?)), rest.trim_start())
        }
        None => (None, line),
    };
    let rest = rest.strip_prefix("STEP ")?;
    let (numbers, instruction) = rest.split_once(':')?;
    let (n, m) = numbers.split_once('/')?;
    Some(Step {
        stage,
        step: n.trim().parse().ok()?,
        steps: m.trim().parse().ok()?,
        instruction: instruction.trim().to_string(),
    })
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} of {}", self.step, self.steps)?;
        if let Some((s, n)) = self.stage {
            write!(f, " (stage {s} of {n})")?;
        }
        write!(f, ": {}", self.instruction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_read_from_single_and_multi_stage_output() {
        assert_eq!(
            parse_step("STEP 2/3: RUN make"),
            Some(Step {
                stage: None,
                step: 2,
                steps: 3,
                instruction: "RUN make".into()
            })
        );
        let s = parse_step("[1/2] STEP 3/3: RUN echo \"a: b\" > /x").unwrap();
        assert_eq!((s.stage, s.step, s.steps), (Some((1, 2)), 3, 3));
        assert_eq!(s.instruction, "RUN echo \"a: b\" > /x");
        assert_eq!(
            s.to_string(),
            "step 3 of 3 (stage 1 of 2): RUN echo \"a: b\" > /x"
        );
        for other in [
            "Getting image source signatures",
            "[x] STEP",
            "STEP a/b: x",
            "",
        ] {
            assert_eq!(parse_step(other), None, "{other}");
        }
    }

    #[test]
    fn arguments_carry_every_build_option() {
        let o = BudOptions {
            context: "/w/src/app".into(),
            dockerfile: "/w/src/app/build/Dockerfile".into(),
            build_args: [("A".to_string(), "1 2".to_string())].into(),
            target: Some("final".into()),
            platform: Some("linux/amd64".into()),
            iid_file: "/w/state/iid".into(),
            auth_file: None,
        };
        let a = bud_args(&o).join(" ");
        assert!(a.contains("--build-arg A=1 2"), "{a}");
        assert!(a.contains("--target final --platform linux/amd64"), "{a}");
        assert!(a.contains("--pull=never"), "{a}");
        assert!(a.ends_with("-f /w/src/app/build/Dockerfile --build-arg A=1 2 --target final --platform linux/amd64 /w/src/app"), "{a}");
        let conf = registries_conf(&["127.0.0.1:5000".into(), "evil\"\n[x]".into()]);
        assert!(
            conf.contains("location = \"127.0.0.1:5000\"\ninsecure = true"),
            "{conf}"
        );
        assert!(conf.contains("location = \"evil\\\"\\u000a[x]\""), "{conf}");
    }
}
