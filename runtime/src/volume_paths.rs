//! Volume sources resolved without a race, and checked again once mounted.
//!
//! A volume's directory is writable by every container that mounts it. If one of them
//! replaces a component of another instance's `subPath` with a symlink at the right moment,
//! a resolve-then-mount by path would bind whatever the symlink points at (runc's
//! CVE-2021-30465 class). So:
//!
//! 1. [`open_beneath`] walks `subPath` one component at a time with `openat2(2)` and
//!    `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, creating missing directories with `mkdirat`
//!    relative to the directory just opened: nothing is ever looked up by a path a container
//!    can change, and no symlink is followed, dangling or not.
//! 2. libcontainer then mounts by path (it canonicalizes the source itself, so an fd cannot
//!    be handed through), and before the container is started [`verify_mounted`] opens each
//!    destination inside the container's root (`RESOLVE_IN_ROOT`) and compares device and
//!    inode with the object opened in step 1. A swap in between is caught while the workload
//!    has not run a single instruction; the container is then discarded.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode};

/// An opened volume source: where it is (for the mount) and what it is (for the check).
#[derive(Debug)]
pub struct OpenedSource {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    _fd: OwnedFd,
}

impl OpenedSource {
    /// The opened object (an `O_PATH` fd), e.g. as the directory of an `openat`.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self._fd.as_fd()
    }
}

fn how(flags: OFlag, resolve: ResolveFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(resolve)
}

fn owned(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: the caller passes an fd a system call just returned to us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Opens the base directory (resolved by the agent) refusing any symlink on the way: the
/// agent gives canonical paths, so a symlink here was put in after it looked.
fn open_base(base: &Path) -> Result<OwnedFd, String> {
    openat2(
        nix::libc::AT_FDCWD,
        base,
        how(OFlag::O_DIRECTORY, ResolveFlag::RESOLVE_NO_SYMLINKS),
    )
    .map(owned)
    .map_err(|e| match e {
        Errno::ELOOP => format!(
            "{} contains a symlink (expected a resolved path)",
            base.display()
        ),
        e => format!("cannot open {}: {e}", base.display()),
    })
}

/// Opens `sub` beneath `base` (the whole of `base` when `sub` is `None`), creating missing
/// directories when `create` is set. Each new directory gets `base`'s owner, so the
/// container's root can write to it as it can to the volume itself.
pub fn open_beneath(base: &Path, sub: Option<&str>, create: bool) -> Result<OpenedSource, String> {
    let mut current = open_base(base)?;
    let owner = fstat(current.as_raw_fd()).map_err(|e| format!("{}: {e}", base.display()))?;
    let components: Vec<&str> = sub
        .unwrap_or("")
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    for (i, component) in components.iter().enumerate() {
        if *component == ".." {
            return Err("must not contain '..'".into());
        }
        let last = i + 1 == components.len();
        let walked = components[..=i].join("/");
        let flags = if last {
            OFlag::empty()
        } else {
            OFlag::O_DIRECTORY
        };
        let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
        let name = OsStr::new(component);
        let mut opened = openat2(current.as_raw_fd(), name, how(flags, resolve));
        if opened == Err(Errno::ENOENT) && create {
            match nix::sys::stat::mkdirat(
                Some(current.as_raw_fd()),
                name,
                Mode::from_bits_truncate(0o755),
            ) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(format!("cannot create {walked:?}: {e}")),
            }
            opened = openat2(current.as_raw_fd(), name, how(flags, resolve));
            if let Ok(fd) = opened {
                give_to(fd, owner.st_uid, owner.st_gid);
            }
        }
        current = match opened {
            Ok(fd) => owned(fd),
            Err(Errno::ELOOP) | Err(Errno::EXDEV) => {
                return Err(format!(
                    "{walked:?} is a symlink; subPath never follows symlinks"
                ))
            }
            Err(Errno::ENOTDIR) => return Err(format!("{walked:?} is not a directory")),
            Err(Errno::ENOENT) => return Err(format!("{walked:?} does not exist")),
            Err(e) => return Err(format!("cannot open {walked:?}: {e}")),
        };
    }
    let stat = fstat(current.as_raw_fd()).map_err(|e| format!("cannot stat: {e}"))?;
    let path = std::fs::read_link(format!("/proc/self/fd/{}", current.as_raw_fd()))
        .map_err(|e| format!("cannot name the opened source: {e}"))?;
    Ok(OpenedSource {
        path,
        dev: stat.st_dev,
        ino: stat.st_ino,
        _fd: current,
    })
}

/// Hands a directory we just created to the volume's owner (a root agent whose volumes
/// belong to the container's mapped root); an unprivileged agent already is that owner.
fn give_to(fd: std::os::fd::RawFd, uid: u32, gid: u32) {
    let me = nix::unistd::geteuid().as_raw();
    if me == 0 && uid != 0 {
        // fchownat with AT_EMPTY_PATH works on an O_PATH fd.
        // SAFETY: a plain system call on an fd we own, with a static empty path.
        unsafe {
            nix::libc::fchownat(fd, c"".as_ptr(), uid, gid, nix::libc::AT_EMPTY_PATH);
        }
    }
}

/// Checks, inside the container whose init is `pid`, that `destination` is the very object
/// `source` opened. Called after create and before start.
pub fn verify_mounted(pid: i32, destination: &str, source: &OpenedSource) -> Result<(), String> {
    let root = nix::fcntl::open(
        Path::new(&format!("/proc/{pid}/root")),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(owned)
    .map_err(|e| format!("cannot open the container's root: {e}"))?;
    let relative = destination.trim_start_matches('/');
    let target = if relative.is_empty() { "." } else { relative };
    let fd = openat2(
        root.as_raw_fd(),
        OsStr::from_bytes(target.as_bytes()),
        how(OFlag::empty(), ResolveFlag::RESOLVE_IN_ROOT),
    )
    .map(owned)
    .map_err(|e| format!("cannot open {destination} in the container: {e}"))?;
    let stat = fstat(fd.as_raw_fd()).map_err(|e| format!("cannot stat {destination}: {e}"))?;
    if (stat.st_dev, stat.st_ino) != (source.dev, source.ino) {
        return Err(format!(
            "{destination} in the container is not {} (it changed while the container was being created: a symlink race?)",
            source.path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_missing_directories_and_refuses_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("vol");
        std::fs::create_dir(&base).unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();

        let opened = open_beneath(&base, Some("a/b/c"), true).unwrap();
        assert_eq!(opened.path, base.join("a/b/c"));
        assert!(base.join("a/b/c").is_dir());

        // A symlink anywhere in the path, dangling or not, is refused and not followed.
        std::os::unix::fs::symlink(&outside, base.join("evil")).unwrap();
        let err = open_beneath(&base, Some("evil/new"), true).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        assert!(!outside.join("new").exists());
        std::os::unix::fs::symlink(outside.join("nope"), base.join("dangling")).unwrap();
        let err = open_beneath(&base, Some("dangling"), true).unwrap_err();
        assert!(err.contains("symlink"), "{err}");
        assert!(!outside.join("nope").exists());
        std::os::unix::fs::symlink("../outside", base.join("rel")).unwrap();
        assert!(open_beneath(&base, Some("rel"), false).is_err());
        assert!(open_beneath(&base, Some("../outside"), false).is_err());

        // A file as the last component is fine; a missing one without create is not.
        std::fs::write(base.join("a/file"), "x").unwrap();
        assert!(open_beneath(&base, Some("a/file"), false).is_ok());
        assert!(open_beneath(&base, Some("a/missing"), false)
            .unwrap_err()
            .contains("does not exist"));
        assert!(open_beneath(&base, Some("a/file/x"), true).is_err());
    }
}
