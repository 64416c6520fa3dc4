//! Files on the node's disk, read and written so that neither a crash nor a workload can
//! corrupt what the agent relies on.
//!
//! Two kinds of file meet here:
//!
//! - **State files** the agent owns (container metadata, the id-slice table, the local
//!   copy of assignments, the node identity): [`write_atomic`] writes a fresh temporary file,
//!   fsyncs it, renames it over the old one and fsyncs the directory, so a power cut leaves
//!   the old or the new file, never a torn one.
//! - **Files a workload can touch**: the log directory is mounted into the container, so its
//!   `stdio.log*` and `exit.json` may have been replaced by a symlink to a host file, a FIFO
//!   that blocks every reader, or a huge file. [`open_untrusted`] and [`read_untrusted`]
//!   never follow a symlink, never block on open, accept only regular files and read at most
//!   a given size; [`write_atomic`] never follows a planted symlink either (the temporary
//!   name is created exclusively, and `rename` replaces a symlink rather than its target).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::libc;

/// Opens `path` for reading if it is a regular file: `O_NOFOLLOW` (a symlink is refused with
/// `ELOOP`), `O_NONBLOCK` (a FIFO cannot stall the caller), then checked with `fstat`.
pub fn open_untrusted(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is {what}; refusing to read it", path.display()),
        ));
    }
    Ok(file)
}

/// Reads at most `max` bytes of a regular file that a workload may have tampered with;
/// `Ok(None)` when it does not exist. A longer file is an error, not a truncated read.
pub fn read_untrusted(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let file = match open_untrusted(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {max} bytes", path.display()),
        ));
    }
    Ok(Some(bytes))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes` atomically and durably (mode `mode`): write a temporary file
/// created exclusively beside it, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_symlinks_fifos_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        let link = dir.path().join("exit.json");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert!(
            read_untrusted(&link, 1024).is_err(),
            "a symlink is not followed"
        );

        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read_untrusted(&fifo, 1024).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");

        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 2048]).unwrap();
        assert!(read_untrusted(&big, 1024).is_err());
        assert_eq!(read_untrusted(&dir.path().join("none"), 10).unwrap(), None);
        assert_eq!(
            read_untrusted(&secret, 1024).unwrap().unwrap(),
            b"host secret"
        );
    }

    #[test]
    fn atomic_write_replaces_a_planted_symlink_not_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("host-file");
        std::fs::write(&target, "untouched").unwrap();
        let path = dir.path().join("exit.json");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write_atomic(&path, b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}");
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
