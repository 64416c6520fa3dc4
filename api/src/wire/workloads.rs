//! Workloads and their instances: the API objects, status, records the leader writes
//! for nodes, job runs, log lines and exec requests.

use super::*;

/// What the leader records for each applied generation (key `workload_meta`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadMeta {
    /// The workload's name, namespace, uid and generation.
    pub metadata: ObjectMeta,
    /// A hash of the whole desired state: a re-apply with the same one changes nothing.
    pub spec_hash: String,
    /// What instances run; instances with another template hash are old versions.
    pub template_hash: String,
    /// The instance template of the generation before, while it differs: kept for rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_template_hash: Option<String>,
    /// `Service`, `Job` or `DaemonService`.
    pub workload_type: crate::workload::WorkloadType,
    /// The whole desired state, typed and validated at apply (what the controllers run on).
    /// Absent only in records written before it existed; such a workload is re-applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub desired: Option<crate::template::Template>,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum InstanceState {
    /// Not placed yet, or waiting for its image or volumes.
    Pending,
    /// Its container is being created.
    Creating,
    /// Its container runs.
    Running,
    /// Exited 0 (jobs).
    Succeeded,
    /// Exited non-zero and will not be restarted, or could not be created.
    Failed,
    /// Its container was killed for exceeding its memory limit.
    OOMKilled,
    /// Its container is being stopped.
    Stopping,
    /// Its container has been stopped.
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

/// What an instance's health check says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Health {
    /// Nothing yet: no check has decided, or there is no health check (the default).
    #[default]
    Unknown,
    /// The check passed `successThreshold` times in a row.
    Healthy,
    /// The check failed `failureThreshold` times in a row.
    Unhealthy,
}

/// An image pull an instance waits for, as its node reports it while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PullStatus {
    /// The image being pulled.
    pub image: String,
    /// Layers in the image (0 until its manifest arrived) and those present so far.
    pub layers: u32,
    /// Layers present so far.
    pub layers_done: u32,
    /// Compressed bytes of all its layers, and those present so far (layers this node
    /// already had count as present).
    pub bytes_total: u64,
    /// Compressed bytes present so far.
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
    /// The instance's id.
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    /// The namespace of its workload.
    pub namespace: String,
    /// Its workload.
    pub workload: String,
    /// The node it runs on; none until it is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeName>,
    /// The generation that made it.
    pub generation: u64,
    /// Where it is in its life.
    pub state: InstanceState,
    /// What its health check says.
    #[serde(default)]
    pub health: Health,
    /// How many times its node restarted its container.
    #[serde(default)]
    pub restarts: u32,
    /// The exit code of its container's last run, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why the instance is in its state, e.g. which scheduler filter excluded the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its address in the cluster network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub ip: Option<std::net::IpAddr>,
    /// When its container last started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When it ended, if it did.
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

impl InstanceStatus {
    /// Instance `instance_id` of `namespace/workload` at `generation`, in `state`, with
    /// nothing else known: no node, health, restarts, exit, times, container or usage.
    /// Callers set what they know with struct update syntax.
    pub fn new(
        instance_id: InstanceId,
        namespace: String,
        workload: String,
        generation: u64,
        state: InstanceState,
    ) -> InstanceStatus {
        InstanceStatus {
            instance_id,
            namespace,
            workload,
            node: None,
            generation,
            state,
            health: Health::Unknown,
            restarts: 0,
            exit_code: None,
            reason: None,
            ip: None,
            started_at: None,
            finished_at: None,
            warnings: Vec::new(),
            pull: None,
            template_hash: None,
            usage: None,
            container_id: None,
            image_digest: None,
            gpus: Vec::new(),
            unhealthy_transitions: 0,
        }
    }

    /// The instance `record` assigns, in `state`: its id, workload, node, generation and
    /// address, nothing else known.
    pub fn of(record: &InstanceRecord, state: InstanceState) -> InstanceStatus {
        InstanceStatus {
            node: Some(record.node.clone()),
            ip: record.ip,
            ..InstanceStatus::new(
                record.instance_id.clone(),
                record.namespace.clone(),
                record.workload.clone(),
                record.generation,
                state,
            )
        }
    }
}

/// What the leader reports about a workload (`status` of [`WorkloadObject`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// The generation the leader last acted on.
    pub observed_generation: u64,
    /// The `specHash` of that generation.
    #[serde(default)]
    pub observed_spec_hash: String,
    /// How many instances the workload should have.
    pub replicas_desired: u32,
    /// How many are ready: running, and healthy where there is a health check.
    pub replicas_ready: u32,
    /// Its instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    /// The rollout under way, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Why the workload is not as desired, for people (e.g. instances that cannot be placed).
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
    /// The workload, `namespace/name`.
    pub workload: String,
    /// `false`: the same bundle was already there (a repeated submission).
    pub created: bool,
}

/// One build of a `source.git` workload's image on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BuildReport {
    /// The namespace of the workload.
    pub namespace: String,
    /// The workload.
    pub workload: String,
    /// The commit being built.
    pub commit: String,
    /// The reference the node keeps the image under (`kat-local/{ns}_{workload}:{sha7}`).
    pub image: String,
    /// Set by the leader from the heartbeat that carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Whether the build runs, succeeded or failed.
    pub state: BuildState,
    /// Where a running build is ("step 2 of 3: RUN make"), how one ended ("built in 4.2 s,
    /// pushed to …"), or why it failed (the failing step and the last lines of output).
    pub message: String,
    /// True when the image came from the build cache and nothing was built.
    #[serde(default)]
    pub from_cache: bool,
    /// When the build started.
    pub started_at: Timestamp,
    /// When it ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
}

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum BuildState {
    /// The build runs.
    Building,
    /// The image was built (or found in the cache).
    Succeeded,
    /// The build failed; the report's `message` says why.
    Failed,
}

/// A rolling update under way: how far the new generation has come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The generation being replaced.
    pub from_generation: u64,
    /// The generation rolling out.
    pub to_generation: u64,
    /// New instances that are healthy.
    pub updated: u32,
    /// How many instances the workload should have.
    pub total: u32,
    /// Whether new instances are not becoming healthy, so the rollout waits.
    #[serde(default)]
    pub stalled: bool,
    /// Why it waits, for people.
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
    /// The secret the git server signs push notifications with (HMAC-SHA256).
    pub secret: String,
}

/// What `PUT …/workloads/{name}?create=true` (`katcall apply` in one call) did, in its
/// [`APPLY_OUTCOME_HEADER`] header: the body is the workload as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// There was no workload of that name: generation 1.
    Created,
    /// A new generation.
    Configured,
    /// The same spec as stored: nothing changed.
    Unchanged,
}

/// The response header that says what an apply did ([`ApplyOutcome`]).
pub const APPLY_OUTCOME_HEADER: &str = "kat-apply-outcome";

impl ApplyOutcome {
    /// As the header says it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyOutcome::Created => "created",
            ApplyOutcome::Configured => "configured",
            ApplyOutcome::Unchanged => "unchanged",
        }
    }

    /// What the header says, if it is one of the outcomes.
    pub fn parse(text: &str) -> Option<ApplyOutcome> {
        [
            ApplyOutcome::Created,
            ApplyOutcome::Configured,
            ApplyOutcome::Unchanged,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }
}

/// `POST …/workloads?dryRun=true` and `PUT …/workloads/{name}?dryRun=true`: what the apply
/// would do, everything validated as for the apply itself and nothing stored (`katcall diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApplyPreview {
    /// The workload's namespace.
    pub namespace: String,
    /// The workload's name.
    pub name: String,
    /// `Service`, `Job` or `DaemonService`.
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
    /// The replicas after the apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// `GET /workloads/...`: metadata and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadObject {
    /// The workload's name, namespace, uid and generation.
    pub metadata: ObjectMeta,
    /// A hash of the whole desired state.
    pub spec_hash: String,
    /// What the current generation's instances run (see `InstanceStatus::template_hash`).
    #[serde(default)]
    pub template_hash: String,
    /// `Service`, `Job` or `DaemonService`.
    pub workload_type: crate::workload::WorkloadType,
    /// The commit this generation builds and runs (`source.git`), as resolved at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// What the leader reports about it.
    pub status: WorkloadStatus,
}

/// A namespace as the API lists and stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NamespaceObject {
    /// Its name, uid and labels.
    pub metadata: ObjectMeta,
}

/// One line of a container's output, as `GET …/instances/{id}/logs` streams it (one JSON
/// object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LogLine {
    /// When the line was logged (RFC 3339).
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// True when the line was split (longer than the log's line limit) and continues.
    #[serde(default)]
    pub partial: bool,
    /// The line's text.
    pub text: String,
}

/// The first frame of an exec session: what to run and how.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Give the command a terminal.
    #[serde(default)]
    pub tty: bool,
    /// Send the client's stdin to the command.
    #[serde(default)]
    pub stdin: bool,
    /// The terminal's height, in rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    /// The terminal's width, in columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
}

/// What the leader assigns to a node (key `instance(node, id)`); the agent converges on it.
/// The record's existence is the instruction to run; deleting it is the instruction to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    /// The instance's id.
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    /// The namespace of its workload.
    pub namespace: String,
    /// Its workload.
    pub workload: String,
    /// The node it is assigned to.
    pub node: NodeName,
    /// The generation that made it.
    pub generation: u64,
    /// The hash of the template it runs (the workload's `templateHash` when it was made).
    pub spec_hash: String,
    /// `Service`, `Job` or `DaemonService`.
    pub workload_type: crate::workload::WorkloadType,
    /// What the scheduler accounted for on the node.
    pub requests: ResourceList,
    /// The job run this instance belongs to (jobs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_run: Option<String>,
    /// When the leader created the record.
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

/// Where a Job run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobRunState {
    /// Its instances are running, or more are to come.
    Active,
    /// It reached `completions` successful instances.
    Succeeded,
    /// It failed: too many failed instances, its deadline passed, or a newer generation superseded it.
    Failed,
}

/// One run of a Job workload: one per generation, or one per cron tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JobRun {
    /// The run's id; runs sort by it, oldest first.
    pub run_id: String,
    /// The namespace of the Job.
    pub namespace: String,
    /// The Job workload.
    pub workload: String,
    /// The generation the run is of.
    pub generation: u64,
    /// Whether it runs, succeeded or failed.
    pub state: JobRunState,
    /// Why it ended as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Instances that succeeded.
    pub succeeded: u32,
    /// Instances that failed.
    pub failed: u32,
    /// When the run started.
    pub started_at: Timestamp,
    /// Start in milliseconds since the epoch, for deadlines (strings are for people).
    pub started_ms: u64,
    /// When it ended, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// The cron tick this run is for, in minutes since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_minute: Option<u64>,
}
