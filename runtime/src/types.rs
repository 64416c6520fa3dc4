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
    /// The KAT namespace of the container's workload.
    pub namespace: String,
    /// The name of the workload the container belongs to.
    pub workload: String,
    /// An image reference already in the store (pulled or imported).
    pub image: String,
    /// The container's hostname.
    pub hostname: String,
    /// Replaces the image's Entrypoint when non-empty (Docker semantics).
    pub command: Vec<String>,
    /// Replaces the image's Cmd when non-empty; with only `command` set, Cmd is dropped.
    pub args: Vec<String>,
    /// Added to, and overriding, the image's Env.
    pub env: BTreeMap<String, String>,
    /// `uid[:gid]` inside the container; empty means the image's User, else 0:0.
    pub user: String,
    /// Labels kept with the container and returned in its status.
    pub labels: BTreeMap<String, String>,
    /// The container's resource limits.
    pub resources: Resources,
    /// Volumes mounted into the container.
    pub volumes: Vec<VolumeMount>,
    /// Extra `/etc/hosts` entries (name → IP).
    pub hosts: BTreeMap<String, String>,
    /// Nameservers for `/etc/resolv.conf`; empty copies none (no network yet).
    pub dns_servers: Vec<String>,
    /// Search domains for `/etc/resolv.conf`.
    pub dns_search: Vec<String>,
    /// Rotation of the container's log.
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
    /// When the hook runs.
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
    /// OCI `prestart`.
    Prestart,
    /// OCI `createRuntime`.
    CreateRuntime,
    /// OCI `createContainer`.
    CreateContainer,
    /// OCI `startContainer`.
    StartContainer,
    /// OCI `poststart`.
    Poststart,
    /// OCI `poststop`.
    Poststop,
}

/// A host path bound in at a container path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostBind {
    /// The path on the host.
    pub host_path: PathBuf,
    /// Where it appears inside the container.
    pub container_path: String,
    /// Bound in read-only.
    pub read_only: bool,
}

/// A host device node and where the container sees it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// The device node on the host.
    pub host_path: PathBuf,
    /// Where it appears inside the container.
    pub container_path: String,
}

/// Resource limits. Zero means unlimited / not set.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Memory limit in bytes.
    pub memory_limit_bytes: u64,
    /// CPU limit in millicores: becomes `cpu.max` (quota per 100 ms period).
    pub cpu_limit_millis: u64,
    /// CPU request in millicores: becomes `cpu.weight` (v2) or `cpu.shares` (v1).
    pub cpu_request_millis: u64,
    /// Most processes (and threads) the container may have at once.
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

/// A volume mounted into a container.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// The volume's name.
    pub name: String,
    /// Host path, already resolved by the agent.
    pub source: PathBuf,
    /// A path under `source` to mount instead of `source` itself.
    pub sub_path: Option<String>,
    /// The absolute path inside the container where it is mounted.
    pub destination: String,
    /// Mounted read-only.
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
    /// `stdio.log` is rotated when it would grow past this many bytes.
    pub max_bytes: u64,
    /// How many log files are kept in all (`stdio.log` and `stdio.log.1` …).
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

/// Where a container is in its life.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    /// Created, not yet started.
    Created,
    /// Its process runs (or is paused).
    Running,
    /// Its process has ended.
    Exited,
    /// libcontainer has no state for it.
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

/// What the runtime knows about one container.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The container's ID (KAT's instance ID).
    pub id: String,
    /// The KAT namespace of its workload.
    pub namespace: String,
    /// The workload it belongs to.
    pub workload: String,
    /// The image reference it was created from.
    pub image: String,
    /// The ID (config digest) of that image.
    pub image_id: String,
    /// Where the container is in its life.
    pub state: ContainerState,
    /// The host PID of its init (kat-init) while it runs.
    pub pid: Option<i32>,
    /// The workload's exit code, once it has exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the workload, if one did.
    pub signal: Option<i32>,
    /// The kernel OOM killer ended the workload (memory limit exceeded).
    pub oom_killed: bool,
    /// When the container was created.
    pub created_at: Option<SystemTime>,
    /// When it was started.
    pub started_at: Option<SystemTime>,
    /// When its workload ended (from kat-init's exit record).
    pub finished_at: Option<SystemTime>,
    /// The labels given at create.
    pub labels: BTreeMap<String, String>,
    /// Limits this node could not enforce for this container.
    pub warnings: Vec<String>,
}

/// An image in the store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ImageSummary {
    /// The config digest (`sha256:…`).
    pub id: String,
    /// The references (names) that point at it.
    pub references: Vec<String>,
    /// The digest of its manifest.
    pub manifest_digest: String,
    /// The digests of its layers, base first.
    pub layers: Vec<String>,
    /// Bytes of unpacked layers on disk.
    pub size: u64,
}

/// Progress of a pull, for the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest was found.
    Resolved {
        /// The reference being pulled.
        reference: String,
        /// How many layers the image has.
        layers: usize,
        /// The compressed size of all layers, in bytes.
        total_bytes: u64,
    },
    /// A layer this node already had: `size` compressed bytes not downloaded.
    LayerCached {
        /// The layer's digest.
        digest: String,
        /// Its compressed size, in bytes.
        size: u64,
    },
    /// Bytes of a layer downloaded so far.
    LayerBytes {
        /// The layer's digest.
        digest: String,
        /// Compressed bytes downloaded so far.
        downloaded: u64,
        /// The layer's compressed size, in bytes.
        total: u64,
    },
    /// A layer was downloaded and added to the store.
    LayerDone {
        /// The layer's digest.
        digest: String,
    },
    /// The image is in the store.
    Done {
        /// The image's ID (config digest).
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
    /// Processes (and threads) in the cgroup.
    pub pids: u64,
}

/// Which log records to return.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    /// Keep streaming new records until the container has exited.
    pub follow: bool,
    /// Only records written at or after this time.
    pub since: Option<SystemTime>,
    /// Only the last N records (before following).
    pub tail: Option<usize>,
}

/// Which output stream a log record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// The workload's standard output.
    Stdout,
    /// The workload's standard error.
    Stderr,
}

/// One record of a container's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// RFC 3339 with nanoseconds, UTC, as written by kat-init.
    pub time: String,
    /// The stream it was written to.
    pub stream: LogStream,
    /// The line did not end here (split long line, or no final newline).
    pub partial: bool,
    /// The record's text, without a newline.
    pub text: String,
}

/// A command to run inside a running container.
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Added to, and overriding, the container's environment.
    pub env: BTreeMap<String, String>,
    /// The working directory; `None`: the container's own.
    pub cwd: Option<String>,
    /// Give the command a terminal.
    pub tty: bool,
    /// Initial terminal size (rows, columns) when `tty`.
    pub size: Option<(u16, u16)>,
}

/// Who manages container cgroups: `Auto` picks systemd where it runs and its bus is
/// reachable, else the cgroup filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CgroupManager {
    /// systemd where it runs and its bus is reachable, else the cgroup filesystem.
    #[default]
    Auto,
    /// systemd transient scopes.
    Systemd,
    /// The cgroup filesystem directly.
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

/// How a container's root filesystem is made.
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
    /// The agent runs without root.
    pub rootless: bool,
    /// How this node's cgroups are set up.
    pub cgroup_mode: CgroupMode,
    /// Memory limits are enforced.
    pub memory_limit: bool,
    /// CPU limits are enforced.
    pub cpu_limit: bool,
    /// Pids limits are enforced.
    pub pids_limit: bool,
    /// How container root filesystems are made.
    pub rootfs: RootfsMode,
    /// Host ids mapped into containers: `(container id, host id, count)`.
    pub uid_map: Vec<(u32, u32, u32)>,
    /// kat-init installs KAT's default seccomp filter in every container.
    pub seccomp: bool,
    /// Plain-language notes on this node's setup (cgroups, seccomp, id slices, image unpacking).
    pub notes: Vec<String>,
}
