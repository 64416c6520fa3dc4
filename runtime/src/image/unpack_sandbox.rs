//! Unpacking a layer as an id that owns nothing on the host.
//!
//! [`super::layer`] touches a layer's tree only by descriptor and never follows a symlink.
//! This is the second wall, for the case that code missed: the unpacking runs in a helper
//! process (`PROGRAM __kat-unpack-layer`, see [`crate::userns_helper`]) whose user namespace
//! maps only an id slice reserved for it — the one before the builds' (the last), which no
//! workload and no build is given — and which becomes root there
//! before it reads a byte of the layer. On the host it is then the slice's root, an id that
//! owns no host file, no key of the agent and nothing of any workload: the kernel refuses
//! whatever a missed case would make it write outside. It reaches its work directory as its
//! current directory, set before it dropped its privileges, so it needs no path through
//! the agent's private directories; the blob is opened before that too.
//!
//! Once it has exited and nothing writes the tree any more, [`crate::id_tool`]'s `Shift`
//! gives the tree to the store's owners (the image's own ids for a root agent, the agent's
//! user for an unprivileged one), and it is renamed into place.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde::{Deserialize, Serialize};

use super::layer::{self, LayerStats, Ownership};
use super::limits::Budget;
use crate::error::{IoContext, Result, RuntimeError};
use crate::id_tool::{self, IdTask};
use crate::idmap::{IdMap, IdRange, NodeIdRange, SLICE_SIZE};
use crate::userns_helper;

/// The first argument that makes a program the unpack helper.
pub const HELPER_ARG: &str = "__kat-unpack-layer";

/// The directory the helper unpacks into, inside its working directory.
const TREE: &str = "tree";

/// What the helper is asked to do.
#[derive(Serialize, Deserialize)]
struct Request {
    blob: PathBuf,
    digest: String,
    budget: Budget,
}

/// What it answers on its stdout.
#[derive(Serialize, Deserialize)]
enum Outcome {
    Unpacked { stats: LayerStats, budget: Budget },
    Refused { reason: String },
}

/// Where and as whom layers are unpacked.
#[derive(Clone, Debug)]
pub struct UnpackSandbox {
    /// The agent's binary (or `kat-runtime-helper`), which serves as the helper.
    program: PathBuf,
    range: NodeIdRange,
    /// Host uid and gid of the reserved slice's root.
    slice: (u32, u32),
}

impl UnpackSandbox {
    /// The sandbox of a node with `range`, unpacking as the root of [`Self::slot`], or
    /// `None` when the range has no slice to spare for it.
    pub fn new(program: PathBuf, range: NodeIdRange) -> Option<UnpackSandbox> {
        let slot = Self::slot(&range)?;
        Some(UnpackSandbox {
            program,
            range,
            slice: range.slot_root(slot),
        })
    }

    /// The slice unpacking uses: the one before the builds' (the last), so that no build
    /// step (which runs as the builds' slice) can signal, trace or reach an unpacker, and no
    /// workload is given it. `None` with fewer than three slices (one for workloads, one
    /// for builds, one for this).
    pub fn slot(range: &NodeIdRange) -> Option<u32> {
        (range.slots() >= 3).then(|| range.slots() - 2)
    }

    /// Host uid and gid the helper unpacks as.
    pub fn unpacks_as(&self) -> (u32, u32) {
        self.slice
    }

    /// Unpacks the layer blob at `blob` into `dest`, which must not exist, counting it
    /// against `budget`; on any error nothing is left behind.
    pub fn unpack(
        &self,
        blob: &Path,
        dest: &Path,
        digest: &str,
        budget: &mut Budget,
    ) -> Result<LayerStats> {
        let work = dest.with_extension(format!("partial-{}", std::process::id()));
        if work.exists() {
            self.remove(&work)?;
        }
        fs::create_dir(&work).context(|| format!("creating {}", work.display()))?;
        // The helper is another uid and must create its tree here. No one else reaches it:
        // the store's directories are the agent's alone (0700).
        fs::set_permissions(&work, fs::Permissions::from_mode(0o777))
            .context(|| format!("chmod {}", work.display()))?;
        let result = self
            .run_helper(blob, &work, digest, budget)
            .and_then(|stats| {
                let tree = work.join(TREE);
                id_tool::run(&self.program, &self.range, &self.give_to_store(&tree))?;
                fs::rename(&tree, dest)
                    .context(|| format!("moving layer {digest} into {}", dest.display()))?;
                Ok(stats)
            });
        let cleaned = self.remove(&work);
        let stats = result?;
        cleaned?;
        Ok(stats)
    }

    /// Removes a tree the helper may have left (owned by the slice).
    pub fn remove(&self, path: &Path) -> Result<()> {
        id_tool::run(
            &self.program,
            &self.range,
            &IdTask::Remove {
                path: path.to_path_buf(),
            },
        )
    }

    /// The slice's ids become the store's: the image's own ids (a root agent), or the
    /// agent's user for everything (an unprivileged agent, which cannot own other ids).
    fn give_to_store(&self, tree: &Path) -> IdTask {
        let (from, count, to) = if nix::unistd::geteuid().is_root() {
            (self.slice, SLICE_SIZE, (0, 0))
        } else {
            (
                self.slice,
                1,
                (
                    nix::unistd::geteuid().as_raw(),
                    nix::unistd::getegid().as_raw(),
                ),
            )
        };
        IdTask::Shift {
            path: tree.to_path_buf(),
            from,
            count,
            to,
        }
    }

    fn run_helper(
        &self,
        blob: &Path,
        work: &Path,
        digest: &str,
        budget: &mut Budget,
    ) -> Result<LayerStats> {
        let failed = |message: String| RuntimeError::Container {
            context: format!("unpacking layer {digest} as uid {}", self.slice.0),
            message,
        };
        let request = Request {
            blob: blob.to_path_buf(),
            digest: digest.to_string(),
            budget: budget.clone(),
        };
        let json = serde_json::to_string(&request).map_err(|e| failed(e.to_string()))?;
        let mut command = Command::new(&self.program);
        command.arg(HELPER_ARG).arg(json).current_dir(work);
        let slice = |outside: u32| {
            [IdRange {
                inside: 0,
                outside,
                count: SLICE_SIZE,
            }]
        };
        let child = userns_helper::start(command, &slice(self.slice.0), &slice(self.slice.1))
            .map_err(failed)?;
        let out = child
            .wait_with_output()
            .map_err(|e| failed(e.to_string()))?;
        match serde_json::from_slice::<Outcome>(&out.stdout) {
            Ok(Outcome::Unpacked { stats, budget: b }) if out.status.success() => {
                *budget = b;
                Ok(stats)
            }
            Ok(Outcome::Refused { reason }) => Err(RuntimeError::BadLayer {
                digest: digest.to_string(),
                reason,
            }),
            _ => Err(failed(format!(
                "the helper failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

/// When this process was started as the unpack helper, runs it and returns its exit code.
/// Call it first in `main`, before any thread exists.
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(HELPER_ARG)) {
        return None;
    }
    let request: Request = match args
        .next()
        .and_then(|a| a.into_string().ok())
        .map(|a| serde_json::from_str(&a))
    {
        Some(Ok(request)) => request,
        _ => {
            eprintln!("usage: PROGRAM {HELPER_ARG} REQUEST_JSON");
            return Some(ExitCode::from(2));
        }
    };
    Some(match helper_main(request) {
        Ok(outcome) => match serde_json::to_writer(std::io::stdout(), &outcome) {
            Ok(()) if matches!(outcome, Outcome::Unpacked { .. }) => ExitCode::SUCCESS,
            Ok(()) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("writing the outcome: {e}");
                ExitCode::FAILURE
            }
        },
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    })
}

fn helper_main(request: Request) -> std::result::Result<Outcome, String> {
    // Opened with the agent's credentials: the slice's root could not reach it.
    let blob = fs::File::open(&request.blob)
        .map_err(|e| format!("opening {}: {e}", request.blob.display()))?;
    userns_helper::enter()?;
    userns_helper::become_root()?;
    // From here on this process is the slice's root on the host.
    fs::create_dir(TREE).map_err(|e| format!("creating the layer's tree: {e}"))?;
    // Ids as the image has them, inside the slice; ids past it become root (as a
    // workload's mapping would show them).
    let image_ids = IdMap {
        uids: vec![IdRange {
            inside: 0,
            outside: 0,
            count: SLICE_SIZE,
        }],
        gids: vec![IdRange {
            inside: 0,
            outside: 0,
            count: SLICE_SIZE,
        }],
    };
    let mut budget = request.budget;
    Ok(
        match layer::unpack_into(
            blob,
            Path::new(TREE),
            Ownership::Mapped(&image_ids),
            &request.digest,
            &mut budget,
        ) {
            Ok(stats) => Outcome::Unpacked { stats, budget },
            Err(RuntimeError::BadLayer { reason, .. }) => Outcome::Refused { reason },
            Err(e) => return Err(e.to_string()),
        },
    )
}
