//! Running a command inside a running container: its namespaces, its cgroup, its user and
//! capabilities, with pipes or a pseudo-terminal.
//!
//! The process is built from the container's own `config.json` (user, env, capabilities)
//! plus the request, and started by libcontainer's tenant builder. With a TTY, libcontainer
//! hands the terminal's master end back over a console socket (SCM_RIGHTS); resizing is a
//! `TIOCSWINSZ` on that fd.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use serde_json::json;

use crate::error::{IoContext, Result, RuntimeError};

/// A running exec'd process.
pub struct ExecHandle {
    pub pid: i32,
    /// Write end of the process's stdin (no TTY).
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// The terminal's master end (TTY): read output from it, write input to it.
    pub pty: Option<File>,
    exit: tokio::sync::oneshot::Receiver<i32>,
}

impl ExecHandle {
    /// Waits for the process; its exit code, or 128+signal.
    pub async fn wait(&mut self) -> Result<i32> {
        (&mut self.exit).await.map_err(|_| RuntimeError::Container {
            context: format!("waiting for exec process {}", self.pid),
            message: "the process could not be waited for".into(),
        })
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

nix::ioctl_write_ptr_bad!(tiocswinsz, nix::libc::TIOCSWINSZ, nix::libc::winsize);

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

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
        context: "creating a pipe".into(),
        source: e.into(),
    })
}

/// Receives the terminal master fd libcontainer sends over the console socket.
fn receive_pty(listener: &UnixListener) -> Result<OwnedFd> {
    let (stream, _) = listener
        .accept()
        .context(|| "waiting for the exec's terminal".to_string())?;
    let mut buf = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .map_err(|e| RuntimeError::Io {
        context: "receiving the exec's terminal".into(),
        source: e.into(),
    })?;
    for cmsg in msg.cmsgs().map_err(|e| RuntimeError::Io {
        context: "receiving the exec's terminal".into(),
        source: e.into(),
    })? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(fd) = fds.first() {
                // SAFETY: the kernel just installed this fd in our table for us.
                return Ok(unsafe { OwnedFd::from_raw_fd(*fd) });
            }
        }
    }
    Err(RuntimeError::Container {
        context: "exec with a TTY".into(),
        message: "libcontainer sent no terminal".into(),
    })
}

pub async fn exec(
    lib_root: PathBuf,
    id: String,
    options: crate::types::ExecOptions,
) -> Result<ExecHandle> {
    if options.command.is_empty() {
        return Err(RuntimeError::InvalidOption {
            field: "command".into(),
            reason: "exec needs a command".into(),
        });
    }
    let container_dir = lib_root.join(&id);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(container_dir.join("state.json"))
            .context(|| format!("reading the state of {id}"))?,
    )
    .map_err(|e| RuntimeError::Container {
        context: format!("state of {id}"),
        message: e.to_string(),
    })?;
    let bundle = PathBuf::from(state["bundle"].as_str().unwrap_or_default());
    let init_pid = state["pid"].as_i64().unwrap_or(0);
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(bundle.join("config.json"))
            .context(|| format!("reading the spec of {id}"))?,
    )
    .map_err(|e| RuntimeError::Container {
        context: format!("spec of {id}"),
        message: e.to_string(),
    })?;
    let process = &config["process"];
    let mut env: Vec<String> = process["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in &options.env {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
    // The container's root as its processes see it, for a clear "not found".
    let root = PathBuf::from(format!("/proc/{init_pid}/root"));
    crate::rootfs::find_executable(&root, &options.command[0], &env)?;

    let (rows, cols) = options.size.unwrap_or((24, 80));
    let exec_dir = tempdir_in(&container_dir)?;
    let process_json = json!({
        "terminal": options.tty,
        "consoleSize": {"height": rows, "width": cols},
        "user": process["user"],
        "args": options.command,
        "env": env,
        "cwd": options.cwd.clone().unwrap_or_else(|| process["cwd"].as_str().unwrap_or("/").to_string()),
        "capabilities": process["capabilities"],
        "noNewPrivileges": true,
    });
    let process_path = exec_dir.join("process.json");
    std::fs::write(
        &process_path,
        serde_json::to_vec(&process_json).unwrap_or_default(),
    )
    .context(|| format!("writing {}", process_path.display()))?;

    let tty = options.tty;
    let result = tokio::task::spawn_blocking(move || -> Result<ExecHandle> {
        let _cwd = crate::LIBCONTAINER_CWD
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut builder = ContainerBuilder::new(id.clone(), SyscallType::default())
            .with_root_path(lib_root)
            .map_err(|e| RuntimeError::Container {
                context: "libcontainer root".into(),
                message: e.to_string(),
            })?;
        let mut handle = ExecHandle {
            pid: 0,
            stdin: None,
            stdout: None,
            stderr: None,
            pty: None,
            exit: tokio::sync::oneshot::channel().1,
        };
        let listener;
        if tty {
            let socket = exec_dir.join("console.sock");
            listener = Some(
                UnixListener::bind(&socket).context(|| format!("binding {}", socket.display()))?,
            );
            builder = builder.with_console_socket(Some(&socket));
        } else {
            listener = None;
            let (in_r, in_w) = pipe()?;
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            builder = builder
                .with_stdin(in_r)
                .with_stdout(out_w)
                .with_stderr(err_w);
            handle.stdin = Some(File::from(in_w));
            handle.stdout = Some(File::from(out_r));
            handle.stderr = Some(File::from(err_r));
        }
        let pid = builder
            .as_tenant()
            .with_process(Some(&process_path))
            .with_detach(tty)
            .build()
            .map_err(|e| RuntimeError::Container {
                context: format!("exec in container {id}"),
                message: e.to_string(),
            })?;
        if let Some(listener) = &listener {
            let master = receive_pty(listener)?;
            set_size(master.as_raw_fd(), rows, cols)?;
            handle.pty = Some(File::from(master));
        }
        handle.pid = pid.as_raw();
        let (tx, rx) = tokio::sync::oneshot::channel();
        handle.exit = rx;
        std::thread::Builder::new()
            .name(format!("exec-{}", pid.as_raw()))
            .spawn(move || {
                use nix::sys::wait::{waitpid, WaitStatus};
                let code = match waitpid(pid, None) {
                    Ok(WaitStatus::Exited(_, code)) => code,
                    Ok(WaitStatus::Signaled(_, sig, _)) => 128 + sig as i32,
                    _ => 255,
                };
                let _ = tx.send(code);
            })
            .context(|| "starting the exec waiter".to_string())?;
        Ok(handle)
    })
    .await
    .map_err(|e| RuntimeError::Container {
        context: "exec".into(),
        message: e.to_string(),
    })?;
    result
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = dir.join(format!(
        "exec-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&path).context(|| format!("creating {}", path.display()))?;
    Ok(path)
}
