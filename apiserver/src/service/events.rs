//! Events (list and watch) and the nodes' heartbeats that `/metrics` and `top` read.

use kat_api::keys;
use kat_api::wire::{Event, NodeHeartbeat};
use kat_leader::events::{self, EventFilter};
use tokio::sync::mpsc;

use super::{Result, Service};

impl Service {
    /// The newest `limit` events matching `filter`, oldest first.
    pub async fn events(&self, filter: &EventFilter, limit: usize) -> Result<Vec<Event>> {
        let (mut matching, _) =
            events::list_at(&*self.store, filter, self.events.capacity()).await?;
        keep_newest(&mut matching, limit);
        Ok(matching)
    }

    /// As [`Service::events`], then every matching event as it is written, through one
    /// channel; ends when the receiver is dropped or the store's watch ends.
    pub async fn watch_events(
        &self,
        filter: EventFilter,
        limit: usize,
    ) -> Result<mpsc::Receiver<Event>> {
        let (mut backlog, revision) =
            events::list_at(&*self.store, &filter, self.events.capacity()).await?;
        keep_newest(&mut backlog, limit);
        let mut live = events::watch(&*self.store, filter, revision + 1).await?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            for event in backlog {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            while let Some(event) = live.recv().await {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }

    /// Every node's last heartbeat: instance states and what nodes and instances use.
    pub async fn heartbeats(&self) -> Result<Vec<NodeHeartbeat>> {
        Ok(self
            .store
            .list(keys::node_statuses())
            .await?
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip)
            .collect())
    }
}

fn keep_newest(events: &mut Vec<Event>, limit: usize) {
    if events.len() > limit {
        events.drain(..events.len() - limit);
    }
}
