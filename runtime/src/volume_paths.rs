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
//!    be handed through), and before the container is started [`verify_mounted`] finds each
//!    destination in the container's `mountinfo` and compares its device and path within the
//!    filesystem with the object opened in step 1. A swap in between is caught while the workload
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
    /// The source's host path, as the kernel names the opened object.
    pub path: PathBuf,
    /// The device of the filesystem it is on (`st_dev`).
    pub dev: u64,
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

/// Checks that the mount at `destination` in the container whose init is `pid` is the
/// very object `source` opened. Called after create and before start.
///
/// It compares the two through `mountinfo` (device, and the path within that filesystem)
/// rather than by opening `/proc/PID/root`: before its first `exec` the container's init is
/// not dumpable, so an unprivileged agent may not open its root, but anyone may read its
/// `mountinfo`.
pub fn verify_mounted(pid: i32, destination: &str, source: &OpenedSource) -> Result<(), String> {
    let ours = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read our mountinfo: {e}"))?;
    let want = filesystem_path(&ours, source)
        .ok_or_else(|| format!("cannot find the mount of {}", source.path.display()))?;
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map_err(|e| format!("cannot read the container's mountinfo: {e}"))?;
    let mounts: Vec<MountLine> = theirs.lines().filter_map(MountLine::parse).collect();
    let destination = Path::new(destination);
    // The last mount at the destination is the one the workload sees; a destination that is
    // a symlink in the image was mounted at its target, so then any mount of ours will do.
    let found = match mounts.iter().rev().find(|m| m.mount_point == destination) {
        Some(m) => m.dev == source.dev && m.root == want,
        None => mounts.iter().any(|m| m.dev == source.dev && m.root == want),
    };
    if found {
        Ok(())
    } else {
        Err(format!(
            "{} in the container is not {} (it changed while the container was being created: a symlink race?)",
            destination.display(),
            source.path.display()
        ))
    }
}

/// Before the container starts: the mounts at or under `/.kat` in the container of `pid`
/// are the runtime's three, in the order it made them (`/.kat`, `/.kat/init`, `/.kat/log`).
/// Anything else there came through a symbolic link of the image: a volume whose destination
/// leads to `/.kat` (then covered, as the runtime mounts its own last, but refused all the
/// same), or an image whose `/.kat` is itself a link, which moved kat-init's mounts elsewhere.
pub fn verify_reserved_dir(pid: i32) -> Result<(), String> {
    use crate::spec::{INIT_PATH, KAT_DIR_PATH, LOG_DIR_PATH};
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map_err(|e| format!("cannot read the container's mountinfo: {e}"))?;
    let reserved = Path::new(KAT_DIR_PATH);
    let found: Vec<PathBuf> = theirs
        .lines()
        .filter_map(MountLine::parse)
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(reserved))
        .collect();
    let want = [KAT_DIR_PATH, INIT_PATH, LOG_DIR_PATH].map(PathBuf::from);
    if found == want {
        return Ok(());
    }
    Err(format!(
        "{KAT_DIR_PATH} in the container holds mounts {found:?}, expected {want:?}: a symbolic link in the image leads a volume to {KAT_DIR_PATH} (or {KAT_DIR_PATH} itself is one); KAT reserves it for kat-init, so mount the volume at a path that is not a link to it"
    ))
}

/// One line of `mountinfo`: device, root of the mount within its filesystem, mount point.
struct MountLine {
    dev: u64,
    root: PathBuf,
    mount_point: PathBuf,
}

impl MountLine {
    fn parse(line: &str) -> Option<MountLine> {
        let mut fields = line.split(' ');
        let (_id, _parent) = (fields.next()?, fields.next()?);
        let (major, minor) = fields.next()?.split_once(':')?;
        let root = unescape(fields.next()?);
        let mount_point = unescape(fields.next()?);
        Some(MountLine {
            dev: nix::libc::makedev(major.parse().ok()?, minor.parse().ok()?),
            root,
            mount_point,
        })
    }
}

/// `mountinfo` escapes space, tab, newline and backslash as `\NNN` (octal).
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let n = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from(std::ffi::OsStr::from_bytes(&out)))
}

/// The path of `source` within its filesystem: the root of the (deepest) mount holding it,
/// joined with the rest of its path.
fn filesystem_path(mountinfo: &str, source: &OpenedSource) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(MountLine::parse)
        .filter(|m| m.dev == source.dev && source.path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .map(|m| {
            let rest = source
                .path
                .strip_prefix(&m.mount_point)
                .unwrap_or(Path::new(""));
            if rest.as_os_str().is_empty() {
                m.root.clone()
            } else {
                m.root.join(rest)
            }
        })
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

    #[test]
    fn reads_mountinfo_lines_and_escapes() {
        let line = "36 35 98:0 /srv/my\\040data /data rw,noatime master:1 - ext4 /dev/root rw";
        let m = MountLine::parse(line).unwrap();
        assert_eq!(m.root, PathBuf::from("/srv/my data"));
        assert_eq!(m.mount_point, PathBuf::from("/data"));
        assert_eq!(m.dev, nix::libc::makedev(98, 0));
        let opened = open_beneath(Path::new("/proc/self"), None, false);
        assert!(opened.is_err(), "a symlink base is refused");
    }
}
