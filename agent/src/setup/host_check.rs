//! What this host offers a rootless KAT node, and what will and will not be enforced.

use std::fmt::Write as _;
use std::path::Path;

/// One finding.
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// What was found.
    pub found: String,
    /// What it means for containers when not ok.
    pub consequence: &'static str,
}

pub struct HostReport {
    pub checks: Vec<Check>,
    pub systemd: bool,
    pub unified: bool,
}

/// `major.minor` of a kernel release string (`6.1.0-28-amd64` → (6, 1)).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn setuid_root(path: &Path) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::metadata(path)
        .map(|m| m.uid() == 0 && m.permissions().mode() & 0o4000 != 0)
        .unwrap_or(false)
        || has_file_caps(path)
}

fn has_file_caps(path: &Path) -> bool {
    nix::sys::stat::stat(path).is_ok()
        && xattr_len(path, "security.capability").is_some_and(|n| n > 0)
}

fn xattr_len(path: &Path, name: &str) -> Option<usize> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks for the length.
    let n = unsafe { nix::libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    (n >= 0).then_some(n as usize)
}

/// The controllers systemd delegates to a user's manager, from `systemctl show`.
fn delegated_controllers(uid: Option<u32>) -> Option<String> {
    let unit = format!("user@{}.service", uid.unwrap_or(0));
    let out = std::process::Command::new("systemctl")
        .args(["show", &unit, "--property=DelegateControllers"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("DelegateControllers=")
        .map(str::to_string)
}

/// Checks the host. `uid` is the agent user's, when it exists already.
pub fn check(uid: Option<u32>, pending_delegation: bool) -> HostReport {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let version = kernel_version(&release).unwrap_or((0, 0));
    let systemd = Path::new("/run/systemd/system").is_dir();
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let mut checks = vec![Check {
        name: "kernel",
        ok: version >= (5, 11),
        found: format!("Linux {release}"),
        consequence: "before 5.11 overlayfs cannot be mounted in a user namespace: every container gets a copy of its image (slower starts, more disk)",
    }];
    checks.push(Check {
        name: "cgroup v2",
        ok: unified,
        found: if unified {
            "unified hierarchy at /sys/fs/cgroup".into()
        } else {
            "v1 or hybrid hierarchy".into()
        },
        consequence: "limits work only through cgroup directories root pre-creates for the agent (setup does it); no systemd scopes",
    });
    checks.push(Check {
        name: "systemd",
        ok: systemd,
        found: if systemd {
            "running (PID 1)".into()
        } else {
            "not running".into()
        },
        consequence: "no unit, no linger, no scopes: start the agent yourself; its containers are plain cgroups",
    });
    if systemd && unified {
        let delegated = delegated_controllers(uid).unwrap_or_default();
        let all = ["memory", "cpu", "pids"]
            .iter()
            .all(|c| delegated.split_whitespace().any(|d| d == *c));
        checks.push(Check {
            name: "delegation",
            ok: all || pending_delegation,
            found: if all {
                format!("user@.service delegates: {delegated}")
            } else if pending_delegation {
                format!(
                    "user@.service delegates: {delegated} (setup adds cpu cpuset io memory pids)"
                )
            } else {
                format!("user@.service delegates: {delegated}")
            },
            consequence:
                "without memory, cpu and pids delegated to the user, those limits are not enforced",
        });
    }
    let uidmap = ["newuidmap", "newgidmap"].map(|b| {
        ["/usr/bin", "/bin", "/usr/sbin"]
            .iter()
            .map(|d| Path::new(d).join(b))
            .find(|p| p.exists())
    });
    let uidmap_ok = uidmap.iter().all(|p| p.as_deref().is_some_and(setuid_root));
    checks.push(Check {
        name: "newuidmap",
        ok: uidmap_ok,
        found: if uidmap_ok {
            "newuidmap and newgidmap are setuid root".into()
        } else {
            "newuidmap/newgidmap missing or not privileged (install uidmap)".into()
        },
        consequence: "only container root can be mapped: images whose files belong to other users lose that ownership",
    });
    let tun = Path::new("/dev/net/tun").exists();
    checks.push(Check {
        name: "/dev/net/tun",
        ok: tun,
        found: if tun {
            "present".into()
        } else {
            "missing".into()
        },
        consequence: "rootless networking (slirp4netns/pasta) will not be available to containers",
    });
    checks.push(Check {
        name: "overlayfs in userns",
        ok: version >= (5, 11),
        found: if version >= (5, 11) {
            "supported (kernel 5.11+)".into()
        } else {
            "not supported by this kernel".into()
        },
        consequence: "the runtime copies each image into each container instead",
    });
    HostReport {
        checks,
        systemd,
        unified,
    }
}

impl HostReport {
    fn ok(&self, name: &str) -> bool {
        self.checks.iter().any(|c| c.name == name && c.ok)
    }

    /// The report as text: one line per check, then what is and is not enforced.
    pub fn render(&self) -> String {
        let mut out = String::from("Host check:\n");
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let mark = if c.ok { "ok  " } else { "WARN" };
            let _ = writeln!(out, "  {mark} {:width$}  {}", c.name, c.found);
            if !c.ok {
                let _ = writeln!(out, "       {:width$}  -> {}", "", c.consequence);
            }
        }
        let limits = if self.unified {
            self.ok("delegation") || !self.systemd
        } else {
            true
        };
        let mut enforced = vec![
            "user namespace (rootless)",
            "no_new_privs",
            "reduced capabilities",
            "seccomp (KAT's default filter)",
        ];
        let mut not = vec![];
        if limits {
            enforced.push("memory, cpu and pids limits");
        } else {
            not.push("memory, cpu and pids limits");
        }
        if self.systemd && self.unified {
            enforced.push("containers as systemd scopes in kat.slice");
        }
        let _ = writeln!(out, "Enforced: {}", enforced.join(", "));
        if not.is_empty() {
            not.push("nothing");
        }
        let _ = writeln!(out, "Not enforced: {}", not.join(", "));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kernel_versions() {
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.10.0"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.10.0").unwrap() < (5, 11));
    }

    #[test]
    fn the_report_names_every_check_and_what_is_enforced() {
        let text = check(None, false).render();
        for name in [
            "kernel",
            "cgroup v2",
            "systemd",
            "newuidmap",
            "/dev/net/tun",
        ] {
            assert!(text.contains(name), "{text}");
        }
        assert!(text.contains("Enforced:") && text.contains("seccomp (KAT's default filter)"));
        assert!(text.contains("Not enforced: "));
    }
}
