//! Nodes: registration, heartbeats and what the leader answers, resources and usage,
//! labels and taints, assignments, the overlay (WireGuard keys, peers) and DNS records.

use super::*;

/// `POST /nodes/{node}/etcd-member` (`kat-agent rejoin`): the member list a control-plane
/// node starts its etcd with to join the (restored) cluster again, as a learner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EtcdMembership {
    /// etcd's `--initial-cluster`: every member's `name=peerURL`.
    pub initial_cluster: String,
}

/// A node's state, from the age of its last heartbeat and whether it drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum NodeState {
    /// Its heartbeats arrive in time.
    Ready,
    /// No heartbeat within `nodeLossTimeoutSeconds`.
    NotReady,
    /// Its heartbeats arrive, and it is draining (`katcall drain`).
    Draining,
}

/// Amounts of node resources, in integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ResourceList {
    /// CPU, in millicores.
    pub cpu_millis: u64,
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// How many process ids (tasks) there are.
    #[serde(default)]
    pub pids: u64,
}

/// Resources in use, measured by a node at a heartbeat: for an instance from its container's
/// cgroup, for a node from the kernel's totals (`/proc`) and the data directory's file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// CPU time used per second over the last measuring interval, in millicores (1000 = one
    /// core busy all the time).
    pub cpu_millis: u64,
    /// Memory in use, in bytes.
    pub memory_bytes: u64,
    /// Tasks (processes and threads) running.
    pub pids: u64,
    /// Nodes only: bytes used and in all on the file system of the agent's data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Nodes only: the size of the data directory's file system, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_total_bytes: Option<u64>,
}

/// A GPU a node has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// Its vendor.
    pub driver: crate::workload::GpuDriver,
    /// Its memory, in MiB.
    #[serde(rename = "vramMB")]
    pub vram_mb: u32,
    /// The product name, as the driver says it (empty if it says none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Its Container Device Interface name (`vendor.com/class=name`): what an instance is
    /// given, and how the node finds what to put in the container.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
}

/// A taint on a node: instances that do not tolerate it are kept away, as `effect` says.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// The taint's key.
    pub key: String,
    /// The taint's value, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What it keeps away.
    pub effect: TaintEffect,
}

/// A node as the API shows it: its registration, last heartbeat and state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its name and labels.
    pub metadata: ObjectMeta,
    /// Its state, from its last heartbeat.
    pub state: NodeState,
    /// The addresses other nodes reach it at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// What the host has.
    pub capacity: ResourceList,
    /// What instances may use of it: capacity minus what the system and KAT need.
    pub allocatable: ResourceList,
    /// Its GPUs, as it reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// What the scheduler may use of it: `allocatable` and `gpus` beyond this are the
    /// node's claim, not approved (`katcall approve node NAME --capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_capacity: Option<ApprovedCapacity>,
    /// Its taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// When its last heartbeat was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Timestamp>,
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
    pub leader_since: Option<Timestamp>,
    /// Its overlay's peers, from its last heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlay: Vec<OverlayPeerStatus>,
}

/// The current leader ([`crate::keys::LEADER`]), written by the node that wins the election,
/// under its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LeaderRecord {
    /// The node's name.
    pub node: String,
    /// Its API endpoint (as in [`crate::keys::LEADER_ENDPOINT`]).
    pub endpoint: String,
    /// RFC 3339: when it won the election.
    pub since: Timestamp,
}

/// A node removed with `katcall delete node`: its certificate is refused from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RevokedNode {
    /// The node's name.
    pub node: String,
    /// The serial (hex) of the certificate it had; `None` if it never recorded one.
    #[serde(default)]
    pub serial: Option<String>,
    /// When it was removed.
    pub revoked_at: Timestamp,
}

/// The answer to a worker's heartbeat: the control plane as it is now, so the worker's list
/// of where to find the leader stays fresh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAnswer {
    /// Whether the heartbeat was taken.
    pub accepted: bool,
    /// The API endpoints of the control-plane nodes (`https://IP:PORT`).
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum AssignmentUpdate {
    /// Every instance record of the node, as of `revision`.
    Snapshot {
        /// The store revision of the records.
        revision: i64,
        /// The node's instance records.
        records: Vec<InstanceRecord>,
    },
    /// An instance record added or changed.
    Put {
        /// The store revision of the change.
        revision: i64,
        /// The record as it is now.
        record: Box<InstanceRecord>,
    },
    /// An instance record removed.
    #[serde(rename_all = "camelCase")]
    Delete {
        /// The store revision of the change.
        revision: i64,
        /// The instance whose record went.
        instance_id: InstanceId,
    },
    /// Nothing changed: the leader is alive.
    Keepalive,
}

/// `POST /nodes/{name}/template-problems`: instances of the node whose template is unusable
/// (gone, or not matching its hash); the leader records a `TemplateMissing` event for each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateProblem {
    /// The instance.
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    /// What is wrong with its template.
    pub reason: String,
}

/// How a joining etcd peer starts its member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EtcdJoin {
    /// etcd's `--initial-cluster`: every member's `name=peerURL`, this node included.
    pub initial_cluster: String,
    /// The CA's key (PEM): quorum members can admit nodes when they lead.
    pub ca_key: String,
}

/// `POST /nodes/{name}/status`: what an agent reports every tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeHeartbeat {
    /// The node that sends it.
    pub node: NodeName,
    /// When the node made it.
    pub timestamp: Timestamp,
    /// What the host has.
    pub capacity: ResourceList,
    /// What instances may use of it: capacity minus what the system and KAT need.
    pub allocatable: ResourceList,
    /// Its GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// The state of every instance on the node.
    #[serde(default)]
    pub instances: Vec<InstanceStatus>,
    /// What the node uses now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Builds running on the node and those that ended in the last minutes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builds: Vec<BuildReport>,
    /// Set while the node runs detached from its parent cluster (in its local cluster only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached: Option<Detachment>,
    /// The overlay's view of each peer node (RFC 001 §4.1.3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlay: Vec<OverlayPeerStatus>,
}

/// One overlay peer as a node's WireGuard sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct OverlayPeerStatus {
    /// The peer node.
    pub node: String,
    /// Its WireGuard endpoint (`address:port`).
    pub endpoint: String,
    /// When the last WireGuard handshake with it completed (none yet: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_peer_sync: Option<Timestamp>,
    /// Handshakes completed since the node's network started (rekeys included).
    pub handshakes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Bytes received from it.
    pub rx_bytes: u64,
}

/// Another node as the overlay needs it (`GET /nodes/{name}/peers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct OverlayPeer {
    /// The node's name.
    pub node: String,
    /// WireGuard public key, base64.
    pub public_key: String,
    /// `address:wireguardPort`, from the node's registration.
    pub endpoint: String,
    /// Its subnet of `clusterCIDR`.
    pub subnet: String,
}

/// A node's WireGuard public key (`POST /nodes/{name}/wireguard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WireguardKey {
    /// The key, base64 (44 characters).
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

/// The response header with the store revision a worker's DNS records or overlay peers
/// were read at: what it gives as `?after=` to wait for their next change.
pub const REVISION_HEADER: &str = "kat-revision";

/// One address of a workload in the cluster's DNS (`/kat/dns/{ns}/{workload}/{A|AAAA}/{ip}`),
/// written by the leader for every running instance that has an address. The workload's name
/// answers with the `ready` ones (healthy, or running where there is no health check); the
/// instance's own name (`{instanceID}.{workload}.{ns}.{domain}`) with its address always.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DnsRecord {
    /// The namespace of the workload.
    pub namespace: String,
    /// The workload.
    pub workload: String,
    /// The instance that has the address.
    #[serde(rename = "instanceID")]
    pub instance_id: InstanceId,
    /// The instance's address.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub ip: std::net::IpAddr,
    /// Whether the workload's name answers with it: healthy, or running where there is no health check.
    pub ready: bool,
}

/// A node's static registration plus what administrators set on it (labels, taints, drain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistration {
    /// The node's name.
    pub name: String,
    /// The addresses other nodes reach it at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Its labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Set by `katcall drain`: no new instances, Service instances move elsewhere.
    #[serde(default)]
    pub draining: bool,
    /// What the scheduler may place on the node: recorded from its first heartbeat, raised
    /// only by an administrator. `None` until that heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ApprovedCapacity>,
}

impl NodeRegistration {
    /// Node `name` with nothing else known: no address, label or taint, not draining, no
    /// approved capacity. Callers set what they know with struct update syntax.
    pub fn new(name: impl Into<String>) -> NodeRegistration {
        NodeRegistration {
            name: name.into(),
            addresses: Vec::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            draining: false,
            capacity: None,
        }
    }
}

/// The capacity the scheduler uses for a node: recorded from its first heartbeat after it
/// joined, changed only by an administrator (`katcall approve node NAME --capacity`). A
/// heartbeat that claims more is not believed: a worker's certificate cannot draw other
/// tenants' instances (with their environment) to itself by overstating what it has.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovedCapacity {
    /// The CPU, memory and pids the scheduler may use.
    pub allocatable: ResourceList,
    /// The GPUs the scheduler may give out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
}

impl ApprovedCapacity {
    /// What a heartbeat claims, to be approved as it is.
    pub fn claimed_by(hb: &NodeHeartbeat) -> Self {
        ApprovedCapacity {
            allocatable: hb.allocatable,
            gpus: hb.gpus.clone(),
        }
    }

    /// `allocatable` no larger than approved, resource by resource.
    pub fn clamp(&self, allocatable: ResourceList) -> ResourceList {
        ResourceList {
            cpu_millis: allocatable.cpu_millis.min(self.allocatable.cpu_millis),
            memory_bytes: allocatable.memory_bytes.min(self.allocatable.memory_bytes),
            pids: allocatable.pids.min(self.allocatable.pids),
        }
    }

    /// The GPUs of `gpus` that were approved as they are (same device, driver, memory).
    pub fn approved_gpus(&self, gpus: &[GpuInfo]) -> Vec<GpuInfo> {
        gpus.iter()
            .filter(|g| self.gpus.contains(g))
            .cloned()
            .collect()
    }

    /// What `hb` claims beyond this, in words; `None` when it claims nothing more.
    pub fn exceeded_by(&self, hb: &NodeHeartbeat) -> Option<String> {
        let a = &self.allocatable;
        let h = &hb.allocatable;
        let mut more = Vec::new();
        if h.cpu_millis > a.cpu_millis {
            more.push(format!(
                "cpu {}m (approved {}m)",
                h.cpu_millis, a.cpu_millis
            ));
        }
        if h.memory_bytes > a.memory_bytes {
            more.push(format!(
                "memory {} MiB (approved {} MiB)",
                h.memory_bytes >> 20,
                a.memory_bytes >> 20
            ));
        }
        if h.pids > a.pids {
            more.push(format!("pids {} (approved {})", h.pids, a.pids));
        }
        let new_gpus: Vec<&str> = hb
            .gpus
            .iter()
            .filter(|g| !self.gpus.contains(g))
            .map(|g| g.device.as_str())
            .collect();
        if !new_gpus.is_empty() {
            more.push(format!("GPUs {}", new_gpus.join(", ")));
        }
        (!more.is_empty()).then(|| more.join(", "))
    }
}

/// The label that names a node's host (set at registration; a `nodeSelector` can use it).
pub const HOSTNAME_LABEL: &str = "kat.dws.rip/hostname";

/// The label that says what a node is to the cluster: `control-plane` (an etcd member) or
/// `worker`. Set from the node's certificate at every start; `katcall label` cannot change it.
pub const CLUSTER_ROLE_LABEL: &str = "kat.dws.rip/cluster-role";

/// What an administrator says a node is for (RFC 001: `kat.dws.rip/role=ingress`), with
/// `katcall label node`. It held the cluster role before [`CLUSTER_ROLE_LABEL`] did; a node
/// registering drops a value of `control-plane` or `worker` found there.
pub const ROLE_LABEL: &str = "kat.dws.rip/role";

/// Labels only the agent sets: `katcall label` refuses them.
pub const SYSTEM_LABELS: [&str; 2] = [HOSTNAME_LABEL, CLUSTER_ROLE_LABEL];

/// A node's cluster role from its labels (a registration older than [`CLUSTER_ROLE_LABEL`]
/// has it in [`ROLE_LABEL`]).
pub fn cluster_role(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels
        .get(CLUSTER_ROLE_LABEL)
        .or_else(|| {
            labels
                .get(ROLE_LABEL)
                .filter(|v| *v == "control-plane" || *v == "worker")
        })
        .map(String::as_str)
}

/// Every node has it, with its own name, without being stored (RFC 001 §4.9): a detached
/// node pins the workloads created on it with `nodeSelector: {kat.dws.rip/nodeName: NODE}`.
pub const NODE_NAME_LABEL: &str = "kat.dws.rip/nodeName";

/// The agent's `--node-type` (e.g. `laptop`, `stable`), recorded at join.
pub const NODE_TYPE_LABEL: &str = "kat.dws.rip/nodeType";

/// The taint `katcall drain` adds; `katcall uncordon` removes it.
pub const DRAIN_TAINT_KEY: &str = "kat.dws.rip/unschedulable";
