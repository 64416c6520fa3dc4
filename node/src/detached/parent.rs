//! The parent cluster of a detachable worker in production: its leader link (contact,
//! leader, revocations, subnet) and, for rejoining, a client that trusts a control-plane
//! certificate only, so a node that offers itself as the leader with a worker's key gets no
//! workload.

use std::collections::HashSet;
use std::sync::Arc;

use kat_client::node::NodeClient;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Parent;
use crate::link::{ControlPlane, LeaderLink};

/// The parent, through the worker's leader link.
pub struct LeaderParent {
    /// The worker's link to the leader.
    pub link: Arc<LeaderLink>,
    /// Calls to an offered leader, trusting a control-plane certificate only.
    pub rejoin: NodeClient,
}

#[async_trait::async_trait]
impl Parent for LeaderParent {
    fn contact(&self) -> watch::Receiver<Option<Instant>> {
        self.link.contact()
    }

    fn leader(&self) -> Option<String> {
        self.link.leader().borrow().clone()
    }

    fn revoked(&self) -> Arc<HashSet<String>> {
        self.link.revoked().borrow().clone()
    }

    async fn subnet(&self) -> Option<String> {
        self.link.subnet().await.ok().flatten()
    }

    async fn probe(&self, leader: &str) -> kat_client::Result<()> {
        self.rejoin.probe(leader).await
    }

    async fn submit(&self, leader: &str, ns: &str, bundle: Vec<u8>) -> kat_client::Result<()> {
        self.rejoin.submit_workload(leader, ns, bundle).await
    }

    fn follow(&self, leader: &str) {
        self.link.follow(leader);
    }
}
