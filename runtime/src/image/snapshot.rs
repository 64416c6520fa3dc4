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

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::layer::{make_writable_and_remove, whiteout, Whiteout};
use crate::error::{IoContext, Result, RuntimeError};

/// Builds `dest` (which must not exist) from `layers`, lowest first. `root_owner` is the
/// host uid/gid of container root, which owns the tree's top directory.
pub fn build(layers: &[&Path], dest: &Path, root_owner: Option<(u32, u32)>) -> Result<()> {
    let chown = root_owner.is_some();
    let tmp = dest.with_extension(format!("partial-{}", std::process::id()));
    let _ = make_writable_and_remove(&tmp);
    fs::create_dir_all(&tmp).context(|| format!("creating {}", tmp.display()))?;
    let result = (|| {
        let mut dir_modes = Vec::new();
        for layer in layers {
            apply(layer, &tmp, chown, &mut dir_modes)?;
        }
        for (dir, mode) in dir_modes.into_iter().rev() {
            let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(mode));
        }
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
            .context(|| format!("chmod {}", tmp.display()))?;
        fs::rename(&tmp, dest).context(|| format!("moving snapshot into {}", dest.display()))
    })();
    if result.is_err() {
        let _ = make_writable_and_remove(&tmp);
    }
    result
}

fn apply(
    layer_dir: &Path,
    snap_dir: &Path,
    chown: bool,
    dir_modes: &mut Vec<(std::path::PathBuf, u32)>,
) -> Result<()> {
    let names: Vec<OsString> = fs::read_dir(layer_dir)
        .context(|| format!("reading {}", layer_dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .context(|| format!("reading {}", layer_dir.display()))?;
    let kinds: Vec<Whiteout> = names
        .iter()
        .map(|name| whiteout(name))
        .collect::<std::result::Result<_, String>>()
        .map_err(|reason| RuntimeError::BadLayer {
            digest: layer_dir.display().to_string(),
            reason,
        })?;
    // Opaque first: it hides what lower layers put here, not what this layer adds.
    if kinds.iter().any(|k| matches!(k, Whiteout::Opaque)) {
        if let Ok(existing) = fs::read_dir(snap_dir) {
            for e in existing.flatten() {
                make_writable_and_remove(&e.path())
                    .context(|| format!("removing {}", e.path().display()))?;
            }
        }
    }
    for (name, kind) in names.iter().zip(kinds) {
        match kind {
            Whiteout::No => {}
            Whiteout::Opaque => continue,
            Whiteout::Hides(hidden) => {
                // `hidden` is one plain name, and the removal does not follow a symlink.
                let doomed = snap_dir.join(hidden);
                make_writable_and_remove(&doomed)
                    .context(|| format!("whiteout {}", doomed.display()))?;
                continue;
            }
        }
        let from = layer_dir.join(name);
        let to = snap_dir.join(name);
        let meta = fs::symlink_metadata(&from).context(|| format!("stat {}", from.display()))?;
        if meta.is_dir() {
            match fs::symlink_metadata(&to) {
                Ok(existing) if existing.is_dir() => {}
                Ok(_) => {
                    fs::remove_file(&to).context(|| format!("replacing {}", to.display()))?;
                    fs::create_dir(&to).context(|| format!("creating {}", to.display()))?;
                }
                Err(_) => fs::create_dir(&to).context(|| format!("creating {}", to.display()))?,
            }
            if chown {
                std::os::unix::fs::lchown(&to, Some(meta.uid()), Some(meta.gid()))
                    .context(|| format!("chown {}", to.display()))?;
            }
            dir_modes.push((to.clone(), meta.mode() & 0o7777));
            let _ = fs::set_permissions(
                &to,
                fs::Permissions::from_mode(0o755 | (meta.mode() & 0o7777)),
            );
            apply(&from, &to, chown, dir_modes)?;
        } else {
            if fs::symlink_metadata(&to).is_ok() {
                make_writable_and_remove(&to).context(|| format!("replacing {}", to.display()))?;
            }
            fs::hard_link(&from, &to).context(|| format!("linking {}", to.display()))?;
        }
    }
    Ok(())
}

/// A private, writable copy of a tree (the rootfs when overlay is not available).
pub fn copy_tree(from: &Path, to: &Path, chown: bool) -> Result<()> {
    let meta = fs::symlink_metadata(from).context(|| format!("stat {}", from.display()))?;
    fs::create_dir(to).context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).context(|| format!("reading {}", from.display()))? {
        let entry = entry.context(|| format!("reading {}", from.display()))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let m = fs::symlink_metadata(&src).context(|| format!("stat {}", src.display()))?;
        let ft = m.file_type();
        if ft.is_dir() {
            copy_tree(&src, &dst, chown)?;
            continue;
        } else if ft.is_symlink() {
            let target = fs::read_link(&src).context(|| format!("readlink {}", src.display()))?;
            std::os::unix::fs::symlink(target, &dst)
                .context(|| format!("symlink {}", dst.display()))?;
        } else if ft.is_file() {
            fs::copy(&src, &dst).context(|| format!("copying {}", src.display()))?;
        } else {
            continue;
        }
        if chown {
            std::os::unix::fs::lchown(&dst, Some(m.uid()), Some(m.gid()))
                .context(|| format!("chown {}", dst.display()))?;
        }
    }
    if chown {
        std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))
            .context(|| format!("chown {}", to.display()))?;
    }
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
        .context(|| format!("chmod {}", to.display()))?;
    Ok(())
}
