//! Types on the wire between `katcall`, agents and the leader: JSON in camelCase.
//!
//! These are the API's representation (RFC 001 §8.2). Timestamps are RFC 3339 strings in UTC,
//! quantities are integers (millicores, bytes) so that clients never parse units.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

pub use crate::workload::TaintEffect;

/// Format a time as RFC 3339 with milliseconds, e.g. `2026-11-21T10:43:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An address as the host part of a URL: IPv6 in brackets (`https://[fd00::1]:9115`).
pub fn url_host(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    }
}

/// The error body of every failed API request: `{"error": code, "message": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: ErrorCode,
    pub message: String,
    /// With `not_leader`: the API endpoint of the node that leads (`https://IP:PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// Machine-readable error codes; each has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    InvalidQuadlet,
    Unauthorized,
    /// Authenticated, but not allowed: a node's certificate outside its own records.
    Forbidden,
    NotFound,
    Conflict,
    PayloadTooLarge,
    RateLimited,
    /// The request (its header or its body) did not arrive within the server's deadline.
    RequestTimeout,
    Unavailable,
    Internal,
    /// A node route sent to a node that does not lead; the body names the leader.
    NotLeader,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::InvalidQuadlet => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited => 429,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            ErrorCode::NotLeader => 421,
        }
    }
}

/// Metadata common to stored objects.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub uid: String,
    #[serde(default)]
    pub generation: u64,
    /// The store revision this object was read at; send it back to update conditionally.
    #[serde(default)]
    pub resource_version: i64,
    pub creation_timestamp: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What the leader records for each applied generation (key `workload_meta`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub desired: Option<crate::template::Template>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Health {
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
}

/// One instance of a workload as reported by its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    #[serde(rename = "instanceID")]
    pub instance_id: String,
    pub namespace: String,
    pub workload: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
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
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Limits the node could not enforce, said out loud.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the running container uses, read from its cgroup at the last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
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

/// A node that lost its parent cluster's leader and leads a one-node cluster of its own
/// (RFC 001 §4.9) until it rejoins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Detachment {
    pub parent_cluster: String,
    /// RFC 3339.
    pub since: String,
}

/// What a detached node multicasts on its LAN (to [`REJOIN_GROUP`] on `rejoinPort`), every
/// 2 s, to find its parent's leader.
/// The leader answers only if `certificate` chains to the cluster CA, names `node`, is not
/// revoked, and `signature` (ECDSA P-256 with SHA-256, hex, by the certificate's key) covers
/// [`RejoinRequest::signed_bytes`]; `timestamp` is within a minute and `nonce` is new.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejoinRequest {
    /// Always `REJOIN_REQUEST`.
    #[serde(rename = "type")]
    pub kind: String,
    pub parent_cluster: String,
    pub node: String,
    /// Seconds since the Unix epoch.
    pub timestamp: u64,
    /// 32 hex digits, new for every request; the answer repeats it.
    pub nonce: String,
    /// The node's certificate (PEM).
    pub certificate: String,
    pub signature: String,
}

/// The value of [`RejoinRequest::kind`].
pub const REJOIN_REQUEST: &str = "REJOIN_REQUEST";

impl RejoinRequest {
    /// The bytes the signature covers: every field but the certificate and the signature.
    pub fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "kat-rejoin-v1\n{}\n{}\n{}\n{}\n{}",
            self.kind, self.parent_cluster, self.node, self.timestamp, self.nonce
        )
        .into_bytes()
    }
}

/// The parent leader's answer to a [`RejoinRequest`], sent straight back (UDP, to the
/// address and port the request came from), proven as the request is: the leader's
/// control-plane certificate and its signature over [`RejoinOffer::signed_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejoinOffer {
    /// Always `REJOIN_OFFER`.
    #[serde(rename = "type")]
    pub kind: String,
    pub parent_cluster: String,
    /// The leader's API endpoint (`https://IP:PORT`).
    pub leader: String,
    /// The request's nonce.
    pub nonce: String,
    pub timestamp: u64,
    pub certificate: String,
    pub signature: String,
}

/// The value of [`RejoinOffer::kind`].
pub const REJOIN_OFFER: &str = "REJOIN_OFFER";

/// The multicast group detached nodes send [`RejoinRequest`]s to (organization-local scope,
/// RFC 2365), on `rejoinPort`.
pub const REJOIN_GROUP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(239, 255, 75, 75);

impl RejoinOffer {
    /// The bytes the signature covers: every field but the certificate and the signature.
    pub fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "kat-rejoin-v1\n{}\n{}\n{}\n{}\n{}",
            self.kind, self.parent_cluster, self.leader, self.nonce, self.timestamp
        )
        .into_bytes()
    }
}

/// What a rejoining node's submission of one locally created workload came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PinnedWorkloadAnswer {
    pub workload: String,
    /// `false`: the same bundle was already there (a repeated submission).
    pub created: bool,
}

/// One build of a `source.git` workload's image on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BuildState {
    Building,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// `POST /nodes/{node}/etcd-member` (`kat-agent rejoin`): the member list a control-plane
/// node starts its etcd with to join the (restored) cluster again, as a learner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMembership {
    pub initial_cluster: String,
}

/// A backup: an etcd snapshot a node wrote to its `backupPath` (`katcall get backups`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The file's name, `kat-{cluster}-{node}-{YYYYMMDDTHHMMSS.mmm}Z.db`.
    pub name: String,
    /// The node whose disk holds it.
    pub node: String,
    pub path: String,
    pub taken_at: String,
    pub size_bytes: u64,
    pub sha256: String,
    /// `schedule` (the leader's) or `manual` (`katcall backup create`).
    pub trigger: String,
}

/// `POST /n/{ns}/workloads/{name}/webhook`: where a git server sends push notifications for
/// the workload and the secret it signs them with (shown once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookInfo {
    /// The route's path on any control-plane node's API (`/v1alpha1/hooks/git/{ns}/{name}`).
    pub path: String,
    pub secret: String,
}

/// `GET /workloads/...`: metadata and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadObject {
    pub metadata: ObjectMeta,
    pub spec_hash: String,
    pub workload_type: crate::workload::WorkloadType,
    /// The commit this generation builds and runs (`source.git`), as resolved at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub status: WorkloadStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceObject {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    Ready,
    NotReady,
    Draining,
}

/// Amounts of node resources, in integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceList {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    #[serde(default)]
    pub pids: u64,
}

/// Resources in use, measured by a node at a heartbeat: for an instance from its container's
/// cgroup, for a node from the kernel's totals (`/proc`) and the data directory's file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// CPU time used per second over the last measuring interval, in millicores (1000 = one
    /// core busy all the time).
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u64,
    /// Nodes only: bytes used and in all on the file system of the agent's data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub driver: crate::workload::GpuDriver,
    #[serde(rename = "vramMB")]
    pub vram_mb: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: TaintEffect,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub metadata: ObjectMeta,
    pub state: NodeState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    /// What the node used at its last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its subnet of `clusterCIDR`, from which its instances get their addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// Set while the node runs detached from its parent cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached: Option<Detachment>,
    /// Whether this node leads the cluster now (runs the controllers and the scheduler).
    #[serde(default)]
    pub leader: bool,
    /// Since when it leads (RFC 3339); only on the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_since: Option<String>,
}

/// The current leader ([`crate::keys::LEADER`]), written by the node that wins the election,
/// under its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderRecord {
    /// The node's name.
    pub node: String,
    /// Its API endpoint (as in [`crate::keys::LEADER_ENDPOINT`]).
    pub endpoint: String,
    /// RFC 3339: when it won the election.
    pub since: String,
}

/// A node removed with `katcall delete node`: its certificate is refused from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokedNode {
    pub node: String,
    /// The serial (hex) of the certificate it had; `None` if it never recorded one.
    #[serde(default)]
    pub serial: Option<String>,
    pub revoked_at: String,
}

/// What a join token admits. A worker token makes worker nodes only; a control-plane
/// token may also make a member of the etcd quorum, which is sent the CA's key: it is made
/// on purpose (`katcall create join-token --control-plane`) and is short-lived by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JoinRole {
    /// Records stored before tokens had a role read as this: the least a token can give.
    #[default]
    Worker,
    ControlPlane,
}

impl JoinRole {
    /// How long a token of this role is valid unless its creator says otherwise.
    pub fn default_ttl(self) -> std::time::Duration {
        match self {
            JoinRole::Worker => std::time::Duration::from_secs(24 * 3600),
            JoinRole::ControlPlane => std::time::Duration::from_secs(3600),
        }
    }
}

impl std::fmt::Display for JoinRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JoinRole::Worker => "worker",
            JoinRole::ControlPlane => "control-plane",
        })
    }
}

/// A join token as listed (`katcall get join-tokens`): no hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenInfo {
    pub id: String,
    /// What it admits; `worker` for a record made before tokens had a role.
    #[serde(default)]
    pub role: JoinRole,
    pub created_at: String,
    pub expires_at: String,
    /// Addresses a joining node may advertise besides the one its join comes from (a node
    /// behind NAT, say); empty: only its source address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Nodes admitted with it.
    #[serde(default)]
    pub used_by: Vec<String>,
    /// How many nodes it may admit; `None`: any number until it expires or is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
}

/// A join token as stored: what is listed, and the SHA-256 of the secret (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRecord {
    #[serde(flatten)]
    pub info: JoinTokenInfo,
    pub secret_sha256: String,
}

/// `POST /join-tokens`: a new token; `token` is shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewJoinToken {
    pub token: String,
    pub id: String,
    #[serde(default)]
    pub role: JoinRole,
    pub expires_at: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// `sha256:…` of the cluster CA, for `kat-agent join --ca-pin`.
    pub ca_pin: String,
}

/// `POST /join`: a node asking to join, authenticated by its join token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub token: String,
    pub node_name: String,
    /// PKCS#10 request (PEM) for the node's own key; only its public key is used.
    pub csr: String,
    /// The address other nodes reach this one at.
    pub address: String,
    /// Become a member of the etcd quorum.
    #[serde(default)]
    pub etcd_peer: bool,
    /// The agent's `--node-type`: the node's `kat.dws.rip/nodeType` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
}

/// The answer to a join: the node's certificate, the CA, the cluster's configuration and, for
/// an etcd peer, how to start its etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    pub certificate: String,
    pub ca: String,
    /// `cluster.kat` as the cluster was initialized with.
    pub cluster_config: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdJoin>,
    /// The API endpoints of the control-plane nodes (`https://IP:PORT`): where a worker finds
    /// the leader, now and after a failover.
    #[serde(default)]
    pub api_endpoints: Vec<String>,
}

/// The answer to a worker's heartbeat: the control plane as it is now, so the worker's list
/// of where to find the leader stays fresh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAnswer {
    pub accepted: bool,
    #[serde(default)]
    pub api_endpoints: Vec<String>,
    /// Serials of removed nodes' certificates: a worker's own API refuses them.
    #[serde(default)]
    pub revoked_serials: Vec<String>,
    /// The node's subnet of `clusterCIDR`, once the leader has given it one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
}

/// `GET /nodes/{name}/assignments`: one JSON line each. A stream starts with a `snapshot`
/// (every instance record of the node, as of `revision`) unless it resumes from a revision
/// the leader still has history for; then come changes in revision order, and `keepalive`
/// lines while nothing changes, so a client notices a dead leader within seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum AssignmentUpdate {
    Snapshot {
        revision: i64,
        records: Vec<InstanceRecord>,
    },
    Put {
        revision: i64,
        record: Box<InstanceRecord>,
    },
    #[serde(rename_all = "camelCase")]
    Delete {
        revision: i64,
        instance_id: String,
    },
    Keepalive,
}

/// `POST /nodes/{name}/template-problems`: instances of the node whose template is unusable
/// (gone, or not matching its hash); the leader records a `TemplateMissing` event for each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateProblem {
    #[serde(rename = "instanceID")]
    pub instance_id: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdJoin {
    /// etcd's `--initial-cluster`: every member's `name=peerURL`, this node included.
    pub initial_cluster: String,
    /// The CA's key (PEM): quorum members can admit nodes when they lead.
    pub ca_key: String,
}

/// `POST /nodes/{name}/status`: what an agent reports every tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHeartbeat {
    pub node: String,
    pub timestamp: String,
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    #[serde(default)]
    pub instances: Vec<InstanceStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Builds running on the node and those that ended in the last minutes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builds: Vec<BuildReport>,
    /// Set while the node runs detached from its parent cluster (in its local cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached: Option<Detachment>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One entry of the capped event log (RFC 001 §9.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub timestamp: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub reason: String,
    pub involved_object: ObjectReference,
    pub message: String,
}

/// One line of a container's output, as `GET …/instances/{id}/logs` streams it (one JSON
/// object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wireguard_keys_are_32_bytes_of_canonical_base64() {
        let key = |k: &str| WireguardKey {
            public_key: k.into(),
        };
        assert_eq!(
            key("xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=").problem(),
            None
        );
        for bad in [
            "",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dh=",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8D==",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n",
            "xTIBA5rb Uvnh4htodjb6e697QjLERt1NAB4mZqp8Dg=",
        ] {
            let problem = key(bad).problem().expect(bad);
            assert!(problem.contains("not a WireGuard public key"), "{problem}");
        }
    }

    #[test]
    fn a_join_token_record_from_before_roles_reads_as_a_worker_token() {
        // As an older version stored it: no role, no addresses.
        let old = r#"{"id":"0123456789ab","createdAt":"2026-01-01T00:00:00Z","expiresAt":"2026-01-02T00:00:00Z","usedBy":["n2"],"secretSha256":"ab"}"#;
        let record: JoinTokenRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.info.role, JoinRole::Worker);
        assert!(record.info.addresses.is_empty());
        assert_eq!(record.info.used_by, ["n2"]);
        assert_eq!(record.secret_sha256, "ab");
        // A control-plane token keeps its role through the store.
        let mut cp = record.clone();
        cp.info.role = JoinRole::ControlPlane;
        cp.info.addresses = vec!["192.0.2.7".into()];
        let text = serde_json::to_string(&cp).unwrap();
        assert!(text.contains(r#""role":"control-plane""#), "{text}");
        assert_eq!(serde_json::from_str::<JoinTokenRecord>(&text).unwrap(), cp);
        assert_eq!(JoinRole::ControlPlane.default_ttl().as_secs(), 3600);
        assert_eq!(JoinRole::Worker.default_ttl().as_secs(), 24 * 3600);
    }

    #[test]
    fn error_body_shape() {
        let body = ErrorBody {
            error: ErrorCode::InvalidQuadlet,
            message: "workload.kat: spec.replicas: is required".into(),
            leader: None,
        };
        let json = serde_json::to_string(&body).unwrap();
        assert_eq!(
            json,
            r#"{"error":"invalid_quadlet","message":"workload.kat: spec.replicas: is required"}"#
        );
        assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
    }

    #[test]
    fn camel_case_on_the_wire() {
        let s = InstanceStatus {
            instance_id: "web-abc".into(),
            namespace: "default".into(),
            workload: "web".into(),
            node: Some("n1".into()),
            generation: 2,
            state: InstanceState::Running,
            health: Health::Healthy,
            restarts: 1,
            exit_code: None,
            reason: None,
            ip: None,
            started_at: Some(rfc3339(std::time::UNIX_EPOCH)),
            finished_at: None,
            warnings: vec![],
            usage: None,
        };
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["instanceID"], "web-abc");
        assert_eq!(json["startedAt"], "1970-01-01T00:00:00.000Z");
        let back: InstanceStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }
}

/// Another node as the overlay needs it (`GET /nodes/{name}/peers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OverlayPeer {
    pub node: String,
    /// WireGuard public key, base64.
    pub public_key: String,
    /// `address:wireguardPort`, from the node's registration.
    pub endpoint: String,
    pub subnet: String,
}

/// A node's WireGuard public key (`POST /nodes/{name}/wireguard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WireguardKey {
    pub public_key: String,
}

impl WireguardKey {
    /// A WireGuard public key is 32 bytes in base64 (44 characters ending in `=`).
    pub fn problem(&self) -> Option<String> {
        let k = self.public_key.as_bytes();
        let base64 = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
        let ok = k.len() == 44
            && k[..43].iter().all(base64)
            && k[43] == b'='
            && b"AEIMQUYcgkosw048".contains(&k[42]);
        (!ok).then(|| {
            format!(
                "{:?} is not a WireGuard public key (expected 32 bytes in base64, 44 characters)",
                self.public_key
            )
        })
    }
}

/// One address of a workload in the cluster's DNS (`/kat/dns/{ns}/{workload}/{A|AAAA}/{ip}`),
/// written by the leader for every running instance that has an address. The workload's name
/// answers with the `ready` ones (healthy, or running where there is no health check); the
/// instance's own name (`{instanceID}.{workload}.{ns}.{domain}`) with its address always.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsRecord {
    pub namespace: String,
    pub workload: String,
    #[serde(rename = "instanceID")]
    pub instance_id: String,
    pub ip: std::net::IpAddr,
    pub ready: bool,
}

/// What the leader assigns to a node (key `instance(node, id)`); the agent converges on it.
/// The record's existence is the instruction to run; deleting it is the instruction to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    #[serde(rename = "instanceID")]
    pub instance_id: String,
    pub namespace: String,
    pub workload: String,
    pub node: String,
    pub generation: u64,
    pub spec_hash: String,
    pub workload_type: crate::workload::WorkloadType,
    /// What the scheduler accounted for on the node.
    pub requests: ResourceList,
    /// The job run this instance belongs to (jobs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_run: Option<String>,
    pub created_at: String,
    /// Its address, from its node's subnet (the leader's IPAM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Ports it publishes on its node (`hostPort`): accounted like `requests`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<crate::load_balancer::HostPort>,
}

impl InstanceRecord {
    /// The workload this instance belongs to.
    pub fn workload_key(&self) -> crate::WorkloadKey {
        crate::WorkloadKey::new(&self.namespace, &self.workload)
    }
}

/// A node's static registration plus what administrators set on it (labels, taints, drain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistration {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Set by `katcall drain`: no new instances, Service instances move elsewhere.
    #[serde(default)]
    pub draining: bool,
}

/// The label that names a node's host (set at registration; a `nodeSelector` can use it).
pub const HOSTNAME_LABEL: &str = "kat.dws.rip/hostname";
/// The label that says what a node is: `control-plane` (an etcd member) or `worker`.
pub const ROLE_LABEL: &str = "kat.dws.rip/role";
/// Every node has it, with its own name, without being stored (RFC 001 §4.9): a detached
/// node pins the workloads created on it with `nodeSelector: {kat.dws.rip/nodeName: NODE}`.
pub const NODE_NAME_LABEL: &str = "kat.dws.rip/nodeName";
/// The agent's `--node-type` (e.g. `laptop`, `stable`), recorded at join.
pub const NODE_TYPE_LABEL: &str = "kat.dws.rip/nodeType";

/// The taint `katcall drain` adds; `katcall uncordon` removes it.
pub const DRAIN_TAINT_KEY: &str = "kat.dws.rip/unschedulable";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobRunState {
    Active,
    Succeeded,
    Failed,
}

/// One run of a Job workload: one per generation, or one per cron tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    pub started_at: String,
    /// Start in milliseconds since the epoch, for deadlines (strings are for people).
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The cron tick this run is for, in minutes since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_minute: Option<u64>,
}
