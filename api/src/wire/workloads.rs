//! Workloads and their instances: the API objects, status, records the leader writes
//! for nodes, job runs, log lines and exec requests.

use super::*;

/// What the leader records for each applied generation (key `workload_meta`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadMeta {
    pub metadata: ObjectMeta,
    pub spec_hash: String,
    /// What instances run; instances with another template hash are old versions.
    pub template_hash: String,
    /// The instance template of the generation before, while it differs: kept for rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_template_hash: Option<String>,
    pub workload_type: crate::workload::WorkloadType,
    /// The whole desired state, typed and validated at apply (what the controllers run on).
    /// Absent only in records written before it existed; such a workload is re-applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub desired: Option<crate::template::Template>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum InstanceState {
    /// Not placed yet, or waiting for its image or volumes.
    Pending,
    Creating,
    Running,
    /// Exited 0 (jobs).
    Succeeded,
    /// Exited non-zero and will not be restarted, or could not be created.
    Failed,
    OOMKilled,
    Stopping,
    Stopped,
    /// The node stopped reporting.
    Unknown,
}

impl InstanceState {
    /// Whether an instance in this state ended for good: its node will not restart it.
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            InstanceState::Succeeded | InstanceState::Failed | InstanceState::OOMKilled
        )
    }

    /// Whether the instance is on its way out or gone: ended, stopping or stopped.
    pub fn is_leaving(self) -> bool {
        self.is_ended() || matches!(self, InstanceState::Stopping | InstanceState::Stopped)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Health {
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

/// An image pull an instance waits for, as its node reports it while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PullStatus {
    pub image: String,
    /// Layers in the image (0 until its manifest arrived) and those present so far.
    pub layers: u32,
    pub layers_done: u32,
    /// Compressed bytes of all its layers, and those present so far (layers this node
    /// already had count as present).
    pub bytes_total: u64,
    pub bytes_done: u64,
}

impl PullStatus {
    /// "pulling IMAGE: 2 of 5 layers, 12.3 of 40.1 MiB".
    pub fn summary(&self) -> String {
        if self.layers == 0 {
            return format!("pulling {}", self.image);
        }
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "pulling {}: {} of {} layers, {:.1} of {:.1} MiB",
            self.image,
            self.layers_done,
            self.layers,
            mib(self.bytes_done),
            mib(self.bytes_total)
        )
    }
}

/// One instance of a workload as reported by its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    pub namespace: String,
    pub workload: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeName>,
    pub generation: u64,
    pub state: InstanceState,
    #[serde(default)]
    pub health: Health,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why the instance is in its state, e.g. which scheduler filter excluded the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub ip: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Limits the node could not enforce, said out loud.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The image pull the instance waits for, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullStatus>,
    /// The hash of the template the instance runs (set by the leader from its record): an
    /// instance whose hash is the workload's `templateHash` runs the current spec, whatever
    /// generation made it (scaling makes a generation and replaces nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// What the running container uses, read from its cgroup at the last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The node's container running the instance (one per attempt).
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// The config digest (`sha256:…`) of the image the container runs: which build of a tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The GPUs (CDI names) its container has: still held while it stops, after its record
    /// is gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// How many times it turned Unhealthy on its node: the leader sees every transition,
    /// even one over between two heartbeats (`healthCheck.onFailure: restart`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unhealthy_transitions: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    pub observed_generation: u64,
    #[serde(default)]
    pub observed_spec_hash: String,
    pub replicas_desired: u32,
    pub replicas_ready: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Builds of this workload's images (`source.git`) the nodes report: running ones and
    /// those that ended in the last minutes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builds: Vec<BuildReport>,
}

/// What a rejoining node's submission of one locally created workload came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PinnedWorkloadAnswer {
    pub workload: String,
    /// `false`: the same bundle was already there (a repeated submission).
    pub created: bool,
}

/// One build of a `source.git` workload's image on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BuildReport {
    pub namespace: String,
    pub workload: String,
    pub commit: String,
    /// The reference the node keeps the image under (`kat-local/{ns}_{workload}:{sha7}`).
    pub image: String,
    /// Set by the leader from the heartbeat that carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub state: BuildState,
    /// Where a running build is ("step 2 of 3: RUN make"), how one ended ("built in 4.2 s,
    /// pushed to …"), or why it failed (the failing step and the last lines of output).
    pub message: String,
    /// True when the image came from the build cache and nothing was built.
    #[serde(default)]
    pub from_cache: bool,
    pub started_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum BuildState {
    Building,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub from_generation: u64,
    pub to_generation: u64,
    pub updated: u32,
    pub total: u32,
    #[serde(default)]
    pub stalled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /n/{ns}/workloads/{name}/webhook`: where a git server sends push notifications for
/// the workload and the secret it signs them with (shown once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WebhookInfo {
    /// The route's path on any control-plane node's API (`/v1alpha1/hooks/git/{ns}/{name}`).
    pub path: String,
    pub secret: String,
}

/// `POST …/workloads?dryRun=true` and `PUT …/workloads/{name}?dryRun=true`: what the apply
/// would do, everything validated as for the apply itself and nothing stored (`katcall diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApplyPreview {
    pub namespace: String,
    pub name: String,
    pub workload_type: crate::workload::WorkloadType,
    /// The generation now; absent when the apply would create the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_generation: Option<u64>,
    /// The generation the apply would make: the current one when nothing changes.
    pub generation: u64,
    /// Whether the apply would make a new generation.
    pub changed: bool,
    /// Whether the bundle's namespace.kat would set the namespace's labels anew (a change
    /// that makes no generation).
    #[serde(default)]
    pub relabels_namespace: bool,
    /// The effective spec now (every file parsed, a git branch resolved to its commit);
    /// absent for a new workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub current: Option<crate::template::Template>,
    /// The effective spec the apply would store.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub desired: crate::template::Template,
    /// Whether what the instances run changes; a new replica count or update strategy alone
    /// replaces nothing.
    pub template_changed: bool,
    /// The instances the apply would replace, under `strategy`: those that do not run the
    /// new template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<InstanceId>,
    /// How they would be replaced (the new spec's update strategy).
    pub strategy: crate::workload::UpdateStrategyType,
    /// Replicas now and after (Services; a DaemonService runs one per matching node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// `GET /workloads/...`: metadata and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadObject {
    pub metadata: ObjectMeta,
    pub spec_hash: String,
    /// What the current generation's instances run (see `InstanceStatus::template_hash`).
    #[serde(default)]
    pub template_hash: String,
    pub workload_type: crate::workload::WorkloadType,
    /// The commit this generation builds and runs (`source.git`), as resolved at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub status: WorkloadStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NamespaceObject {
    pub metadata: ObjectMeta,
}

/// One line of a container's output, as `GET …/instances/{id}/logs` streams it (one JSON
/// object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LogLine {
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// True when the line was split (longer than the log's line limit) and continues.
    #[serde(default)]
    pub partial: bool,
    pub text: String,
}

/// The first frame of an exec session: what to run and how.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Vec<String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub stdin: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
}

/// What the leader assigns to a node (key `instance(node, id)`); the agent converges on it.
/// The record's existence is the instruction to run; deleting it is the instruction to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    pub namespace: String,
    pub workload: String,
    pub node: NodeName,
    pub generation: u64,
    pub spec_hash: String,
    pub workload_type: crate::workload::WorkloadType,
    /// What the scheduler accounted for on the node.
    pub requests: ResourceList,
    /// The job run this instance belongs to (jobs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_run: Option<String>,
    pub created_at: Timestamp,
    /// Its address, from its node's subnet (the leader's IPAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub ip: Option<std::net::IpAddr>,
    /// Ports it publishes on its node (`hostPort`): accounted like `requests`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<crate::load_balancer::HostPort>,
    /// The node's GPUs it is given (CDI names, from the node's heartbeat), chosen by the
    /// scheduler: no other instance has them while it exists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
}

impl InstanceRecord {
    /// The workload this instance belongs to.
    pub fn workload_key(&self) -> crate::WorkloadKey {
        crate::WorkloadKey::new(&self.namespace, &self.workload)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobRunState {
    Active,
    Succeeded,
    Failed,
}

/// One run of a Job workload: one per generation, or one per cron tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JobRun {
    pub run_id: String,
    pub namespace: String,
    pub workload: String,
    pub generation: u64,
    pub state: JobRunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub succeeded: u32,
    pub failed: u32,
    pub started_at: Timestamp,
    /// Start in milliseconds since the epoch, for deadlines (strings are for people).
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// The cron tick this run is for, in minutes since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_minute: Option<u64>,
}
