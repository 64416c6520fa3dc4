//! What the API allows a node, shared by the node (which keeps within it) and the API
//! server (which enforces it).

use std::time::Duration;

/// At most this many template problems in one report, each reason at most this long (the
/// events of one report go in one transaction, which etcd caps at 128 operations).
pub const MAX_PROBLEMS: usize = 50;
/// At most this many instance states in one heartbeat.
pub const MAX_HEARTBEAT_INSTANCES: usize = 2048;
/// A node's heartbeats: a burst of [`HEARTBEAT_BURST`] (the states of a Service's replicas
/// as they start, one after another), then one per [`MIN_HEARTBEAT_INTERVAL`] on average: a
/// worker cannot fill etcd with them.
pub const HEARTBEAT_BURST: u32 = 5;
/// See [`HEARTBEAT_BURST`].
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);

/// The longest a node's read of the DNS records or the overlay's peers waits for a change
/// (`?after=REVISION`): with no change, a worker reads them again this often.
pub const CHANGE_WAIT_MAX: Duration = Duration::from_secs(30);
