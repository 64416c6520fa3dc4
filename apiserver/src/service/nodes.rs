//! Nodes: registration and last heartbeat read together; heartbeats in; what administrators set.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kat_api::keys;
use kat_api::wire::{
    ErrorCode, LeaderRecord, Node, NodeHeartbeat, NodeRegistration, NodeState, ObjectMeta, Taint,
};
use kat_leader::desired::node_admin;

use super::{Error, Result, Service};

/// The API's view of a node: registration, last heartbeat, and a state from the heartbeat's age.
pub fn node_object(
    reg: Option<NodeRegistration>,
    hb: Option<NodeHeartbeat>,
    name: &str,
    node_loss_timeout: Duration,
    now: SystemTime,
) -> Node {
    let fresh = hb
        .as_ref()
        .is_some_and(|hb| hb.timestamp.age(now) <= node_loss_timeout);
    let draining = reg.as_ref().is_some_and(|r| r.draining);
    let state = match (fresh, draining) {
        (false, _) => NodeState::NotReady,
        (true, true) => NodeState::Draining,
        (true, false) => NodeState::Ready,
    };
    let reg = reg.unwrap_or_else(|| NodeRegistration::new(name));
    Node {
        metadata: ObjectMeta {
            name: name.into(),
            labels: reg.labels,
            ..Default::default()
        },
        state,
        addresses: reg.addresses,
        capacity: hb.as_ref().map(|h| h.capacity).unwrap_or_default(),
        allocatable: hb.as_ref().map(|h| h.allocatable).unwrap_or_default(),
        gpus: hb.as_ref().map(|h| h.gpus.clone()).unwrap_or_default(),
        approved_capacity: reg.capacity,
        taints: reg.taints,
        usage: hb.as_ref().and_then(|h| h.usage),
        detached: hb.as_ref().and_then(|h| h.detached.clone()),
        overlay: hb.as_ref().map(|h| h.overlay.clone()).unwrap_or_default(),
        last_heartbeat: hb.map(|h| h.timestamp),
        subnet: None,
        leader: false,
        leader_since: None,
    }
}

impl Service {
    /// Every node the store knows of, by name.
    pub async fn nodes(&self) -> Result<BTreeMap<String, Node>> {
        let regs = self.store.list(keys::node_registrations()).await?;
        let hbs = self.store.list(keys::node_statuses()).await?;
        let subnets = self.store.list(keys::node_subnets()).await?;
        let mut parts: BTreeMap<String, (Option<NodeRegistration>, Option<NodeHeartbeat>)> =
            BTreeMap::new();
        for kv in &regs.kvs {
            let name = kv.key[keys::node_registrations().len()..].to_string();
            parts.entry(name).or_default().0 = kat_store::decode_or_skip(kv);
        }
        for kv in &hbs.kvs {
            let name = kv.key[keys::node_statuses().len()..].to_string();
            parts.entry(name).or_default().1 = kat_store::decode_or_skip(kv);
        }
        let timeout = Duration::from_secs(self.cluster.spec.node_loss_timeout_seconds as u64);
        let now = self.clock.wall();
        let mut nodes: BTreeMap<String, Node> = parts
            .into_iter()
            .map(|(name, (reg, hb))| {
                let node = node_object(reg, hb, &name, timeout, now);
                (name, node)
            })
            .collect();
        for kv in &subnets.kvs {
            if let Some(kat_api::keys::Key::NodeSubnet { node }) = kat_api::keys::parse(&kv.key) {
                if let Some(n) = nodes.get_mut(node) {
                    n.subnet = Some(String::from_utf8_lossy(&kv.value).into_owned());
                }
            }
        }
        if let Some(leader) = self.leader().await? {
            if let Some(n) = nodes.get_mut(&leader.node) {
                n.leader = true;
                n.leader_since = Some(leader.since);
            }
        }
        Ok(nodes)
    }

    /// Who leads now, from the record the leader keeps under its lease; `None` between
    /// leaders (or while a leader from before this record existed leads).
    pub async fn leader(&self) -> Result<Option<LeaderRecord>> {
        let Some(kv) = self.store.get(keys::LEADER).await? else {
            return Ok(None);
        };
        match kat_store::decode::<LeaderRecord>(&kv) {
            Ok(record) => Ok(Some(record)),
            Err(e) => {
                tracing::warn!(
                    "{}: not a leader record ({e}); no node is shown as leader",
                    keys::LEADER
                );
                Ok(None)
            }
        }
    }

    pub async fn node(&self, name: &str) -> Result<Node> {
        self.nodes().await?.remove(name).ok_or_else(|| {
            Error::not_found(format!("node {name} not found (see `katcall get nodes`)"))
        })
    }

    /// Record node `name`'s heartbeat (agents on other nodes; the local agent writes directly).
    pub async fn record_heartbeat(&self, name: &str, hb: NodeHeartbeat) -> Result<()> {
        if hb.node != name {
            return Err(Error::bad_request(format!(
                "heartbeat body: node: is {:?} but the path names node {name:?}",
                hb.node.as_str()
            )));
        }
        let value = serde_json::to_vec(&hb)
            .map_err(|e| Error::bad_request(format!("heartbeat body: {e}")))?;
        self.store
            .put(&keys::node_status(name), value, None)
            .await?;
        Ok(())
    }

    pub async fn set_node_taints(
        &self,
        name: &str,
        taints: Vec<Taint>,
    ) -> Result<NodeRegistration> {
        Ok(node_admin::set_taints(&*self.store, &self.events, &self.clock, name, taints).await?)
    }

    /// `None` removes a label.
    pub async fn set_node_labels(
        &self,
        name: &str,
        changes: BTreeMap<String, Option<String>>,
    ) -> Result<NodeRegistration> {
        Ok(node_admin::set_labels(&*self.store, &self.events, &self.clock, name, changes).await?)
    }

    /// `katcall approve node NAME --capacity`: the capacity the administrator saw it claim.
    pub async fn approve_node_capacity(
        &self,
        name: &str,
        approved: kat_api::wire::ApprovedCapacity,
    ) -> Result<NodeRegistration> {
        Ok(
            node_admin::approve_capacity(&*self.store, &self.events, &self.clock, name, approved)
                .await?,
        )
    }

    pub async fn drain_node(&self, name: &str) -> Result<NodeRegistration> {
        Ok(node_admin::drain(&*self.store, &self.events, &self.clock, name).await?)
    }

    pub async fn uncordon_node(&self, name: &str) -> Result<NodeRegistration> {
        Ok(node_admin::uncordon(&*self.store, &self.events, &self.clock, name).await?)
    }

    /// Remove node `name` from the cluster: its etcd member leaves the quorum, its
    /// certificate is revoked (the API refuses it; etcd refuses new connections with it once
    /// the nodes have rewritten their revocation list, within seconds), and its registration
    /// goes, so its instances are placed elsewhere. The node itself should be stopped.
    pub async fn remove_node(&self, name: &str) -> Result<()> {
        let admission = self.admission()?;
        if name == admission.node {
            return Err(Error::new(
                ErrorCode::Conflict,
                format!("node {name} serves this request; remove it through another node's API"),
            ));
        }
        node_admin::remove(
            &*self.store,
            &self.events,
            &self.clock,
            admission.etcd.as_ref(),
            name,
            "",
            None,
        )
        .await
        .map(drop)
        .map_err(|e| match e {
            node_admin::NodeAdminError::NotFound(_) => {
                Error::not_found(format!("node {name} not found (see `katcall get nodes`)"))
            }
            e => e.into(),
        })
    }

    /// Whether node `name`'s certificate was revoked (`katcall delete node`).
    pub async fn node_revoked(&self, name: &str) -> Result<bool> {
        Ok(self.store.get(&keys::revoked_node(name)).await?.is_some())
    }
}
