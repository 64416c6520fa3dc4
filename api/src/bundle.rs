//! Quadlet bundles: a workload directory packed as tar.gz for the API.
//!
//! The leader unpacks archives sent over the network, so unpacking trusts nothing. The whole
//! archive is read and checked in memory first (sizes, entry types, names) and only a fully
//! valid archive produces files; [`unpack_to_dir`] writes them to a fresh temporary directory
//! and renames it into place, so a malicious archive writes nothing.
//!
//! Limits (defaults in [`BundleLimits::default`]):
//! - compressed archive: 1 MiB;
//! - decompressed stream (headers included): 2 MiB, which also stops gzip bombs early;
//! - sum of file sizes: 1 MiB, and each file at most 256 KiB;
//! - at most 16 files.
//!
//! Entries must be regular files directly in the archive root named `*.kat` (a leading `./`
//! and the root directory entry itself are tolerated). Links, devices, FIFOs, subdirectories,
//! absolute paths and `..` are rejected.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::quadlet::MAX_FILE_BYTES;

/// The size and count limits an unpacked bundle must keep to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLimits {
    /// The largest archive accepted as sent (gzip-compressed), in bytes.
    pub max_compressed_bytes: u64,
    /// The most the gzip stream may expand to, tar headers included, in bytes.
    pub max_decompressed_bytes: u64,
    /// The largest sum of the files' sizes, in bytes.
    pub max_total_file_bytes: u64,
    /// The largest size of one file, in bytes.
    pub max_file_bytes: u64,
    /// The most files a bundle may hold.
    pub max_files: usize,
}

impl Default for BundleLimits {
    fn default() -> Self {
        BundleLimits {
            max_compressed_bytes: 1 << 20,
            max_decompressed_bytes: 2 << 20,
            max_total_file_bytes: 1 << 20,
            max_file_bytes: MAX_FILE_BYTES as u64,
            max_files: 16,
        }
    }
}

/// Why a bundle could not be read, packed or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A file or directory could not be written while unpacking.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The directory to pack holds no `*.kat` file.
    #[error("{0} has no *.kat files (expected at least a workload.kat)")]
    NoQuadlets(PathBuf),
    /// A `*.kat` entry of the directory to pack is not a regular file.
    #[error("{path} is a {what}, not a regular file: only regular *.kat files can be packed")]
    NotRegularSource {
        /// The entry.
        path: PathBuf,
        /// What it is instead (`symbolic link`, `directory`, `special file`).
        what: &'static str,
    },
    /// The archive is larger than [`BundleLimits::max_compressed_bytes`].
    #[error("bundle is {size} bytes, more than the limit of {limit}")]
    TooLarge {
        /// The archive's size, in bytes.
        size: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The archive is not a valid tar.gz; the text says why.
    #[error("bundle is not a valid tar.gz archive: {0}")]
    Corrupt(String),
    /// The archive expands to more than [`BundleLimits::max_decompressed_bytes`].
    #[error("bundle expands to more than {limit} bytes (a compression bomb, or far too large for Quadlet files)")]
    DecompressedTooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// An entry of the archive is not a regular file.
    #[error("bundle entry {name:?} is a {what}: only regular *.kat files are allowed")]
    NotRegularFile {
        /// The entry's name as written in the archive.
        name: String,
        /// What it is instead (a link, a directory, a device…).
        what: &'static str,
    },
    /// An entry's name is absolute, has `..`, NUL or a backslash, or is not at the top level.
    #[error("bundle entry {name:?} has an unsafe path: {why}")]
    UnsafePath {
        /// The entry's name as written in the archive.
        name: String,
        /// What is wrong with the name.
        why: &'static str,
    },
    /// An entry's name does not end in `.kat`.
    #[error("bundle entry {name:?} is not a *.kat file")]
    NotQuadlet {
        /// The entry's name as written in the archive.
        name: String,
    },
    /// Two entries have the same name.
    #[error("bundle entry {name:?} appears more than once")]
    Duplicate {
        /// The entry's name as written in the archive.
        name: String,
    },
    /// An entry is larger than [`BundleLimits::max_file_bytes`].
    #[error("bundle entry {name:?} is {size} bytes, more than the per-file limit of {limit}")]
    FileTooLarge {
        /// The entry's name as written in the archive.
        name: String,
        /// The entry's size, in bytes.
        size: u64,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The entries add up to more than [`BundleLimits::max_total_file_bytes`].
    #[error("bundle files add up to more than {limit} bytes")]
    TotalTooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The archive has more entries than [`BundleLimits::max_files`].
    #[error("bundle has more than {limit} files")]
    TooManyFiles {
        /// The limit.
        limit: usize,
    },
    /// The archive holds no file.
    #[error("bundle has no files (expected at least a workload.kat)")]
    Empty,
}

/// Read the `*.kat` files of a directory (not recursing; other files are not part of a bundle).
pub fn read_dir(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    let read_err = |source| BundleError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".kat") {
            continue;
        }
        let path = entry.path();
        let file_type = fs::symlink_metadata(&path)
            .map_err(|source| BundleError::Read {
                path: path.clone(),
                source,
            })?
            .file_type();
        if !file_type.is_file() {
            let what = if file_type.is_symlink() {
                "symbolic link"
            } else if file_type.is_dir() {
                "directory"
            } else {
                "special file"
            };
            return Err(BundleError::NotRegularSource { path, what });
        }
        let bytes = fs::read(&path).map_err(|source| BundleError::Read {
            path: path.clone(),
            source,
        })?;
        files.insert(name, bytes);
    }
    if files.is_empty() {
        return Err(BundleError::NoQuadlets(dir.to_path_buf()));
    }
    Ok(files)
}

/// Pack files into a tar.gz. The output is deterministic: sorted names, zero times and owners.
pub fn pack(files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    for (name, bytes) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        // Writing into memory cannot fail; names were validated by read_dir or the caller.
        let _ = builder.append_data(&mut header, name, bytes.as_slice());
    }
    builder
        .into_inner()
        .and_then(|gz| gz.finish())
        .unwrap_or_default()
}

/// Pack the `*.kat` files of a directory.
pub fn pack_dir(dir: &Path) -> Result<Vec<u8>, BundleError> {
    Ok(pack(&read_dir(dir)?))
}

/// Unpack and check an archive in memory. Nothing touches the disk.
pub fn unpack(
    archive: &[u8],
    limits: &BundleLimits,
) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    if archive.len() as u64 > limits.max_compressed_bytes {
        return Err(BundleError::TooLarge {
            size: archive.len() as u64,
            limit: limits.max_compressed_bytes,
        });
    }
    let stream = CappedReader {
        inner: GzDecoder::new(archive),
        remaining: limits.max_decompressed_bytes,
    };
    let mut tar = tar::Archive::new(stream);
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    let entries = tar.entries().map_err(|e| map_io(e, limits))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| map_io(e, limits))?;
        let raw_name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let entry_type = entry.header().entry_type();
        let name = check_name(&raw_name)?;
        if entry_type.is_dir() && name.is_empty() {
            continue; // the archive root, "./"
        }
        if !entry_type.is_file() {
            return Err(BundleError::NotRegularFile {
                name: raw_name,
                what: describe(entry_type),
            });
        }
        if name.is_empty() || name.contains('/') {
            return Err(BundleError::UnsafePath {
                name: raw_name,
                why: "files must be at the top level of the bundle",
            });
        }
        if !name.ends_with(".kat") {
            return Err(BundleError::NotQuadlet { name: raw_name });
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| BundleError::Corrupt(e.to_string()))?;
        if size > limits.max_file_bytes {
            return Err(BundleError::FileTooLarge {
                name: raw_name,
                size,
                limit: limits.max_file_bytes,
            });
        }
        total += size;
        if total > limits.max_total_file_bytes {
            return Err(BundleError::TotalTooLarge {
                limit: limits.max_total_file_bytes,
            });
        }
        if files.len() == limits.max_files {
            return Err(BundleError::TooManyFiles {
                limit: limits.max_files,
            });
        }
        if files.contains_key(name) {
            return Err(BundleError::Duplicate { name: raw_name });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| map_io(e, limits))?;
        files.insert(name.to_string(), bytes);
    }
    if files.is_empty() {
        return Err(BundleError::Empty);
    }
    Ok(files)
}

/// Unpack into `dir`, which must not exist yet. Everything is checked before anything is
/// written, and the files appear at once by renaming a temporary sibling directory.
pub fn unpack_to_dir(
    archive: &[u8],
    dir: &Path,
    limits: &BundleLimits,
) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    let files = unpack(archive, limits)?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BundleError::Write { path, source }
    };
    let staging = tempfile_dir(parent).map_err(write_err(parent))?;
    let result = (|| {
        for (name, bytes) in &files {
            let path = staging.join(name);
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(write_err(&path))?;
            f.write_all(bytes).map_err(write_err(&path))?;
        }
        fs::rename(&staging, dir).map_err(write_err(dir))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result.map(|_| files)
}

fn tempfile_dir(parent: &Path) -> io::Result<PathBuf> {
    for attempt in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!(
            ".kat-bundle-{}-{nanos}-{attempt}",
            std::process::id()
        ));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary directory name",
    ))
}

/// Normalise an entry name: strip a leading `./`; reject absolute paths, `..` and NUL.
fn check_name(raw: &str) -> Result<&str, BundleError> {
    let unsafe_path = |why| {
        Err(BundleError::UnsafePath {
            name: raw.to_string(),
            why,
        })
    };
    if raw.starts_with('/') {
        return unsafe_path("absolute paths are not allowed");
    }
    if raw.contains('\0') || raw.contains('\\') {
        return unsafe_path("NUL bytes and backslashes are not allowed");
    }
    if raw.split('/').any(|c| c == "..") {
        return unsafe_path("'..' is not allowed");
    }
    let mut name = raw;
    while let Some(rest) = name.strip_prefix("./") {
        name = rest;
    }
    if name == "." {
        name = "";
    }
    Ok(name.trim_end_matches('/'))
}

fn describe(t: tar::EntryType) -> &'static str {
    match t {
        tar::EntryType::Symlink => "symbolic link",
        tar::EntryType::Link => "hard link",
        tar::EntryType::Directory => "directory",
        tar::EntryType::Char | tar::EntryType::Block => "device",
        tar::EntryType::Fifo => "FIFO",
        _ => "special entry",
    }
}

fn map_io(e: io::Error, limits: &BundleLimits) -> BundleError {
    if e.get_ref().is_some_and(|inner| inner.is::<CapExceeded>()) {
        BundleError::DecompressedTooLarge {
            limit: limits.max_decompressed_bytes,
        }
    } else {
        BundleError::Corrupt(e.to_string())
    }
}

#[derive(Debug)]
struct CapExceeded;
impl std::fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("decompressed size limit exceeded")
    }
}
impl std::error::Error for CapExceeded {}

/// Fails with [`CapExceeded`] once more than `limit` bytes have been read.
struct CappedReader<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // One probe byte tells a stream that ends exactly at the cap from one that goes on.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(CapExceeded)),
            };
        }
        let max = buf
            .len()
            .min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        self.remaining -= n as u64;
        Ok(n)
    }
}
