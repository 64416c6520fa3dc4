//! The leader's in-memory picture of the cluster, kept from one watch on `/kat/`.
//!
//! Controllers read this view, never the store, so a reconcile round costs no I/O. The view
//! is fed by watch events and, right after the leader commits a plan, by the plan's own
//! writes, so the next round never acts twice on the same gap. Every entry remembers the
//! revision it was written at and an older event never overwrites a newer value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ipnet::IpNet;
use kat_api::finished::FinishedInstance;
use kat_api::keys::{self, Key};
use kat_api::wire::{
    DnsRecord, InstanceId, InstanceRecord, InstanceStatus, JobRun, NodeHeartbeat, NodeName,
    NodeRegistration, WorkloadMeta,
};
use kat_api::{Template, WorkloadKey};
use kat_store::{Revision, TxnOp};
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct WorkloadEntry {
    pub key: WorkloadKey,
    pub meta: Option<WorkloadMeta>,
    /// The typed desired state from `meta` (validated at apply; never parsed from files here).
    /// `None` for a record written before apply stored it.
    pub desired: Option<Arc<Template>>,
    /// The store revision `meta` was written at.
    pub meta_revision: Revision,
}

#[derive(Debug, Clone, Default)]
pub struct NodeEntry {
    pub registration: Option<NodeRegistration>,
    pub heartbeat: Option<NodeHeartbeat>,
    /// When the leader last saw a heartbeat (its own clock, so node clocks do not matter).
    pub last_seen: Option<Instant>,
}

#[derive(Default)]
pub struct ClusterView {
    pub workloads: BTreeMap<WorkloadKey, WorkloadEntry>,
    pub nodes: BTreeMap<NodeName, NodeEntry>,
    /// Instance records by instance id.
    pub instances: BTreeMap<InstanceId, InstanceRecord>,
    /// Job runs by workload, then run id.
    pub job_runs: BTreeMap<WorkloadKey, BTreeMap<String, JobRun>>,
    /// Stored instance templates, (namespace, workload, hash), and the revision each was
    /// written at.
    pub templates: BTreeMap<(String, String, String), Revision>,
    /// Each node's subnet of `clusterCIDR` (`crate::ipam`).
    pub subnets: BTreeMap<NodeName, IpNet>,
    /// The cluster's DNS records by key (`crate::dns`).
    pub dns: BTreeMap<String, DnsRecord>,
    /// Finished instances kept for their exit codes and logs, by workload, then instance id
    /// (`crate::finished`).
    pub finished: BTreeMap<WorkloadKey, BTreeMap<InstanceId, FinishedInstance>>,
    /// Instances whose records this leader saw deleted, by id, with the node they were on:
    /// only that node may still report them (while their containers stop). Forgotten once
    /// the node stops reporting them or is gone.
    departed: HashMap<InstanceId, NodeName>,
    /// The newest revision taken in. Watch events come in revision order, so everything
    /// written at an older revision (a whole transaction) has been taken in too.
    pub latest: Revision,
    revisions: HashMap<String, Revision>,
}

impl ClusterView {
    /// Apply a put (`Some(value)`) or delete (`None`) of `key` at `revision`, observed at `now`.
    pub fn apply(&mut self, key: &str, value: Option<&[u8]>, revision: Revision, now: Instant) {
        if self.revisions.get(key).is_some_and(|r| *r > revision) {
            return; // an older event for a key we already wrote through
        }
        self.revisions.insert(key.to_string(), revision);
        self.latest = self.latest.max(revision);
        let Some(parsed) = keys::parse(key) else {
            return;
        };
        match parsed {
            Key::WorkloadMeta { ns, name } => {
                match value.and_then(|v| decode::<WorkloadMeta>(key, v)) {
                    Some(meta) => {
                        let key = WorkloadKey::new(ns, name);
                        let desired = meta.desired.clone().map(Arc::new);
                        if desired.is_none() {
                            tracing::warn!(
                                workload = %key,
                                "the workload's record has no typed spec (written by an older version); apply it again"
                            );
                        }
                        self.workloads.insert(
                            key.clone(),
                            WorkloadEntry {
                                key,
                                meta: Some(meta),
                                desired,
                                meta_revision: revision,
                            },
                        );
                    }
                    None => {
                        self.workloads.remove(&WorkloadKey::new(ns, name));
                    }
                }
            }
            Key::Template { ns, name, hash } => {
                let id = (ns.to_string(), name.to_string(), hash.to_string());
                if value.is_some() {
                    self.templates.insert(id, revision);
                } else {
                    self.templates.remove(&id);
                }
            }
            Key::NodeRegistration { node } => {
                let Ok(name) = NodeName::parse(node) else {
                    tracing::warn!(key, "a node key whose name is not a node name: ignored");
                    return;
                };
                let entry = self.nodes.entry(name).or_default();
                entry.registration = value.and_then(|v| decode(key, v));
                if entry.registration.is_none() {
                    self.departed.retain(|_, n| n != node);
                }
                self.forget_node_if_empty(node);
            }
            Key::NodeStatus { node } => {
                let Ok(name) = NodeName::parse(node) else {
                    tracing::warn!(key, "a node key whose name is not a node name: ignored");
                    return;
                };
                let entry = self.nodes.entry(name).or_default();
                entry.heartbeat = value.and_then(|v| decode(key, v));
                if let Some(hb) = &entry.heartbeat {
                    entry.last_seen = Some(now);
                    let reported: std::collections::HashSet<&str> = hb
                        .instances
                        .iter()
                        .map(|s| s.instance_id.as_str())
                        .collect();
                    self.departed
                        .retain(|id, n| n != node || reported.contains(id.as_str()));
                }
                self.forget_node_if_empty(node);
            }
            Key::NodeSubnet { node } => {
                let Ok(name) = NodeName::parse(node) else {
                    tracing::warn!(key, "a node key whose name is not a node name: ignored");
                    return;
                };
                match value.and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok()) {
                    Some(subnet) => {
                        self.subnets.insert(name, subnet);
                    }
                    None => {
                        self.subnets.remove(node);
                    }
                }
            }
            Key::DnsRecord => match value.and_then(|v| decode::<DnsRecord>(key, v)) {
                Some(record) => {
                    self.dns.insert(key.to_string(), record);
                }
                None => {
                    self.dns.remove(key);
                }
            },
            Key::Instance { id, .. } => {
                match value.and_then(|v| decode::<InstanceRecord>(key, v)) {
                    // The record's id is the checked one; a key that says otherwise is not ours.
                    Some(record) if record.instance_id == id => {
                        self.instances.insert(record.instance_id.clone(), record);
                    }
                    Some(_) => {
                        tracing::warn!(key, "an instance record under another id's key: ignored")
                    }
                    None => {
                        if let Some((id, gone)) = self.instances.remove_entry(id) {
                            self.departed.insert(id, gone.node);
                        }
                    }
                }
            }
            Key::JobRun { ns, name, run } => {
                let workload = WorkloadKey::new(ns, name);
                match value.and_then(|v| decode::<JobRun>(key, v)) {
                    Some(r) => {
                        self.job_runs
                            .entry(workload)
                            .or_default()
                            .insert(run.to_string(), r);
                    }
                    None => {
                        if let Some(runs) = self.job_runs.get_mut(&workload) {
                            runs.remove(run);
                            if runs.is_empty() {
                                self.job_runs.remove(&workload);
                            }
                        }
                    }
                }
            }
            Key::FinishedInstance { ns, name, id } => {
                let workload = WorkloadKey::new(ns, name);
                match value.and_then(|v| decode::<FinishedInstance>(key, v)) {
                    Some(f) if f.record.instance_id == id => {
                        self.finished
                            .entry(workload)
                            .or_default()
                            .insert(f.record.instance_id.clone(), f);
                    }
                    Some(_) => {
                        tracing::warn!(key, "a finished instance under another id's key: ignored")
                    }
                    None => {
                        if let Some(kept) = self.finished.get_mut(&workload) {
                            kept.remove(id);
                            if kept.is_empty() {
                                self.finished.remove(&workload);
                            }
                        }
                    }
                }
            }
            Key::WorkloadManifest { .. }
            | Key::WorkloadStatus { .. }
            | Key::Namespace { .. }
            | Key::WireguardKey { .. }
            | Key::Event => {}
        }
    }

    /// Apply the writes of a committed transaction.
    pub fn apply_ops(&mut self, ops: &[TxnOp], revision: Revision, now: Instant) {
        for op in ops {
            match op {
                TxnOp::Put { key, value, .. } => self.apply(key, Some(value), revision, now),
                TxnOp::Delete { key } => self.apply(key, None, revision, now),
                TxnOp::Get { .. } => {}
            }
        }
    }

    fn forget_node_if_empty(&mut self, node: &str) {
        if self
            .nodes
            .get(node)
            .is_some_and(|n| n.registration.is_none() && n.heartbeat.is_none())
        {
            self.nodes.remove(node);
        }
    }

    /// Instance states as their nodes last reported them, by instance id. A node speaks for
    /// the instances assigned to it and for those it had when their records were deleted
    /// (their containers still stopping), never for an instance assigned to another node nor
    /// for ids it makes up: a worker's heartbeat cannot change what the leader believes of
    /// its neighbours, nor hold back their rollouts with phantom "terminating" instances.
    pub fn reported(&self) -> HashMap<&InstanceId, (&NodeName, &InstanceStatus)> {
        let mut out = HashMap::new();
        for (node, entry) in &self.nodes {
            if let Some(hb) = &entry.heartbeat {
                for s in &hb.instances {
                    let speaks_for = match self.instances.get(&s.instance_id) {
                        Some(r) => r.node == *node,
                        None => self.departed.get(&s.instance_id) == Some(node),
                    };
                    if !speaks_for {
                        continue;
                    }
                    out.insert(&s.instance_id, (node, s));
                }
            }
        }
        out
    }
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Option<T> {
    kat_store::decode_value_or_skip(key, bytes)
}
