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
//! the binary: about 2 ms per create. After a create, the next helper is started ahead
//! ([`Spares`]): it waits for its request on its standard input, so a burst of creates (a
//! workload's replicas, a rollout's steps, restarts) does not wait for that exec. A spare
//! unused for [`SPARE_KEEP`] is ended: an idle node keeps no extra process.
//!
//! A binary that embeds [`crate::NativeRuntime`] calls [`run_if_requested`] first thing in
//! `main`. Test binaries, whose `main` is the test harness, use the small
//! `kat-runtime-helper` binary of this crate instead.

use std::ffi::OsString;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::io::{Read, Seek};

use tokio::io::AsyncWriteExt;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result, RuntimeError};

/// The first argument that makes a program the create helper.
pub const HELPER_ARG: &str = "__kat-create-container";
/// The request argument of a spare helper: it reads its request from its standard input.
const REQUEST_ON_STDIN: &str = "-";
/// How long a spare helper waits for a create before it is ended.
pub const SPARE_KEEP: Duration = Duration::from_secs(20);

/// What the helper is asked to create.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    /// The container's ID.
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
    /// The entries to give: the overlay's directories and the workload's own volumes.
    pub paths: Vec<PathBuf>,
    /// The workload root's host uid and gid.
    pub host_uid: u32,
    /// The workload root's host gid.
    pub host_gid: u32,
}

/// How long a helper took to start (from the agent's spawn, by the wall clock, to having its
/// request: the exec, Rust's start and reading the request; for a spare, started ahead, only
/// the hand-over) and to build the container; the rest of its time is its exit and the agent
/// seeing it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HelperTimes {
    /// From the agent's spawn to the helper having its request.
    pub start: std::time::Duration,
    /// Building the container.
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
    let request = match request {
        Some(r) if r == REQUEST_ON_STDIN => match request_from_stdin() {
            Ok(text) => Some(OsString::from(text)),
            Err(e) => {
                eprintln!("{HELPER_ARG}: reading the request: {e}");
                return ExitCode::from(2);
            }
        },
        other => other,
    };
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

/// A spare's request: its standard input to the end (the agent closes it after the request),
/// which is then replaced by `/dev/null` so that nothing holds the agent's pipe.
fn request_from_stdin() -> std::io::Result<String> {
    let text = std::io::read_to_string(std::io::stdin())?;
    let null = fs::File::open("/dev/null")?;
    nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0)?;
    Ok(text)
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

/// The create helper started ahead of the next create (at most one), and what starting one
/// takes. See the module's documentation.
pub(crate) struct Spares {
    program: PathBuf,
    /// Where a spare's error output is made (and at once unlinked: see [`Spare::err`]).
    dir: PathBuf,
    spare: Mutex<Option<Spare>>,
    keep: Duration,
    /// Creates that used a spare.
    used: AtomicU64,
}

/// Numbers the spares of this process (every runtime's): the one an expiry timer was set for
/// may have been used since, and their error files must not share a name.
static SPARES_MADE: AtomicU64 = AtomicU64::new(0);

struct Spare {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    /// The spare's error output: a file unlinked as soon as it was made, which this handle
    /// (and the spare's standard error) keep open: nothing is left behind, even by a crash.
    err: fs::File,
    number: u64,
}

impl Spares {
    /// Spares of helper `program`, their error output in `dir` (which must exist).
    pub(crate) fn new(program: PathBuf, dir: PathBuf, keep: Duration) -> Arc<Spares> {
        Arc::new(Spares {
            program,
            dir,
            spare: Mutex::new(None),
            keep,
            used: AtomicU64::new(0),
        })
    }

    /// How many creates used a spare.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Spare>> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self) -> Option<Spare> {
        self.lock().take()
    }

    fn has_spare(&self) -> bool {
        self.lock().is_some()
    }

    /// Starts a spare if there is none, and a timer that ends it if still unused after
    /// `keep`. A spare that cannot start is no error: the next create starts its own helper.
    fn refill(self: &Arc<Self>) {
        if self.has_spare() {
            return;
        }
        let number = SPARES_MADE.fetch_add(1, Ordering::Relaxed) + 1;
        let path = self.dir.join(format!(
            "create-helper-spare-{}-{number}.err",
            std::process::id()
        ));
        let started = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|err| {
                let for_helper = err.try_clone();
                fs::remove_file(&path)?;
                let child = tokio::process::Command::new(&self.program)
                    .arg(HELPER_ARG)
                    .arg(REQUEST_ON_STDIN)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(for_helper?)
                    .kill_on_drop(true)
                    .spawn()?;
                Ok((child, err))
            });
        let (mut child, err) = match started {
            Ok(started) => started,
            Err(e) => {
                tracing::debug!("starting a spare create helper: {e}");
                let _ = fs::remove_file(&path);
                return;
            }
        };
        let Some(stdin) = child.stdin.take() else {
            return; // piped above: always there
        };
        let spare = Spare {
            child,
            stdin,
            err,
            number,
        };
        let mut slot = self.lock();
        if slot.is_some() {
            // Another create's refill came first: this one is dropped (and killed).
            drop(slot);
            spare.end();
            return;
        }
        *slot = Some(spare);
        drop(slot);
        let spares = Arc::downgrade(self);
        let keep = self.keep;
        tokio::spawn(async move {
            tokio::time::sleep(keep).await;
            let Some(spares) = spares.upgrade() else {
                return;
            };
            let mut slot = spares.lock();
            if slot.as_ref().is_some_and(|s| s.number == number) {
                if let Some(unused) = slot.take() {
                    drop(slot);
                    unused.end();
                }
            }
        });
    }
}

impl Spare {
    /// Gives the spare `request`: its exit status and error output; `None` if it was gone
    /// before it took the request (then the caller starts a helper of its own: a spare that
    /// took no request has done nothing).
    async fn hand(mut self, request: &str) -> Result<Option<(ExitStatus, String)>> {
        let written = async {
            self.stdin.write_all(request.as_bytes()).await?;
            self.stdin.shutdown().await
        }
        .await;
        drop(self.stdin);
        if let Err(e) = written {
            tracing::debug!("a spare create helper took no request ({e}): starting another");
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
            return Ok(None);
        }
        // Waited for in a task of its own: a caller that stops waiting (a cancelled create)
        // does not kill a helper halfway through libcontainer's create.
        let mut child = self.child;
        let status = tokio::spawn(async move { child.wait().await })
            .await
            .map_err(std::io::Error::other)
            .and_then(|waited| waited)
            .context(|| "waiting for the create helper".to_string())?;
        let mut err = self.err;
        let mut output = String::new();
        let _ = err
            .seek(std::io::SeekFrom::Start(0))
            .and_then(|_| err.read_to_string(&mut output));
        Ok(Some((status, output)))
    }

    /// Ends an unused spare: killed and waited for, in the background.
    fn end(mut self) {
        let _ = self.child.start_kill();
        tokio::spawn(async move {
            let _ = self.child.wait().await;
        });
    }
}

/// Makes this process the reaper of orphaned descendants: a container's init, orphaned when
/// its helper exits, becomes our child, so we can wait for it and record how it ended.
pub(crate) fn become_subreaper() -> Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| RuntimeError::Io {
        context: "becoming a child subreaper".into(),
        source: e.into(),
    })
}

/// Runs a helper for `request`, the spare of `spares` if there is one, else a new one; its
/// error output (kept in a file, not a pipe the container could inherit) becomes the error.
/// A helper that does not say how long it took (an older binary) gives `None`.
pub(crate) async fn create(
    spares: &Arc<Spares>,
    mut request: Request,
    err_file: &Path,
) -> Result<Option<HelperTimes>> {
    let encode = |request: &Request| {
        serde_json::to_string(request).map_err(|e| RuntimeError::Container {
            context: format!("creating container {}", request.id),
            message: e.to_string(),
        })
    };
    let spare = spares.take();
    request.spawned_at_micros = micros_now();
    let json = encode(&request)?;
    let handed = match spare {
        Some(spare) => spare.hand(&json).await?,
        None => None,
    };
    let (status, output) = match handed {
        Some(done) => {
            spares.used.fetch_add(1, Ordering::Relaxed);
            done
        }
        None => {
            request.spawned_at_micros = micros_now();
            let json = encode(&request)?;
            let program = &spares.program;
            let err = fs::File::create(err_file)
                .context(|| format!("creating {}", err_file.display()))?;
            let status = tokio::process::Command::new(program)
                .arg(HELPER_ARG)
                .arg(json)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(err)
                .status()
                .await
                .context(|| format!("running the create helper {}", program.display()))?;
            let output = fs::read_to_string(err_file).unwrap_or_default();
            let _ = fs::remove_file(err_file);
            (status, output)
        }
    };
    // The next create's helper, started off this create's path (its spawn waits for the
    // exec: a blocking thread's time, not a worker's).
    let next = spares.clone();
    tokio::task::spawn_blocking(move || next.refill());
    let program = &spares.program;
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
