//! Unpacking one image layer, safely.
//!
//! A layer is a tar stream (gzip, zstd or uncompressed, detected by magic bytes). It is
//! unpacked into a fresh directory next to its final place and renamed into place only when
//! every entry was accepted, so a rejected layer leaves nothing behind. An entry is rejected
//! when it would land outside the layer directory: a `..` component, a parent that is a
//! symlink, or a hard link whose target is outside or is not yet unpacked. Symlink *targets*
//! are stored as they are; they are never followed while unpacking.
//!
//! Whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) are kept as empty files here;
//! [`super::snapshot`] honours them when it flattens an image's layers.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{IoContext, Result, RuntimeError};
use crate::idmap::IdMap;

/// How the unpacked files are owned on the host.
#[derive(Clone, Copy)]
pub enum Ownership<'a> {
    /// chown every entry to its id mapped through the node's id map (agent runs as root).
    Mapped(&'a IdMap),
    /// Leave everything owned by the unpacking user (unprivileged agent): inside the user
    /// namespace it is container root.
    Squashed,
}

/// Unpacks `reader` into `dest`, which must not exist. Returns the bytes of file content.
pub fn unpack(
    reader: impl Read,
    dest: &Path,
    ownership: Ownership<'_>,
    digest: &str,
) -> Result<u64> {
    let tmp = dest.with_extension(format!("partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).context(|| format!("creating {}", tmp.display()))?;
    match unpack_into(reader, &tmp, ownership, digest) {
        Ok(bytes) => {
            fs::rename(&tmp, dest)
                .context(|| format!("moving layer {digest} into {}", dest.display()))?;
            Ok(bytes)
        }
        Err(e) => {
            let _ = make_writable_and_remove(&tmp);
            Err(e)
        }
    }
}

/// Removes a tree even where an image made directories read-only.
pub fn make_writable_and_remove(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(meta) if !meta.is_dir() => return fs::remove_file(path),
        Ok(_) => {}
    }
    if let Err(first) = fs::remove_dir_all(path) {
        if first.kind() == std::io::ErrorKind::NotFound {
            return Ok(());
        }
        for entry in walk_dirs(path) {
            let _ = fs::set_permissions(&entry, fs::Permissions::from_mode(0o700));
        }
        fs::remove_dir_all(path)?;
    }
    Ok(())
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let _ = fs::set_permissions(&out[i], fs::Permissions::from_mode(0o700));
        if let Ok(entries) = fs::read_dir(&out[i]) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
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
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Creates the parents of `rel` under `root`, refusing to pass through anything that is
/// not a real directory (a symlink planted by an earlier entry, say).
fn safe_parent(root: &Path, rel: &Path, digest: &str) -> Result<PathBuf> {
    let mut at = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for component in parent.components() {
            at.push(component);
            match fs::symlink_metadata(&at) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(bad(
                        digest,
                        format!(
                            "entry {} passes through non-directory {}",
                            rel.display(),
                            component.as_os_str().to_string_lossy()
                        ),
                    ))
                }
                Err(_) => fs::create_dir(&at).context(|| format!("creating {}", at.display()))?,
            }
        }
    }
    Ok(root.join(rel))
}

fn remove_existing(path: &Path, keep_dir: bool) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {
            if !keep_dir {
                make_writable_and_remove(path)
                    .context(|| format!("replacing {}", path.display()))?;
            }
        }
        Ok(_) => fs::remove_file(path).context(|| format!("replacing {}", path.display()))?,
        Err(_) => {}
    }
    Ok(())
}

fn unpack_into(
    reader: impl Read,
    root: &Path,
    ownership: Ownership<'_>,
    digest: &str,
) -> Result<u64> {
    let mut buffered = BufReader::with_capacity(256 * 1024, reader);
    let magic = buffered
        .fill_buf()
        .map_err(|e| bad(digest, format!("cannot read: {e}")))?;
    let stream: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e| bad(digest, format!("bad zstd stream: {e}")))?,
        )
    } else {
        Box::new(buffered)
    };
    let mut archive = tar::Archive::new(stream);
    let mut bytes = 0u64;
    // Directory modes are applied last, so a read-only directory can still be filled.
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| bad(digest, format!("not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(digest, format!("corrupt tar stream: {e}")))?;
        let header = entry.header().clone();
        let raw_path = entry.path_bytes().into_owned();
        let Some(rel) = clean_path(&raw_path, digest)? else {
            continue;
        };
        let target = safe_parent(root, &rel, digest)?;
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let kind = header.entry_type();
        match kind {
            tar::EntryType::Directory => {
                remove_existing(&target, true)?;
                if !target.is_dir() {
                    fs::create_dir(&target).context(|| format!("creating {}", target.display()))?;
                }
                dir_modes.push((target.clone(), mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_existing(&target, false)?;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .context(|| format!("creating {}", target.display()))?;
                bytes += std::io::copy(&mut entry, &mut file)
                    .map_err(|e| bad(digest, format!("reading {}: {e}", rel.display())))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .context(|| format!("chmod {}", target.display()))?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(|e| bad(digest, format!("symlink {}: {e}", rel.display())))?
                    .ok_or_else(|| {
                        bad(digest, format!("symlink {} has no target", rel.display()))
                    })?;
                remove_existing(&target, false)?;
                symlink(&link, &target).context(|| format!("symlink {}", target.display()))?;
            }
            tar::EntryType::Link => {
                let link = entry.link_name_bytes().ok_or_else(|| {
                    bad(digest, format!("hard link {} has no target", rel.display()))
                })?;
                let link_rel = clean_path(&link, digest)?.ok_or_else(|| {
                    bad(
                        digest,
                        format!("hard link {} points at the layer root", rel.display()),
                    )
                })?;
                let source = safe_parent(root, &link_rel, digest)?;
                match fs::symlink_metadata(&source) {
                    Ok(meta) if !meta.is_dir() => {}
                    _ => {
                        return Err(bad(
                            digest,
                            format!(
                                "hard link {} targets {} which is not a file earlier in the layer",
                                rel.display(),
                                link_rel.display()
                            ),
                        ))
                    }
                }
                remove_existing(&target, false)?;
                fs::hard_link(&source, &target)
                    .context(|| format!("hard link {}", target.display()))?;
                continue; // shares the target's owner and mode
            }
            tar::EntryType::Fifo => {
                remove_existing(&target, false)?;
                nix::unistd::mkfifo(&target, nix::sys::stat::Mode::from_bits_truncate(mode))
                    .map_err(|e| bad(digest, format!("mkfifo {}: {e}", rel.display())))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                // Containers get their /dev from the runtime; device nodes in images are
                // neither needed nor creatable without privilege.
                tracing::debug!(layer = digest, path = %rel.display(), "skipping device node");
                continue;
            }
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => continue,
            other => {
                return Err(bad(
                    digest,
                    format!("entry {} has unsupported type {other:?}", rel.display()),
                ))
            }
        }
        if let Ownership::Mapped(ids) = ownership {
            let uid = header.uid().unwrap_or(0).min(u32::MAX as u64) as u32;
            let gid = header.gid().unwrap_or(0).min(u32::MAX as u64) as u32;
            std::os::unix::fs::lchown(&target, Some(ids.host_uid(uid)), Some(ids.host_gid(gid)))
                .context(|| format!("chown {}", target.display()))?;
        }
    }
    for (dir, mode) in dir_modes.into_iter().rev() {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
            .context(|| format!("chmod {}", dir.display()))?;
    }
    Ok(bytes)
}
