//! Placement (RFC 001 §4.4): a pure function of nodes, their current load and a request.
//!
//! Filters exclude nodes; the survivors are ranked by, in order:
//! 1. no untolerated `PreferNoSchedule` taint (such nodes come last);
//! 2. fewest instances of the same workload (replicas spread across nodes);
//! 3. "most empty": the highest `100 - max(cpu%, memory%)` after placing the request;
//! 4. a random tie-break (reservoir sampling, so equal nodes share the load).
//!
//! Filters split into static ones (readiness, `nodeSelector`, taints, GPU), computed once per
//! workload by [`eligible`], and the resource filter (CPU, memory, a free address, the host
//! ports the workload publishes), checked per placement by [`pick`], so
//! placing many replicas on a large cluster stays linear and cheap.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use kat_api::load_balancer::HostPort;
use kat_api::wire::NODE_NAME_LABEL;
use kat_api::wire::{GpuInfo, InstanceRecord, ResourceList, Taint};
use kat_api::workload::{GpuRequest, TaintEffect, Toleration, TolerationOperator};
use kat_api::WorkloadKey;
use rand::Rng;

/// A node as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedNode {
    pub name: kat_api::wire::NodeName,
    /// Ready and not draining.
    pub schedulable: bool,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: ResourceList,
    pub gpus: Vec<GpuInfo>,
    /// Addresses left in the node's subnet (0 before it has one).
    pub free_ips: u64,
}

/// What is already placed on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLoad {
    pub requested: ResourceList,
    /// Instances per workload, for spreading.
    pub per_workload: HashMap<WorkloadKey, u32>,
    /// Ports published on the node, with the workloads and template hashes publishing them.
    pub host_ports: HashMap<HostPort, Vec<(WorkloadKey, String)>>,
    /// The node's GPUs given to instances (CDI names).
    pub gpus: std::collections::HashSet<String>,
}

impl NodeLoad {
    pub fn add(&mut self, record: &InstanceRecord) {
        let r = &record.requests;
        self.requested.cpu_millis += r.cpu_millis;
        self.requested.memory_bytes += r.memory_bytes;
        *self.per_workload.entry(record.workload_key()).or_default() += 1;
        self.gpus.extend(record.gpus.iter().cloned());
        for p in &record.host_ports {
            self.host_ports
                .entry(*p)
                .or_default()
                .push((record.workload_key(), record.spec_hash.clone()));
        }
    }

    /// Take a deleted instance off. Its host ports and GPUs stay taken for the rest of the
    /// round: its container still holds them while it stops.
    pub fn remove(&mut self, record: &InstanceRecord) {
        let (workload, r) = (&record.workload_key(), &record.requests);
        self.requested.cpu_millis = self.requested.cpu_millis.saturating_sub(r.cpu_millis);
        self.requested.memory_bytes = self.requested.memory_bytes.saturating_sub(r.memory_bytes);
        if let Some(n) = self.per_workload.get_mut(workload) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_workload.remove(workload);
            }
        }
    }
}

/// What one instance needs.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `namespace/name`.
    pub workload: &'a WorkloadKey,
    pub requests: ResourceList,
    pub node_selector: &'a BTreeMap<String, String>,
    pub tolerations: &'a [Toleration],
    pub gpu: Option<&'a GpuRequest>,
    /// Ports each instance publishes on its node.
    pub host_ports: &'a [HostPort],
    /// The template the instance runs: an instance of the same workload on an older
    /// template (one a rolling update replaces) does not hold a host port against it.
    pub template_hash: &'a str,
}

/// Why a node was excluded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Exclusion {
    NotReady,
    NodeSelector,
    Taint(String),
    Gpu,
    GpuInUse,
    InsufficientCpu,
    InsufficientMemory,
    NoFreeIp,
    HostPortInUse,
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::NotReady => f.write_str("not ready or draining"),
            Exclusion::NodeSelector => f.write_str("node selector mismatch"),
            Exclusion::Taint(key) => write!(f, "untolerated taint {key}"),
            Exclusion::Gpu => f.write_str("not enough matching GPUs"),
            Exclusion::GpuInUse => f.write_str("matching GPUs in use"),
            Exclusion::InsufficientCpu => f.write_str("insufficient cpu"),
            Exclusion::InsufficientMemory => f.write_str("insufficient memory"),
            Exclusion::NoFreeIp => f.write_str("no free address in the node's subnet"),
            Exclusion::HostPortInUse => f.write_str("host port already in use"),
        }
    }
}

/// How many nodes each filter excluded: the reason an instance stays `Pending`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unschedulable {
    pub total_nodes: usize,
    pub excluded: BTreeMap<Exclusion, usize>,
}

impl Exclusion {
    /// A stable, low-cardinality name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Exclusion::NotReady => "not_ready",
            Exclusion::NodeSelector => "node_selector",
            Exclusion::Taint(_) => "taint",
            Exclusion::Gpu => "gpu",
            Exclusion::GpuInUse => "gpu_in_use",
            Exclusion::InsufficientCpu => "insufficient_cpu",
            Exclusion::InsufficientMemory => "insufficient_memory",
            Exclusion::NoFreeIp => "no_free_ip",
            Exclusion::HostPortInUse => "host_port_in_use",
        }
    }
}

impl Unschedulable {
    /// Why, in one label: the filter that excluded the most nodes (`no_nodes` without any).
    pub fn reason_label(&self) -> &'static str {
        self.excluded
            .iter()
            .max_by_key(|(_, n)| **n)
            .map_or("no_nodes", |(why, _)| why.label())
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes available", self.total_nodes)?;
        for (i, (why, n)) in self.excluded.iter().enumerate() {
            write!(f, "{} {n} {why}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}

/// Static filters for one node.
pub fn static_exclusion(node: &SchedNode, req: &Request<'_>) -> Option<Exclusion> {
    if !node.schedulable {
        return Some(Exclusion::NotReady);
    }
    // `kat.dws.rip/nodeName` is the node's own name, whatever labels it was given.
    if !req
        .node_selector
        .iter()
        .all(|(k, v)| match k == NODE_NAME_LABEL {
            true => *v == node.name,
            false => node.labels.get(k) == Some(v),
        })
    {
        return Some(Exclusion::NodeSelector);
    }
    if let Some(t) = node
        .taints
        .iter()
        .find(|t| t.effect == TaintEffect::NoSchedule && !tolerated(t, req.tolerations))
    {
        return Some(Exclusion::Taint(t.key.clone()));
    }
    if let Some(gpu) = req.gpu {
        // Only GPUs with a CDI name can be given (an older agent reports none).
        let matching = node
            .gpus
            .iter()
            .filter(|g| gpu.matches(g) && !g.device.is_empty())
            .count();
        if matching < gpu.count() as usize {
            return Some(Exclusion::Gpu);
        }
    }
    None
}

/// The node's matching GPUs no instance has, as many as `req` asks for; `None` if there are
/// not enough (an instance without a GPU request gets an empty list).
pub fn free_gpus(node: &SchedNode, load: &NodeLoad, req: &Request<'_>) -> Option<Vec<String>> {
    let Some(gpu) = req.gpu else {
        return Some(Vec::new());
    };
    let free: Vec<String> = node
        .gpus
        .iter()
        .filter(|g| gpu.matches(g) && !g.device.is_empty() && !load.gpus.contains(&g.device))
        .map(|g| g.device.clone())
        .take(gpu.count() as usize)
        .collect();
    (free.len() == gpu.count() as usize).then_some(free)
}

/// The resource filter: requests against allocatable minus what is already requested.
pub fn resource_exclusion(
    node: &SchedNode,
    load: &NodeLoad,
    req: &Request<'_>,
) -> Option<Exclusion> {
    let free_cpu = node
        .allocatable
        .cpu_millis
        .saturating_sub(load.requested.cpu_millis);
    let free_mem = node
        .allocatable
        .memory_bytes
        .saturating_sub(load.requested.memory_bytes);
    if req.requests.cpu_millis > free_cpu {
        Some(Exclusion::InsufficientCpu)
    } else if req.requests.memory_bytes > free_mem {
        Some(Exclusion::InsufficientMemory)
    } else if node.free_ips == 0 {
        Some(Exclusion::NoFreeIp)
    } else if req.host_ports.iter().any(|p| port_taken(load, req, p)) {
        Some(Exclusion::HostPortInUse)
    } else if free_gpus(node, load, req).is_none() {
        Some(Exclusion::GpuInUse)
    } else {
        None
    }
}

/// Whether `port` on a node is taken for `req`: published there by another workload, or by
/// an instance of the same workload and template (two of those never share a node). An
/// instance of the same workload on another template is one a rolling update is replacing:
/// the node's relay spreads the port over both while both are ready, and the old one leaves
/// it before it stops, so the update needs no spare node.
fn port_taken(load: &NodeLoad, req: &Request<'_>, port: &HostPort) -> bool {
    load.host_ports.get(port).is_some_and(|owners| {
        owners
            .iter()
            .any(|(workload, hash)| workload != req.workload || hash == req.template_hash)
    })
}

/// Whether `tolerations` tolerate `taint` (an empty effect tolerates every effect; an empty
/// key with `Exists` tolerates every taint).
pub fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = t.key.is_empty() || t.key == taint.key;
        let value_ok = match t.operator {
            TolerationOperator::Exists => true,
            TolerationOperator::Equal => t.value == taint.value,
        };
        let effect_ok = t.effect.is_none_or(|e| e == taint.effect);
        key_ok && value_ok && effect_ok
    })
}

/// Nodes that pass the static filters, and counts of those that did not.
pub fn eligible(nodes: &[SchedNode], req: &Request<'_>) -> (Vec<usize>, Unschedulable) {
    let mut out = Vec::new();
    let mut why = Unschedulable {
        total_nodes: nodes.len(),
        excluded: BTreeMap::new(),
    };
    for (i, node) in nodes.iter().enumerate() {
        match static_exclusion(node, req) {
            None => out.push(i),
            Some(e) => *why.excluded.entry(e).or_default() += 1,
        }
    }
    (out, why)
}

/// Pick the best node among `candidates` (indices into `nodes`, already statically eligible).
/// `static_why` carries the static exclusions for the error.
pub fn pick<R: Rng + ?Sized>(
    nodes: &[SchedNode],
    loads: &[NodeLoad],
    candidates: &[usize],
    req: &Request<'_>,
    static_why: &Unschedulable,
    rng: &mut R,
) -> Result<usize, Unschedulable> {
    let mut best: Option<(Rank, usize)> = None;
    let mut ties = 0u32;
    let mut why = static_why.clone();
    for &i in candidates {
        let (node, load) = (&nodes[i], &loads[i]);
        if let Some(e) = resource_exclusion(node, load, req) {
            *why.excluded.entry(e).or_default() += 1;
            continue;
        }
        let rank = Rank {
            prefer_penalty: node.taints.iter().any(|t| {
                t.effect == TaintEffect::PreferNoSchedule && !tolerated(t, req.tolerations)
            }),
            same_workload: load.per_workload.get(req.workload).copied().unwrap_or(0),
            emptiness: emptiness(node, load, req),
        };
        match &best {
            Some((b, _)) if rank.better_than(b) => {
                best = Some((rank, i));
                ties = 1;
            }
            Some((b, _)) if rank == *b => {
                ties += 1;
                if rng.gen_range(0..ties) == 0 {
                    best = Some((rank, i));
                }
            }
            Some(_) => {}
            None => {
                best = Some((rank, i));
                ties = 1;
            }
        }
    }
    best.map(|(_, i)| i).ok_or(why)
}

/// The whole decision for one instance: static filters, resources, ranking.
pub fn place<R: Rng + ?Sized>(
    nodes: &[SchedNode],
    loads: &[NodeLoad],
    req: &Request<'_>,
    rng: &mut R,
) -> Result<usize, Unschedulable> {
    let (candidates, why) = eligible(nodes, req);
    pick(nodes, loads, &candidates, req, &why, rng)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rank {
    prefer_penalty: bool,
    same_workload: u32,
    /// 0..=100 in hundredths of a percent: higher is emptier.
    emptiness: u32,
}

impl Rank {
    fn better_than(&self, other: &Rank) -> bool {
        (
            !self.prefer_penalty,
            std::cmp::Reverse(self.same_workload),
            self.emptiness,
        ) > (
            !other.prefer_penalty,
            std::cmp::Reverse(other.same_workload),
            other.emptiness,
        )
    }
}

/// `100% - max(cpu%, memory%)` after placing the request, in hundredths of a percent.
fn emptiness(node: &SchedNode, load: &NodeLoad, req: &Request<'_>) -> u32 {
    let used = |requested: u64, extra: u64, total: u64| -> u64 {
        if total == 0 {
            10_000
        } else {
            ((requested + extra) as u128 * 10_000 / total as u128).min(10_000) as u64
        }
    };
    let cpu = used(
        load.requested.cpu_millis,
        req.requests.cpu_millis,
        node.allocatable.cpu_millis,
    );
    let mem = used(
        load.requested.memory_bytes,
        req.requests.memory_bytes,
        node.allocatable.memory_bytes,
    );
    (10_000 - cpu.max(mem)) as u32
}
