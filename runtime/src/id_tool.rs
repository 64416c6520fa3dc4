//! File ownership in the node's id range: give a tree to a workload's slice, remove a tree
//! a container wrote.
//!
//! A root agent does this directly. An unprivileged agent cannot `chown` to, or remove
//! directories owned by, its subordinate ids in the host's user namespace; a process that
//! is root in a user namespace mapping them can (podman's `unshare` pattern). So it runs
//! the task in a helper (`PROGRAM __kat-id-task TASK`, see [`crate::userns_helper`]) whose
//! user namespace maps `0 → our uid, 1.. → the node range`, and does the work as root
//! there. Tasks are written with host ids; the helper translates them.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use kat_api::id_map::ProcIdMap;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::idmap::{IdRange, NodeIdRange};
use crate::tree_dir::TreeDir;
use crate::userns_helper;

/// The first argument that makes a program the id helper.
pub const HELPER_ARG: &str = "__kat-id-task";

/// Work on files, with host ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "task")]
pub enum IdTask {
    /// Every entry of the tree (never through a symlink): an id in `from..from+count` moves
    /// to the same offset from `to`, any other id becomes `to` itself.
    Shift {
        /// The tree's top.
        path: PathBuf,
        /// The first host (uid, gid) of the ids that move.
        from: (u32, u32),
        /// How many ids move.
        count: u32,
        /// The host (uid, gid) the first of them moves to.
        to: (u32, u32),
    },
    /// These entries (not what is below them) get `owner`.
    Own {
        /// The entries.
        paths: Vec<PathBuf>,
        /// Their new host (uid, gid).
        owner: (u32, u32),
    },
    /// Removes the tree.
    Remove {
        /// The tree's top.
        path: PathBuf,
    },
}

/// Runs `task`: here when we are root, else in the user-namespace helper `program`.
pub fn run(program: &Path, range: &NodeIdRange, task: &IdTask) -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        return perform(task).map_err(|message| failed(task, message));
    }
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let translated = translate(task, me, range).map_err(|m| failed(task, m))?;
    let json = serde_json::to_string(&translated).map_err(|e| failed(task, e.to_string()))?;
    let mut command = Command::new(program);
    command.arg(HELPER_ARG).arg(json);
    let line = |own: u32, start: u32, count: u32| {
        [
            IdRange {
                inside: 0,
                outside: own,
                count: 1,
            },
            IdRange {
                inside: 1,
                outside: start,
                count,
            },
        ]
    };
    let child = userns_helper::start(
        command,
        &line(me.0, range.uid_start, range.uid_count),
        &line(me.1, range.gid_start, range.gid_count),
    )
    .map_err(|m| failed(task, m))?;
    let out = child
        .wait_with_output()
        .map_err(|e| failed(task, e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            task,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

fn failed(task: &IdTask, message: String) -> RuntimeError {
    let what = match task {
        IdTask::Shift { path, .. } => format!("giving {} to a workload's ids", path.display()),
        IdTask::Own { paths, .. } => format!(
            "giving {} to a workload's root",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        IdTask::Remove { path } => format!("removing {}", path.display()),
    };
    RuntimeError::Container {
        context: what,
        message,
    }
}

/// `Own` of `paths` for host ids `owner`, done by this process in the user namespace it is
/// in (the create helper, once it entered the node user namespace): the ids are translated
/// through this namespace's own maps, so an id it does not map is refused, never guessed.
pub(crate) fn own_here(paths: &[PathBuf], owner: (u32, u32)) -> std::result::Result<(), String> {
    let inside = |file: &str, host: u32| -> std::result::Result<u32, String> {
        let path = format!("/proc/self/{file}");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
        let map = ProcIdMap::parse(&text).map_err(|e| format!("{path}: {e}"))?;
        map.inside(host).ok_or_else(|| {
            format!(
                "host id {host} is not mapped in this user namespace ({path}: {})",
                text.trim()
            )
        })
    };
    let owner = (inside("uid_map", owner.0)?, inside("gid_map", owner.1)?);
    perform(&IdTask::Own {
        paths: paths.to_vec(),
        owner,
    })
}

/// Host ids as the helper's user namespace sees them: our own ids are 0, the node range
/// starts at 1.
fn translate(
    task: &IdTask,
    me: (u32, u32),
    range: &NodeIdRange,
) -> std::result::Result<IdTask, String> {
    let uid = |h: u32| -> std::result::Result<u32, String> {
        if h == me.0 {
            Ok(0)
        } else if h >= range.uid_start && h - range.uid_start < range.uid_count {
            Ok(1 + h - range.uid_start)
        } else {
            Err(format!("uid {h} is neither ours nor in the node's range"))
        }
    };
    let gid = |h: u32| -> std::result::Result<u32, String> {
        if h == me.1 {
            Ok(0)
        } else if h >= range.gid_start && h - range.gid_start < range.gid_count {
            Ok(1 + h - range.gid_start)
        } else {
            Err(format!("gid {h} is neither ours nor in the node's range"))
        }
    };
    Ok(match task {
        IdTask::Shift {
            path,
            from,
            count,
            to,
        } => IdTask::Shift {
            path: path.clone(),
            from: (uid(from.0)?, gid(from.1)?),
            count: *count,
            to: (uid(to.0)?, gid(to.1)?),
        },
        IdTask::Own { paths, owner } => IdTask::Own {
            paths: paths.clone(),
            owner: (uid(owner.0)?, gid(owner.1)?),
        },
        IdTask::Remove { path } => IdTask::Remove { path: path.clone() },
    })
}

/// Does the task with the ids as given (in the helper: ids of its namespace).
fn perform(task: &IdTask) -> std::result::Result<(), String> {
    match task {
        IdTask::Shift {
            path,
            from,
            count,
            to,
        } => {
            let shift = |id: u32, from: u32, to: u32| {
                if id >= from && id - from < *count {
                    to + (id - from)
                } else {
                    to
                }
            };
            // By descriptor (`tree_dir`): a container writing this tree at the same time
            // cannot swap a directory for a symlink and have us chown the host's files.
            let top = TreeDir::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let me = top
                .stat_self()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            top.chown_self(shift(me.uid, from.0, to.0), shift(me.gid, from.1, to.1))
                .map_err(|e| format!("chown {}: {e}", path.display()))?;
            top.for_each_entry(|dir, name, entry| {
                dir.chown(
                    name,
                    shift(entry.uid, from.0, to.0),
                    shift(entry.gid, from.1, to.1),
                )
            })
            .map_err(|e| format!("chown below {}: {e}", path.display()))
        }
        IdTask::Own { paths, owner } => paths.iter().try_for_each(|path| {
            // The entry itself, by descriptor of its parent (a path we made): never followed.
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(format!("{} has no parent", path.display()));
            };
            TreeDir::open(parent)
                .and_then(|dir| dir.chown(name, owner.0, owner.1))
                .map_err(|e| format!("chown {}: {e}", path.display()))
        }),
        IdTask::Remove { path } => {
            crate::tree_dir::remove_tree(path).map_err(|e| format!("{}: {e}", path.display()))
        }
    }
}

/// When this process was started as the id helper, runs it and returns its exit code.
/// Call it first in `main`, before any thread exists (`unshare(CLONE_NEWUSER)` needs a
/// single-threaded process).
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(HELPER_ARG)) {
        return None;
    }
    let task: IdTask = match args
        .next()
        .and_then(|a| a.into_string().ok())
        .map(|a| serde_json::from_str(&a))
    {
        Some(Ok(task)) => task,
        _ => {
            eprintln!("usage: PROGRAM {HELPER_ARG} TASK_JSON");
            return Some(ExitCode::from(2));
        }
    };
    if let Err(message) = userns_helper::enter() {
        eprintln!("{message}");
        return Some(ExitCode::FAILURE);
    }
    match perform(&task) {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(message) => {
            eprintln!("{message}");
            Some(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_host_ids_into_the_helper_namespace() {
        let range = NodeIdRange {
            uid_start: 100_000,
            uid_count: 65_536 * 2,
            gid_start: 200_000,
            gid_count: 65_536 * 2,
        };
        let task = IdTask::Shift {
            path: "/x".into(),
            from: (1000, 1000),
            count: 1,
            to: (165_536, 265_536),
        };
        assert_eq!(
            translate(&task, (1000, 1000), &range).unwrap(),
            IdTask::Shift {
                path: "/x".into(),
                from: (0, 0),
                count: 1,
                to: (65_537, 65_537),
            }
        );
        let bad = IdTask::Own {
            paths: vec!["/x".into()],
            owner: (0, 0),
        };
        assert!(
            translate(&bad, (1000, 1000), &range).is_err(),
            "host root is never reachable"
        );
    }
}
