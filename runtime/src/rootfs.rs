//! Looking things up inside an image's tree without leaving it: executables on `PATH` and
//! users in `/etc/passwd`. Symlinks are resolved relative to the image root, as the kernel
//! will once the container has pivoted into it.

use std::path::Path;

use crate::error::{Result, RuntimeError};
use crate::tree_dir::TreeDir;

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Finds the executable the container will run, as the kernel will look for it (symlinks
/// resolved inside `root`, by descriptor), or says clearly that the image does not have
/// it. A lookup the kernel refuses for another reason (say, `root` became unreachable) is
/// no verdict: the program's own exec will tell.
pub fn find_executable(root: &TreeDir, program: &str, env: &[String]) -> Result<String> {
    let is_exec = |path: &str| match root.is_executable_in_root(path) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(path, error = %e, "cannot look up the executable; leaving it to exec");
            true
        }
    };
    if program.contains('/') {
        return if is_exec(program) {
            Ok(program.to_string())
        } else {
            Err(RuntimeError::ExecutableNotFound(program.to_string()))
        };
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH);
    for dir in path.split(':').filter(|d| d.starts_with('/')) {
        if is_exec(&format!("{}/{program}", dir.trim_end_matches('/'))) {
            return Ok(program.to_string());
        }
    }
    Err(RuntimeError::ExecutableNotFound(format!(
        "{program} (searched PATH={path})"
    )))
}

/// Where the container path `path` lands in the image `root` once the kernel (and
/// libcontainer, which resolves mount destinations the same way) follows the image's
/// symbolic links inside the root: `..` stops at `/`, an absolute target starts again from
/// the root, and a part that does not exist yet (libcontainer makes it) ends the walk.
/// `None` for a chain of more than 40 links (the kernel's `ELOOP`).
pub fn resolve_in_image(root: &TreeDir, path: &str) -> std::io::Result<Option<String>> {
    use std::collections::VecDeque;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let mut todo: VecDeque<Vec<u8>> = parts(path.as_bytes()).collect();
    let mut resolved: Vec<Vec<u8>> = Vec::new();
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        if part == b".." {
            resolved.pop();
            continue;
        }
        let at = resolved.iter().fold(std::path::PathBuf::new(), |p, c| {
            p.join(OsStr::from_bytes(c))
        });
        let entry = match root.walk(&at) {
            Ok(dir) => dir.stat(OsStr::from_bytes(&part))?.map(|e| (dir, e)),
            // Below a part that does not exist (libcontainer makes it: no link there), or a
            // file where a directory is needed (the mount fails and lands nowhere).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ENOENT | nix::libc::ENOTDIR)
                ) =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        match entry {
            Some((dir, e)) if e.kind == crate::tree_dir::Kind::Symlink => {
                links += 1;
                if links > 40 {
                    return Ok(None);
                }
                let target = dir.read_link(OsStr::from_bytes(&part))?;
                let target = target.as_os_str().as_bytes();
                if target.starts_with(b"/") {
                    resolved.clear();
                }
                for (i, p) in parts(target).enumerate() {
                    todo.insert(i, p);
                }
            }
            Some(_) | None => resolved.push(part),
        }
    }
    let mut out = String::new();
    for part in &resolved {
        out.push('/');
        out.push_str(&String::from_utf8_lossy(part));
    }
    Ok(Some(if out.is_empty() { "/".into() } else { out }))
}

fn parts(path: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    path.split(|b| *b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .map(<[u8]>::to_vec)
}

/// Refuses an image whose `/.kat` is not a directory (a symbolic link there would move
/// kat-init's mounts elsewhere) and a volume whose destination leads to `/.kat` through
/// the image's symbolic links. `destinations` are (volume name, destination).
pub fn check_reserved_paths(root: &TreeDir, destinations: &[(&str, &str)]) -> Result<()> {
    use crate::spec::KAT_DIR_PATH;
    let name = std::ffi::OsStr::new(KAT_DIR_PATH.trim_start_matches('/'));
    let refused = |field: String, reason: String| RuntimeError::InvalidOption { field, reason };
    let io = |e: std::io::Error| {
        refused(
            "image".into(),
            format!("cannot look up {KAT_DIR_PATH} in the image: {e}"),
        )
    };
    if let Some(entry) = root.stat(name).map_err(io)? {
        if entry.kind != crate::tree_dir::Kind::Dir {
            return Err(refused(
                "image".into(),
                format!(
                    "the image's {KAT_DIR_PATH} is a symbolic link or a file; KAT reserves {KAT_DIR_PATH} for kat-init (rebuild the image without it)"
                ),
            ));
        }
    }
    for (volume, destination) in destinations {
        let field = format!("volume {volume} destination");
        match resolve_in_image(root, destination).map_err(io)? {
            None => {
                return Err(refused(
                    field,
                    format!("{destination:?} goes through more than 40 symbolic links in the image"),
                ))
            }
            Some(real) if kat_api::names::is_reserved_container_path(&real) => {
                return Err(refused(
                    field,
                    format!(
                        "{destination:?} is a symbolic link in the image that leads to {real}; KAT reserves {KAT_DIR_PATH} for kat-init, so mount the volume at another path"
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An image's `/etc/passwd` or `/etc/group` is input from the image: a FIFO there must not
/// block the agent, nor an 8 GiB file fill its memory.
const MAX_ACCOUNT_FILE: u64 = 1 << 20;

fn read_account_file(image: &crate::tree_dir::TreeDir, path: &str) -> Result<String> {
    let bytes = image
        .read_in_root(path, MAX_ACCOUNT_FILE)
        .map_err(|e| RuntimeError::InvalidOption {
            field: "user".into(),
            reason: format!("the image's {path} cannot be read: {e}"),
        })?
        .unwrap_or_default();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Resolves `user[:group]` (names or numbers) against the image's passwd and group files.
pub fn resolve_user(root: &Path, spec: &str) -> Result<(u32, u32)> {
    if spec.is_empty() {
        return Ok((0, 0));
    }
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let image = crate::tree_dir::TreeDir::open(root).map_err(|e| RuntimeError::Container {
        context: format!("opening the image tree {}", root.display()),
        message: e.to_string(),
    })?;
    let passwd = read_account_file(&image, "/etc/passwd")?;
    let (uid, primary_gid) = match user.parse::<u32>() {
        Ok(uid) => {
            let gid = passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 3 && f[2] == user)
                    .then(|| f[3].parse().ok())
                    .flatten()
            });
            (uid, gid.unwrap_or(0))
        }
        Err(_) => passwd
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 3 && f[0] == user)
                    .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                    .flatten()
            })
            .ok_or_else(|| RuntimeError::InvalidOption {
                field: "user".into(),
                reason: format!(
                    "user {user:?} is not in the image's /etc/passwd; use a numeric uid"
                ),
            })?,
    };
    let gid = match group {
        None => primary_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_account_file(&image, "/etc/group")?;
                groups
                    .lines()
                    .find_map(|l| {
                        let f: Vec<&str> = l.split(':').collect();
                        (f.len() > 2 && f[0] == g)
                            .then(|| f[2].parse().ok())
                            .flatten()
                    })
                    .ok_or_else(|| RuntimeError::InvalidOption {
                        field: "user".into(),
                        reason: format!(
                            "group {g:?} is not in the image's /etc/group; use a numeric gid"
                        ),
                    })?
            }
        },
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// An image whose `/etc/passwd` is a FIFO (nobody ever writes to it) or a symlink to the
    /// host's: the lookup neither blocks nor reads the host's file.
    #[test]
    fn hostile_account_files_neither_block_nor_leave_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("etc")).unwrap();
        nix::unistd::mkfifo(
            &root.join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let err = resolve_user(root, "app").unwrap_err().to_string();
        assert!(err.contains("/etc/passwd"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        fs::remove_file(root.join("etc/passwd")).unwrap();
        // Absolute: resolved in the image, where /etc/accounts names app.
        std::os::unix::fs::symlink("/etc/accounts", root.join("etc/passwd")).unwrap();
        fs::write(root.join("etc/accounts"), "app:x:7:8::/:/bin/sh\n").unwrap();
        assert_eq!(resolve_user(root, "app").unwrap(), (7, 8));
        // Out of the image by `..`: stays at the image's root, so the host's root is unknown.
        fs::remove_file(root.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/passwd", root.join("etc/passwd"))
            .unwrap();
        assert!(resolve_user(root, "root").is_err());
    }

    #[test]
    fn mount_destinations_resolve_through_the_images_links() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir_all(r.join("srv/app")).unwrap();
        std::os::unix::fs::symlink("/.kat", r.join("data")).unwrap();
        std::os::unix::fs::symlink("../../.kat/log", r.join("srv/app/logs")).unwrap();
        std::os::unix::fs::symlink("srv", r.join("rel")).unwrap();
        std::os::unix::fs::symlink("loop", r.join("loop")).unwrap();
        let root = TreeDir::open(r).unwrap();
        let resolve = |p: &str| resolve_in_image(&root, p).unwrap();
        assert_eq!(resolve("/data").as_deref(), Some("/.kat"));
        assert_eq!(resolve("/data/x/y").as_deref(), Some("/.kat/x/y"));
        assert_eq!(resolve("/srv/app/logs").as_deref(), Some("/.kat/log"));
        assert_eq!(resolve("/rel/app/../../../etc").as_deref(), Some("/etc"));
        assert_eq!(resolve("/missing/../srv/x").as_deref(), Some("/srv/x"));
        assert_eq!(resolve("/loop"), None);
        let err = check_reserved_paths(&root, &[("v", "/srv/app/logs")]).unwrap_err();
        assert!(err.to_string().contains("leads to /.kat/log"), "{err}");
        assert!(check_reserved_paths(&root, &[("v", "/rel/app")]).is_ok());
        std::os::unix::fs::symlink("/tmp", r.join(".kat")).unwrap();
        let err = check_reserved_paths(&root, &[]).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
    }

    #[test]
    fn resolves_symlinks_inside_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/busybox"), "x").unwrap();
        fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("bin/data"), "x").unwrap();
        std::os::unix::fs::symlink("/bin/busybox", root.join("bin/sh")).unwrap();
        // `..` past the root stays at the root, as it does after pivot_root: this names the
        // image's /usr/bin/env, not the host's.
        std::os::unix::fs::symlink("../../../../../usr/bin/env", root.join("bin/escape")).unwrap();
        let tree = TreeDir::open(root).unwrap();
        assert_eq!(find_executable(&tree, "sh", &[]).unwrap(), "sh");
        assert_eq!(find_executable(&tree, "/bin/sh", &[]).unwrap(), "/bin/sh");
        for missing in ["/app/server", "/bin/escape", "/bin/data", "/bin"] {
            assert!(
                matches!(find_executable(&tree, missing, &[]), Err(RuntimeError::ExecutableNotFound(p)) if p == missing),
                "{missing}"
            );
        }
        assert!(find_executable(&tree, "env", &["PATH=/bin".into()]).is_err());
    }

    #[test]
    fn resolves_users() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/app:/bin/sh\n",
        )
        .unwrap();
        fs::write(dir.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        assert_eq!(resolve_user(dir.path(), "").unwrap(), (0, 0));
        assert_eq!(resolve_user(dir.path(), "app").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(dir.path(), "1000").unwrap(), (1000, 1001));
        assert_eq!(resolve_user(dir.path(), "app:staff").unwrap(), (1000, 50));
        assert_eq!(resolve_user(dir.path(), "7:8").unwrap(), (7, 8));
        assert!(resolve_user(dir.path(), "nobody").is_err());
    }
}
