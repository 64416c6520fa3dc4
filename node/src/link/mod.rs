//! How a node reaches the control plane: the one seam between the node's own work
//! (supervisor, feed, heartbeat) and where cluster state lives.
//!
//! A control-plane node (an etcd member) reads and writes the store directly
//! ([`StoreLink`]). A worker holds no etcd credentials and goes through the leader's API with
//! its node certificate ([`LeaderLink`]), which authorizes it for its own records only. Both
//! give the same assignment stream ([`kat_leader::assignments`]), so the feed, the
//! supervisor and the heartbeat do not know which kind of node they run on.

mod leader_link;
mod store_link;

use anyhow::Result;
use kat_api::wire::{
    AssignmentUpdate, DnsRecord, InstanceRecord, NodeHeartbeat, OverlayPeer, TemplateProblem,
};
use tokio::sync::mpsc;

pub use leader_link::{write_endpoints, LeaderLink};
pub use store_link::StoreLink;

/// A node's assignment stream; it ends (or yields an error) when the connection does.
pub type Assignments = mpsc::Receiver<Result<AssignmentUpdate>>;

/// What a node asks of the control plane and tells it, wherever cluster state lives:
/// [`StoreLink`] on a control-plane node, [`LeaderLink`] on a worker.
#[async_trait::async_trait]
pub trait ControlPlane: Send + Sync {
    /// This node's instance records: a snapshot then changes, or (with `resume`, the last
    /// revision seen) the changes since, or a new snapshot when that history is gone.
    async fn assignments(&self, resume: Option<i64>) -> Result<Assignments>;

    /// The stored template (JSON) an instance names; `None` when it is gone.
    async fn template(&self, record: &InstanceRecord) -> Result<Option<Vec<u8>>>;

    /// Record `heartbeat` as this node's status.
    async fn heartbeat(&self, heartbeat: &NodeHeartbeat) -> Result<()>;

    /// Whether heartbeats go through the leader's API and its per-node limit
    /// (`kat_api::node_limits::HEARTBEAT_BURST`); a control-plane node writes its own.
    fn heartbeats_rate_limited(&self) -> bool {
        true
    }

    /// Instances of this node whose template is unusable: `TemplateMissing` events.
    async fn template_problems(&self, problems: Vec<TemplateProblem>) -> Result<()>;

    /// This node's subnet of `clusterCIDR`, once the leader has given it one.
    async fn subnet(&self) -> Result<Option<String>>;

    /// The cluster's DNS records, for this node's DNS server.
    async fn dns_records(&self) -> Result<Vec<DnsRecord>>;

    /// [`ControlPlane::dns_records`], and the store revision they were read at where this
    /// link can wait for a change after it ([`ControlPlane::dns_records_changed`]).
    async fn dns_records_at(&self) -> Result<(Vec<DnsRecord>, Option<i64>)> {
        Ok((self.dns_records().await?, None))
    }

    /// Returns once the DNS records read at `revision` may have changed, or after `at_most`.
    /// A link that cannot watch (it gave no revision) is never asked.
    async fn dns_records_changed(&self, _revision: i64, at_most: std::time::Duration) {
        tokio::time::sleep(at_most).await;
    }

    /// Publishes this node's WireGuard public key (base64).
    async fn publish_wireguard_key(&self, key: &str) -> Result<()>;

    /// Every node of the overlay (this one included).
    async fn overlay_peers(&self) -> Result<Vec<OverlayPeer>>;

    /// [`ControlPlane::overlay_peers`], and a revision to wait for changes after, where this
    /// link can ([`ControlPlane::overlay_peers_changed`]).
    async fn overlay_peers_at(&self) -> Result<(Vec<OverlayPeer>, Option<i64>)> {
        Ok((self.overlay_peers().await?, None))
    }

    /// Returns once the peers read at `revision` may have changed, or after `at_most`.
    async fn overlay_peers_changed(&self, _revision: i64, at_most: std::time::Duration) {
        tokio::time::sleep(at_most).await;
    }
}
