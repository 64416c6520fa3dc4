//! Values that cross the [`StateStore`](crate::StateStore) interface.

use std::time::Duration;

use tokio::sync::mpsc;

pub type Revision = i64;
pub type LeaseId = i64;
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("revision {requested} has been compacted (history starts at {compacted}); list the keys again and watch from the listing's revision")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("lease {0:x} was not found: it expired or was revoked")]
    LeaseNotFound(LeaseId),
    #[error("state store unavailable: {0} (is etcd running and reachable?)")]
    Unavailable(String),
    #[error("state store request failed: {0}")]
    Backend(String),
    #[error("invalid state store request: {0}")]
    InvalidRequest(String),
    /// A value that could not be encoded for, or decoded from, `key`.
    #[error("state store value at {key} {detail}")]
    Value { key: String, detail: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// 1 when created, +1 per change; 0 means "does not exist" in compares.
    pub version: i64,
    /// 0 when not attached to a lease.
    pub lease: LeaseId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    /// The store revision the listing was read at.
    pub revision: Revision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// For a delete: the key, an empty value and `mod_revision` = the deletion's revision.
    pub kv: KeyValue,
    /// The value before this event, if there was one.
    pub prev: Option<KeyValue>,
}

impl WatchEvent {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WatchOptions {
    pub prefix: bool,
    /// First revision to deliver; 0 means changes after the current revision.
    pub start_revision: Revision,
}

impl WatchOptions {
    pub fn key() -> Self {
        WatchOptions {
            prefix: false,
            start_revision: 0,
        }
    }
    pub fn prefix() -> Self {
        WatchOptions {
            prefix: true,
            start_revision: 0,
        }
    }
    pub fn from_revision(mut self, revision: Revision) -> Self {
        self.start_revision = revision;
        self
    }
}

/// A stream of watch events. It ends with an error (and then `None`) when the watch can no
/// longer continue, e.g. [`StoreError::Compacted`] or a lost connection: the caller resumes
/// with a new watch from the last revision it saw + 1.
pub struct WatchStream {
    rx: mpsc::UnboundedReceiver<Result<WatchEvent>>,
    _guard: Option<Box<dyn Send + Sync>>,
}

impl WatchStream {
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<Result<WatchEvent>>,
        guard: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        WatchStream { rx, _guard: guard }
    }

    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        self.rx.recv().await
    }

    /// An event that has already arrived, without waiting. `None` when there is none yet, or
    /// the stream has ended (then [`WatchStream::next`] returns `None` too).
    pub fn try_next(&mut self) -> Option<Result<WatchEvent>> {
        self.rx.try_recv().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(Revision),
    ModRevision(Revision),
    Value(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub target: CompareTarget,
    pub op: CompareOp,
}

impl Compare {
    pub fn new(key: impl Into<String>, target: CompareTarget, op: CompareOp) -> Self {
        Compare {
            key: key.into(),
            target,
            op,
        }
    }
    /// The key does not exist.
    pub fn absent(key: impl Into<String>) -> Self {
        Self::new(key, CompareTarget::Version(0), CompareOp::Equal)
    }
    pub fn version_is(key: impl Into<String>, version: i64) -> Self {
        Self::new(key, CompareTarget::Version(version), CompareOp::Equal)
    }
    /// The key was last changed at `revision` (compare-and-swap on a value read earlier).
    pub fn mod_revision_is(key: impl Into<String>, revision: Revision) -> Self {
        Self::new(key, CompareTarget::ModRevision(revision), CompareOp::Equal)
    }
    pub fn create_revision_is(key: impl Into<String>, revision: Revision) -> Self {
        Self::new(
            key,
            CompareTarget::CreateRevision(revision),
            CompareOp::Equal,
        )
    }
    pub fn value_is(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self::new(key, CompareTarget::Value(value.into()), CompareOp::Equal)
    }

    /// Evaluate against the key's current state (`None` = absent: version, revisions 0,
    /// and a value compare is false, as in etcd).
    pub fn holds(&self, kv: Option<&KeyValue>) -> bool {
        use std::cmp::Ordering;
        let ordering = match (&self.target, kv) {
            (CompareTarget::Version(v), kv) => kv.map_or(0, |k| k.version).cmp(v),
            (CompareTarget::CreateRevision(r), kv) => kv.map_or(0, |k| k.create_revision).cmp(r),
            (CompareTarget::ModRevision(r), kv) => kv.map_or(0, |k| k.mod_revision).cmp(r),
            (CompareTarget::Value(v), Some(k)) => k.value.cmp(v),
            (CompareTarget::Value(_), None) => return false,
        };
        match self.op {
            CompareOp::Equal => ordering == Ordering::Equal,
            CompareOp::NotEqual => ordering != Ordering::Equal,
            CompareOp::Less => ordering == Ordering::Less,
            CompareOp::Greater => ordering == Ordering::Greater,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }
    pub fn put_leased(key: impl Into<String>, value: impl Into<Vec<u8>>, lease: LeaseId) -> Self {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }
    pub fn delete(key: impl Into<String>) -> Self {
        TxnOp::Delete { key: key.into() }
    }
    pub fn get(key: impl Into<String>) -> Self {
        TxnOp::Get { key: key.into() }
    }

    /// Approximate bytes on the wire, for keeping transactions under [`MAX_TXN_BYTES`].
    pub fn size(&self) -> usize {
        match self {
            TxnOp::Put { key, value, .. } => key.len() + value.len() + 16,
            TxnOp::Delete { key } | TxnOp::Get { key } => key.len() + 16,
        }
    }
}

/// Split groups of ops into transactions of at most `max_ops` operations and
/// [`MAX_TXN_BYTES`] bytes, never splitting a group (a group larger than a whole
/// transaction goes alone).
pub fn batch_groups(groups: Vec<Vec<TxnOp>>, max_ops: usize) -> Vec<Vec<TxnOp>> {
    let mut batches = Vec::new();
    let mut batch: Vec<TxnOp> = Vec::new();
    let mut bytes = 0;
    for group in groups {
        let group_bytes: usize = group.iter().map(TxnOp::size).sum();
        if !batch.is_empty()
            && (batch.len() + group.len() > max_ops || bytes + group_bytes > MAX_TXN_BYTES)
        {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += group_bytes;
        batch.extend(group);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// etcd's default limit of operations in one transaction.
pub const MAX_TXN_OPS: usize = 128;

/// A safe size for one transaction: etcd refuses requests over 1.5 MiB by default.
pub const MAX_TXN_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(compares);
        self
    }
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.success.extend(ops);
        self
    }
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.failure.extend(ops);
        self
    }

    pub(crate) fn check_size(&self) -> Result<()> {
        let n = self.success.len().max(self.failure.len());
        if n > MAX_TXN_OPS || self.compares.len() > MAX_TXN_OPS {
            return Err(StoreError::InvalidRequest(format!("a transaction holds at most {MAX_TXN_OPS} operations, this one {n}; split it into batches")));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: Revision,
    /// One entry per `Get` op of the branch that ran, in order.
    pub gets: Vec<Option<KeyValue>>,
}

/// Lease TTLs are whole seconds in etcd; round up so a lease never lives shorter than asked.
pub(crate) fn ttl_seconds(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}
