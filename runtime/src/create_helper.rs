//! libcontainer's `create`, run in a fresh single-threaded process.
//!
//! libcontainer makes a container by `clone`-ing the calling process (an intermediate
//! process, then the container's init). Cloning a multi-threaded process (the agent runs
//! tokio) copies every lock another thread held at that instant — malloc's arena locks,
//! std's thread-info lock — into a child with only one thread, which then deadlocks at its
//! first allocation. glibc's `fork` resets its own locks; a raw `clone` does not.
//!
//! So the runtime never lets libcontainer clone the agent. Each create spawns a helper
//! (`PROGRAM __kat-create-container REQUEST`) with `fork`+`exec`: a new, single-threaded
//! image of the agent's binary that builds the container and exits. The container's init
//! (kat-init) is then reparented to the agent, which is a child subreaper
//! ([`become_subreaper`]) and waits for it as before. The helper's own cost is an `exec` of
//! the binary: a few milliseconds per create.
//!
//! A binary that embeds [`crate::NativeRuntime`] calls [`run_if_requested`] first thing in
//! `main`. Test binaries, whose `main` is the test harness, use the small
//! `kat-runtime-helper` binary of this crate instead.

use std::ffi::OsString;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result, RuntimeError};

/// The first argument that makes a program the create helper.
pub const HELPER_ARG: &str = "__kat-create-container";

/// What the helper is asked to create.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    pub id: String,
    /// libcontainer's state root.
    pub lib_root: PathBuf,
    /// The bundle with `config.json`.
    pub bundle: PathBuf,
    /// Cgroups through systemd (a transient scope) rather than the cgroup filesystem.
    pub systemd: bool,
    /// A user namespace to enter before libcontainer runs (see
    /// [`crate::network::JoinedNamespaces::parent_user`]).
    #[serde(default)]
    pub enter_user_namespace: Option<PathBuf>,
    /// Entries to give to the workload's root (host ids) once in that user namespace,
    /// before libcontainer runs: the overlay's directories and the workload's own volumes.
    /// It maps the node's ids, so this spares an unprivileged agent an id helper of its own
    /// (see [`crate::id_tool`]).
    #[serde(default)]
    pub own_first: Option<OwnFirst>,
    /// When the agent spawned the helper (microseconds since the epoch): the helper says how
    /// long its own start took ([`HelperTimes`]).
    #[serde(default)]
    pub spawned_at_micros: u64,
}

/// What the helper gives to the workload's root before libcontainer runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnFirst {
    pub paths: Vec<PathBuf>,
    /// The workload root's host uid and gid.
    pub host_uid: u32,
    pub host_gid: u32,
}

/// How long a helper took to start (from the agent's spawn, by the wall clock, to its `main`:
/// the exec, Rust's start and reading the request) and to build the container; the rest of
/// its time is its exit and the agent seeing it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HelperTimes {
    pub start: std::time::Duration,
    pub build: std::time::Duration,
}

/// The line a helper that succeeded writes last on its error output.
const TIMES_PREFIX: &str = "kat-create-helper-times ";

fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// When this process was started as the create helper, runs it and returns its exit code.
/// Call it before starting any thread.
pub fn run_if_requested() -> Option<ExitCode> {
    // The same program serves as the id helper (see `crate::id_tool`).
    if let Some(code) = crate::id_tool::run_if_requested() {
        return Some(code);
    }
    // And as the layer unpacker (see `crate::image::unpack_sandbox`).
    if let Some(code) = crate::image::unpack_sandbox::run_if_requested() {
        return Some(code);
    }
    // And as the build sandbox (see `crate::build::buildah`).
    if let Some(code) = crate::build::buildah::run_if_requested() {
        return Some(code);
    }
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(HELPER_ARG)) {
        return None;
    }
    Some(helper_main(args.next()))
}

fn helper_main(request: Option<OsString>) -> ExitCode {
    let request: Request = match request
        .and_then(|r| r.into_string().ok())
        .map(|r| serde_json::from_str(&r))
    {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            eprintln!("{HELPER_ARG}: bad request: {e}");
            return ExitCode::from(2);
        }
        None => {
            eprintln!("usage: PROGRAM {HELPER_ARG} REQUEST_JSON");
            return ExitCode::from(2);
        }
    };
    let started = micros_now();
    match build(&request) {
        Ok(()) => {
            // Diagnostics only: the container exists whether or not this line is written.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "{TIMES_PREFIX}{} {}",
                started.saturating_sub(request.spawned_at_micros),
                micros_now().saturating_sub(started)
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// The helper's work: libcontainer's create, detached. Runs single-threaded.
fn build(r: &Request) -> std::result::Result<(), String> {
    if r.own_first.is_some() && r.enter_user_namespace.is_none() {
        return Err("giving the container's directories to its root needs the node user namespace to enter, and the request names none".into());
    }
    if let Some(path) = &r.enter_user_namespace {
        let file = fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        // Allowed: this process is single-threaded and its user owns that namespace.
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWUSER)
            .map_err(|e| format!("entering the node user namespace {}: {e}", path.display()))?;
        if let Some(own) = &r.own_first {
            crate::id_tool::own_here(&own.paths, (own.host_uid, own.host_gid))
                .map_err(|e| format!("giving the container's directories to its root: {e}"))?;
        }
    }
    // kat-init's stdio is /dev/null: it opens its log directory inside the container and
    // replaces these with the container's own /dev/null, so it holds no host file.
    let null = || -> std::result::Result<OwnedFd, String> {
        Ok(fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| format!("opening /dev/null: {e}"))?
            .into())
    };
    ContainerBuilder::new(r.id.clone(), SyscallType::default())
        .with_root_path(&r.lib_root)
        .map_err(|e| format!("libcontainer root {}: {e}", r.lib_root.display()))?
        .with_stdin(null()?)
        .with_stdout(null()?)
        .with_stderr(null()?)
        .validate_id()
        .map_err(|e| format!("container id {}: {e}", r.id))?
        .as_init(&r.bundle)
        .with_systemd(r.systemd)
        .with_detach(true)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Makes this process the reaper of orphaned descendants: a container's init, orphaned when
/// its helper exits, becomes our child, so we can wait for it and record how it ended.
pub(crate) fn become_subreaper() -> Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| RuntimeError::Io {
        context: "becoming a child subreaper".into(),
        source: e.into(),
    })
}

/// Runs the helper `program` for `request`; its error output (kept in `err_file`, not a
/// pipe the container could inherit) becomes the error.
/// A helper that does not say how long it took (an older binary) gives `None`.
pub(crate) async fn create(
    program: &Path,
    mut request: Request,
    err_file: &Path,
) -> Result<Option<HelperTimes>> {
    request.spawned_at_micros = micros_now();
    let json = serde_json::to_string(&request).map_err(|e| RuntimeError::Container {
        context: format!("creating container {}", request.id),
        message: e.to_string(),
    })?;
    let err = fs::File::create(err_file).context(|| format!("creating {}", err_file.display()))?;
    let status = tokio::process::Command::new(program)
        .arg(HELPER_ARG)
        .arg(json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .status()
        .await
        .context(|| format!("running the create helper {}", program.display()))?;
    let output = fs::read_to_string(err_file).unwrap_or_default();
    let _ = fs::remove_file(err_file);
    if status.success() {
        let times = output
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(TIMES_PREFIX))
            .and_then(|t| t.split_once(' '))
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
            .map(|(start, build)| HelperTimes {
                start: std::time::Duration::from_micros(start),
                build: std::time::Duration::from_micros(build),
            });
        return Ok(times);
    }
    Err(RuntimeError::Container {
        context: format!("creating container {}", request.id),
        message: match output.trim() {
            "" => format!(
                "the create helper {} ended with {status}",
                program.display()
            ),
            text => text.to_string(),
        },
    })
}
