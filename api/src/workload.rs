//! `workload.kat`: a workload's identity, source, type and lifecycle policies (RFC 001 §3.2).
//!
//! Long because it holds the whole `workload.kat` schema and every rule that checks it: the
//! private checks behind [`Workload::validate`] feed one another (the names `validate_volumes`
//! returns are what `Container::validate` checks each mount against).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::names::{
    absolute_path_problem, dns_label_problem, env_name_problem, label_key_problem,
    relative_path_problem, validate_labels,
};
use crate::quantity::{Amount, Bytes, MilliCpu};
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// The namespace of a workload that names none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The default `maxSurge` of a rolling update: one extra instance.
pub const DEFAULT_MAX_SURGE: u32 = 1;
/// The default `restartPolicy.maxRestarts`.
pub const DEFAULT_MAX_RESTARTS: u32 = 5;
/// The default `restartPolicy.resetSeconds` (an hour).
pub const DEFAULT_RESET_SECONDS: u32 = 3600;
/// Below this no process, not even kat-init, can start in a container.
pub const MIN_MEMORY_LIMIT: Bytes = Bytes(4 << 20);
/// A ceiling that catches typos such as `replicas: 30000`; raise it if a real cluster needs it.
pub const MAX_REPLICAS: u32 = 10_000;

/// A `workload.kat`: what runs, how many, where, and how it is kept running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `Workload`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "Workload")))]
    pub kind: String,
    /// The workload's name and namespace.
    pub metadata: WorkloadMetadata,
    /// What runs, how many, where and how it is kept running.
    pub spec: WorkloadSpec,
}

/// The `metadata` of a `workload.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadMetadata {
    /// The workload's name: a DNS label (lowercase letters, digits and `-`, at most 63).
    #[cfg_attr(
        feature = "schema",
        schemars(pattern(crate::schema::DNS_LABEL), length(max = 63))
    )]
    #[cfg_attr(feature = "schema", schemars(example = &"web"))]
    pub name: String,
    /// The namespace it lives in (default `default`); it must exist, or come with a `namespace.kat` beside this file.
    #[serde(default = "default_namespace")]
    #[cfg_attr(
        feature = "schema",
        schemars(pattern(crate::schema::DNS_LABEL), length(max = 63))
    )]
    pub namespace: String,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_string()
}

/// The `spec` of a `workload.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSpec {
    /// `Service`: `replicas` long-running instances; `DaemonService`: one on every matching node; `Job`: runs to completion (needs a `job.kat`).
    #[serde(rename = "type")]
    pub workload_type: WorkloadType,
    /// Where the image comes from: exactly one of `image` and `git`.
    pub source: Source,
    /// How many instances a `Service` runs (required for a Service, not allowed for a DaemonService).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(max = crate::workload::MAX_REPLICAS)))]
    pub replicas: Option<u32>,
    /// How a new generation replaces running instances (default `Rolling` with `maxSurge: 1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// When the node restarts an instance's process that exited.
    pub restart_policy: RestartPolicy,
    /// Labels a node must carry to run this workload (`kat.dws.rip/nodeName: NAME` pins it to one node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints of nodes this workload may run on anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The container: command, environment, mounts and resources.
    pub container: Container,
    /// Volumes the container may mount (`container.volumeMounts` names them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Seconds an instance that is being replaced or removed keeps running after it has left
    /// DNS and the published ports, before it gets SIGTERM: requests under way finish and
    /// clients that resolved its address a moment ago still reach it. Default
    /// [`DEFAULT_DRAIN_SECONDS`], at most [`MAX_DRAIN_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(max = crate::workload::MAX_DRAIN_SECONDS)))]
    pub drain_seconds: Option<u32>,
}

/// Default of `spec.drainSeconds`.
pub const DEFAULT_DRAIN_SECONDS: u32 = 5;
/// Most `spec.drainSeconds` may be (an hour).
pub const MAX_DRAIN_SECONDS: u32 = 3600;

/// `spec.type`: how a workload's instances are counted and placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WorkloadType {
    /// `replicas` long-running instances.
    Service,
    /// Instances that run to completion (needs a `job.kat`).
    Job,
    /// One long-running instance on every eligible node.
    DaemonService,
}

/// `spec.source`: where the image comes from (exactly one of `image` and `git`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    /// An image reference (`registry.local:5000/web:1.0`, `docker.io/library/caddy:2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(example = "registry.local:5000/web:1.0"))]
    pub image: Option<String>,
    /// A git repository the node builds the image from (needs a `build.kat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
    /// With `git`: a registry path the built image is pushed to and pulled from by other nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_image: Option<String>,
}

/// `source.git`: a repository the node builds the image from, at a branch, tag or commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitSource {
    /// The repository URL (`https://…`, `git://…` or `ssh://…`).
    #[cfg_attr(
        feature = "schema",
        schemars(example = "https://git.example.com/team/web.git")
    )]
    pub repository: String,
    /// The branch to build (resolved to a commit at apply and at `katcall redeploy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The tag to build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The full commit id to build (40 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(pattern("^[0-9a-f]{40}$")))]
    pub commit: Option<String>,
}

/// `spec.updateStrategy`: how a new generation replaces running instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateStrategy {
    /// `Rolling` (new instances first, old ones go as new ones become healthy) or `Simultaneous` (all stop, then all start: downtime by design).
    #[serde(rename = "type", default)]
    pub strategy_type: UpdateStrategyType,
    /// Settings of a `Rolling` update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling: Option<RollingUpdate>,
}

/// `updateStrategy.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum UpdateStrategyType {
    /// New instances first; old ones go as new ones become healthy (the default).
    #[default]
    Rolling,
    /// All old instances stop, then all new ones start: downtime by design.
    Simultaneous,
}

/// `updateStrategy.rolling`: the settings of a `Rolling` update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollingUpdate {
    /// How many instances beyond `replicas` may run during a rolling update: a number of at least 1 or a percentage (`"25%"`, rounded up). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(example = 1, example = "25%"))]
    pub max_surge: Option<IntOrString>,
}

/// A YAML value that may be written as a number or a string (`maxSurge: 2` or `maxSurge: "25%"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum IntOrString {
    /// Written as a number.
    Int(i64),
    /// Written as a string.
    String(String),
}

/// `maxSurge` once validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxSurge {
    /// A number of extra instances.
    Count(u32),
    /// A percentage of `replicas`, 1–100, rounded up.
    Percent(u32),
}

impl MaxSurge {
    /// Checks a `maxSurge` as written: an integer of at least 1, or a percentage from `"1%"` to `"100%"`.
    pub fn parse(v: &IntOrString) -> Result<Self, String> {
        let expected = "(expected an integer of at least 1, e.g. 1, or a percentage, e.g. \"25%\")";
        match v {
            IntOrString::Int(n) if *n >= 1 && *n <= u32::MAX as i64 => {
                Ok(MaxSurge::Count(*n as u32))
            }
            IntOrString::Int(n) => Err(format!("{n} is out of range {expected}")),
            IntOrString::String(s) => match s.strip_suffix('%').map(str::parse::<u32>) {
                Some(Ok(p)) if (1..=100).contains(&p) => Ok(MaxSurge::Percent(p)),
                Some(Ok(p)) => Err(format!("\"{p}%\" is out of range (expected 1% to 100%)")),
                _ => Err(format!("{s:?} is not a surge {expected}")),
            },
        }
    }

    /// The absolute number of extra instances for `replicas`: percentages round up, and the
    /// result is at least 1 so that a rollout can always make progress.
    pub fn absolute(self, replicas: u32) -> u32 {
        let n = match self {
            MaxSurge::Count(n) => n,
            MaxSurge::Percent(p) => ((replicas as u64 * p as u64).div_ceil(100)) as u32,
        };
        n.max(1)
    }
}

/// `spec.restartPolicy`: when the node restarts an instance's container that exited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartPolicy {
    /// `Always`: restart whatever the exit; `MaxCount`: restart after a failure at most `maxRestarts` times within `resetSeconds`; `Never`.
    pub condition: RestartCondition,
    /// With `MaxCount`: restarts allowed within `resetSeconds` (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// With `MaxCount`: seconds of running after which the restart count starts again (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_seconds: Option<u32>,
}

impl RestartPolicy {
    /// `maxRestarts`, or its default.
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS)
    }
    /// `resetSeconds`, or its default.
    pub fn reset_seconds(&self) -> u32 {
        self.reset_seconds.unwrap_or(DEFAULT_RESET_SECONDS)
    }
}

/// `restartPolicy.condition`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum RestartCondition {
    /// The node never restarts the container: the instance ends.
    Never,
    /// Restart after a failure, never after exit 0, at most `maxRestarts` times in a series.
    MaxCount,
    /// Restart after every exit (a Job's instance: after a failure, ending at exit 0).
    Always,
}

/// One of `spec.tolerations`: a node taint this workload may run on anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Toleration {
    /// The taint's key (empty with `operator: Exists` tolerates every taint).
    #[serde(default)]
    pub key: String,
    /// `Exists` (any value of the key, the default) or `Equal` (the taint's value must be
    /// `value`).
    #[serde(default)]
    pub operator: TolerationOperator,
    /// With `Equal`: the taint's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `None` tolerates every effect of the matching taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
}

/// `toleration.operator`: how a toleration matches a taint's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum TolerationOperator {
    /// Any value of the taint's key matches (the default).
    #[default]
    Exists,
    /// The taint's value must equal the toleration's `value`.
    Equal,
}

/// What a node taint keeps away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TaintEffect {
    /// No instance is placed on the node unless it tolerates the taint.
    NoSchedule,
    /// The scheduler prefers other nodes for instances that do not tolerate the taint.
    PreferNoSchedule,
}

/// `spec.container`: the one container of each instance.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Container {
    /// A name for the container (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The program and its first arguments, replacing the image's entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments after `command`, replacing the image's command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables, on top of the image's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Where volumes of `spec.volumes` appear in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// CPU, memory and GPU requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// One of `container.env`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    /// The variable's name.
    #[cfg_attr(feature = "schema", schemars(example = &"MODE"))]
    pub name: String,
    /// Its value (default empty).
    #[serde(default)]
    pub value: String,
}

/// One of `container.volumeMounts`: where a volume appears in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name in `spec.volumes`.
    pub name: String,
    /// The absolute path in the container.
    #[cfg_attr(feature = "schema", schemars(pattern("^/"), example = "/data"))]
    pub mount_path: String,
    /// A relative path inside the volume to mount instead of its root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// Mount it read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// `container.resources`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// What the scheduler reserves on a node (defaults to `limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceAmounts>,
    /// What the container may use at most (its cgroup's limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceAmounts>,
    /// GPUs the instance needs (nodes report theirs through CDI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRequest>,
}

/// CPU and memory amounts, of `requests` or `limits`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceAmounts {
    /// CPU: cores (`"1"`, `"0.5"`) or millicores (`100m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, proptest(strategy = "amounts::<MilliCpu>()"))]
    #[cfg_attr(feature = "schema", schemars(example = "100m", example = "0.5"))]
    pub cpu: Option<Amount<MilliCpu>>,
    /// Memory: bytes or with a unit (`64Mi`, `1Gi`, `500M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, proptest(strategy = "amounts::<Bytes>()"))]
    #[cfg_attr(feature = "schema", schemars(example = "64Mi", example = "1Gi"))]
    pub memory: Option<Amount<Bytes>>,
}

/// Amounts as a user might write them, good and bad.
#[cfg(test)]
fn amounts<T: crate::quantity::ParseQuantity + Copy + std::fmt::Debug>(
) -> impl proptest::strategy::Strategy<Value = Option<Amount<T>>> {
    use proptest::prelude::*;
    proptest::option::of("[0-9.]{0,6}(m|Mi|Gi|M|k)?|[a-z ]{0,4}".prop_map(Amount::new))
}

/// `resources.gpu`: the GPUs an instance needs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct GpuRequest {
    /// `nvidia`, `amd` or `any` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<GpuDriver>,
    #[serde(
        rename = "minVRAM_MB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    /// The least memory each GPU must have, in MiB.
    pub min_vram_mb: Option<u32>,
    /// How many matching GPUs the instance gets (beyond RFC 001, which asks for one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = crate::workload::MAX_GPU_COUNT)))]
    pub count: Option<u32>,
}

/// At most this many GPUs for one instance.
pub const MAX_GPU_COUNT: u32 = 16;

impl GpuRequest {
    /// How many GPUs the instance gets (default 1).
    pub fn count(&self) -> u32 {
        self.count.unwrap_or(1)
    }

    /// Whether the node's `gpu` is one this request can use.
    pub fn matches(&self, gpu: &crate::wire::GpuInfo) -> bool {
        let driver_ok = match self.driver {
            None | Some(GpuDriver::Any) => true,
            Some(d) => gpu.driver == d,
        };
        driver_ok && gpu.vram_mb >= self.min_vram_mb.unwrap_or(0)
    }
}

/// A GPU vendor, as a request names it and a node reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum GpuDriver {
    /// Any vendor (in a request).
    Any,
    /// NVIDIA.
    Nvidia,
    /// AMD.
    Amd,
}

/// One of `spec.volumes`: a name and where its data lives (one of `simpleClusterStorage` and `hostMount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    /// The volume's name, as `container.volumeMounts` refers to it.
    #[cfg_attr(
        feature = "schema",
        schemars(pattern(crate::schema::DNS_LABEL), length(max = 63))
    )]
    pub name: String,
    /// A directory of the node's own under `volumeBasePath`, kept for the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple_cluster_storage: Option<SimpleClusterStorage>,
    /// A path of the node (within the cluster's `hostMountAllowedPaths`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mount: Option<HostMount>,
}

/// `volume.simpleClusterStorage`: no settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SimpleClusterStorage {}

/// `volume.hostMount`: a path of the node bound into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostMount {
    /// The absolute path on the node.
    #[cfg_attr(feature = "schema", schemars(pattern("^/"), example = "/srv/web"))]
    pub host_path: String,
    /// What must be there: created if missing (`DirectoryOrCreate`, `FileOrCreate`) or required as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ensure_type: Option<EnsureType>,
}

/// `hostMount.ensureType`: what must be at the host path before it is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum EnsureType {
    /// A directory, created if missing.
    DirectoryOrCreate,
    /// An existing directory.
    Directory,
    /// A regular file, created (empty) if missing.
    FileOrCreate,
    /// An existing regular file.
    File,
    /// An existing Unix socket.
    Socket,
}

/// Requests and limits once parsed. Requests default to limits (RFC §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParsedResources {
    /// The CPU the scheduler reserves: the request, else the limit.
    pub cpu_request: Option<MilliCpu>,
    /// The memory the scheduler reserves, in bytes: the request, else the limit.
    pub memory_request: Option<Bytes>,
    /// The most CPU the container may use.
    pub cpu_limit: Option<MilliCpu>,
    /// The most memory the container may use, in bytes.
    pub memory_limit: Option<Bytes>,
}

impl Resources {
    /// The quantities (parsed when the file was read); `None` for any that is absent or
    /// malformed (validation reports those).
    pub fn parsed(&self) -> ParsedResources {
        let cpu = |a: &Option<ResourceAmounts>| a.as_ref()?.cpu.as_ref()?.value();
        let mem = |a: &Option<ResourceAmounts>| a.as_ref()?.memory.as_ref()?.value();
        let cpu_limit = cpu(&self.limits);
        let memory_limit = mem(&self.limits);
        ParsedResources {
            cpu_request: cpu(&self.requests).or(cpu_limit),
            memory_request: mem(&self.requests).or(memory_limit),
            cpu_limit,
            memory_limit,
        }
    }
}

impl WorkloadSpec {
    /// How long an instance leaving drains before it is stopped (`drainSeconds`). A Job's
    /// instances serve no one through DNS or published ports, and one stopped at its
    /// deadline or the end of its run must stop then: they never drain.
    pub fn drain(&self) -> std::time::Duration {
        if self.workload_type == WorkloadType::Job {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_secs(u64::from(
            self.drain_seconds
                .unwrap_or(DEFAULT_DRAIN_SECONDS)
                .min(MAX_DRAIN_SECONDS),
        ))
    }

    /// `updateStrategy.type`, or `Rolling` when there is none.
    pub fn update_strategy_type(&self) -> UpdateStrategyType {
        self.update_strategy
            .as_ref()
            .map(|u| u.strategy_type)
            .unwrap_or_default()
    }

    /// Validated `maxSurge`, defaulting to 1.
    pub fn max_surge(&self) -> MaxSurge {
        self.update_strategy
            .as_ref()
            .and_then(|u| u.rolling.as_ref())
            .and_then(|r| r.max_surge.as_ref())
            .and_then(|v| MaxSurge::parse(v).ok())
            .unwrap_or(MaxSurge::Count(DEFAULT_MAX_SURGE))
    }
}

impl Workload {
    /// Every rule of `workload.kat` that needs no other file.
    pub fn validate(&self, s: &mut Scope<'_>) {
        if let Some(p) = dns_label_problem(&self.metadata.name) {
            s.error("metadata.name", p);
        }
        if let Some(p) = dns_label_problem(&self.metadata.namespace) {
            s.error("metadata.namespace", p);
        }
        self.spec.validate(&mut s.field("spec"));
    }
}

impl WorkloadSpec {
    fn validate(&self, s: &mut Scope<'_>) {
        validate_source(&self.source, &mut s.field("source"));

        match (self.workload_type, self.replicas) {
            (WorkloadType::Service, None) => {
                s.error("replicas", "is required for type Service (the number of instances to run, e.g. 2)")
            }
            (WorkloadType::Service, Some(n)) if n > MAX_REPLICAS => {
                s.error("replicas", format!("{n} is more than the maximum of {MAX_REPLICAS}"))
            }
            (WorkloadType::DaemonService, Some(_)) => {
                s.error("replicas", "is not used by type DaemonService, which runs one instance on every eligible node; remove it")
            }
            (WorkloadType::Job, Some(_)) => {
                s.error("replicas", "is not used by type Job; set completions and parallelism in job.kat instead")
            }
            _ => {}
        }

        if let Some(n) = self.drain_seconds {
            if n > MAX_DRAIN_SECONDS {
                s.error(
                    "drainSeconds",
                    format!("{n} is more than the maximum of {MAX_DRAIN_SECONDS} (an hour); an instance leaving keeps serving its connections this long before it is stopped"),
                );
            }
        }

        if let Some(strategy) = &self.update_strategy {
            let mut s = s.field("updateStrategy");
            if self.workload_type == WorkloadType::Job {
                s.error_here("is not used by type Job (jobs run to completion and are not rolled); remove it");
            }
            match (strategy.strategy_type, &strategy.rolling) {
                (UpdateStrategyType::Simultaneous, Some(_)) => s.error(
                    "rolling",
                    "applies only to type Rolling; remove it or set type: Rolling",
                ),
                (_, Some(RollingUpdate { max_surge: Some(v) })) => {
                    if let Err(p) = MaxSurge::parse(v) {
                        s.error("rolling.maxSurge", p);
                    }
                }
                _ => {}
            }
        }

        let policy = &self.restart_policy;
        let mut rp = s.field("restartPolicy");
        if policy.condition != RestartCondition::MaxCount {
            for (field, set) in [
                ("maxRestarts", policy.max_restarts.is_some()),
                ("resetSeconds", policy.reset_seconds.is_some()),
            ] {
                if set {
                    rp.error(
                        field,
                        format!(
                            "is used only with condition MaxCount, not {:?}; remove it",
                            policy.condition
                        ),
                    );
                }
            }
        }
        if policy.max_restarts == Some(0) {
            rp.error(
                "maxRestarts",
                "0 must be at least 1 (use condition: Never for no restarts)",
            );
        }
        if policy.reset_seconds == Some(0) {
            rp.error("resetSeconds", "0 must be at least 1 second");
        }

        validate_labels(&self.node_selector, &mut s.field("nodeSelector"));

        for (i, t) in self.tolerations.iter().enumerate() {
            let mut ts = s.item("tolerations", i, "toleration", &t.key);
            if t.key.is_empty() && t.operator == TolerationOperator::Equal {
                ts.error("key", "is required with operator Equal");
            } else if !t.key.is_empty() {
                if let Some(p) = label_key_problem(&t.key) {
                    ts.error("key", p);
                }
            }
            match (t.operator, &t.value) {
                (TolerationOperator::Equal, None) => {
                    ts.error("value", "is required with operator Equal")
                }
                (TolerationOperator::Exists, Some(_)) => ts.error(
                    "value",
                    "must not be set with operator Exists (use operator: Equal to match a value)",
                ),
                _ => {}
            }
        }

        let volume_names = validate_volumes(&self.volumes, s);
        self.container
            .validate(&volume_names, &mut s.field("container"));
    }
}

fn validate_source(source: &Source, s: &mut Scope<'_>) {
    match (&source.image, &source.git) {
        (Some(_), Some(_)) => s.error_here("has both image and git (expected exactly one of them)"),
        (None, None) => s.error_here("has neither image nor git (expected exactly one of them)"),
        _ => {}
    }
    if let Some(image) = &source.image {
        if let Some(p) = image_reference_problem(image) {
            s.error("image", p);
        } else if crate::build_definition::is_local_image(image) {
            s.error(
                "image",
                format!("{image:?} is an image a node built for a workload's git source (kat-local/…), which only that workload uses; name an image in a registry, or build from git with source.git"),
            );
        }
    }
    if let Some(cache) = &source.cache_image {
        if source.git.is_none() {
            s.error("cacheImage", "is used only with a git source; remove it");
        } else if let Some(p) = cache_path_problem(cache) {
            s.error("cacheImage", p);
        }
    }
    if let Some(git) = &source.git {
        if git.repository.trim().is_empty() {
            s.error(
                "git.repository",
                "must not be empty (expected a Git URL, e.g. https://example.com/app.git)",
            );
        }
        if let Some(c) = &git.commit {
            let hex = c.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex || !(7..=64).contains(&c.len()) {
                s.error(
                    "git.commit",
                    format!("{c:?} is not a commit id (expected 7 to 64 hexadecimal digits)"),
                );
            }
        }
        for (field, v) in [("git.branch", &git.branch), ("git.tag", &git.tag)] {
            if let Some(v) = v {
                if v.is_empty() || v.contains(char::is_whitespace) || v.contains("..") {
                    s.error(field, format!("{v:?} is not a valid Git ref name"));
                }
            }
        }
    }
}

/// A light syntactic check of an image reference (`[registry/]repo[:tag][@digest]`); the registry
/// has the last word, but obvious typos are caught before anything is stored.
pub fn image_reference_problem(image: &str) -> Option<String> {
    let bad = || {
        Some(format!("{image:?} is not an image reference (expected e.g. \"registry.example.com/app:1.2\" or \"busybox@sha256:…\")"))
    };
    if image.is_empty() || image.len() > 512 || image.contains(char::is_whitespace) {
        return bad();
    }
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let Some((alg, hex)) = d.split_once(':') else {
            return bad();
        };
        if alg.is_empty() || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return bad();
        }
    }
    // A tag is after the last ':' that follows the last '/' (a ':' before that is a registry port).
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return bad();
        }
    }
    if repo.is_empty() || repo.split('/').any(|c| c.is_empty()) {
        return bad();
    }
    // Path components after the registry must be lowercase.
    let path = repo.split_once('/').map_or(repo, |(first, rest)| {
        if first.contains(['.', ':']) || first == "localhost" {
            rest
        } else {
            repo
        }
    });
    if path.bytes().any(|b| {
        !(b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-' | b'/'))
    }) {
        return bad();
    }
    None
}

/// A build cache's repository (`source.cacheImage`, `build.kat` `cache.registryPath`): an
/// image name without tag or digest, since each build is kept under `{path}:{commit}`.
pub fn cache_path_problem(path: &str) -> Option<String> {
    if let Some(p) = image_reference_problem(path) {
        return Some(p);
    }
    let last = &path[path.rfind('/').map_or(0, |i| i + 1)..];
    if path.contains('@') || last.contains(':') {
        return Some(format!(
            "{path:?} names a tag or digest; give the repository only (e.g. \"registry.example.com/app-cache\"): each build is kept under {{repository}}:{{commit}}"
        ));
    }
    None
}

/// Checks `spec.volumes` and returns the set of declared names.
fn validate_volumes(volumes: &[Volume], s: &mut Scope<'_>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let mut vs = s.item("volumes", i, "volume", &v.name);
        if let Some(p) = dns_label_problem(&v.name) {
            vs.error("name", p);
        }
        if !names.insert(v.name.clone()) {
            vs.error("name", format!("{:?} is declared more than once", v.name));
        }
        match (&v.simple_cluster_storage, &v.host_mount) {
            (Some(_), Some(_)) => {
                vs.error_here("has both simpleClusterStorage and hostMount (expected exactly one)")
            }
            (None, None) => vs.error_here(
                "has no source (expected exactly one of simpleClusterStorage: {} or hostMount)",
            ),
            _ => {}
        }
        if let Some(h) = &v.host_mount {
            if let Some(p) = absolute_path_problem(&h.host_path) {
                vs.error("hostMount.hostPath", p);
            }
        }
    }
    names
}

impl Container {
    fn validate(&self, volumes: &BTreeSet<String>, s: &mut Scope<'_>) {
        for (field, list) in [("command", &self.command), ("args", &self.args)] {
            for (i, item) in list.iter().enumerate() {
                if item.contains('\0') {
                    s.error(&format!("{field}[{i}]"), "contains a NUL byte");
                }
            }
        }
        if self.command.first().is_some_and(|c| c.is_empty()) {
            s.error(
                "command[0]",
                "must not be empty (expected the program to run)",
            );
        }
        let mut env_names = BTreeSet::new();
        for (i, e) in self.env.iter().enumerate() {
            if let Some(p) = env_name_problem(&e.name) {
                s.error(&format!("env[{i}].name"), p);
            } else if !env_names.insert(&e.name) {
                s.error(
                    &format!("env[{i}].name"),
                    format!("{:?} is set more than once", e.name),
                );
            }
            if e.value.contains('\0') {
                s.error(&format!("env[{i}].value"), "contains a NUL byte");
            }
        }
        let mut mount_paths = BTreeSet::new();
        for (i, m) in self.volume_mounts.iter().enumerate() {
            let mut ms = s.item("volumeMounts", i, "mount of", &m.name);
            if !volumes.contains(&m.name) {
                let known = if volumes.is_empty() {
                    "no volumes are declared in spec.volumes".to_string()
                } else {
                    format!(
                        "declared: {}",
                        volumes.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                };
                ms.error(
                    "name",
                    format!(
                        "{:?} does not refer to a volume in spec.volumes ({known})",
                        m.name
                    ),
                );
            }
            if let Some(p) = absolute_path_problem(&m.mount_path) {
                ms.error("mountPath", p);
            } else if m.mount_path.trim_end_matches('/').is_empty() {
                ms.error(
                    "mountPath",
                    "\"/\" cannot be a mount point (expected a directory such as /data)",
                );
            } else if crate::names::is_reserved_container_path(&m.mount_path) {
                ms.error(
                    "mountPath",
                    format!(
                        "{:?} is at or under {}, which KAT reserves for kat-init and the container's logs (mount the volume elsewhere, such as /data)",
                        m.mount_path,
                        crate::names::RESERVED_CONTAINER_DIR
                    ),
                );
            } else if !mount_paths.insert(m.mount_path.trim_end_matches('/')) {
                ms.error(
                    "mountPath",
                    format!("{:?} is used by more than one mount", m.mount_path),
                );
            }
            if let Some(sub) = &m.sub_path {
                if let Some(p) = relative_path_problem(sub) {
                    ms.error("subPath", p);
                }
            }
        }
        if let Some(r) = &self.resources {
            validate_resources(r, &mut s.field("resources"));
        }
    }
}

fn validate_resources(r: &Resources, s: &mut Scope<'_>) {
    let mut parsed: [[Option<u64>; 2]; 2] = [[None; 2]; 2]; // [requests, limits] x [cpu, memory]
    for (i, (section, amounts)) in [("requests", &r.requests), ("limits", &r.limits)]
        .into_iter()
        .enumerate()
    {
        let Some(a) = amounts else { continue };
        if let Some(amount) = &a.cpu {
            let cpu = amount.text();
            match amount.parsed() {
                Ok(MilliCpu(0)) => s.error(
                    &format!("{section}.cpu"),
                    format!("{cpu:?} must be greater than zero"),
                ),
                Ok(v) => parsed[i][0] = Some(v.0),
                Err(e) => s.error(&format!("{section}.cpu"), e.to_string()),
            }
        }
        if let Some(amount) = &a.memory {
            let mem = amount.text();
            match amount.parsed() {
                Ok(Bytes(0)) => s.error(&format!("{section}.memory"), format!("{mem:?} must be greater than zero")),
                Ok(v) if section == "limits" && v < MIN_MEMORY_LIMIT => s.error(
                    "limits.memory",
                    format!("{mem:?} is below the minimum of {MIN_MEMORY_LIMIT} (no process can start with less)"),
                ),
                Ok(v) => parsed[i][1] = Some(v.0),
                Err(e) => s.error(&format!("{section}.memory"), e.to_string()),
            }
        }
    }
    for (j, what) in ["cpu", "memory"].into_iter().enumerate() {
        if let (Some(req), Some(lim)) = (parsed[0][j], parsed[1][j]) {
            if req > lim {
                let (rv, lv) = (
                    r.requests
                        .as_ref()
                        .and_then(|a| {
                            if j == 0 {
                                a.cpu.as_ref().map(|c| c.text().to_string())
                            } else {
                                a.memory.as_ref().map(|m| m.text().to_string())
                            }
                        })
                        .unwrap_or_default(),
                    r.limits
                        .as_ref()
                        .and_then(|a| {
                            if j == 0 {
                                a.cpu.as_ref().map(|c| c.text().to_string())
                            } else {
                                a.memory.as_ref().map(|m| m.text().to_string())
                            }
                        })
                        .unwrap_or_default(),
                );
                s.error(&format!("requests.{what}"), format!("{rv:?} is larger than limits.{what} {lv:?} (a request must not exceed its limit)"));
            }
        }
    }
    if let Some(gpu) = &r.gpu {
        if gpu.min_vram_mb == Some(0) {
            s.error("gpu.minVRAM_MB", "0 must be at least 1 (or remove it)");
        }
        if let Some(n) = gpu.count {
            if !(1..=MAX_GPU_COUNT).contains(&n) {
                s.error(
                    "gpu.count",
                    format!("{n} is not between 1 and {MAX_GPU_COUNT}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_surge_forms() {
        assert_eq!(
            MaxSurge::parse(&IntOrString::Int(2)),
            Ok(MaxSurge::Count(2))
        );
        assert_eq!(
            MaxSurge::parse(&IntOrString::String("25%".into())),
            Ok(MaxSurge::Percent(25))
        );
        assert!(MaxSurge::parse(&IntOrString::Int(0)).is_err());
        assert!(MaxSurge::parse(&IntOrString::Int(-1)).is_err());
        assert!(MaxSurge::parse(&IntOrString::String("0%".into())).is_err());
        assert!(MaxSurge::parse(&IntOrString::String("101%".into())).is_err());
        assert!(MaxSurge::parse(&IntOrString::String("two".into())).is_err());
        assert!(MaxSurge::parse(&IntOrString::String("2".into())).is_err());
    }

    #[test]
    fn max_surge_absolute_rounds_up_and_is_at_least_one() {
        assert_eq!(MaxSurge::Percent(25).absolute(10), 3);
        assert_eq!(MaxSurge::Percent(1).absolute(1), 1);
        assert_eq!(MaxSurge::Percent(50).absolute(0), 1);
        assert_eq!(MaxSurge::Count(4).absolute(2), 4);
    }

    #[test]
    fn image_references() {
        for ok in [
            "busybox",
            "busybox:1.36",
            "127.0.0.1:5000/test/busybox:latest",
            "localhost/app",
            "ghcr.io/a/b-c_d.e:v1.2-rc",
            &format!("app@sha256:{}", "a".repeat(64)),
        ] {
            assert_eq!(image_reference_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "Busybox",
            "bad image",
            "app:",
            "app:t@g",
            "/app",
            "app//x",
            "app@sha256:xyz",
        ] {
            assert!(image_reference_problem(bad).is_some(), "{bad}");
        }
    }
}
