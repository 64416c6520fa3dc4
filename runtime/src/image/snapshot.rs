//! An image's layers flattened into one read-only tree, built once per image.
//!
//! Files are hard links into the unpacked layers (no data is copied); whiteouts remove what
//! lower layers put there and opaque markers hide a lower directory's contents. The result
//! is the lower directory of every container's overlay, or the source of its copy.
//!
//! Nothing outside the snapshot is ever removed. A whiteout must name one plain entry of
//! its own directory (layers unpacked by an older KAT are checked again here), and removal
//! never follows a symlink: the entry itself goes. A directory reached through a symlink
//! planted by a lower layer is never entered either: a layer that has a directory where the
//! snapshot has a symlink replaces the symlink with a real directory first, so `a -> /`
//! then `a/.wh.etc` removes nothing of the host's `/etc`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::layer::{whiteout, Whiteout};
use crate::error::{IoContext, Result, RuntimeError};
use crate::tree_dir::{remove_tree, Kind, TreeDir};

/// Builds `dest` (which must not exist) from `layers`, lowest first. `root_owner` is the
/// host uid/gid of container root, which owns the tree's top directory.
pub fn build(layers: &[&Path], dest: &Path, root_owner: Option<(u32, u32)>) -> Result<()> {
    let chown = root_owner.is_some();
    let tmp = dest.with_extension(format!("partial-{}", std::process::id()));
    let _ = remove_tree(&tmp);
    fs::create_dir_all(&tmp).context(|| format!("creating {}", tmp.display()))?;
    let result = (|| {
        let snap = TreeDir::open(&tmp).context(|| format!("opening {}", tmp.display()))?;
        let mut dir_modes = Vec::new();
        for layer in layers {
            let from = TreeDir::open(layer).context(|| format!("opening {}", layer.display()))?;
            apply(&from, &snap, Path::new(""), chown, &mut dir_modes)?;
        }
        // By a fresh walk that refuses symlinks: a directory replaced since is skipped.
        for (rel, mode) in dir_modes.into_iter().rev() {
            if let Ok(dir) = snap.walk(&rel) {
                let _ = dir.set_mode(mode);
            }
        }
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
            .context(|| format!("chmod {}", tmp.display()))?;
        fs::rename(&tmp, dest).context(|| format!("moving snapshot into {}", dest.display()))
    })();
    if result.is_err() {
        let _ = remove_tree(&tmp);
    }
    result
}

fn failed(what: &str, rel: &Path, name: &OsStr) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = rel.join(name).display().to_string();
    let what = what.to_string();
    move |e| RuntimeError::Container {
        context: format!("building a snapshot: {what} {path}"),
        message: e.to_string(),
    }
}

/// Applies the layer directory `layer` onto the snapshot directory `snap` (at `rel` in
/// the snapshot), by descriptor.
fn apply(
    layer: &TreeDir,
    snap: &TreeDir,
    rel: &Path,
    chown: bool,
    dir_modes: &mut Vec<(PathBuf, u32)>,
) -> Result<()> {
    let names = layer
        .names()
        .map_err(failed("reading", rel, OsStr::new("")))?;
    let kinds: Vec<Whiteout> = names
        .iter()
        .map(|name| whiteout(name))
        .collect::<std::result::Result<_, String>>()
        .map_err(|reason| RuntimeError::BadLayer {
            digest: layer.display(),
            reason,
        })?;
    // Opaque first: it hides what lower layers put here, not what this layer adds.
    if kinds.iter().any(|k| matches!(k, Whiteout::Opaque)) {
        snap.clear()
            .map_err(failed("clearing (opaque)", rel, OsStr::new("")))?;
    }
    for (name, kind) in names.iter().zip(kinds) {
        match kind {
            Whiteout::No => {}
            Whiteout::Opaque => continue,
            Whiteout::Hides(hidden) => {
                // `hidden` is one plain name, and the removal does not follow a symlink.
                snap.remove(hidden)
                    .map_err(failed("whiteout", rel, hidden))?;
                continue;
            }
        }
        let meta = layer
            .stat(name)
            .map_err(failed("stat", rel, name))?
            .ok_or_else(|| {
                failed("stat", rel, name)(std::io::Error::from(std::io::ErrorKind::NotFound))
            })?;
        if meta.kind == Kind::Dir {
            match snap.stat(name).map_err(failed("stat", rel, name))? {
                Some(existing) if existing.kind == Kind::Dir => {}
                Some(_) => {
                    snap.remove(name).map_err(failed("replacing", rel, name))?;
                    snap.mkdir(name, 0o755)
                        .map_err(failed("creating", rel, name))?;
                }
                None => snap
                    .mkdir(name, 0o755)
                    .map_err(failed("creating", rel, name))?,
            }
            let to = snap.dir(name).map_err(failed("opening", rel, name))?;
            if chown {
                to.chown_self(meta.uid, meta.gid)
                    .map_err(failed("chown", rel, name))?;
            }
            dir_modes.push((rel.join(name), meta.mode));
            let _ = to.set_mode(0o755 | meta.mode);
            let from = layer.dir(name).map_err(failed("opening", rel, name))?;
            apply(&from, &to, &rel.join(name), chown, dir_modes)?;
        } else {
            snap.remove(name).map_err(failed("replacing", rel, name))?;
            snap.hard_link(layer, name, name)
                .map_err(failed("linking", rel, name))?;
        }
    }
    Ok(())
}

/// A private, writable copy of a tree (the rootfs when overlay is not available), by
/// descriptor on both sides.
pub fn copy_tree(from: &Path, to: &Path, chown: bool) -> Result<()> {
    let source = TreeDir::open(from).context(|| format!("opening {}", from.display()))?;
    let meta = source
        .stat_self()
        .context(|| format!("stat {}", from.display()))?;
    let dest = TreeDir::create(to, 0o700).context(|| format!("creating {}", to.display()))?;
    copy_into(
        &source,
        &dest,
        &dest,
        Path::new(""),
        chown,
        &mut HashMap::new(),
    )?;
    if chown {
        dest.chown_self(meta.uid, meta.gid)
            .context(|| format!("chown {}", to.display()))?;
    }
    dest.set_mode(meta.mode)
        .context(|| format!("chmod {}", to.display()))?;
    Ok(())
}

/// Where a file with several links was first copied to (its directory in the copy and its
/// name), so its other links stay links: an image of one file and a million hard links to
/// it costs one file's bytes, not a million.
type Copied = HashMap<(u64, u64), (PathBuf, OsString)>;

fn copy_into(
    from: &TreeDir,
    to: &TreeDir,
    top: &TreeDir,
    rel: &Path,
    chown: bool,
    copied: &mut Copied,
) -> Result<()> {
    for name in from
        .names()
        .map_err(failed("reading", rel, OsStr::new("")))?
    {
        let Some(meta) = from.stat(&name).map_err(failed("stat", rel, &name))? else {
            continue;
        };
        match meta.kind {
            Kind::Dir => {
                to.mkdir(&name, 0o700)
                    .map_err(failed("creating", rel, &name))?;
                let sub_from = from.dir(&name).map_err(failed("opening", rel, &name))?;
                let sub_to = to.dir(&name).map_err(failed("opening", rel, &name))?;
                copy_into(&sub_from, &sub_to, top, &rel.join(&name), chown, copied)?;
                if chown {
                    sub_to
                        .chown_self(meta.uid, meta.gid)
                        .map_err(failed("chown", rel, &name))?;
                }
                sub_to
                    .set_mode(meta.mode)
                    .map_err(failed("chmod", rel, &name))?;
            }
            Kind::Symlink => {
                let target = from
                    .read_link(&name)
                    .map_err(failed("readlink", rel, &name))?;
                to.symlink(&target, &name)
                    .map_err(failed("symlink", rel, &name))?;
                if chown {
                    to.chown(&name, meta.uid, meta.gid)
                        .map_err(failed("chown", rel, &name))?;
                }
            }
            Kind::File => {
                if meta.nlink > 1 {
                    if let Some((dir, first)) = copied.get(&(meta.dev, meta.ino)) {
                        // One component at a time: the path may be longer than PATH_MAX.
                        let mut at = top
                            .walk(Path::new("."))
                            .map_err(failed("opening", dir, first))?;
                        for c in dir.iter() {
                            at = at.dir(c).map_err(failed("opening", dir, first))?;
                        }
                        to.hard_link(&at, first, &name)
                            .map_err(failed("linking", rel, &name))?;
                        continue;
                    }
                    copied.insert((meta.dev, meta.ino), (rel.to_path_buf(), name.clone()));
                }
                let mut src = from
                    .open_file(&name)
                    .map_err(failed("opening", rel, &name))?;
                let mut dst = to
                    .create_file(&name, 0o600)
                    .map_err(failed("creating", rel, &name))?;
                std::io::copy(&mut src, &mut dst).map_err(failed("copying", rel, &name))?;
                if chown {
                    std::os::unix::fs::fchown(&dst, Some(meta.uid), Some(meta.gid))
                        .map_err(failed("chown", rel, &name))?;
                }
                dst.set_permissions(fs::Permissions::from_mode(meta.mode & 0o777))
                    .map_err(failed("chmod", rel, &name))?;
            }
            Kind::Other => continue,
        }
    }
    Ok(())
}
