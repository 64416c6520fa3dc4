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

/// The programs the node network runs that `found` does not find.
fn missing_network_tools(found: &dyn Fn(&str) -> bool) -> Vec<&'static str> {
    ["ip", "iptables", "nsenter", "slirp4netns"]
        .into_iter()
        .filter(|t| !found(t))
        .collect()
}

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|d| d.join(name).is_file())
}

/// Whether the kernel has NAT: loaded, built in (`modules.builtin`), or a module it can load.
/// `read` reads a file.
fn nat_available(read: &dyn Fn(&str) -> Option<String>) -> bool {
    match read("/proc/modules") {
        // A kernel without module support has what it was built with; the node network
        // reports a NAT it cannot set up when it starts.
        None => return true,
        Some(m) if m.lines().any(|l| l.starts_with("nf_nat ")) => return true,
        Some(_) => {}
    }
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    ["modules.builtin", "modules.dep"].iter().any(|f| {
        read(&format!("/lib/modules/{release}/{f}"))
            .is_some_and(|m| m.lines().any(|l| l.contains("/nf_nat.ko")))
    })
}

/// `major.minor` of a kernel release string (`6.1.0-28-amd64` → (6, 1)).
/// Whether an unprivileged user may create user namespaces: `Err` says what stops it and
/// how to allow it. `read` reads a /proc/sys file (absent: not restricted that way).
fn userns_allowed(read: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    let value = |p: &str| read(p).and_then(|v| v.trim().parse::<u64>().ok());
    if value("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user.max_user_namespaces is 0: sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d)".into());
    }
    if value("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err("kernel.unprivileged_userns_clone is 0: sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d)".into());
    }
    if value("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Err("AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+): sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for kat-agent with `userns,`".into());
    }
    Ok(())
}

/// Whether `/dev/net/tun` (its mode, if present) can be opened by the agent's user.
fn tun_state(mode: Option<u32>) -> Result<(), String> {
    match mode {
        None => Err("missing: modprobe tun (and list it in /etc/modules)".into()),
        Some(m) if m & 0o006 != 0o006 => Err(format!(
            "present but mode {:o}, closed to unprivileged users: chmod 0666 /dev/net/tun (the usual default; keep it with a udev rule KERNEL==\"tun\", MODE=\"0666\")",
            m & 0o777
        )),
        Some(_) => Ok(()),
    }
}

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
    let userns = userns_allowed(&|p| std::fs::read_to_string(p).ok());
    checks.push(Check {
        name: "user namespaces",
        ok: userns.is_ok(),
        found: match &userns {
            Ok(()) => "unprivileged users may create them".into(),
            Err(fix) => fix.clone(),
        },
        consequence: "a rootless agent cannot create containers (or their networks) at all",
    });
    let tun = tun_state(std::fs::metadata("/dev/net/tun").ok().map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode()
    }));
    checks.push(Check {
        name: "/dev/net/tun",
        ok: tun.is_ok(),
        found: match &tun {
            Ok(()) => "present, usable by unprivileged users".into(),
            Err(fix) => fix.clone(),
        },
        consequence: "rootless networking (slirp4netns/pasta, the userspace WireGuard overlay) will not be available to containers",
    });
    let tools = missing_network_tools(&|name| on_path(name));
    checks.push(Check {
        name: "network tools",
        ok: tools.is_empty(),
        found: if tools.is_empty() {
            "ip, iptables, nsenter, slirp4netns present".into()
        } else {
            format!("missing: {} (apt install iproute2 iptables util-linux slirp4netns)", tools.join(", "))
        },
        consequence: "without ip or nsenter containers get no network (they wait); without iptables or slirp4netns no egress",
    });
    let nat = nat_available(&|p| std::fs::read_to_string(p).ok());
    checks.push(Check {
        name: "kernel NAT",
        ok: nat,
        found: if nat {
            "nf_nat available".into()
        } else {
            "nf_nat is neither loaded nor a module of this kernel (modprobe nf_nat; echo nf_nat > /etc/modules-load.d/kat.conf)".into()
        },
        consequence: "containers cannot reach addresses outside the cluster",
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
    fn network_tools_and_nat_say_what_is_missing() {
        assert!(missing_network_tools(&|_| true).is_empty());
        assert_eq!(
            missing_network_tools(&|t| t != "slirp4netns"),
            ["slirp4netns"]
        );
        let files = |modules: &'static str, builtin: &'static str| {
            move |p: &str| -> Option<String> {
                match p {
                    "/proc/modules" => Some(modules.to_string()),
                    "/proc/sys/kernel/osrelease" => Some("6.1.0\n".to_string()),
                    "/lib/modules/6.1.0/modules.builtin" => Some(builtin.to_string()),
                    _ => None,
                }
            }
        };
        assert!(nat_available(&files("nf_nat 61440 2 - Live\n", "")));
        assert!(nat_available(&files(
            "",
            "kernel/net/netfilter/nf_nat.ko\n"
        )));
        assert!(!nat_available(&files(
            "nf_tables 1 0\n",
            "kernel/net/netfilter/nf_tables.ko\n"
        )));
        assert!(nat_available(&|_| None), "no module support: built in");
    }

    #[test]
    fn reads_kernel_versions() {
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.10.0"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.10.0").unwrap() < (5, 11));
    }

    #[test]
    fn user_namespaces_and_tun_say_what_stops_them_and_the_fix() {
        let sysctls = |pairs: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(userns_allowed(&sysctls(&[])), Ok(()));
        let err = userns_allowed(&sysctls(&[(
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1\n",
        )]))
        .unwrap_err();
        assert!(
            err.contains("apparmor_restrict_unprivileged_userns=0"),
            "{err}"
        );
        let err =
            userns_allowed(&sysctls(&[("/proc/sys/user/max_user_namespaces", "0")])).unwrap_err();
        assert!(err.contains("max_user_namespaces"), "{err}");
        assert_eq!(tun_state(Some(0o20666)), Ok(()));
        assert!(tun_state(Some(0o20600)).unwrap_err().contains("chmod 0666"));
        assert!(tun_state(None).unwrap_err().contains("modprobe tun"));
    }

    #[test]
    fn the_report_names_every_check_and_what_is_enforced() {
        let text = check(None, false).render();
        for name in [
            "kernel",
            "cgroup v2",
            "systemd",
            "newuidmap",
            "user namespaces",
            "/dev/net/tun",
        ] {
            assert!(text.contains(name), "{text}");
        }
        assert!(text.contains("Enforced:") && text.contains("seccomp (KAT's default filter)"));
        assert!(text.contains("Not enforced: "));
    }
}
