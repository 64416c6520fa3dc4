//! What a detachable worker's node network talks to: its parent's leader and, while the node
//! is detached, its local cluster as well, so that the node's DNS answers for the workloads
//! created there too. While detached the parent is asked briefly (2 s; it is usually out of
//! reach) and its last records are served beside the local cluster's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use kat_api::wire::{DnsRecord, InstanceRecord, NodeHeartbeat, OverlayPeer, TemplateProblem};
use tokio::sync::watch;

use crate::control_plane::{Assignments, ControlPlane, LeaderLink, StoreLink};

pub struct Uplink {
    pub parent: Arc<LeaderLink>,
    /// The local cluster's link while the node is detached.
    pub local: watch::Receiver<Option<Arc<StoreLink>>>,
    /// The parent's records as it last gave them.
    parent_records: Mutex<Vec<DnsRecord>>,
}

impl Uplink {
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

    async fn publish_wireguard_key(&self, key: &str) -> Result<()> {
        self.parent.publish_wireguard_key(key).await
    }

    async fn overlay_peers(&self) -> Result<Vec<OverlayPeer>> {
        self.parent.overlay_peers().await
    }
}
