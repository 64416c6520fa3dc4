//! Volumes on the node: `simpleClusterStorage` and `hostMount` (RFC 001 §3.2).
//!
//! `simpleClusterStorage` is a directory `volumeBasePath/{ns}/{workload}/{volume}`, shared by
//! the workload's instances on this node and kept when they go. It is owned by the host id
//! that the container's root maps to, so the workload can write to it from inside its user
//! namespace. `hostMount` follows `ensureType`: `DirectoryOrCreate`/`FileOrCreate` create the
//! path if missing, `Directory`/`File`/`Socket` require it to exist with that type.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use kat_api::workload::{EnsureType, Volume};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: hostPath {path} {problem}")]
    HostPath {
        volume: String,
        path: PathBuf,
        problem: String,
    },
    #[error("volume {volume:?}: cannot prepare {path}: {source}")]
    Io {
        volume: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("volume {volume:?} has neither simpleClusterStorage nor hostMount")]
    Empty { volume: String },
}

/// The host directory or file for `volume` of `ns/workload`, created or checked.
/// `owner` is the host (uid, gid) the container's root maps to.
pub fn prepare(
    base: &Path,
    ns: &str,
    workload: &str,
    volume: &Volume,
    owner: (u32, u32),
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
            let me = nix::unistd::geteuid().as_raw();
            if owner.0 != me {
                nix::unistd::chown(
                    &dir,
                    Some(nix::unistd::Uid::from_raw(owner.0)),
                    Some(nix::unistd::Gid::from_raw(owner.1)),
                )
                .map_err(|e| io(&dir)(std::io::Error::from(e)))?;
            }
        }
        return Ok(dir);
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
    let meta = std::fs::metadata(&path);
    match host.ensure_type {
        None => {
            meta.map_err(|_| {
                problem("does not exist (set ensureType: DirectoryOrCreate to create it)")
            })?;
        }
        Some(EnsureType::DirectoryOrCreate) => match meta {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(problem("exists but is not a directory")),
            Err(_) => std::fs::create_dir_all(&path).map_err(io(&path))?,
        },
        Some(EnsureType::FileOrCreate) => match meta {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(problem("exists but is not a regular file")),
            Err(_) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io(parent))?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(io(&path))?;
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
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::workload::{HostMount, SimpleClusterStorage};

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
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let dir = prepare(base.path(), "default", "web", &v, me).unwrap();
        assert_eq!(dir, base.path().join("default/web/data"));
        assert!(dir.is_dir());
    }

    #[test]
    fn ensure_type_rules() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("a/b");
        let err = prepare(t.path(), "ns", "w", &host(&missing, None), (0, 0)).unwrap_err();
        assert!(err.to_string().contains("DirectoryOrCreate"), "{err}");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&missing, Some(EnsureType::DirectoryOrCreate)),
            (0, 0),
        )
        .unwrap();
        assert!(missing.is_dir());
        let file = t.path().join("c/f.txt");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::FileOrCreate)),
            (0, 0),
        )
        .unwrap();
        assert!(file.is_file());
        let err = prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::Directory)),
            (0, 0),
        )
        .unwrap_err();
        assert!(err.to_string().contains("existing directory"), "{err}");
        let err = prepare(
            t.path(),
            "ns",
            "w",
            &host(&missing, Some(EnsureType::Socket)),
            (0, 0),
        )
        .unwrap_err();
        assert!(err.to_string().contains("socket"), "{err}");
        prepare(
            t.path(),
            "ns",
            "w",
            &host(&file, Some(EnsureType::File)),
            (0, 0),
        )
        .unwrap();
    }
}
