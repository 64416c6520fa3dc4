//! Volumes on the node: `simpleClusterStorage` and `hostMount` (RFC 001 §3.2).
//!
//! `simpleClusterStorage` is a directory `volumeBasePath/{ns}/{workload}/{volume}`, shared by
//! the workload's instances on this node and kept when they go. The runtime gives it to the
//! root of the workload's id slice when it mounts it (`VolumeMount::owned_by_container`),
//! so the workload can write to it from inside its user namespace and no other can. `hostMount` follows `ensureType`: `DirectoryOrCreate`/`FileOrCreate` create the
//! path if missing, `Directory`/`File`/`Socket` require it to exist with that type.
//!
//! A `hostMount` path must pass the node's [`HostMountPolicy`] (the cluster's allow-list,
//! never `/` or KAT's own directories) twice: as written, and once resolved, so a symlink
//! under `/srv` cannot lead to `/etc`. The path itself may not be a symlink, and what is
//! created is created without following one (directories with `mkdirat` beneath the last
//! existing ancestor, files with `O_CREAT | O_EXCL | O_NOFOLLOW`). Every returned path is
//! canonical: the runtime opens it refusing any symlink, so a later swap fails the create.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use kat_api::host_paths::HostMountPolicy;
use kat_api::workload::{EnsureType, Volume};
use kat_runtime::volume_paths::open_beneath;

/// Why a volume's host path could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A `hostMount` path that cannot be used: refused by the node's policy, missing, of
    /// another type than `ensureType`, or not creatable.
    #[error("volume {volume:?}: hostPath {path} {problem}")]
    HostPath {
        /// The volume's name.
        volume: String,
        /// The host path.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A file-system operation on the volume's path failed.
    #[error("volume {volume:?}: cannot prepare {path}: {source}")]
    Io {
        /// The volume's name.
        volume: String,
        /// The path it failed on.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The volume names no source: neither `simpleClusterStorage` nor `hostMount`.
    #[error("volume {volume:?} has neither simpleClusterStorage nor hostMount")]
    Empty {
        /// The volume's name.
        volume: String,
    },
}

/// The host directory or file for `volume` of `ns/workload`, created or checked, as a
/// canonical path.
pub fn prepare(
    base: &Path,
    ns: &str,
    workload: &str,
    volume: &Volume,
    policy: &HostMountPolicy,
) -> Result<PathBuf, VolumeError> {
    let io = |path: &Path| {
        let volume = volume.name.clone();
        let path = path.to_path_buf();
        move |source| VolumeError::Io {
            volume,
            path,
            source,
        }
    };
    if volume.simple_cluster_storage.is_some() {
        let dir = base.join(ns).join(workload).join(&volume.name);
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            // Private to the workload's root (the runtime gives it the directory).
            set_mode(&dir, 0o700).map_err(io(&dir))?;
        }
        // Searchable, not listable, by anyone: the container's root (a host id of its
        // own) must walk through to bind its volume; other users learn nothing here.
        for parent in [
            base.to_path_buf(),
            base.join(ns),
            base.join(ns).join(workload),
        ] {
            set_mode(&parent, 0o711).map_err(io(&parent))?;
        }
        return std::fs::canonicalize(&dir).map_err(io(&dir));
    }
    let Some(host) = &volume.host_mount else {
        return Err(VolumeError::Empty {
            volume: volume.name.clone(),
        });
    };
    let path = PathBuf::from(&host.host_path);
    let problem = |problem: &str| VolumeError::HostPath {
        volume: volume.name.clone(),
        path: path.clone(),
        problem: problem.to_string(),
    };
    if let Some(p) = policy.problem(&path) {
        return Err(problem(&p));
    }
    let meta = std::fs::symlink_metadata(&path);
    if meta.as_ref().is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(problem(
            "is a symlink (expected the directory or file itself, so what is mounted cannot change under it)",
        ));
    }
    // The deepest ancestor that exists, resolved; the rest is what may be created.
    let mut existing = path.as_path();
    while std::fs::symlink_metadata(existing).is_err() {
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    let resolved = std::fs::canonicalize(existing).map_err(io(existing))?;
    let rest = path.strip_prefix(existing).unwrap_or(Path::new(""));
    if let Some(p) = policy.problem(&resolved.join(rest)) {
        return Err(problem(&format!("resolves through a symlink: {p}")));
    }
    let created = |e: String| problem(&format!("cannot be created: {e}"));
    match host.ensure_type {
        None => {
            meta.map_err(|_| {
                problem("does not exist (set ensureType: DirectoryOrCreate to create it)")
            })?;
        }
        Some(EnsureType::DirectoryOrCreate) => match meta {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(problem("exists but is not a directory")),
            Err(_) => {
                open_beneath(&resolved, rest.to_str(), true).map_err(created)?;
            }
        },
        Some(EnsureType::FileOrCreate) => match meta {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(problem("exists but is not a regular file")),
            Err(_) => {
                let parent = rest
                    .parent()
                    .and_then(Path::to_str)
                    .filter(|p| !p.is_empty());
                let dir = open_beneath(&resolved, parent, true).map_err(created)?;
                let name = rest.file_name().ok_or_else(|| problem("names no file"))?;
                create_file_in(&dir, name).map_err(|e| created(e.to_string()))?;
            }
        },
        Some(EnsureType::Directory) => {
            if !meta.is_ok_and(|m| m.is_dir()) {
                return Err(problem(
                    "must be an existing directory (ensureType: Directory)",
                ));
            }
        }
        Some(EnsureType::File) => {
            if !meta.is_ok_and(|m| m.is_file()) {
                return Err(problem(
                    "must be an existing regular file (ensureType: File)",
                ));
            }
        }
        Some(EnsureType::Socket) => {
            if !meta.is_ok_and(|m| m.file_type().is_socket()) {
                return Err(problem(
                    "must be an existing Unix socket (ensureType: Socket)",
                ));
            }
        }
    }
    let canonical = std::fs::canonicalize(&path).map_err(io(&path))?;
    if let Some(p) = policy.problem(&canonical) {
        return Err(problem(&format!("resolves through a symlink: {p}")));
    }
    Ok(canonical)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Creates an empty file `name` in the opened directory, never through a symlink. A regular
/// file made there meanwhile (by another replica's start, side by side with this one) will
/// do; anything else there is EEXIST.
fn create_file_in(
    dir: &kat_runtime::volume_paths::OpenedSource,
    name: &std::ffi::OsStr,
) -> nix::Result<()> {
    let fd = match nix::fcntl::openat(
        Some(dir.fd().as_raw_fd()),
        name,
        nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_EXCL
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::EEXIST) => {
            let st = nix::sys::stat::fstatat(
                Some(dir.fd().as_raw_fd()),
                name,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
            return if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG {
                Ok(())
            } else {
                Err(nix::errno::Errno::EEXIST)
            };
        }
        Err(e) => return Err(e),
    };
    // SAFETY: openat just returned this fd; closing it is all we do with it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::workload::{HostMount, SimpleClusterStorage};

    fn open_policy(root: &Path) -> HostMountPolicy {
        HostMountPolicy {
            allowed: vec![root.to_path_buf()],
            denied: vec![root.join("kat-data")],
        }
    }

    fn host(path: &Path, ensure: Option<EnsureType>) -> Volume {
        Volume {
            name: "v".into(),
            simple_cluster_storage: None,
            host_mount: Some(HostMount {
                host_path: path.display().to_string(),
                ensure_type: ensure,
            }),
        }
    }

    #[test]
    fn cluster_storage_is_per_namespace_workload_and_volume() {
        let base = tempfile::tempdir().unwrap();
        let v = Volume {
            name: "data".into(),
            simple_cluster_storage: Some(SimpleClusterStorage {}),
            host_mount: None,
        };
        let dir = prepare(
            base.path(),
            "default",
            "web",
            &v,
            &HostMountPolicy::default(),
        )
        .unwrap();
        assert_eq!(
            dir,
            base.path().canonicalize().unwrap().join("default/web/data")
        );
        assert!(dir.is_dir());
    }

    #[test]
    fn ensure_type_rules() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("a/b");
        let err = prepare(
            t.path(),
            "ns",
            "w",
            &host(&missing, None),
            &open_policy(t.path()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("DirectoryOrCreate"), "{err}");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&missing, Some(EnsureType::DirectoryOrCreate)),
            &open_policy(t.path()),
        )
        .unwrap();
        assert!(missing.is_dir());
        let file = t.path().join("c/f.txt");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::FileOrCreate)),
            &open_policy(t.path()),
        )
        .unwrap();
        assert!(file.is_file());
        let err = prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::Directory)),
            &open_policy(t.path()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("existing directory"), "{err}");
        let err = prepare(
            t.path(),
            "ns",
            "w",
            &host(&missing, Some(EnsureType::Socket)),
            &open_policy(t.path()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("socket"), "{err}");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::File)),
            &open_policy(t.path()),
        )
        .unwrap();
    }

    #[test]
    fn host_mounts_never_leave_the_allow_list_or_follow_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let policy = open_policy(t.path());
        let try_mount = |path: &Path, ensure| {
            prepare(t.path(), "ns", "w", &host(path, ensure), &policy).map_err(|e| e.to_string())
        };
        // KAT's own directory, or an ancestor of it, is refused.
        std::fs::create_dir_all(t.path().join("kat-data/pki")).unwrap();
        let err = try_mount(&t.path().join("kat-data/pki"), None).unwrap_err();
        assert!(err.contains("KAT uses itself"), "{err}");
        // A path off the allow-list is refused; so is one that resolves off it.
        assert!(try_mount(Path::new("/etc"), None)
            .unwrap_err()
            .contains("allow-list"));
        std::os::unix::fs::symlink("/etc", t.path().join("to-etc")).unwrap();
        let err = try_mount(
            &t.path().join("to-etc/kat-new"),
            Some(EnsureType::DirectoryOrCreate),
        )
        .unwrap_err();
        assert!(err.contains("resolves through a symlink"), "{err}");
        assert!(!Path::new("/etc/kat-new").exists());
        // FileOrCreate never follows a dangling symlink.
        let target = t.path().join("outside/created-through-link");
        std::fs::create_dir_all(t.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("dangling")).unwrap();
        let err =
            try_mount(&t.path().join("dangling"), Some(EnsureType::FileOrCreate)).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        assert!(!target.exists());
        // A symlinked directory to a place inside the allow-list is still not mounted as such.
        std::os::unix::fs::symlink(t.path().join("outside"), t.path().join("alias")).unwrap();
        assert!(try_mount(&t.path().join("alias"), None)
            .unwrap_err()
            .contains("symlink"));
    }

    /// Two replicas' starts making the same FileOrCreate at once: the second finds the file
    /// the first made and goes on; a directory or a symlink in its place is still refused.
    #[test]
    fn a_file_made_meanwhile_will_do_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let dir = kat_runtime::volume_paths::open_beneath(t.path(), None, true).unwrap();
        let name = std::ffi::OsStr::new;
        create_file_in(&dir, name("f")).unwrap();
        create_file_in(&dir, name("f")).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        assert_eq!(
            create_file_in(&dir, name("d")),
            Err(nix::errno::Errno::EEXIST)
        );
        std::os::unix::fs::symlink(t.path().join("f"), t.path().join("l")).unwrap();
        assert_eq!(
            create_file_in(&dir, name("l")),
            Err(nix::errno::Errno::EEXIST)
        );
    }
}
