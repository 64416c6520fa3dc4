//! What a node asks of the leader about its own records: where its instances are
//! (assignments), the templates they run, its heartbeat, and templates it cannot use.
//!
//! Worker nodes hold no etcd credentials: this is their whole view of cluster state. The
//! HTTP guard has already checked that the certificate names the node in the path; here a
//! node gets a template only when one of *its* instances runs it, and reports problems only
//! for its own instances. These operations are the leader's: a control-plane node that does
//! not lead answers [`Error::not_leader`] with the leader's endpoint, which is how a worker
//! finds the new leader after a failover.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::{
    DnsRecord, EventType, HeartbeatAnswer, InstanceRecord, NodeHeartbeat, NodeRegistration,
    OverlayPeer, RevokedNode, TemplateProblem, WireguardKey,
};
use kat_leader::assignments::AssignmentWatch;
use kat_store::{Revision, Txn};

use crate::rate_limit::{Client, RateLimiter};

use kat_api::wire::ErrorCode;

use kat_api::node_limits::{
    HEARTBEAT_BURST, MAX_HEARTBEAT_INSTANCES, MAX_PROBLEMS, MIN_HEARTBEAT_INTERVAL,
};

use super::{Error, Result, Service};

/// At most this long, each reason of a template problem.
const MAX_REASON: usize = 1024;
/// After a change a read waited for, a moment for the rest of its burst (a rollout makes
/// several instances ready in one leader round): one answer for it, not one per record.
const CHANGE_SETTLE: Duration = Duration::from_millis(20);

/// What a node may wait on for a change ([`NodeLimits::wait_for_change`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeRead {
    Dns,
    Peers,
}

/// Per-node limits on what the leader takes from nodes: heartbeats (see
/// [`HEARTBEAT_BURST`]), one assignment stream per node (a new one ends the old), and one
/// read waiting for a change per node and [`ChangeRead`] (a new one ends the old's wait):
/// each holds a watch on etcd, and a node cannot pile them up.
pub struct NodeLimits {
    heartbeats: RateLimiter,
    streams: Mutex<HashMap<String, u64>>,
    waiting: Mutex<HashMap<(String, ChangeRead), Arc<tokio::sync::Notify>>>,
}

impl Default for NodeLimits {
    fn default() -> Self {
        NodeLimits {
            heartbeats: RateLimiter::new(
                HEARTBEAT_BURST,
                1.0 / MIN_HEARTBEAT_INTERVAL.as_secs_f64(),
                Duration::from_secs(300),
            ),
            streams: Mutex::default(),
            waiting: Mutex::default(),
        }
    }
}

impl NodeLimits {
    fn heartbeat_allowed(&self, node: &str) -> bool {
        self.heartbeats
            .check_client(Client::Node(node.to_string()))
            .is_ok()
    }

    /// Register a new stream of `node`; the number it returns stays current until the next.
    pub fn open_stream(&self, node: &str) -> u64 {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let n = streams.entry(node.to_string()).or_default();
        *n += 1;
        *n
    }

    /// Whether stream `number` of `node` is still the newest.
    pub fn stream_current(&self, node: &str, number: u64) -> bool {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.get(node) == Some(&number)
    }

    /// Waits for `change` (a watch for a change after the node's last reading) as `node`'s
    /// only waiting `read`, then the settle moment. A newer wait of the same node and kind
    /// ends this one at once (a client that reconnected does not leave a watch behind it):
    /// then the answer is a conflict, which its client backs off from, so two clients
    /// sharing a certificate cannot end each other's waits in a tight loop.
    async fn wait_for_change(
        &self,
        node: &str,
        read: ChangeRead,
        change: impl Future<Output = ()>,
    ) -> Result<()> {
        let key = (node.to_string(), read);
        let mine = Arc::new(tokio::sync::Notify::new());
        if let Some(older) = self.lock_waiting().insert(key.clone(), mine.clone()) {
            // Stored as a permit if the older one has not started waiting yet.
            older.notify_one();
        }
        let _ends = WaitEnds {
            limits: self,
            key: &key,
            mine: &mine,
        };
        tokio::select! {
            () = change => {
                tokio::time::sleep(CHANGE_SETTLE).await;
                Ok(())
            }
            () = mine.notified() => Err(Error::new(
                ErrorCode::Conflict,
                format!("a newer read of node {node}'s {read:?} waits for the change: this one ended"),
            )),
        }
    }

    fn lock_waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, ChangeRead), Arc<tokio::sync::Notify>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Removes a wait from [`NodeLimits`]'s table when it ends (or its request is dropped),
/// unless a newer one took its place.
struct WaitEnds<'a> {
    limits: &'a NodeLimits,
    key: &'a (String, ChangeRead),
    mine: &'a Arc<tokio::sync::Notify>,
}

impl Drop for WaitEnds<'_> {
    fn drop(&mut self) {
        let mut waiting = self.limits.lock_waiting();
        if waiting
            .get(self.key)
            .is_some_and(|w| Arc::ptr_eq(w, self.mine))
        {
            waiting.remove(self.key);
        }
    }
}

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
            let Some(reg) = kat_store::decode_or_skip::<NodeRegistration>(&kv) else {
                continue;
            };
            if let Some(address) = reg.addresses.first() {
                let endpoint = format!(
                    "https://{}:{}",
                    kat_api::wire::url_host(address),
                    self.cluster.spec.api_port
                );
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
        if hb.instances.len() > MAX_HEARTBEAT_INSTANCES {
            return Err(Error::bad_request(format!(
                "heartbeat body: instances: {} is more than {MAX_HEARTBEAT_INSTANCES}",
                hb.instances.len()
            )));
        }
        if !self.node_limits.heartbeat_allowed(name) {
            return Err(Error::new(
                ErrorCode::RateLimited,
                format!(
                    "node {name} sends heartbeats more often than {HEARTBEAT_BURST} at once, then one every {} ms",
                    MIN_HEARTBEAT_INTERVAL.as_millis()
                ),
            ));
        }
        let previous: Option<NodeHeartbeat> = self
            .store
            .get(&keys::node_status(name))
            .await?
            .and_then(|kv| kat_store::decode_or_skip(&kv));
        if hb.node == name {
            kat_leader::desired::node_admin::check_capacity(
                &*self.store,
                &self.events,
                &self.clock,
                &hb,
                previous.as_ref(),
            )
            .await?;
        }
        self.record_heartbeat(name, hb).await?;
        let revoked_serials = self
            .store
            .list(keys::revoked_nodes())
            .await?
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip::<RevokedNode>)
            .filter_map(|r| r.serial)
            .collect();
        let subnet = self
            .store
            .get(&keys::node_subnet(name))
            .await?
            .and_then(|kv| String::from_utf8(kv.value).ok());
        Ok(HeartbeatAnswer {
            accepted: true,
            api_endpoints: self.api_endpoints().await?,
            revoked_serials,
            subnet,
        })
    }

    /// Node `name`'s WireGuard public key (a worker's; members write theirs to etcd).
    pub async fn set_wireguard_key(&self, name: &str, key: WireguardKey) -> Result<()> {
        self.require_leader().await?;
        if let Some(problem) = key.problem() {
            return Err(Error::bad_request(format!(
                "wireguard body: publicKey: {problem}"
            )));
        }
        if self
            .store
            .get(&keys::node_registration(name))
            .await?
            .is_none()
        {
            return Err(Error::not_found(format!("node {name} is not registered")));
        }
        self.store
            .put(
                &keys::wireguard_key(name),
                key.public_key.into_bytes(),
                None,
            )
            .await?;
        Ok(())
    }

    /// The overlay's peers for worker `node`, and the store revision they were read at;
    /// with `after` (a revision of an earlier reading, and how long to wait at most), read
    /// once they may have changed since.
    pub async fn overlay_peers(
        &self,
        node: &str,
        after: Option<(Revision, Duration)>,
    ) -> Result<(Vec<OverlayPeer>, Revision)> {
        self.require_leader().await?;
        let port = self.cluster.spec.wireguard_port;
        let now = kat_leader::overlay::peers_at(&*self.store, port).await?;
        let Some((revision, wait)) = after.filter(|(after, _)| *after <= now.1) else {
            // No wait asked, or a revision the store has not reached (one from before a
            // restore): the answer now, whose revision the next wait starts from.
            return Ok(now);
        };
        let change = kat_leader::overlay::peers_changed(&*self.store, revision, wait);
        self.node_limits
            .wait_for_change(node, ChangeRead::Peers, change)
            .await?;
        self.require_leader().await?;
        Ok(kat_leader::overlay::peers_at(&*self.store, port).await?)
    }

    /// The cluster's DNS records for worker `node`'s DNS server (a control-plane node reads
    /// them from etcd), and the revision they were read at; `after` as for
    /// [`Service::overlay_peers`].
    pub async fn dns_records(
        &self,
        node: &str,
        after: Option<(Revision, Duration)>,
    ) -> Result<(Vec<DnsRecord>, Revision)> {
        self.require_leader().await?;
        let now = kat_leader::dns::records_at(&*self.store).await?;
        let Some((revision, wait)) = after.filter(|(after, _)| *after <= now.1) else {
            return Ok(now); // as in `overlay_peers`
        };
        let change = kat_leader::dns::records_changed(&*self.store, revision, wait);
        self.node_limits
            .wait_for_change(node, ChangeRead::Dns, change)
            .await?;
        self.require_leader().await?;
        Ok(kat_leader::dns::records_at(&*self.store).await?)
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
                self.clock.timestamp(),
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
            .filter_map(kat_store::decode_or_skip)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_come_in_a_burst_then_at_the_interval() {
        let limits = NodeLimits::default();
        for n in 0..HEARTBEAT_BURST {
            assert!(limits.heartbeat_allowed("n1"), "heartbeat {n} of the burst");
        }
        assert!(!limits.heartbeat_allowed("n1"), "one past the burst");
        // Another node has its own bucket.
        assert!(limits.heartbeat_allowed("n2"));
        std::thread::sleep(MIN_HEARTBEAT_INTERVAL + Duration::from_millis(20));
        assert!(limits.heartbeat_allowed("n1"), "one more after an interval");
    }
}
