//! KAT's state: the [`StateStore`] trait (RFC 001 §5.1) and its two implementations.
//!
//! etcd is the source of truth in production ([`EtcdStore`]); [`MemStore`] implements the same
//! semantics in-process (revisions, watches from old revisions, compaction, leases that expire
//! under tokio's clock) so that controllers can be tested fast and deterministically with
//! `tokio::time::pause()`. One conformance suite (`tests/conformance.rs`) runs against both.
//!
//! Leader election ([`election`]) is written once on top of the trait's primitives, using the
//! same algorithm as etcd's `concurrency` package: candidates create leased keys under a
//! prefix, and the one with the lowest create revision leads. [`etcd_server`] starts and
//! supervises the etcd process the agent owns; [`snapshot`] writes and checks its backups.

pub mod changes;
pub mod election;
pub mod etcd;
pub mod etcd_server;
pub mod etcd_tls;
mod json;
pub mod mem;
pub mod snapshot;
mod types;

pub use election::{campaign, current_leader, Leadership};
pub use etcd::EtcdStore;
pub use etcd_server::{EtcdHealth, EtcdServer, EtcdServerConfig, EtcdServerError};
pub use etcd_tls::EtcdTls;
pub use json::{decode, decode_or_skip, decode_value, decode_value_or_skip, encode, JsonStore};
pub use mem::MemStore;
pub use types::*;

use std::time::Duration;

use async_trait::async_trait;

/// The only door to cluster state.
///
/// Revisions are global and increase with every write; each key carries the revision that
/// created it, the revision of its last change and a per-key version (1 on create). A watch
/// started at revision `r` delivers every change from `r` on, in order, exactly once, or fails
/// with [`StoreError::Compacted`] when `r` is older than the retained history.
#[async_trait]
pub trait StateStore: Send + Sync + 'static {
    /// Store `value` at `key`, attached to `lease` if given. Returns the new revision.
    async fn put(&self, key: &str, value: Vec<u8>, lease: Option<LeaseId>) -> Result<Revision>;

    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Delete `key`; `false` if it did not exist.
    async fn delete(&self, key: &str) -> Result<bool>;

    /// Delete every key under `prefix`; returns how many were deleted.
    async fn delete_prefix(&self, prefix: &str) -> Result<u64>;

    /// Every key under `prefix` in key order, with the store revision of the read, so that a
    /// watch from `revision + 1` continues exactly where the listing ended.
    async fn list(&self, prefix: &str) -> Result<Listing>;

    /// Watch one key, or every key under a prefix, from `start_revision` (0 = from now).
    async fn watch(&self, key: &str, options: WatchOptions) -> Result<WatchStream>;

    /// All compares hold ⇒ `success` ops run, else `failure` ops, atomically at one revision.
    async fn txn(&self, txn: Txn) -> Result<TxnResult>;

    /// A lease that expires `ttl` after its last keep-alive; keys attached to it go with it.
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId>;

    /// Refresh a lease; [`StoreError::LeaseNotFound`] once it has expired or was revoked.
    async fn keep_alive(&self, lease: LeaseId) -> Result<()>;

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Forget history before `revision`: watches from earlier revisions fail afterwards.
    async fn compact(&self, revision: Revision) -> Result<()>;
}
