//! The OCI runtime spec (`config.json`) of a KAT container.
//!
//! What every container gets, and why:
//! - `kat-init` as PID 1, bind-mounted read-only at `/.kat/init`, with the workload's argv
//!   after `--` (the image's Entrypoint and Cmd merged with the workload's command and
//!   args, Docker semantics);
//! - user, pid, mount, ipc, uts, cgroup and (empty, for now) network namespaces;
//! - the node's id mapping; `noNewPrivileges`; a minimal capability set; KAT's seccomp
//!   filter, which kat-init installs in itself (`--seccomp default`, see `init/`);
//! - `proc`, a tmpfs `/dev` with the default devices, `/dev/pts`, `/dev/shm`, read-only
//!   `sys` (with the container's own cgroup v2 read-only at `/sys/fs/cgroup` on v2 hosts),
//!   and runc's masked and read-only paths;
//! - the container's log directory at `/.kat/log` (kat-init opens it there: no host fd);
//! - generated `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf`;
//! - volumes as bind mounts (`subPath`, `readOnly`);
//! - the rootfs as an overlay made inside the user namespace, or a private copy;
//! - a `cgroupsPath` always, with the limits the node can enforce.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::idmap::IdMap;
use crate::image::config::RunConfig;
use crate::types::{CreateOptions, Resources};

/// Where kat-init lives inside every container.
pub const INIT_PATH: &str = "/.kat/init";

/// Where the container's log directory is bind-mounted for kat-init. kat-init opens it by
/// this path, inside the container, so it never holds a descriptor of a host directory.
pub const LOG_DIR_PATH: &str = "/.kat/log";

/// Capabilities a workload keeps: enough to run ordinary services as root, nothing that
/// reaches outside the container.
pub const CAPABILITIES: [&str; 9] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
];

/// Held by kat-init alone, dropped before the workload starts: the container's network
/// namespace (its loopback) is set up with it.
pub const INIT_ONLY_CAPABILITY: &str = "CAP_NET_ADMIN";

const MASKED: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READ_ONLY: [&str; 6] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/sys/fs/cgroup",
];

/// The workload's argv: Docker's rules for Entrypoint/Cmd against command/args.
pub fn workload_argv(image: &RunConfig, command: &[String], args: &[String]) -> Vec<String> {
    let (entry, cmd): (&[String], &[String]) = match (command.is_empty(), args.is_empty()) {
        (false, false) => (command, args),
        (false, true) => (command, &[]),
        (true, false) => (&image.entrypoint, args),
        (true, true) => (&image.entrypoint, &image.cmd),
    };
    entry.iter().chain(cmd.iter()).cloned().collect()
}

/// The image's Env overridden by the workload's, with a default PATH and HOSTNAME.
pub fn merged_env(
    image: &RunConfig,
    env: &BTreeMap<String, String>,
    hostname: &str,
) -> Vec<String> {
    let mut merged: BTreeMap<String, String> = BTreeMap::new();
    merged.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    for entry in &image.env {
        if let Some((k, v)) = entry.split_once('=') {
            merged.insert(k.to_string(), v.to_string());
        }
    }
    merged.insert("HOSTNAME".into(), hostname.to_string());
    for (k, v) in env {
        merged.insert(k.clone(), v.clone());
    }
    merged
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// The container's rootfs as the spec sees it.
pub enum Rootfs<'a> {
    /// Mount an overlay of `lower` inside the user namespace onto `mountpoint`.
    Overlay {
        mountpoint: &'a Path,
        lower: &'a Path,
        upper: &'a Path,
        work: &'a Path,
    },
    /// A private copy already at this path.
    Copy(&'a Path),
}

pub struct SpecInput<'a> {
    pub options: &'a CreateOptions,
    pub hostname: &'a str,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub ids: &'a IdMap,
    pub rootfs: Rootfs<'a>,
    pub init_binary: &'a Path,
    /// Generated files: `/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`.
    pub etc_dir: &'a Path,
    /// The container's log directory (`stdio.log`, `exit.json`), mounted at [`LOG_DIR_PATH`].
    pub log_dir: &'a Path,
    /// Volume sources resolved (subPath applied), in `options.volumes` order.
    pub volume_sources: Vec<PathBuf>,
    pub cgroups_path: Option<String>,
    /// Which limits the node enforces through libcontainer.
    pub memory_limit: bool,
    pub cpu_limit: bool,
    pub pids_limit: bool,
    /// Leave `linux.resources` out: the agent writes the limits itself (rootless on v1).
    pub omit_resources: bool,
    /// kat-init installs KAT's default seccomp filter (`--seccomp default`).
    pub seccomp: bool,
    /// Mount the container's own cgroup (v2, through the cgroup namespace) read-only at
    /// `/sys/fs/cgroup`, so kat-init can read `memory.events` before it exits: under systemd
    /// the scope and its counters are gone as soon as the last process leaves.
    pub cgroup_mount: bool,
    /// User and network namespaces made for the container, joined by path (they carry its id
    /// mappings, so `config.json` has none): see [`crate::network`].
    pub joined: Option<(PathBuf, PathBuf)>,
}

fn bind(source: &Path, destination: &str, read_only: bool) -> Value {
    let mut options = vec!["rbind", "nosuid", "nodev"];
    if read_only {
        options.push("ro");
    }
    json!({"destination": destination, "type": "bind", "source": source, "options": options})
}

/// Builds `config.json`.
pub fn build(input: &SpecInput<'_>) -> Value {
    let o = input.options;
    let mut init_args: Vec<String> = vec![
        INIT_PATH.into(),
        "--log-dir".into(),
        LOG_DIR_PATH.into(),
        "--log-max-bytes".into(),
        o.log.max_bytes.to_string(),
        "--log-max-files".into(),
        o.log.max_files.to_string(),
        "--seccomp".into(),
        if input.seccomp {
            "default"
        } else {
            "unconfined"
        }
        .into(),
        "--".into(),
    ];
    init_args.extend(input.argv.iter().cloned());

    let (root_path, mut mounts) = match &input.rootfs {
        Rootfs::Overlay {
            mountpoint,
            lower,
            upper,
            work,
        } => (
            *mountpoint,
            vec![json!({
                "destination": "/",
                "type": "overlay",
                "source": "overlay",
                "options": [
                    format!("lowerdir={}", lower.display()),
                    format!("upperdir={}", upper.display()),
                    format!("workdir={}", work.display()),
                    "userxattr",
                ],
            })],
        ),
        Rootfs::Copy(path) => (*path, Vec::new()),
    };
    mounts.extend([
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        bind(input.init_binary, INIT_PATH, true),
        json!({"destination": LOG_DIR_PATH, "type": "bind", "source": input.log_dir, "options": ["rbind", "nosuid", "nodev", "noexec"]}),
        bind(&input.etc_dir.join("hosts"), "/etc/hosts", false),
        bind(&input.etc_dir.join("hostname"), "/etc/hostname", false),
        bind(&input.etc_dir.join("resolv.conf"), "/etc/resolv.conf", false),
    ]);
    if input.cgroup_mount {
        mounts.push(json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}));
    }
    for (volume, source) in o.volumes.iter().zip(&input.volume_sources) {
        mounts.push(bind(source, &volume.destination, volume.read_only));
    }

    let mapping = |ranges: &[crate::idmap::IdRange]| -> Vec<Value> {
        ranges
            .iter()
            .map(|r| json!({"containerID": r.inside, "hostID": r.outside, "size": r.count}))
            .collect()
    };

    let mut resources = serde_json::Map::new();
    let r = &input.options.resources;
    if input.memory_limit && r.memory_limit_bytes > 0 {
        // No swap beyond the limit: exceeding it means the OOM killer, as users expect.
        resources.insert(
            "memory".into(),
            json!({"limit": r.memory_limit_bytes, "swap": r.memory_limit_bytes}),
        );
    }
    if input.cpu_limit && (r.cpu_limit_millis > 0 || r.cpu_request_millis > 0) {
        let mut cpu = serde_json::Map::new();
        if r.cpu_limit_millis > 0 {
            cpu.insert("quota".into(), json!(r.cpu_quota_us()));
            cpu.insert("period".into(), json!(Resources::CPU_PERIOD_US));
        }
        if r.cpu_request_millis > 0 {
            cpu.insert("shares".into(), json!(r.cpu_shares()));
        }
        resources.insert("cpu".into(), Value::Object(cpu));
    }
    if input.pids_limit && r.pids_limit > 0 {
        resources.insert("pids".into(), json!({"limit": r.pids_limit}));
    }

    let mut linux = json!({
        "uidMappings": mapping(&input.ids.uids),
        "gidMappings": mapping(&input.ids.gids),
        "namespaces": [
            {"type": "user"}, {"type": "pid"}, {"type": "mount"}, {"type": "ipc"},
            {"type": "uts"}, {"type": "cgroup"}, {"type": "network"},
        ],
        "resources": Value::Object(resources),
        "maskedPaths": MASKED,
        "readonlyPaths": READ_ONLY,
    });
    if input.omit_resources {
        if let Some(l) = linux.as_object_mut() {
            l.remove("resources");
        }
    }
    if let Some((user, network)) = &input.joined {
        linux["namespaces"] = json!([
            {"type": "user", "path": user}, {"type": "pid"}, {"type": "mount"}, {"type": "ipc"},
            {"type": "uts"}, {"type": "cgroup"}, {"type": "network", "path": network},
        ]);
        if let Some(l) = linux.as_object_mut() {
            l.remove("uidMappings");
            l.remove("gidMappings");
        }
    }
    if let Some(path) = &input.cgroups_path {
        linux["cgroupsPath"] = json!(path);
    }

    // kat-init (PID 1) also holds CAP_NET_ADMIN, to set the container's loopback up; it
    // drops it from every set before the workload starts (init/src/loopback.rs).
    let init_caps: Vec<&str> = CAPABILITIES
        .iter()
        .copied()
        .chain([INIT_ONLY_CAPABILITY])
        .collect();
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": input.uid, "gid": input.gid},
            "args": init_args,
            "env": input.env,
            "cwd": input.cwd,
            "capabilities": {
                "bounding": init_caps, "effective": init_caps, "permitted": init_caps,
            },
            "noNewPrivileges": true,
        },
        "root": {"path": root_path, "readonly": false},
        "hostname": input.hostname,
        "mounts": mounts,
        "linux": linux,
    })
}

/// `/etc/hosts` of a container: its own name on its address (else `127.0.1.1`, as Debian).
pub fn hosts_file(
    hostname: &str,
    address: Option<std::net::Ipv4Addr>,
    extra: &BTreeMap<String, String>,
) -> String {
    let own = address.map_or_else(|| "127.0.1.1".to_string(), |a| a.to_string());
    let mut out = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}\t{hostname}\n"
    );
    for (name, ip) in extra {
        out.push_str(&format!("{ip}\t{name}\n"));
    }
    out
}

/// `/etc/resolv.conf` of a container.
pub fn resolv_conf(servers: &[String], search: &[String]) -> String {
    let mut out = String::new();
    if !search.is_empty() {
        out.push_str(&format!("search {}\n", search.join(" ")));
    }
    for s in servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn docker_entrypoint_and_cmd_rules() {
        let image = RunConfig {
            entrypoint: s(&["/entry"]),
            cmd: s(&["default"]),
            ..Default::default()
        };
        assert_eq!(workload_argv(&image, &[], &[]), s(&["/entry", "default"]));
        assert_eq!(workload_argv(&image, &[], &s(&["x"])), s(&["/entry", "x"]));
        assert_eq!(
            workload_argv(&image, &s(&["/bin/sh"]), &[]),
            s(&["/bin/sh"])
        );
        assert_eq!(
            workload_argv(&image, &s(&["/bin/sh"]), &s(&["-c", "true"])),
            s(&["/bin/sh", "-c", "true"])
        );
    }

    #[test]
    fn env_overrides_image() {
        let image = RunConfig {
            env: s(&["PATH=/app/bin", "A=1"]),
            ..Default::default()
        };
        let env = merged_env(
            &image,
            &BTreeMap::from([("A".to_string(), "2".to_string())]),
            "h",
        );
        assert_eq!(env, s(&["A=2", "HOSTNAME=h", "PATH=/app/bin"]));
    }
}
