//! A control-plane node's link: the store itself (its own etcd member, over mutual TLS).

use std::sync::Arc;

use anyhow::{Context, Result};
use kat_api::keys;
use kat_api::wire::{
    DnsRecord, EventType, InstanceRecord, NodeHeartbeat, OverlayPeer, TemplateProblem,
};
use kat_leader::assignments::AssignmentWatch;
use kat_leader::events::EventLog;
use kat_store::{StateStore, Txn};
use tokio::sync::mpsc;

use super::{Assignments, ControlPlane};

pub struct StoreLink {
    store: Arc<dyn StateStore>,
    node: String,
    events: EventLog,
    wireguard_port: u32,
}

impl StoreLink {
    pub fn new(store: Arc<dyn StateStore>, node: &str, wireguard_port: u32) -> Self {
        StoreLink {
            store,
            wireguard_port,
            node: node.to_string(),
            events: EventLog::new(kat_leader::events::DEFAULT_CAPACITY),
        }
    }
}

#[async_trait::async_trait]
impl ControlPlane for StoreLink {
    async fn assignments(&self, resume: Option<i64>) -> Result<Assignments> {
        let mut watch = AssignmentWatch::start(self.store.clone(), &self.node, resume)
            .await
            .context("listing this node's assignments")?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    update = watch.next() => {
                        let Some(update) = update else { return };
                        let failed = update.is_err();
                        if tx.send(update.map_err(anyhow::Error::from)).await.is_err() || failed {
                            return;
                        }
                    }
                    () = tx.closed() => return,
                }
            }
        });
        Ok(rx)
    }

    async fn template(&self, record: &InstanceRecord) -> Result<Option<Vec<u8>>> {
        let key = keys::template(&record.namespace, &record.workload, &record.spec_hash);
        Ok(self.store.get(&key).await?.map(|kv| kv.value))
    }

    fn heartbeats_rate_limited(&self) -> bool {
        false
    }

    async fn heartbeat(&self, heartbeat: &NodeHeartbeat) -> Result<()> {
        self.store
            .put(
                &keys::node_status(&self.node),
                serde_json::to_vec(heartbeat)?,
                None,
            )
            .await?;
        Ok(())
    }

    async fn subnet(&self) -> Result<Option<String>> {
        Ok(self
            .store
            .get(&keys::node_subnet(&self.node))
            .await?
            .and_then(|kv| String::from_utf8(kv.value).ok()))
    }

    async fn dns_records(&self) -> Result<Vec<DnsRecord>> {
        Ok(kat_leader::dns::records(&*self.store).await?)
    }

    async fn publish_wireguard_key(&self, key: &str) -> Result<()> {
        self.store
            .put(
                &keys::wireguard_key(&self.node),
                key.as_bytes().to_vec(),
                None,
            )
            .await?;
        Ok(())
    }

    async fn overlay_peers(&self) -> Result<Vec<OverlayPeer>> {
        Ok(kat_leader::overlay::peers(&*self.store, self.wireguard_port).await?)
    }

    async fn template_problems(&self, problems: Vec<TemplateProblem>) -> Result<()> {
        let mut ops = Vec::new();
        for p in problems {
            let Some(kv) = self
                .store
                .get(&keys::instance(&self.node, &p.instance_id))
                .await?
            else {
                continue;
            };
            let Ok(r) = serde_json::from_slice::<InstanceRecord>(&kv.value) else {
                continue;
            };
            ops.extend(self.events.ops(&kat_leader::events::event(
                kat_api::wire::Timestamp::now(),
                EventType::Warning,
                "TemplateMissing",
                kat_leader::events::workload_ref(&r.namespace, &r.workload),
                format!(
                    "instance {} on node {}: {}",
                    r.instance_id, self.node, p.reason
                ),
            )));
        }
        self.store.txn(Txn::new().and_then(ops)).await?;
        Ok(())
    }
}
