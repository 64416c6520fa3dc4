//! Trees that others control, touched only by descriptor.
//!
//! An image's layers, a container's writable layer, a volume and a build's workspace are
//! trees whose entries an image author or a running workload chose. A privileged operation
//! by *path* on such a tree (`chmod`, `chown`, `remove_dir_all`, `create`) resolves every
//! component again at the moment of the call, and one symlink planted there (by a later tar
//! entry, or by a container racing us) sends it to the host: a layer with a directory `x`
//! of mode 6777 and then a symlink `x -> /usr/bin/passwd` made a root agent `chmod` the
//! host's file when it applied the saved directory modes.
//!
//! One mechanism, used for every such tree: [`TreeDir`] holds an `O_PATH` descriptor of a
//! directory opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` relative to a directory already opened (the first one from a
//! path the agent made itself, whose last component may not be a symlink). Each operation names one plain
//! entry of that directory and never follows a symlink (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`,
//! `linkat` without `AT_SYMLINK_FOLLOW`), or acts on a descriptor of the object itself
//! (`fchown`, `chmod` of `/proc/self/fd/N`, which names the pinned inode and nothing else).
//! `openat2` was chosen over `O_NOFOLLOW` walks because it refuses symlinks in *every*
//! component in one call and cannot be tricked by `..` or magic links; it needs Linux 5.6.
//! A symlink met where a directory is needed is an error ([`is_symlink_refusal`]), never a
//! detour.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

/// What an entry is, as `lstat` says (a symlink is never looked through).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// FIFOs, sockets, device nodes.
    Other,
}

/// An entry's kind, owner and mode, from `fstatat(AT_SYMLINK_NOFOLLOW)`.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// What the entry is.
    pub kind: Kind,
    /// Its owner's uid.
    pub uid: u32,
    /// Its group's gid.
    pub gid: u32,
    /// Permission bits with setuid, setgid and sticky (`& 0o7777`).
    pub mode: u32,
    /// Device and inode: which object it is (hard links share them).
    pub dev: u64,
    /// Its inode number (on `dev`).
    pub ino: u64,
    /// How many hard links it has.
    pub nlink: u64,
}

/// How deep an image may nest directories, and how many directory descriptors a walk of
/// a tree holds at once. Images go a few dozen levels deep; a layer nesting deeper is
/// refused, and a removal that meets a deeper tree (a container can make one) moves the
/// deep part up rather than holding a descriptor (and a stack frame) per level.
pub const MAX_DEPTH: usize = 128;

impl Entry {
    fn from_stat(stat: &FileStat) -> Entry {
        let format = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits());
        let kind = if format == SFlag::S_IFDIR {
            Kind::Dir
        } else if format == SFlag::S_IFREG {
            Kind::File
        } else if format == SFlag::S_IFLNK {
            Kind::Symlink
        } else {
            Kind::Other
        };
        Entry {
            kind,
            uid: stat.st_uid,
            gid: stat.st_gid,
            mode: stat.st_mode & 0o7777,
            dev: stat.st_dev,
            ino: stat.st_ino,
            nlink: stat.st_nlink,
        }
    }
}

/// A directory of an untrusted tree, held by an `O_PATH` descriptor.
#[derive(Debug)]
pub struct TreeDir {
    fd: OwnedFd,
}

/// `RESOLVE_NO_XDEV` too: a walk never enters a mount point (a volume bound inside a tree
/// is never emptied by the tree's removal).
const BENEATH: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned to us by a system call and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// True when `e` is the refusal of a symlink (or of a magic link, or of a way out of the
/// tree) by this module's resolution.
pub fn is_symlink_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::ELOOP) | Some(Errno::EXDEV)
    )
}

/// A path of plain names only (`a/b/c`); `None` for `..`, a root or a prefix.
fn plain(rel: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

fn one_name(name: &OsStr) -> io::Result<&OsStr> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(invalid(format!("{name:?} is not one plain entry name")));
    }
    Ok(name)
}

impl TreeDir {
    /// Opens the top of a tree at `path`, a path the agent made inside its data directory.
    /// The path's prefix is the operator's (a symlinked `/var/run` or home is fine); the
    /// tree's own top may not be a symlink.
    pub fn open(path: &Path) -> io::Result<TreeDir> {
        let fd = nix::fcntl::openat(
            None,
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(TreeDir { fd: owned(fd) })
    }

    /// Reads the regular file at `path` as a process chrooted here would see it: symlinks
    /// are followed but resolved inside this tree (`RESOLVE_IN_ROOT`), never into the host.
    /// A FIFO, device or directory is refused without blocking; at most `max` bytes are
    /// read. `None` when nothing is there.
    pub fn read_in_root(&self, path: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_IN_ROOT
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        let fd = match openat2(self.raw(), path.trim_start_matches('/'), how) {
            Ok(fd) => owned(fd),
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(invalid(format!("{path} is not a regular file")));
        }
        let mut out = Vec::new();
        file.take(max).read_to_end(&mut out)?;
        Ok(Some(out))
    }

    /// Opens the root directory of process `pid` (`/proc/PID/root`, a link the kernel
    /// follows to that process's root, mounts included), to look things up as it would.
    pub fn open_root_of(pid: i32) -> io::Result<TreeDir> {
        let fd = nix::fcntl::openat(
            None,
            format!("/proc/{pid}/root").as_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(TreeDir { fd: owned(fd) })
    }

    /// Whether `path` names an executable regular file as a process chrooted here would
    /// see it (symlinks resolved inside this tree, `RESOLVE_IN_ROOT`; mounts below are
    /// crossed, as an exec would). `Ok(false)` when nothing, or no such file, is there.
    pub fn is_executable_in_root(&self, path: &str) -> io::Result<bool> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match openat2(self.raw(), path.trim_start_matches('/'), how) {
            Ok(fd) => owned(fd),
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
        Ok(st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG && st.st_mode & 0o111 != 0)
    }

    /// Creates the directory `path` (its parent must exist) with `mode`, and opens it.
    pub fn create(path: &Path, mode: u32) -> io::Result<TreeDir> {
        let (parent, name) = split(path)?;
        let parent = TreeDir::open(parent)?;
        parent.mkdir(name, mode)?;
        parent.dir(name)
    }

    /// The descriptor, for `*at` calls this module does not wrap.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Where this directory is now, for messages only (never to operate on).
    pub fn display(&self) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", self.raw()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "<tree>".into())
    }

    fn open_beneath(&self, rel: &Path, flags: OFlag) -> io::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(BENEATH);
        Ok(owned(openat2(self.raw(), rel, how)?))
    }

    /// The directory `rel` (plain names) beneath this one; a symlink anywhere on the way is
    /// refused (`ELOOP`), as is anything that is not a directory (`ENOTDIR`).
    pub fn walk(&self, rel: &Path) -> io::Result<TreeDir> {
        let rel =
            plain(rel).ok_or_else(|| invalid(format!("{} leaves the tree", rel.display())))?;
        let rel: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &rel
        };
        let fd = self.open_beneath(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
        Ok(TreeDir { fd })
    }

    /// The subdirectory `name`.
    pub fn dir(&self, name: &OsStr) -> io::Result<TreeDir> {
        self.walk(Path::new(one_name(name)?))
    }

    /// The directory `rel` beneath this one, creating missing directories with `mode` on
    /// the way. Anything in the way that is not a directory is an error, never replaced.
    pub fn make_dirs(&self, rel: &Path, mode: u32) -> io::Result<TreeDir> {
        let rel =
            plain(rel).ok_or_else(|| invalid(format!("{} leaves the tree", rel.display())))?;
        let mut at = self.walk(Path::new("."))?;
        for name in rel.iter() {
            match at.stat(name)? {
                None => match at.mkdir(name, mode) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
                    Err(e) => return Err(e),
                },
                Some(entry) if entry.kind == Kind::Dir => {}
                Some(_) => return Err(io::Error::from(Errno::ENOTDIR)),
            }
            at = at.dir(name)?;
        }
        Ok(at)
    }

    /// What `name` is, without following it; `None` when there is nothing of that name.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<Entry>> {
        let name = one_name(name)?;
        match nix::sys::stat::fstatat(
            Some(self.raw()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(stat) => Ok(Some(Entry::from_stat(&stat))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// This directory's own owner and mode.
    pub fn stat_self(&self) -> io::Result<Entry> {
        Ok(Entry::from_stat(&nix::sys::stat::fstat(self.raw())?))
    }

    /// The names in this directory (without `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let fd = self.open_beneath(Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        // `Dir` owns the descriptor from here (and closes it, also when it fails).
        let mut dir = nix::dir::Dir::from_fd(fd.into_raw_fd())?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_os_string());
            }
        }
        Ok(names)
    }

    /// Makes the directory `name` with `mode` (before the umask).
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        nix::sys::stat::mkdirat(
            Some(self.raw()),
            one_name(name)?,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(())
    }

    /// Creates the regular file `name`, which must not exist (not even as a dangling
    /// symlink), for writing.
    pub fn create_file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let fd = nix::fcntl::openat(
            Some(self.raw()),
            one_name(name)?,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(File::from(owned(fd)))
    }

    /// Opens the regular file `name` for reading; a symlink is refused.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let fd = self.open_beneath(
            Path::new(one_name(name)?),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        )?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(invalid(format!("{name:?} is not a regular file")));
        }
        Ok(file)
    }

    /// Makes the symlink `name` pointing at `target` (stored as it is, never resolved).
    pub fn symlink(&self, target: &Path, name: &OsStr) -> io::Result<()> {
        nix::unistd::symlinkat(target, Some(self.raw()), one_name(name)?)?;
        Ok(())
    }

    /// The target of the symlink `name`.
    pub fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
        let target = nix::fcntl::readlinkat(Some(self.raw()), one_name(name)?)?;
        Ok(PathBuf::from(target))
    }

    /// Makes `name` a hard link to `from_name` of `from` (the entry itself, even a symlink).
    pub fn hard_link(&self, from: &TreeDir, from_name: &OsStr, name: &OsStr) -> io::Result<()> {
        nix::unistd::linkat(
            Some(from.raw()),
            one_name(from_name)?,
            Some(self.raw()),
            one_name(name)?,
            nix::fcntl::AtFlags::empty(),
        )?;
        Ok(())
    }

    /// Makes the FIFO `name`.
    pub fn mkfifo(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        nix::unistd::mkfifoat(
            Some(self.raw()),
            one_name(name)?,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(())
    }

    /// Gives the entry `name` itself (a symlink is not followed) to `uid`/`gid`.
    pub fn chown(&self, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
        nix::unistd::fchownat(
            Some(self.raw()),
            one_name(name)?,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        Ok(())
    }

    /// Gives this directory to `uid`/`gid`.
    pub fn chown_self(&self, uid: u32, gid: u32) -> io::Result<()> {
        // fchownat with AT_EMPTY_PATH works on an O_PATH descriptor (fchown does not).
        nix::unistd::fchownat(
            Some(self.raw()),
            "",
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        )?;
        Ok(())
    }

    /// Sets this directory's mode.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        chmod_fd(self.raw(), mode)
    }

    /// Sets the mode of the entry `name`; a symlink is refused (symlinks have no mode of
    /// their own, and `chmod` would reach their target).
    pub fn set_mode_of(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let fd = self.open_beneath(
            Path::new(one_name(name)?),
            OFlag::O_PATH | OFlag::O_NOFOLLOW,
        )?;
        let stat = nix::sys::stat::fstat(fd.as_raw_fd())?;
        if Entry::from_stat(&stat).kind == Kind::Symlink {
            return Err(io::Error::from(Errno::ELOOP));
        }
        chmod_fd(fd.as_raw_fd(), mode)
    }

    /// Removes the entry `name` and, for a directory, everything below it, even where the
    /// tree made directories read-only. Nothing is followed: a symlink goes, its target
    /// stays. Nothing there is not an error.
    ///
    /// Depth-first without recursion, holding at most [`MAX_DEPTH`] directories open: a
    /// deeper directory is moved (`renameat2(RENAME_NOREPLACE)`, within the tree) up into
    /// the directory being removed, and removed from there.
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        let Some(entry) = self.stat(name)? else {
            return Ok(());
        };
        if entry.kind != Kind::Dir {
            return self.unlink(name, false);
        }
        struct Level {
            dir: TreeDir,
            name: OsString,
            pending: Vec<OsString>,
        }
        let open = |parent: &TreeDir, name: &OsStr, mode: u32| -> io::Result<Level> {
            // Owner rwx, so that its entries can be listed and removed.
            if mode & 0o700 != 0o700 {
                parent.set_mode_of(name, 0o700)?;
            }
            let dir = parent.dir(name)?;
            let pending = dir.names()?;
            Ok(Level {
                dir,
                name: name.to_os_string(),
                pending,
            })
        };
        let mut stack = vec![open(self, name, entry.mode)?];
        let mut hoisted = 0u64;
        while let Some(top) = stack.len().checked_sub(1) {
            let Some(child) = stack[top].pending.pop() else {
                let Some(done) = stack.pop() else { break };
                let parent = stack.last().map(|l| &l.dir).unwrap_or(self);
                drop(done.dir);
                parent.unlink(&done.name, true)?;
                continue;
            };
            let Some(e) = stack[top].dir.stat(&child)? else {
                continue;
            };
            if e.kind != Kind::Dir {
                stack[top].dir.unlink(&child, false)?;
                continue;
            }
            if stack.len() >= MAX_DEPTH {
                let from = top;
                let fresh = loop {
                    let fresh = OsString::from(format!(".kat-removing-{hoisted}"));
                    hoisted += 1;
                    match nix::fcntl::renameat2(
                        Some(stack[from].dir.raw()),
                        child.as_os_str(),
                        Some(stack[0].dir.raw()),
                        fresh.as_os_str(),
                        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
                    ) {
                        Ok(()) => break fresh,
                        Err(Errno::EEXIST) => continue,
                        Err(e) => return Err(e.into()),
                    }
                };
                stack[0].pending.push(fresh);
                continue;
            }
            let next = open(&stack[top].dir, &child, e.mode)?;
            stack.push(next);
        }
        Ok(())
    }

    fn unlink(&self, name: &OsStr, dir: bool) -> io::Result<()> {
        let flag = if dir {
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        };
        match nix::unistd::unlinkat(Some(self.raw()), one_name(name)?, flag) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes everything in this directory, keeping the directory.
    pub fn clear(&self) -> io::Result<()> {
        for child in self.names()? {
            self.remove(&child)?;
        }
        Ok(())
    }

    /// Calls `visit(dir, name, entry)` for every entry below this directory, depth-first,
    /// never following a symlink; directories are visited before what they hold. Holds one
    /// descriptor per level (and names, not descriptors, for what is pending); a tree deeper
    /// than [`MAX_DEPTH`] is an error.
    pub fn for_each_entry(
        &self,
        mut visit: impl FnMut(&TreeDir, &OsStr, &Entry) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut stack: Vec<(TreeDir, Vec<OsString>)> =
            vec![(self.walk(Path::new("."))?, self.names()?)];
        while let Some(top) = stack.len().checked_sub(1) {
            let Some(name) = stack[top].1.pop() else {
                stack.pop();
                continue;
            };
            let dir = &stack[top].0;
            let Some(entry) = dir.stat(&name)? else {
                continue;
            };
            visit(dir, &name, &entry)?;
            if entry.kind == Kind::Dir {
                if stack.len() >= MAX_DEPTH {
                    return Err(invalid(format!(
                        "the tree nests directories deeper than {MAX_DEPTH} levels"
                    )));
                }
                let sub = dir.dir(&name)?;
                let names = sub.names()?;
                stack.push((sub, names));
            }
        }
        Ok(())
    }
}

/// `chmod` of the object a descriptor pins (an `O_PATH` one too, which `fchmod` refuses):
/// `/proc/self/fd/N` is a magic link to that very inode, so nothing can be swapped in.
fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmodat(
        None,
        format!("/proc/self/fd/{fd}").as_str(),
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?;
    Ok(())
}

/// The parent and the last name of `path`.
fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((
            if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            },
            name,
        )),
        _ => Err(invalid(format!("{} has no parent", path.display()))),
    }
}

/// Removes the tree at `path` (a path the agent made) by descriptor: nothing below it is
/// followed. Nothing there is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (parent, name) = split(path)?;
    match TreeDir::open(parent) {
        Ok(parent) => parent.remove(name),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
