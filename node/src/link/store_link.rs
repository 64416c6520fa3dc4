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

/// A control-plane node's link: the store itself, through its own etcd member.
pub struct StoreLink {
    store: Arc<dyn StateStore>,
    node: String,
    events: EventLog,
    wireguard_port: u32,
}

impl StoreLink {
    /// The link of `node` through `store`; the overlay's peers are reached on
    /// `wireguard_port`.
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
        // A member's capacity is recorded and checked as a worker's is by the leader's API
        // (a member writes the store itself, so this holds for an honest member only:
        // members are trusted, docs/security.md).
        let previous: Option<NodeHeartbeat> = self
            .store
            .get(&keys::node_status(&self.node))
            .await?
            .and_then(|kv| kat_store::decode_or_skip(&kv));
        kat_leader::desired::node_admin::check_capacity(
            &*self.store,
            &self.events,
            &kat_leader::Clock::system(),
            heartbeat,
            previous.as_ref(),
        )
        .await
        .context("checking this node's capacity against the approved one")?;
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

    async fn dns_records_at(&self) -> Result<(Vec<DnsRecord>, Option<i64>)> {
        let (records, revision) = kat_leader::dns::records_at(&*self.store).await?;
        Ok((records, Some(revision)))
    }

    async fn dns_records_changed(&self, revision: i64, at_most: std::time::Duration) {
        kat_leader::dns::records_changed(&*self.store, revision, at_most).await;
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

    async fn overlay_peers_at(&self) -> Result<(Vec<OverlayPeer>, Option<i64>)> {
        let (peers, revision) =
            kat_leader::overlay::peers_at(&*self.store, self.wireguard_port).await?;
        Ok((peers, Some(revision)))
    }

    async fn overlay_peers_changed(&self, revision: i64, at_most: std::time::Duration) {
        kat_leader::overlay::peers_changed(&*self.store, revision, at_most).await;
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
            let Some(r) = kat_store::decode_or_skip::<InstanceRecord>(&kv) else {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kat_api::keys;
    use kat_store::{MemStore, StateStore};
    use tokio::time::Instant;

    use super::StoreLink;
    use crate::link::ControlPlane;

    const AT_MOST: Duration = Duration::from_secs(30);

    fn record(ip: &str) -> (String, Vec<u8>) {
        let record = kat_api::wire::DnsRecord {
            namespace: "default".into(),
            workload: "web".into(),
            instance_id: kat_api::wire::InstanceId::generated("web", 1),
            ip: ip.parse().unwrap(),
            ready: true,
        };
        let key = keys::dns_record("default", "web", "A", ip);
        (key, serde_json::to_vec(&record).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_after_the_read_wakes_the_dns_server_even_one_made_before_it_waits() {
        let store = Arc::new(MemStore::new());
        let link = StoreLink::new(store.clone(), "n1", 51820);
        let (first, revision) = link.dns_records_at().await.unwrap();
        assert!(first.is_empty());
        let revision = revision.expect("a store link can watch");
        // Written between the read and the wait: the watch starts at the read's revision.
        let (key, value) = record("10.44.0.5");
        store.put(&key, value, None).await.unwrap();
        let start = Instant::now();
        link.dns_records_changed(revision, AT_MOST).await;
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let (now, _) = link.dns_records_at().await.unwrap();
        assert_eq!(now.len(), 1);

        // A change while it waits wakes it too.
        let (_, revision) = link.dns_records_at().await.unwrap();
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                store.delete(&key).await.unwrap();
            })
        };
        let start = Instant::now();
        link.dns_records_changed(revision.unwrap(), AT_MOST).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
        writer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_change_to_the_records_it_waits_the_whole_bound() {
        let store = Arc::new(MemStore::new());
        let link = StoreLink::new(store.clone(), "n1", 51820);
        let (_, revision) = link.dns_records_at().await.unwrap();
        // Other keys change all the time (heartbeats, statuses): none of it counts.
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..20u32 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let _ = store
                        .put(&keys::node_status("n1"), i.to_string().into_bytes(), None)
                        .await;
                }
            })
        };
        let start = Instant::now();
        link.dns_records_changed(revision.unwrap(), AT_MOST).await;
        assert_eq!(start.elapsed(), AT_MOST);
        writer.await.unwrap();
    }
}
