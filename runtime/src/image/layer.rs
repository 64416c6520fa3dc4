//! Unpacking one image layer, safely.
//!
//! A layer is a tar stream (gzip, zstd or uncompressed, detected by magic bytes). It is
//! unpacked into a fresh directory next to its final place and renamed into place only when
//! every entry was accepted, so a rejected layer leaves nothing behind. An entry is rejected
//! when it would land outside the layer directory: a `..` component, a parent that is a
//! symlink, or a hard link whose target is outside or is not yet unpacked. Symlink *targets*
//! are stored as they are; they are never followed while unpacking: every operation goes
//! through [`crate::tree_dir`] (by descriptor, `openat2` refusing symlinks).
//!
//! Whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) are kept as empty files here;
//! [`super::snapshot`] honours them when it flattens an image's layers. A whiteout must name
//! one plain entry of its own directory (not nothing, `.` or `..`), and nothing may be
//! unpacked under a whiteout, so flattening can only ever remove inside the snapshot.
//!
//! What a layer may cost is capped by the image's [`Budget`]: every entry's size is counted
//! from its header *before* its data is read, so a gzip bomb stops at the limit, not after
//! filling the disk. Device nodes are never created.
//!
//! Setuid and setgid bits of files are dropped, with or without privilege. Without it the
//! files belong to the agent's user, and a setuid file would run as that user for anyone
//! who reaches it on the host (snapshots are searchable). With it, the kernel already
//! cleared them when the file was chowned to its mapped id. Inside the container they
//! could do nothing anyway: every container runs with `noNewPrivileges`.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use super::limits::Budget;
use crate::error::{IoContext, Result, RuntimeError};
use crate::idmap::IdMap;
use crate::tree_dir::{self, Kind, TreeDir};

/// How the unpacked files are owned on the host.
#[derive(Clone, Copy)]
pub enum Ownership<'a> {
    /// chown every entry to its id mapped through the node's id map (agent runs as root).
    Mapped(&'a IdMap),
    /// Leave everything owned by the unpacking user (unprivileged agent): inside the user
    /// namespace it is container root.
    Squashed,
}

/// What one unpacked layer holds, as counted against its image's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerStats {
    /// Bytes of entry data (file contents).
    pub bytes: u64,
    /// Entries of the tar stream, whiteouts and skipped device nodes included.
    pub entries: u64,
}

pub(crate) const WHITEOUT_PREFIX: &[u8] = b".wh.";
pub(crate) const OPAQUE: &[u8] = b".wh..wh..opq";

/// What a directory entry named `name` means to the snapshot.
pub(crate) enum Whiteout<'a> {
    /// A plain entry.
    No,
    /// `.wh..wh..opq`: hide what lower layers put in this directory.
    Opaque,
    /// `.wh.NAME`: remove `NAME`, a plain name of this same directory.
    Hides(&'a OsStr),
}

/// Classifies `name`, or says why it is a whiteout that must not be honoured: one naming
/// nothing, `.` or `..` (which would remove the directory itself or its parent).
pub(crate) fn whiteout(name: &OsStr) -> std::result::Result<Whiteout<'_>, String> {
    let bytes = name.as_bytes();
    if bytes == OPAQUE {
        return Ok(Whiteout::Opaque);
    }
    let Some(hidden) = bytes.strip_prefix(WHITEOUT_PREFIX) else {
        return Ok(Whiteout::No);
    };
    match hidden {
        b"" => Err(format!("whiteout {name:?} names nothing")),
        b"." | b".." => Err(format!(
            "whiteout {name:?} names {:?}",
            OsStr::from_bytes(hidden)
        )),
        _ if hidden.contains(&b'/') => Err(format!("whiteout {name:?} names a path")),
        _ => Ok(Whiteout::Hides(OsStr::from_bytes(hidden))),
    }
}

/// Unpacks `reader` into `dest`, which must not exist, counting it against `budget`.
pub fn unpack(
    reader: impl Read,
    dest: &Path,
    ownership: Ownership<'_>,
    digest: &str,
    budget: &mut Budget,
) -> Result<LayerStats> {
    let tmp = dest.with_extension(format!("partial-{}", std::process::id()));
    let _ = tree_dir::remove_tree(&tmp);
    fs::create_dir_all(&tmp).context(|| format!("creating {}", tmp.display()))?;
    match unpack_into(reader, &tmp, ownership, digest, budget) {
        Ok(stats) => {
            fs::rename(&tmp, dest)
                .context(|| format!("moving layer {digest} into {}", dest.display()))?;
            Ok(stats)
        }
        Err(e) => {
            let _ = tree_dir::remove_tree(&tmp);
            Err(e)
        }
    }
}

fn bad(digest: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::BadLayer {
        digest: digest.to_string(),
        reason: reason.into(),
    }
}

/// A path inside the layer: its components, each a plain name.
fn clean_path(raw: &[u8], digest: &str) -> Result<Option<PathBuf>> {
    let text = std::str::from_utf8(raw).map_err(|_| bad(digest, "entry name is not UTF-8"))?;
    let mut out = PathBuf::new();
    for component in Path::new(text).components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                return Err(bad(
                    digest,
                    format!("entry {text:?} escapes the layer with '..'"),
                ))
            }
            Component::Prefix(_) => {
                return Err(bad(digest, format!("entry {text:?} has a prefix")))
            }
        }
    }
    // Deeper trees only cost the node descriptors and time in every later walk.
    if out.components().count() > tree_dir::MAX_DEPTH {
        return Err(bad(
            digest,
            format!(
                "entry {:.80}… nests deeper than {} directories",
                text,
                tree_dir::MAX_DEPTH
            ),
        ));
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// The directory that will hold `rel`, created as needed, refusing to pass through anything
/// that is not a real directory (a symlink planted by an earlier entry, say), and the
/// entry's own name.
fn parent_of<'r>(root: &TreeDir, rel: &'r Path, digest: &str) -> Result<(TreeDir, &'r OsStr)> {
    let name = rel
        .file_name()
        .ok_or_else(|| bad(digest, format!("entry {} has no name", rel.display())))?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    let dir = root.make_dirs(parent, 0o755).map_err(|e| {
        if tree_dir::is_symlink_refusal(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) {
            bad(
                digest,
                format!(
                    "entry {} passes through non-directory (or symlink) on its way",
                    rel.display()
                ),
            )
        } else {
            bad(
                digest,
                format!("creating the parents of {}: {e}", rel.display()),
            )
        }
    })?;
    Ok((dir, name))
}

/// Makes room for a new entry `name`: whatever is there goes (a directory only when
/// `keep_dir` is false), never following a symlink.
fn remove_existing(dir: &TreeDir, name: &OsStr, keep_dir: bool) -> std::io::Result<()> {
    match dir.stat(name)? {
        Some(e) if e.kind == Kind::Dir && keep_dir => Ok(()),
        Some(_) => dir.remove(name),
        None => Ok(()),
    }
}

/// Extension headers (PAX records, GNU long names) allowed before one entry. The `tar`
/// crate reads them into memory before it yields the entry, so they cannot wait for the
/// budget: the stream itself is cut off past them.
const MAX_ENTRY_HEADERS: u64 = 1 << 20;

/// How far the decompressed stream has been read, and how far it may be.
#[derive(Default)]
struct Meter {
    read: Cell<u64>,
    end: Cell<u64>,
}

/// The decompressed tar stream, ending where the entries so far say it may: the current
/// entry's data and padding, then at most [`MAX_ENTRY_HEADERS`] for the next header.
struct Capped<R> {
    inner: R,
    meter: Rc<Meter>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let (read, end) = (self.meter.read.get(), self.meter.end.get());
        if read >= end {
            return Err(std::io::Error::other(format!(
                "an entry's tar headers take more than {MAX_ENTRY_HEADERS} bytes"
            )));
        }
        let room = usize::try_from(end - read).unwrap_or(usize::MAX);
        let n = buf.len().min(room);
        let got = self.inner.read(&mut buf[..n])?;
        self.meter.read.set(read + got as u64);
        Ok(got)
    }
}

/// The tar stream of a layer, decompressed as its magic bytes say.
fn decompressed<'r>(reader: impl Read + 'r, digest: &str) -> Result<Box<dyn Read + 'r>> {
    let mut buffered = BufReader::with_capacity(256 * 1024, reader);
    let magic = buffered
        .fill_buf()
        .map_err(|e| bad(digest, format!("cannot read: {e}")))?;
    Ok(if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e| bad(digest, format!("bad zstd stream: {e}")))?,
        )
    } else {
        Box::new(buffered)
    })
}

/// Rejects a whiteout that names nothing, `.` or `..`, and any entry *under* a whiteout
/// (`.wh.a/b`), which the snapshot would never look into.
fn check_whiteouts(rel: &Path, digest: &str) -> Result<()> {
    let mut components = rel.components().peekable();
    while let Some(component) = components.next() {
        let name = component.as_os_str();
        let last = components.peek().is_none();
        match whiteout(name) {
            Err(reason) => return Err(bad(digest, format!("entry {}: {reason}", rel.display()))),
            Ok(Whiteout::No) => {}
            Ok(_) if last => {}
            Ok(_) => {
                return Err(bad(
                    digest,
                    format!(
                        "entry {} is under whiteout {name:?}, which is not a directory",
                        rel.display()
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Unpacks `reader` into the existing, empty directory `root`.
pub(crate) fn unpack_into(
    reader: impl Read,
    root: &Path,
    ownership: Ownership<'_>,
    digest: &str,
    budget: &mut Budget,
) -> Result<LayerStats> {
    let meter = Rc::new(Meter::default());
    meter.end.set(MAX_ENTRY_HEADERS);
    let stream = Capped {
        inner: decompressed(reader, digest)?,
        meter: meter.clone(),
    };
    // A stream error past the cap is the cap's doing, whatever the tar crate calls it.
    let stream_error = |what: &str, e: std::io::Error| {
        if meter.read.get() >= meter.end.get() {
            bad(
                digest,
                format!("an entry's tar headers (PAX or GNU long name) take more than {MAX_ENTRY_HEADERS} bytes"),
            )
        } else {
            bad(digest, format!("{what}: {e}"))
        }
    };
    let mut archive = tar::Archive::new(stream);
    let mut stats = LayerStats::default();
    let top = TreeDir::open(root).context(|| format!("opening {}", root.display()))?;
    let io = |what: String| move |e: std::io::Error| bad(digest, format!("{what}: {e}"));
    // Directory modes are applied last, so a read-only directory can still be filled. They
    // are kept by path inside the layer and applied through a fresh descriptor walk that
    // refuses symlinks: a later entry that replaced the directory with a symlink to the
    // host (the attack this module is written against) makes the walk fail, and the mode
    // is dropped with the directory it belonged to.
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| stream_error("not a tar stream", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| stream_error("corrupt tar stream", e))?;
        let header = entry.header().clone();
        // Counted from the header, before any data is read: a bomb stops here.
        let size = entry.size();
        budget.add_entries(digest, 1)?;
        budget.add_bytes(digest, size)?;
        stats.entries += 1;
        stats.bytes += size;
        let padded = size.div_ceil(512).saturating_mul(512);
        meter.end.set(
            meter
                .read
                .get()
                .saturating_add(padded)
                .saturating_add(MAX_ENTRY_HEADERS),
        );
        let raw_path = entry.path_bytes().into_owned();
        let Some(rel) = clean_path(&raw_path, digest)? else {
            continue;
        };
        check_whiteouts(&rel, digest)?;
        let kind = header.entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader
                | tar::EntryType::XHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            continue;
        }
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            // Containers get their /dev from the runtime; device nodes in images are
            // neither needed nor creatable without privilege.
            tracing::debug!(layer = digest, path = %rel.display(), "skipping device node");
            continue;
        }
        let (dir, name) = parent_of(&top, &rel, digest)?;
        let shown = rel.display();
        let mut mode = header.mode().unwrap_or(0o644) & 0o7777;
        if kind != tar::EntryType::Directory {
            // See the module comment. (Setgid on a directory only passes its group on.)
            mode &= !0o6000;
        }
        let owner = match ownership {
            Ownership::Mapped(ids) => {
                let uid = header.uid().unwrap_or(0).min(u32::MAX as u64) as u32;
                let gid = header.gid().unwrap_or(0).min(u32::MAX as u64) as u32;
                Some((ids.host_uid(uid), ids.host_gid(gid)))
            }
            Ownership::Squashed => None,
        };
        match kind {
            tar::EntryType::Directory => {
                remove_existing(&dir, name, true).map_err(io(format!("replacing {shown}")))?;
                if dir
                    .stat(name)
                    .map_err(io(format!("stat {shown}")))?
                    .is_none()
                {
                    dir.mkdir(name, 0o755)
                        .map_err(io(format!("creating {shown}")))?;
                }
                dir_modes.push((rel.clone(), mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_existing(&dir, name, false).map_err(io(format!("replacing {shown}")))?;
                let mut file = dir
                    .create_file(name, 0o600)
                    .map_err(io(format!("creating {shown}")))?;
                std::io::copy(&mut entry, &mut file)
                    .map_err(|e| stream_error(&format!("reading {shown}"), e))?;
                // On the descriptor: the file we wrote, whatever its name means by now.
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                        .map_err(io(format!("chown {shown}")))?;
                }
                file.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(io(format!("chmod {shown}")))?;
                continue;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(|e| bad(digest, format!("symlink {shown}: {e}")))?
                    .ok_or_else(|| bad(digest, format!("symlink {shown} has no target")))?;
                remove_existing(&dir, name, false).map_err(io(format!("replacing {shown}")))?;
                dir.symlink(&link, name)
                    .map_err(io(format!("symlink {shown}")))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| bad(digest, format!("hard link {shown} has no target")))?;
                let link_rel = clean_path(&link, digest)?.ok_or_else(|| {
                    bad(
                        digest,
                        format!("hard link {shown} points at the layer root"),
                    )
                })?;
                let not_earlier = || {
                    bad(
                        digest,
                        format!(
                            "hard link {shown} targets {} which is not a file earlier in the layer",
                            link_rel.display()
                        ),
                    )
                };
                let source_name = link_rel.file_name().ok_or_else(not_earlier)?;
                let source_dir = top
                    .walk(link_rel.parent().unwrap_or(Path::new("")))
                    .map_err(|_| not_earlier())?;
                match source_dir.stat(source_name) {
                    Ok(Some(e)) if e.kind != Kind::Dir => {}
                    _ => return Err(not_earlier()),
                }
                if link_rel != rel {
                    remove_existing(&dir, name, false).map_err(io(format!("replacing {shown}")))?;
                    dir.hard_link(&source_dir, source_name, name)
                        .map_err(io(format!("hard link {shown}")))?;
                }
                continue; // shares the target's owner and mode
            }
            tar::EntryType::Fifo => {
                remove_existing(&dir, name, false).map_err(io(format!("replacing {shown}")))?;
                dir.mkfifo(name, mode)
                    .map_err(io(format!("mkfifo {shown}")))?;
            }
            other => {
                return Err(bad(
                    digest,
                    format!("entry {shown} has unsupported type {other:?}"),
                ))
            }
        }
        if let Some((uid, gid)) = owner {
            dir.chown(name, uid, gid)
                .map_err(io(format!("chown {shown}")))?;
        }
    }
    for (rel, mode) in dir_modes.into_iter().rev() {
        match top.walk(&rel) {
            Ok(dir) => dir
                .set_mode(mode)
                .map_err(|e| bad(digest, format!("chmod {}: {e}", rel.display())))?,
            // Replaced by a symlink (or under one): the mode is never applied through it.
            // Harmless in a tar, and the shape of an attack on the host: said once per entry.
            Err(e) if tree_dir::is_symlink_refusal(&e) => tracing::warn!(
                layer = digest,
                entry = %rel.display(),
                "a directory of this layer was replaced by a symbolic link; its mode is not applied through the link (nothing outside the image is touched)"
            ),
            // Replaced by a later file, or removed: its mode went with it.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ENOTDIR) | Some(nix::libc::ENOENT)
                ) => {}
            Err(e) => return Err(bad(digest, format!("chmod {}: {e}", rel.display()))),
        }
    }
    Ok(stats)
}
