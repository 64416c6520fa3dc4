//! What goes in and out of a `ContainerRuntime`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Everything needed to create one container (RFC 001 §6.1, trimmed to what KAT enforces).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreateOptions {
    /// KAT's instance ID: the container's ID on the node. A DNS label.
    pub id: String,
    pub namespace: String,
    pub workload: String,
    /// An image reference already in the store (pulled or imported).
    pub image: String,
    pub hostname: String,
    /// Replaces the image's Entrypoint when non-empty (Docker semantics).
    pub command: Vec<String>,
    /// Replaces the image's Cmd when non-empty; with only `command` set, Cmd is dropped.
    pub args: Vec<String>,
    /// Added to, and overriding, the image's Env.
    pub env: BTreeMap<String, String>,
    /// `uid[:gid]` inside the container; empty means the image's User, else 0:0.
    pub user: String,
    pub labels: BTreeMap<String, String>,
    pub resources: Resources,
    pub volumes: Vec<VolumeMount>,
    /// Extra `/etc/hosts` entries (name → IP).
    pub hosts: BTreeMap<String, String>,
    /// Nameservers for `/etc/resolv.conf`; empty copies none (no network yet).
    pub dns_servers: Vec<String>,
    pub dns_search: Vec<String>,
    pub log: LogConfig,
    /// The container's address on the node network ([`crate::network`]); `None`: a network
    /// namespace of its own with only `lo`.
    #[serde(default)]
    pub address: Option<std::net::Ipv4Addr>,
    /// Host device nodes given to the container (a GPU's, from its CDI specification): bound
    /// in at their container paths and allowed in its device cgroup.
    #[serde(default)]
    pub devices: Vec<DeviceNode>,
    /// Host files and directories bound in as they are (a GPU's CDI `mounts`: libraries,
    /// tools, sockets; root's configuration, so not confined like volumes).
    #[serde(default)]
    pub host_binds: Vec<HostBind>,
    /// Programs run around the container's life (a GPU's CDI `hooks`), as the runtime runs
    /// OCI hooks: as the agent's user, with the container's state on their input.
    #[serde(default)]
    pub hooks: Vec<Hook>,
}

/// A program run at one point of a container's life (OCI runtime spec, `hooks`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub stage: HookStage,
    /// An absolute host path (`startContainer`: a path in the container).
    pub path: PathBuf,
    /// Its arguments, `argv[0]` first; empty: the path alone.
    pub args: Vec<String>,
    /// Its whole environment (`NAME=VALUE`).
    pub env: Vec<String>,
    /// Seconds before it is killed and the step fails; `None`: no limit.
    pub timeout: Option<i64>,
}

/// When a [`Hook`] runs, as OCI names the points (CDI's `hookName`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum HookStage {
    Prestart,
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

/// A host path bound in at a container path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostBind {
    pub host_path: PathBuf,
    pub container_path: String,
    pub read_only: bool,
}

/// A host device node and where the container sees it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub host_path: PathBuf,
    pub container_path: String,
}

/// Resource limits. Zero means unlimited / not set.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub memory_limit_bytes: u64,
    /// CPU limit in millicores: becomes `cpu.max` (quota per 100 ms period).
    pub cpu_limit_millis: u64,
    /// CPU request in millicores: becomes `cpu.weight` (v2) or `cpu.shares` (v1).
    pub cpu_request_millis: u64,
    pub pids_limit: u64,
}

impl Resources {
    /// The CFS period every KAT container uses, in microseconds.
    pub const CPU_PERIOD_US: u64 = 100_000;

    /// `limits.cpu` as a CFS quota per [`Self::CPU_PERIOD_US`] (500m → 50,000 µs).
    pub fn cpu_quota_us(&self) -> u64 {
        self.cpu_limit_millis * Self::CPU_PERIOD_US / 1000
    }

    /// `requests.cpu` as cgroup v1 shares, 1 CPU = 1024 as Kubernetes does (libcontainer
    /// converts shares to `cpu.weight` on cgroup v2).
    pub fn cpu_shares(&self) -> u64 {
        (self.cpu_request_millis * 1024 / 1000).max(2)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub name: String,
    /// Host path, already resolved by the agent.
    pub source: PathBuf,
    /// A path under `source` to mount instead of `source` itself.
    pub sub_path: Option<String>,
    pub destination: String,
    pub read_only: bool,
    /// A directory of the workload's own (`simpleClusterStorage`): given to the container's
    /// root, in the workload's id slice. Host paths (`hostMount`) keep their owner.
    #[serde(default)]
    pub owned_by_container: bool,
}

/// Log rotation for one container.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LogConfig {
    pub max_bytes: u64,
    pub max_files: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            max_bytes: 10 * 1024 * 1024,
            max_files: 3,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl std::fmt::Display for ContainerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Unknown => "unknown",
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub id: String,
    pub namespace: String,
    pub workload: String,
    pub image: String,
    pub image_id: String,
    pub state: ContainerState,
    pub pid: Option<i32>,
    pub exit_code: Option<i32>,
    /// The signal that ended the workload, if one did.
    pub signal: Option<i32>,
    /// The kernel OOM killer ended the workload (memory limit exceeded).
    pub oom_killed: bool,
    pub created_at: Option<SystemTime>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    pub labels: BTreeMap<String, String>,
    /// Limits this node could not enforce for this container.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ImageSummary {
    /// The config digest (`sha256:…`).
    pub id: String,
    pub references: Vec<String>,
    pub manifest_digest: String,
    pub layers: Vec<String>,
    /// Bytes of unpacked layers on disk.
    pub size: u64,
}

/// Progress of a pull, for the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullProgress {
    Resolved {
        reference: String,
        layers: usize,
        total_bytes: u64,
    },
    /// A layer this node already had: `size` compressed bytes not downloaded.
    LayerCached {
        digest: String,
        size: u64,
    },
    LayerBytes {
        digest: String,
        downloaded: u64,
        total: u64,
    },
    LayerDone {
        digest: String,
    },
    Done {
        image_id: String,
    },
}

/// What a container's cgroup says it uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerUsage {
    /// CPU time used since the container started, in microseconds (a counter: the rate is
    /// the difference of two readings over the time between them).
    pub cpu_usec: u64,
    /// Memory charged to the cgroup (page cache included, as the memory limit counts it).
    pub memory_bytes: u64,
    pub pids: u64,
}

/// Which log records to return.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    pub follow: bool,
    pub since: Option<SystemTime>,
    /// Only the last N records (before following).
    pub tail: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// One record of a container's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// RFC 3339 with nanoseconds, UTC, as written by kat-init.
    pub time: String,
    pub stream: LogStream,
    /// The line did not end here (split long line, or no final newline).
    pub partial: bool,
    pub text: String,
}

/// A command to run inside a running container.
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub tty: bool,
    /// Initial terminal size (rows, columns) when `tty`.
    pub size: Option<(u16, u16)>,
}

/// Who manages container cgroups: `Auto` picks systemd where it runs and its bus is
/// reachable, else the cgroup filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CgroupManager {
    #[default]
    Auto,
    Systemd,
    Cgroupfs,
}

/// How this node's cgroups are set up, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CgroupMode {
    /// cgroup v2 through systemd: every container is a transient scope in `kat.slice` of
    /// the agent's systemd instance (the user's own for an unprivileged agent), so
    /// `systemctl --user status` shows it and systemd accounts and reaps it.
    Systemd,
    /// A cgroup v2 subtree delegated to the (unprivileged) agent.
    V2Delegated,
    /// cgroup v2, agent running as root.
    V2Root,
    /// cgroup v1 or hybrid; as root, or with directories pre-created by `kat-agent setup`.
    V1,
    /// No usable cgroup: nothing can be limited.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RootfsMode {
    /// An overlay mount made inside the container's user namespace.
    Overlay,
    /// A private copy of the image per container.
    Copy,
}

/// What this node can enforce. Reported in heartbeats; anything false is warned about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapabilities {
    pub rootless: bool,
    pub cgroup_mode: CgroupMode,
    pub memory_limit: bool,
    pub cpu_limit: bool,
    pub pids_limit: bool,
    pub rootfs: RootfsMode,
    /// Host ids mapped into containers: `(container id, host id, count)`.
    pub uid_map: Vec<(u32, u32, u32)>,
    pub seccomp: bool,
    pub notes: Vec<String>,
}
