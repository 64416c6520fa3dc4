//! The steps of a setup, each able to say what it does, do it if not already done, and
//! undo it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Our drop-in that delegates cpu, memory and pids to every user's systemd instance.
pub const DELEGATE_DROP_IN: &str = "/etc/systemd/system/user@.service.d/kat-delegate.conf";
/// 64 workload slices of 65,536 ids (see `kat_runtime::idmap`): each workload on the node
/// gets its own.
const SUBID_COUNT: u32 = 64 * 65_536;

pub enum Step {
    /// A system user with its own group and home.
    User { name: String, home: PathBuf },
    /// A subuid and subgid range for the user.
    SubIds { user: String },
    /// A directory, given to `owner` if set.
    Dir {
        path: PathBuf,
        mode: u32,
        owner: Option<String>,
    },
    /// A binary copied in (replaced atomically, so a running one can be upgraded).
    Install { from: PathBuf, to: PathBuf },
    /// A file with this content; `keep` leaves an existing one alone.
    File {
        path: PathBuf,
        content: String,
        mode: u32,
        owner: Option<String>,
        keep: bool,
    },
    /// cgroup v1/hybrid: container cgroup parents in every controller, given to the user.
    V1Cgroups { parent: String, user: String },
    /// A command.
    Run { argv: Vec<String>, why: String },
    /// The user's systemd instance runs from boot, without a login.
    Linger { user: String },
    /// The agent's user unit enabled and (re)started in the user's systemd instance.
    UserUnit { user: String },
}

/// uid and gid of a user, if it exists.
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
}

fn ids(name: &str) -> Result<(u32, u32)> {
    user_ids(name).with_context(|| format!("user {name} does not exist"))
}

fn run(argv: &[&str]) -> Result<()> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("running {}", argv[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `systemctl --user ARGS` in the user's own systemd instance.
fn user_systemctl(user: &str, args: &[&str]) -> Result<()> {
    let (uid, _) = ids(user)?;
    let runtime = format!("XDG_RUNTIME_DIR=/run/user/{uid}");
    let bus = format!("DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus");
    let mut argv = vec![
        "runuser",
        "-u",
        user,
        "--",
        "env",
        &runtime,
        &bus,
        "systemctl",
        "--user",
    ];
    argv.extend_from_slice(args);
    run(&argv)
}

/// The first free range of `count` ids above every range in `text` (an /etc/subuid).
pub fn free_subid_start(text: &str, count: u32) -> u32 {
    let end = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (_, start, n) = (
                f.next()?,
                f.next()?.parse::<u64>().ok()?,
                f.next()?.parse::<u64>().ok()?,
            );
            Some(start + n)
        })
        .max()
        .unwrap_or(0)
        .max(100_000);
    let count = u64::from(count);
    (end.div_ceil(count) * count) as u32
}

fn has_subids(file: &str, user: &str) -> bool {
    std::fs::read_to_string(file)
        .map(|t| t.lines().any(|l| l.split(':').next() == Some(user)))
        .unwrap_or(false)
}

fn remove_subids(file: &str, user: &str) -> Result<bool> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(false);
    };
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| l.split(':').next() != Some(user))
        .collect();
    if kept.len() == text.lines().count() {
        return Ok(false);
    }
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    std::fs::write(file, out).with_context(|| format!("writing {file}"))?;
    Ok(true)
}

/// Kills every process in a cgroup tree and removes its directories, deepest first.
fn remove_cgroup_tree(dir: &Path) -> Result<bool> {
    if !dir.is_dir() {
        return Ok(false);
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            remove_cgroup_tree(&path)?;
        }
    }
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            break;
        }
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing cgroup {}", dir.display()))?;
    Ok(true)
}

fn chown_to(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .with_context(|| format!("chown {}", path.display()))?;
    }
    Ok(())
}

impl Step {
    pub fn describe(&self) -> String {
        match self {
            Step::User { name, home } => format!("system user {name} (home {})", home.display()),
            Step::SubIds { user } => format!("subuid/subgid range of {SUBID_COUNT} ids for {user}"),
            Step::Dir { path, mode, owner } => format!(
                "directory {} ({mode:o}{})",
                path.display(),
                owner
                    .as_ref()
                    .map(|o| format!(", owned by {o}"))
                    .unwrap_or_default()
            ),
            Step::Install { from, to } if from.as_os_str().is_empty() => {
                format!("{}", to.display())
            }
            Step::Install { from, to } => format!("install {} -> {}", from.display(), to.display()),
            Step::File { path, .. } => format!("file {}", path.display()),
            Step::V1Cgroups { parent, user } => {
                format!("cgroup v1 parents /sys/fs/cgroup/*{parent} given to {user}")
            }
            Step::Run { argv, why } => format!("{} ({why})", argv.join(" ")),
            Step::Linger { user } => format!("linger for {user} (its systemd runs from boot)"),
            Step::UserUnit { user } => {
                format!("user service kat-agent of {user}: enabled, (re)started, ready (sd_notify)")
            }
        }
    }

    /// Does the step unless already done; true if something changed.
    pub fn apply(&self) -> Result<bool> {
        match self {
            Step::User { name, home } => {
                if user_ids(name).is_some() {
                    return Ok(false);
                }
                let home = home.display().to_string();
                run(&[
                    "useradd",
                    "--system",
                    "--user-group",
                    "--create-home",
                    "--home-dir",
                    &home,
                    "--shell",
                    "/usr/sbin/nologin",
                    "--comment",
                    "KAT node agent",
                    name,
                ])?;
                Ok(true)
            }
            Step::SubIds { user } => {
                if has_subids("/etc/subuid", user) && has_subids("/etc/subgid", user) {
                    return Ok(false);
                }
                let existing = format!(
                    "{}{}",
                    std::fs::read_to_string("/etc/subuid").unwrap_or_default(),
                    std::fs::read_to_string("/etc/subgid").unwrap_or_default()
                );
                let start = free_subid_start(&existing, SUBID_COUNT);
                let range = format!("{start}-{}", start + SUBID_COUNT - 1);
                run(&[
                    "usermod",
                    "--add-subuids",
                    &range,
                    "--add-subgids",
                    &range,
                    user,
                ])?;
                Ok(true)
            }
            Step::Dir { path, mode, owner } => {
                let created = !path.is_dir();
                std::fs::create_dir_all(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                    .with_context(|| format!("chmod {}", path.display()))?;
                chown_to(path, owner.as_deref().map(ids).transpose()?)?;
                Ok(created)
            }
            Step::Install { from, to } => {
                let new =
                    std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
                if std::fs::read(to).is_ok_and(|old| old == new) {
                    return Ok(false);
                }
                let dir = to.parent().context("install target has no directory")?;
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let tmp = to.with_extension("kat-new");
                std::fs::write(&tmp, &new).with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                    .with_context(|| format!("chmod {}", tmp.display()))?;
                std::fs::rename(&tmp, to)
                    .with_context(|| format!("installing {}", to.display()))?;
                Ok(true)
            }
            Step::File {
                path,
                content,
                mode,
                owner,
                keep,
            } => {
                if path.exists()
                    && (*keep || std::fs::read_to_string(path).is_ok_and(|old| &old == content))
                {
                    return Ok(false);
                }
                let owner = owner.as_deref().map(ids).transpose()?;
                let dir = path.parent().context("file has no directory")?;
                if !dir.is_dir() {
                    // Create (and, for the user's files, give) each missing parent.
                    let mut missing = Vec::new();
                    let mut d = dir;
                    while !d.is_dir() {
                        missing.push(d.to_path_buf());
                        d = d.parent().context("no existing parent")?;
                    }
                    for m in missing.iter().rev() {
                        std::fs::create_dir(m)
                            .with_context(|| format!("creating {}", m.display()))?;
                        chown_to(m, owner)?;
                    }
                }
                std::fs::write(path, content)
                    .with_context(|| format!("writing {}", path.display()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))
                    .with_context(|| format!("chmod {}", path.display()))?;
                chown_to(path, owner)?;
                Ok(true)
            }
            Step::V1Cgroups { parent, user } => {
                let (uid, gid) = ids(user)?;
                let ready = kat_runtime::cgroups::v1_parent_dirs(parent)
                    .iter()
                    .all(|d| std::fs::metadata(d).is_ok_and(|m| m.uid() == uid));
                if ready {
                    return Ok(false);
                }
                kat_runtime::cgroups::prepare_v1_parent(parent, uid, gid)?;
                Ok(true)
            }
            Step::Run { argv, .. } => {
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                run(&argv)?;
                Ok(true)
            }
            Step::Linger { user } => {
                let (uid, _) = ids(user)?;
                let lingering = Path::new("/var/lib/systemd/linger").join(user).exists();
                if !lingering {
                    run(&["loginctl", "enable-linger", user])?;
                }
                // Linger starts the user's systemd; wait for its bus.
                run(&["systemctl", "start", &format!("user@{uid}.service")])?;
                Ok(!lingering)
            }
            Step::UserUnit { user } => {
                user_systemctl(user, &["daemon-reload"])?;
                user_systemctl(user, &["enable", "kat-agent.service"])?;
                user_systemctl(user, &["restart", "kat-agent.service"])?;
                Ok(true)
            }
        }
    }

    /// Undoes the step; true if there was something to undo.
    pub fn undo(&self) -> Result<bool> {
        match self {
            Step::User { name, home } => {
                let Some((uid, _)) = user_ids(name) else {
                    let removed = home.is_dir();
                    if removed {
                        std::fs::remove_dir_all(home)
                            .with_context(|| format!("removing {}", home.display()))?;
                    }
                    return Ok(removed);
                };
                // Whatever still runs as the user (an agent started by hand, etcd).
                let _ = run(&["pkill", "-KILL", "-U", &uid.to_string()]);
                std::thread::sleep(std::time::Duration::from_millis(300));
                run(&["userdel", "--remove", name])?;
                remove_subids("/etc/subuid", name)?;
                remove_subids("/etc/subgid", name)?;
                if home.is_dir() {
                    std::fs::remove_dir_all(home)
                        .with_context(|| format!("removing {}", home.display()))?;
                }
                Ok(true)
            }
            Step::SubIds { user } => {
                Ok(remove_subids("/etc/subuid", user)? | remove_subids("/etc/subgid", user)?)
            }
            Step::Dir { path, .. } => match std::fs::remove_dir(path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
            },
            Step::Install { to: path, .. } | Step::File { path, .. } => {
                match std::fs::remove_file(path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
                }
            }
            Step::V1Cgroups { parent, .. } => {
                let mut any = false;
                for dir in kat_runtime::cgroups::v1_parent_dirs(parent) {
                    any |= remove_cgroup_tree(&dir)?;
                }
                Ok(any)
            }
            // A command step (daemon-reload) is its own undo: it re-reads what changed.
            Step::Run { .. } => self.apply(),
            Step::Linger { user } => {
                let Some((uid, _)) = user_ids(user) else {
                    return Ok(false);
                };
                let lingering = Path::new("/var/lib/systemd/linger").join(user).exists();
                if lingering {
                    run(&["loginctl", "disable-linger", user])?;
                }
                // Stopping the user's systemd ends every scope and process it holds.
                run(&["systemctl", "stop", &format!("user@{uid}.service")])?;
                Ok(lingering)
            }
            Step::UserUnit { user } => {
                let Some((uid, _)) = user_ids(user) else {
                    return Ok(false);
                };
                if !Path::new(&format!("/run/user/{uid}/bus")).exists() {
                    return Ok(false);
                }
                user_systemctl(user, &["disable", "--now", "kat-agent.service"])?;
                // Every container scope.
                user_systemctl(user, &["stop", "kat.slice"])?;
                Ok(true)
            }
        }
    }
}
