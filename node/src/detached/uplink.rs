//! What a detachable worker's node network talks to: its parent's leader and, while the node
//! is detached, its local cluster as well, so that the node's DNS answers for the workloads
//! created there too. While detached the parent is asked briefly (2 s; it is usually out of
//! reach) and its last records are served beside the local cluster's. While attached, the
//! reads wait for changes at the leader as a plain worker's do (long polls), and a wait
//! ends when the node detaches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use kat_api::wire::{DnsRecord, InstanceRecord, NodeHeartbeat, OverlayPeer, TemplateProblem};
use tokio::sync::watch;

use crate::link::{Assignments, ControlPlane, LeaderLink, StoreLink};

/// The parent's leader link, with the local cluster's records added while detached.
pub struct Uplink {
    /// The link to the parent's leader.
    pub parent: Arc<LeaderLink>,
    /// The local cluster's link while the node is detached.
    pub local: watch::Receiver<Option<Arc<StoreLink>>>,
    /// The parent's records as it last gave them.
    parent_records: Mutex<Vec<DnsRecord>>,
}

impl Uplink {
    /// The parent's link, and the local cluster's while there is one.
    pub fn new(parent: Arc<LeaderLink>, local: watch::Receiver<Option<Arc<StoreLink>>>) -> Self {
        Uplink {
            parent,
            local,
            parent_records: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl ControlPlane for Uplink {
    async fn assignments(&self, resume: Option<i64>) -> Result<Assignments> {
        self.parent.assignments(resume).await
    }

    async fn template(&self, record: &InstanceRecord) -> Result<Option<Vec<u8>>> {
        self.parent.template(record).await
    }

    async fn heartbeat(&self, heartbeat: &NodeHeartbeat) -> Result<()> {
        self.parent.heartbeat(heartbeat).await
    }

    async fn template_problems(&self, problems: Vec<TemplateProblem>) -> Result<()> {
        self.parent.template_problems(problems).await
    }

    async fn subnet(&self) -> Result<Option<String>> {
        self.parent.subnet().await
    }

    async fn dns_records(&self) -> Result<Vec<DnsRecord>> {
        let local = self.local.borrow().clone();
        let Some(local) = local else {
            let records = self.parent.dns_records().await?;
            *self
                .parent_records
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = records.clone();
            return Ok(records);
        };
        if let Ok(Ok(records)) =
            tokio::time::timeout(Duration::from_secs(2), self.parent.dns_records()).await
        {
            *self
                .parent_records
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = records;
        }
        let mut records = self
            .parent_records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        records.extend(local.dns_records().await?);
        Ok(records)
    }

    async fn dns_records_at(&self) -> Result<(Vec<DnsRecord>, Option<i64>)> {
        if self.local.borrow().is_some() {
            // Two sources: read on a clock while detached.
            return Ok((self.dns_records().await?, None));
        }
        let (records, revision) = self.parent.dns_records_at().await?;
        *self
            .parent_records
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = records.clone();
        Ok((records, revision))
    }

    async fn dns_records_changed(&self, revision: i64, at_most: Duration) {
        // Cloned before the check: a detach after it is a change this receiver sees.
        let mut local = self.local.clone();
        if local.borrow_and_update().is_some() {
            return;
        }
        tokio::select! {
            () = self.parent.dns_records_changed(revision, at_most) => {}
            _ = local.changed() => {}
        }
    }

    async fn publish_wireguard_key(&self, key: &str) -> Result<()> {
        self.parent.publish_wireguard_key(key).await
    }

    async fn overlay_peers(&self) -> Result<Vec<OverlayPeer>> {
        self.parent.overlay_peers().await
    }

    async fn overlay_peers_at(&self) -> Result<(Vec<OverlayPeer>, Option<i64>)> {
        self.parent.overlay_peers_at().await
    }

    async fn overlay_peers_changed(&self, revision: i64, at_most: Duration) {
        self.parent.overlay_peers_changed(revision, at_most).await
    }
}
