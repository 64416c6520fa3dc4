//! Which cgroups this node can use, and each container's cgroup.
//!
//! Detection picks the best the host offers:
//! - **systemd** (cgroup v2 with systemd running and its bus reachable): every container is
//!   a transient scope `kat-<id>.scope` in `kat.slice`, made by libcontainer's systemd
//!   manager over D-Bus with `MemoryMax`, `CPUQuota` and `TasksMax`; for an unprivileged
//!   agent in its user's own systemd instance. Scopes do not belong to the agent's unit, so
//!   restarting or upgrading the agent leaves them running.
//! - **v2, delegated**: the agent is unprivileged and owns its own cgroup (systemd
//!   `Delegate=yes`). It moves itself into a leaf `agent` child, enables `memory cpu pids`
//!   for its subtree, and gives every container `OWN/kat-<id>`.
//! - **v2 as root**: containers go under `/kat/<id>`.
//! - **v1 / hybrid** (this project's CI hosts): containers go under `/kat/<id>` in every
//!   controller hierarchy. An unprivileged agent needs `/sys/fs/cgroup/<ctrl>/kat` created
//!   and chowned to it once by root (`prepare_v1_parent`).
//!
//! `cgroupsPath` is always set, so libcontainer never invents a top-level cgroup.
//!
//! Usage is read here, not through `libcgroups`' `stats()`: that needs a manager per
//! container (for a systemd scope, one with its own D-Bus connection) and reads every
//! controller it finds (hugetlb, blkio, all of `memory.stat`), where a heartbeat needs three
//! numbers per container, from three files ([`Cgroups::usage`]).
//!
//! Limits are libcgroups' work too: libcontainer's cgroup manager applies a container's
//! `linux.resources` from its spec. Two cases write files here instead. An unprivileged
//! agent on v1 ([`Cgroups::kat_applies_limits`]): libcgroups' v1 manager also writes
//! `devices.allow`, which needs CAP_SYS_ADMIN in the host. And a build's cgroup
//! ([`Cgroups::build_group`]), which buildah joins on exec: there is no container spec
//! for a manager to apply, and three files are the whole job.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};
use crate::types::{CgroupManager, CgroupMode, ContainerUsage};

/// The v1 controllers libcontainer joins; an unprivileged agent needs a parent in each.
const V1_CONTROLLERS: [&str; 12] = [
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
];
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The slice of container scopes under systemd.
pub const SYSTEMD_SLICE: &str = "kat.slice";

/// The cgroup setup detected on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    /// How this node's cgroups are set up.
    pub mode: CgroupMode,
    /// The parent of container cgroups, as a cgroup path (`/kat`, `/user.slice/…/kat-agent`).
    pub parent: String,
    /// The memory controller is usable: memory limits are enforced.
    pub memory: bool,
    /// The cpu controller is usable: CPU limits are enforced.
    pub cpu: bool,
    /// The pids controller is usable: pids limits are enforced.
    pub pids: bool,
    /// Plain-language notes on the setup: where containers go, or what is unusable and why.
    pub notes: Vec<String>,
}

fn is_unified() -> bool {
    Path::new(CGROUP_ROOT).join("cgroup.controllers").exists()
}

/// This process's cgroup v2 path (`0::/path` in /proc/self/cgroup).
fn own_v2_path() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

fn writable(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}

impl Cgroups {
    /// Detects the cgroup setup. `parent` overrides the default parent (`/kat`).
    pub fn detect(parent: Option<&str>, manager: CgroupManager) -> Cgroups {
        let root = nix::unistd::geteuid().is_root();
        let parent_name = parent.unwrap_or("/kat").to_string();
        if manager != CgroupManager::Cgroupfs {
            match systemd_base(root) {
                Ok(base) => return Self::v2(CgroupMode::Systemd, base, Vec::new()),
                Err(why) if manager == CgroupManager::Systemd => {
                    return Self::none(format!("--cgroup-manager systemd: {why}"))
                }
                Err(_) => {}
            }
        }
        if is_unified() {
            if root {
                return Self::v2(CgroupMode::V2Root, parent_name, Vec::new());
            }
            if let Some(own) = own_v2_path() {
                let dir = Path::new(CGROUP_ROOT).join(own.trim_start_matches('/'));
                if writable(&dir) && writable(&dir.join("cgroup.subtree_control")) {
                    match delegate(&dir) {
                        Ok(()) => return Self::v2(CgroupMode::V2Delegated, own, Vec::new()),
                        Err(e) => {
                            return Self::none(format!(
                                "cgroup v2 subtree {} is writable but could not be delegated: {e}",
                                dir.display()
                            ))
                        }
                    }
                }
            }
            return Self::none("cgroup v2 without a delegated subtree: run kat-agent as a systemd unit with Delegate=yes to enforce limits".into());
        }
        if Path::new(CGROUP_ROOT).join("memory").is_dir() {
            let rel = parent_name.trim_start_matches('/');
            let mut c = Cgroups {
                mode: CgroupMode::V1,
                parent: parent_name.clone(),
                memory: false,
                cpu: false,
                pids: false,
                notes: Vec::new(),
            };
            for ctrl in ["memory", "cpu", "pids"] {
                let base = Path::new(CGROUP_ROOT).join(ctrl);
                let ok = if root {
                    base.is_dir()
                } else {
                    writable(&base.join(rel))
                };
                match ctrl {
                    "memory" => c.memory = ok,
                    "cpu" => c.cpu = ok,
                    _ => c.pids = ok,
                }
                if !ok {
                    c.notes.push(format!("cgroup v1 {ctrl}: {}/{rel} is not writable by this user; run `kat-agent setup` as root", base.display()));
                }
            }
            if !(c.memory && c.cpu && c.pids) {
                return Cgroups {
                    mode: CgroupMode::None,
                    ..c
                };
            }
            return c;
        }
        Self::none("no cgroup filesystem found under /sys/fs/cgroup".into())
    }

    fn v2(mode: CgroupMode, parent: String, mut notes: Vec<String>) -> Cgroups {
        let dir = Path::new(CGROUP_ROOT).join(parent.trim_start_matches('/'));
        if mode == CgroupMode::Systemd {
            notes.push(format!("containers run as systemd scopes in {SYSTEMD_SLICE} (cgroup {parent}/{SYSTEMD_SLICE})"));
        }
        let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))
            .or_else(|_| fs::read_to_string(Path::new(CGROUP_ROOT).join("cgroup.controllers")))
            .unwrap_or_default();
        // systemd enables a delegated controller in a slice on demand: what matters is
        // what the manager's own cgroup was given.
        let available = if mode == CgroupMode::Systemd {
            fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default()
        } else {
            enabled
        };
        let has =
            |c: &str| available.split_whitespace().any(|x| x == c) || mode == CgroupMode::V2Root;
        Cgroups {
            mode,
            memory: has("memory"),
            cpu: has("cpu"),
            pids: has("pids"),
            parent,
            notes,
        }
    }

    fn none(note: String) -> Cgroups {
        Cgroups {
            mode: CgroupMode::None,
            parent: String::new(),
            memory: false,
            cpu: false,
            pids: false,
            notes: vec![note],
        }
    }

    /// The `cgroupsPath` of a container, or `None` where the node has no usable cgroups.
    pub fn container_path(&self, id: &str) -> Option<String> {
        match self.mode {
            CgroupMode::None => None,
            // libcontainer's systemd manager: `slice:prefix:name` → kat.slice/kat-<id>.scope.
            CgroupMode::Systemd => Some(format!("{SYSTEMD_SLICE}:kat:{id}")),
            CgroupMode::V2Delegated => {
                Some(format!("{}/kat-{id}", self.parent.trim_end_matches('/')))
            }
            _ => Some(format!("{}/{id}", self.parent.trim_end_matches('/'))),
        }
    }

    /// The container's cgroup directories: one on cgroup v2 (or under systemd), one per
    /// controller on v1, none without usable cgroups.
    pub fn dirs(&self, id: &str) -> Vec<PathBuf> {
        let Some(path) = self.container_path(id) else {
            return Vec::new();
        };
        if self.mode == CgroupMode::Systemd {
            let scope = format!(
                "{}/{SYSTEMD_SLICE}/kat-{id}.scope",
                self.parent.trim_matches('/')
            );
            return vec![Path::new(CGROUP_ROOT).join(scope.trim_start_matches('/'))];
        }
        let rel = path.trim_start_matches('/');
        if self.mode == CgroupMode::V1 {
            V1_CONTROLLERS
                .iter()
                .map(|c| Path::new(CGROUP_ROOT).join(c).join(rel))
                .collect()
        } else {
            vec![Path::new(CGROUP_ROOT).join(rel)]
        }
    }

    /// The `cgroup.procs` files of the container's cgroups that exist: a process joins the
    /// container's cgroups by writing `0` to each.
    pub fn procs_files(&self, id: &str) -> Vec<PathBuf> {
        self.dirs(id)
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .filter(|p| p.exists())
            .collect()
    }

    /// Whether the kernel OOM killer killed something in the container's cgroup.
    pub fn oom_killed(&self, id: &str) -> bool {
        for dir in self.dirs(id) {
            for file in ["memory.events", "memory.oom_control"] {
                if let Ok(text) = fs::read_to_string(dir.join(file)) {
                    let kills = text
                        .lines()
                        .find_map(|l| l.strip_prefix("oom_kill "))
                        .and_then(|n| n.trim().parse::<u64>().ok())
                        .unwrap_or(0);
                    if kills > 0 {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// What the container's cgroup uses now, from whichever files this hierarchy has: v2's
    /// `cpu.stat` (usage_usec), `memory.current`, `pids.current`; v1's `cpuacct.usage` (ns),
    /// `memory.usage_in_bytes`, `pids.current`. `None` when the container has no cgroup.
    pub fn usage(&self, id: &str) -> Option<ContainerUsage> {
        let dirs: Vec<PathBuf> = self.dirs(id).into_iter().filter(|d| d.is_dir()).collect();
        if dirs.is_empty() {
            return None;
        }
        let number = |file: &str| -> Option<u64> {
            dirs.iter()
                .find_map(|d| fs::read_to_string(d.join(file)).ok())
                .and_then(|t| t.trim().parse().ok())
        };
        let cpu_usec = dirs
            .iter()
            .find_map(|d| fs::read_to_string(d.join("cpu.stat")).ok())
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .or_else(|| number("cpuacct.usage").map(|ns| ns / 1000))
            .unwrap_or(0);
        Some(ContainerUsage {
            cpu_usec,
            memory_bytes: number("memory.current")
                .or_else(|| number("memory.usage_in_bytes"))
                .unwrap_or(0),
            pids: number("pids.current").unwrap_or(0),
        })
    }

    /// Whether KAT writes the limits itself instead of libcontainer: an unprivileged agent on
    /// cgroup v1, where libcontainer's v1 manager would also write `devices.allow`, which
    /// needs CAP_SYS_ADMIN in the host. The container's processes are already in their
    /// cgroups when `create` returns and the workload has not started yet.
    pub fn kat_applies_limits(&self) -> bool {
        self.mode == CgroupMode::V1 && !nix::unistd::geteuid().is_root()
    }

    /// Writes memory, cpu and pids limits into a container's v1 cgroups.
    pub fn apply_v1_limits(&self, id: &str, r: &crate::types::Resources) -> Result<()> {
        let Some(path) = self.container_path(id) else {
            return Ok(());
        };
        let rel = path.trim_start_matches('/');
        let write = |ctrl: &str, file: &str, value: String| -> Result<()> {
            let p = Path::new(CGROUP_ROOT).join(ctrl).join(rel).join(file);
            fs::write(&p, value).context(|| format!("writing {}", p.display()))
        };
        if r.memory_limit_bytes > 0 {
            write(
                "memory",
                "memory.limit_in_bytes",
                r.memory_limit_bytes.to_string(),
            )?;
            // Without swap accounting the file is absent; the limit above still holds.
            let _ = write(
                "memory",
                "memory.memsw.limit_in_bytes",
                r.memory_limit_bytes.to_string(),
            );
        }
        if r.cpu_limit_millis > 0 {
            write(
                "cpu",
                "cpu.cfs_period_us",
                crate::types::Resources::CPU_PERIOD_US.to_string(),
            )?;
            write("cpu", "cpu.cfs_quota_us", r.cpu_quota_us().to_string())?;
        }
        if r.cpu_request_millis > 0 {
            write("cpu", "cpu.shares", r.cpu_shares().to_string())?;
        }
        if r.pids_limit > 0 {
            write("pids", "pids.max", r.pids_limit.to_string())?;
        }
        Ok(())
    }

    /// Whether any of the container's cgroup directories still exists.
    pub fn exists(&self, id: &str) -> bool {
        self.dirs(id).iter().any(|d| d.exists())
    }

    /// Removes what is left of the container's cgroups (empty directories only).
    pub fn remove(&self, id: &str) {
        for dir in self.dirs(id) {
            let _ = fs::remove_dir(&dir);
        }
    }
}

impl Cgroups {
    /// A cgroup `id` for a build (or anything that is not a container), with memory, CPU
    /// and pids limits written by us; its `cgroup.procs` files, for [`join_on_exec`]. Under
    /// systemd, builds run in a transient scope instead ([`Cgroups::systemd_run`]) and this
    /// returns nothing; without usable cgroups, nothing either (the build is not limited,
    /// and the node's notes say cgroups are not enforced).
    pub fn build_group(
        &self,
        id: &str,
        memory: u64,
        cpu_millis: u64,
        pids: u64,
    ) -> Result<Vec<PathBuf>> {
        match self.mode {
            CgroupMode::None | CgroupMode::Systemd => return Ok(Vec::new()),
            _ => {}
        }
        for dir in self.dirs(id) {
            fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
            // A new v1 cpuset has no CPUs and no memory nodes, and joining it fails with
            // ENOSPC: each one from the top down (the parent too, when a build made it
            // before any container did) takes its parent's.
            let mut chain: Vec<&Path> = dir
                .ancestors()
                .take_while(|d| d.starts_with(CGROUP_ROOT) && d.join("cpuset.cpus").exists())
                .collect();
            chain.reverse();
            for d in chain {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let own = d.join(file);
                    if fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty()) {
                        if let Some(value) = d
                            .parent()
                            .and_then(|p| fs::read_to_string(p.join(file)).ok())
                        {
                            fs::write(&own, value.trim())
                                .context(|| format!("writing {}", own.display()))?;
                        }
                    }
                }
            }
        }
        if self.mode == CgroupMode::V1 {
            self.apply_v1_limits(
                id,
                &crate::types::Resources {
                    memory_limit_bytes: memory,
                    cpu_limit_millis: cpu_millis,
                    pids_limit: pids,
                    ..Default::default()
                },
            )?;
        } else {
            for dir in self.dirs(id) {
                let write = |file: &str, value: String| -> Result<()> {
                    let p = dir.join(file);
                    fs::write(&p, value).context(|| format!("writing {}", p.display()))
                };
                if self.memory {
                    write("memory.max", memory.to_string())?;
                }
                if self.cpu {
                    let period = crate::types::Resources::CPU_PERIOD_US;
                    write(
                        "cpu.max",
                        format!("{} {period}", cpu_millis * period / 1000),
                    )?;
                }
                if self.pids {
                    write("pids.max", pids.to_string())?;
                }
            }
        }
        Ok(self.procs_files(id))
    }

    /// Under systemd, the `systemd-run` prefix that runs a build in a transient scope of
    /// `kat.slice` with these limits; `None` elsewhere.
    pub fn systemd_run(&self, memory: u64, cpu_millis: u64, pids: u64) -> Option<Vec<String>> {
        if self.mode != CgroupMode::Systemd {
            return None;
        }
        let mut prefix = vec!["systemd-run".to_string()];
        if !nix::unistd::geteuid().is_root() {
            prefix.push("--user".into());
        }
        prefix.extend([
            "--scope".to_string(),
            "--quiet".into(),
            "--collect".into(),
            format!("--slice={SYSTEMD_SLICE}"),
            "-p".into(),
            format!("MemoryMax={memory}"),
            "-p".into(),
            format!("CPUQuota={}%", cpu_millis.div_ceil(10)),
            "-p".into(),
            format!("TasksMax={pids}"),
            "--".into(),
        ]);
        Some(prefix)
    }
}

/// Makes the child of `command` join the cgroups whose `cgroup.procs` files are `procs`
/// between fork and exec, so that everything it starts is limited from the first instruction.
pub fn join_on_exec(command: &mut std::process::Command, procs: Vec<PathBuf>) {
    use std::os::unix::process::CommandExt;
    if procs.is_empty() {
        return;
    }
    let paths: Vec<std::ffi::CString> = procs
        .iter()
        .filter_map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect();
    // SAFETY: between fork and exec only open(2), write(2) and close(2) run, on memory
    // prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            for path in &paths {
                let fd = nix::libc::open(path.as_ptr(), nix::libc::O_WRONLY | nix::libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let rc = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                nix::libc::close(fd);
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Where this process's systemd instance keeps its units, when systemd can make container
/// scopes: `` (the root cgroup) for root's system instance, `/user.slice/…/user@UID.service`
/// for an unprivileged agent's user instance.
fn systemd_base(root: bool) -> std::result::Result<String, String> {
    if !is_unified() {
        return Err("systemd scopes need cgroup v2 (this host has v1 or hybrid cgroups)".into());
    }
    if !Path::new("/run/systemd/system").is_dir() {
        return Err("systemd is not running on this host".into());
    }
    if root {
        let bus = std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
            .ok()
            .and_then(|a| a.strip_prefix("unix:path=").map(str::to_string))
            .unwrap_or_else(|| "/run/dbus/system_bus_socket".into());
        if !Path::new(&bus).exists() {
            return Err(format!("the system bus {bus} does not exist"));
        }
        return Ok(String::new());
    }
    let bus = match std::env::var("DBUS_SESSION_BUS_ADDRESS") {
        Ok(address) => address
            .strip_prefix("unix:path=")
            .map(str::to_string)
            .unwrap_or(address),
        Err(_) => match std::env::var("XDG_RUNTIME_DIR") {
            Ok(dir) => format!("{dir}/bus"),
            Err(_) => {
                return Err("neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set: run kat-agent as a systemd user service (kat-agent setup installs one)".into())
            }
        },
    };
    if !Path::new(&bus).exists() {
        return Err(format!(
            "the user's bus {bus} does not exist (is the user lingering, with dbus-user-session installed?)"
        ));
    }
    let own = own_v2_path().ok_or("this process has no cgroup v2 path")?;
    let mut base = String::new();
    for part in own.split('/').filter(|p| !p.is_empty()) {
        base.push('/');
        base.push_str(part);
        if part.starts_with("user@") && part.ends_with(".service") {
            return Ok(base);
        }
    }
    Err(format!(
        "kat-agent runs in {own}, outside a user's systemd instance (user@UID.service): run it as a systemd user service"
    ))
}

/// Moves this process into `OWN/agent` and enables controllers for the subtree (the
/// "no internal processes" rule of cgroup v2).
fn delegate(own: &Path) -> std::io::Result<()> {
    let leaf = own.join("agent");
    fs::create_dir_all(&leaf)?;
    fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())?;
    let available = fs::read_to_string(own.join("cgroup.controllers"))?;
    let wanted: Vec<String> = ["memory", "cpu", "pids"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if !wanted.is_empty() {
        fs::write(own.join("cgroup.subtree_control"), wanted.join(" "))?;
    }
    Ok(())
}

/// `/sys/fs/cgroup/<ctrl>/<parent>` for every v1 controller this host mounts.
pub fn v1_parent_dirs(parent: &str) -> Vec<PathBuf> {
    V1_CONTROLLERS
        .iter()
        .map(|c| Path::new(CGROUP_ROOT).join(c))
        .filter(|base| base.is_dir())
        .map(|base| base.join(parent.trim_start_matches('/')))
        .collect()
}

/// Root's one-time step for an unprivileged agent on a v1/hybrid host: creates
/// `/sys/fs/cgroup/<ctrl>/<parent>` for each controller and gives it to `uid:gid`.
pub fn prepare_v1_parent(parent: &str, uid: u32, gid: u32) -> Result<Vec<PathBuf>> {
    let mut made = Vec::new();
    for dir in v1_parent_dirs(parent) {
        let base = dir.parent().unwrap_or(Path::new(CGROUP_ROOT)).to_path_buf();
        let ctrl = base
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        if ctrl == "cpuset" {
            // A cpuset child is unusable until it has cpus and mems.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = fs::read_to_string(base.join(file))
                    .context(|| format!("reading {}", base.join(file).display()))?;
                fs::write(dir.join(file), value)
                    .context(|| format!("writing {}", dir.join(file).display()))?;
            }
        }
        for entry in std::iter::once(dir.clone()).chain(
            fs::read_dir(&dir)
                .context(|| format!("reading {}", dir.display()))?
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
                .map(|e| e.path()),
        ) {
            std::os::unix::fs::chown(&entry, Some(uid), Some(gid))
                .context(|| format!("chown {}", entry.display()))?;
        }
        made.push(dir);
    }
    Ok(made)
}
