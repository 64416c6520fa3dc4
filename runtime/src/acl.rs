//! A POSIX ACL on a container's log directory, so that exactly two users can use it: the
//! agent (its owner) and the workload's user, who is a different host id (a subordinate id
//! of the workload's slice) that an unprivileged agent cannot `chown` to. Any owner may set
//! an ACL naming any uid, so this needs no privilege and no helper.
//!
//! The directory gets `user::rwx, user:WORKLOAD:rwx, group::---, mask::rwx, other::---`, and
//! a default ACL so the files kat-init creates there (`stdio.log*`, `exit.json`, which it
//! owns) stay readable by the agent: `user::rw-, user:AGENT:r--, group::---, mask::r--,
//! other::---`.
//!
//! The format is the kernel's `posix_acl_xattr` (a version word, then sorted entries of
//! tag, permissions and id), written with `setxattr(2)`; ids are host ids, as the agent sees
//! them. Written here rather than through a crate: it is two fixed lists of entries.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED: u32 = u32::MAX;

fn encode(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

fn set(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let c_name =
        CString::new(name).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: NUL-terminated strings and a buffer that live for the call.
    let rc = unsafe {
        nix::libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Shares the directory `dir` (owned by us) with `workload_uid`, as described above.
pub fn share_log_dir(dir: &Path, workload_uid: u32, agent_uid: u32) -> std::io::Result<()> {
    let access = encode(&[
        (USER_OBJ, 7, UNDEFINED),
        (USER, 7, workload_uid),
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 7, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ]);
    let default = encode(&[
        (USER_OBJ, 6, UNDEFINED),
        (USER, 4, agent_uid),
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 4, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ]);
    set(dir, "system.posix_acl_access", &access)?;
    set(dir, "system.posix_acl_default", &default)
}

/// Opens the directory `dir` (owned by us, 0700) to `uid` as well: a build's workspace,
/// which the build slice's root must write and nobody else may enter. No default ACL: what
/// the build creates keeps its plain mode bits.
pub fn open_dir_to(dir: &Path, uid: u32) -> std::io::Result<()> {
    let access = encode(&[
        (USER_OBJ, 7, UNDEFINED),
        (USER, 7, uid),
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 7, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ]);
    set(dir, "system.posix_acl_access", &access)
}

/// Lets exactly `uids` (besides us, the owner) pass through the directory `dir`, which
/// others may not even enter: a container's directory, which its root must traverse to
/// mount its overlay and bind sources, and a slice's directory of image copies. Search
/// only: nobody but us lists or changes it.
pub fn searchable_by(dir: &Path, uids: &[u32]) -> std::io::Result<()> {
    let mut uids = uids.to_vec();
    uids.sort_unstable();
    uids.dedup();
    let mut entries = vec![(USER_OBJ, 7, UNDEFINED)];
    entries.extend(uids.iter().map(|&uid| (USER, 1, uid)));
    entries.extend([
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 1, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ]);
    set(dir, "system.posix_acl_access", &encode(&entries))
}

/// Lets `uid` read the file `file` (owned by us, 0600) too: a build's copy of the auth file.
pub fn open_file_to(file: &Path, uid: u32) -> std::io::Result<()> {
    let access = encode(&[
        (USER_OBJ, 6, UNDEFINED),
        (USER, 4, uid),
        (GROUP_OBJ, 0, UNDEFINED),
        (MASK, 4, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ]);
    set(file, "system.posix_acl_access", &access)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_kernel_format() {
        let bytes = encode(&[(USER_OBJ, 7, UNDEFINED), (USER, 5, 1000)]);
        assert_eq!(
            bytes,
            [2, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255, 2, 0, 5, 0, 0xe8, 3, 0, 0]
        );
    }

    #[test]
    fn the_kernel_accepts_it() {
        let dir = tempfile::tempdir().unwrap();
        share_log_dir(dir.path(), 4_000_000, nix::unistd::geteuid().as_raw()).unwrap();
        // The group bits of the mode now show the mask.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o770);
    }
}
