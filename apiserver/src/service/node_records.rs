//! What a node asks of the leader about its own records: where its instances are
//! (assignments), the templates they run, its heartbeat, and templates it cannot use.
//!
//! Worker nodes hold no etcd credentials: this is their whole view of cluster state. The
//! HTTP guard has already checked that the certificate names the node in the path; here a
//! node gets a template only when one of *its* instances runs it, and reports problems only
//! for its own instances. These operations are the leader's: a control-plane node that does
//! not lead answers [`Error::not_leader`] with the leader's endpoint, which is how a worker
//! finds the new leader after a failover.

use std::sync::Arc;

use kat_api::keys;
use kat_api::wire::{
    rfc3339, EventType, HeartbeatAnswer, InstanceRecord, NodeHeartbeat, NodeRegistration,
    TemplateProblem,
};
use kat_leader::assignments::AssignmentWatch;
use kat_store::Txn;

use super::{Error, Result, Service};

/// At most this many template problems in one report, each reason at most this long.
const MAX_PROBLEMS: usize = 1000;
const MAX_REASON: usize = 1024;

impl Service {
    /// The leader's API endpoint, if one leads.
    pub async fn leader_endpoint(&self) -> Result<Option<String>> {
        Ok(self
            .store
            .get(keys::LEADER_ENDPOINT)
            .await?
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    /// `Ok` when this node leads (or serves alone, without an endpoint of its own).
    pub async fn require_leader(&self) -> Result<()> {
        let Some(own) = &self.api_endpoint else {
            return Ok(());
        };
        match self.leader_endpoint().await? {
            Some(leader) if &leader == own => Ok(()),
            leader => Err(Error::not_leader(leader)),
        }
    }

    /// The API endpoints of the control-plane nodes (the etcd members), from their
    /// registrations: what a worker keeps to find the leader.
    pub async fn api_endpoints(&self) -> Result<Vec<String>> {
        let mut endpoints: Vec<String> = self.api_endpoint.iter().cloned().collect();
        let Some(etcd) = self.admission.as_ref().and_then(|a| a.etcd.as_ref()) else {
            return Ok(endpoints);
        };
        for (name, _, learner) in etcd.members().await? {
            if learner {
                continue;
            }
            let Some(kv) = self.store.get(&keys::node_registration(&name)).await? else {
                continue;
            };
            let Ok(reg) = serde_json::from_slice::<NodeRegistration>(&kv.value) else {
                continue;
            };
            if let Some(address) = reg.addresses.first() {
                let host = match address.contains(':') {
                    true => format!("[{address}]"),
                    false => address.clone(),
                };
                let endpoint = format!("https://{host}:{}", self.cluster.spec.api_port);
                if !endpoints.contains(&endpoint) {
                    endpoints.push(endpoint);
                }
            }
        }
        Ok(endpoints)
    }

    /// A worker's heartbeat, answered with the control plane's endpoints.
    pub async fn worker_heartbeat(&self, name: &str, hb: NodeHeartbeat) -> Result<HeartbeatAnswer> {
        self.require_leader().await?;
        self.record_heartbeat(name, hb).await?;
        Ok(HeartbeatAnswer {
            accepted: true,
            api_endpoints: self.api_endpoints().await?,
        })
    }

    /// Node `name`'s assignment stream, resuming after revision `resume` if given.
    pub async fn assignments(&self, name: &str, resume: Option<i64>) -> Result<AssignmentWatch> {
        self.require_leader().await?;
        Ok(AssignmentWatch::start(Arc::clone(&self.store), name, resume).await?)
    }

    /// The template (its stored JSON, which the node checks against the hash) of workload
    /// `ns/workload` at `hash`, for node `name`, which must run an instance of it.
    pub async fn template_for_node(
        &self,
        name: &str,
        ns: &str,
        workload: &str,
        hash: &str,
    ) -> Result<Vec<u8>> {
        self.require_leader().await?;
        let uses = self
            .node_records(name)
            .await?
            .iter()
            .any(|r| r.namespace == ns && r.workload == workload && r.spec_hash == hash);
        if !uses {
            return Err(Error::forbidden(format!(
                "node {name} runs no instance of {ns}/{workload} with template {hash}"
            )));
        }
        let kv = self
            .store
            .get(&keys::template(ns, workload, hash))
            .await?
            .ok_or_else(|| {
                Error::not_found(format!("template {hash} of {ns}/{workload} is gone"))
            })?;
        Ok(kv.value)
    }

    /// `TemplateMissing` warnings for node `name`'s own instances; others are refused.
    pub async fn template_problems(
        &self,
        name: &str,
        problems: Vec<TemplateProblem>,
    ) -> Result<()> {
        self.require_leader().await?;
        if problems.len() > MAX_PROBLEMS {
            return Err(Error::bad_request(format!(
                "template problems: at most {MAX_PROBLEMS} at once"
            )));
        }
        let records = self.node_records(name).await?;
        let mut ops = Vec::new();
        for p in problems {
            let Some(r) = records.iter().find(|r| r.instance_id == p.instance_id) else {
                return Err(Error::forbidden(format!(
                    "instance {} is not assigned to node {name}",
                    p.instance_id
                )));
            };
            let reason: String = p.reason.chars().take(MAX_REASON).collect();
            ops.extend(self.events.ops(&kat_leader::events::event(
                rfc3339(self.clock.wall()),
                EventType::Warning,
                "TemplateMissing",
                kat_leader::events::workload_ref(&r.namespace, &r.workload),
                format!("instance {} on node {name}: {reason}", r.instance_id),
            )));
        }
        if !ops.is_empty() {
            self.store.txn(Txn::new().and_then(ops)).await?;
        }
        Ok(())
    }

    async fn node_records(&self, name: &str) -> Result<Vec<InstanceRecord>> {
        Ok(self
            .store
            .list(&keys::node_instances(name))
            .await?
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect())
    }
}
