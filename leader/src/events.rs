//! The capped event log in etcd (RFC 001 §9.3).
//!
//! Any number of writers, in any number of processes on any nodes, record events at once:
//! the API of every node, the leader, the agents. So an event's key is not a shared counter
//! but an id ordered by time and unique per writer: `/kat/events/{nanos}-{writer}`, where
//! `nanos` is the writer's wall clock in nanoseconds since the epoch (16 hex digits, so the
//! keys sort by time), strictly increasing per writer, and `writer` a random 64-bit id drawn
//! when the log is opened. Two writers never produce the same key, a writer never reuses one
//! after a restart (a new id), and a listing, sorted by key, is in time order.
//!
//! An event is written in the same transaction as the change it reports (callers add
//! [`EventLog::ops`] to their own). Without a shared counter a writer cannot know which event
//! is the oldest, so the cap is kept apart from the writes: readers never see more than the
//! newest `capacity` events ([`list`]), and [`EventLog::maintain`], which the leader runs every
//! round, deletes the older ones once its own writes since the last trim reach a twentieth of
//! the capacity or 30 seconds have passed. Between two trims the store holds at most the
//! events written since the last one beyond the cap.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kat_api::keys;
use kat_api::wire::{Event, EventType, ObjectReference, Timestamp};
use kat_store::{Result, StateStore, Txn, TxnOp};

pub const DEFAULT_CAPACITY: u64 = 1000;

/// Most keys deleted in one trimming transaction (etcd's default `--max-txn-ops` is 128).
const TRIM_BATCH: usize = 100;

/// Allocates event keys for one writer; clones share it.
#[derive(Clone)]
pub struct EventLog {
    inner: Arc<Mutex<State>>,
    writer: u64,
    capacity: u64,
}

struct State {
    /// The nanosecond of the last key, so the next one is later even if the clock is not.
    last_nanos: u64,
    /// Events allocated since the last trim.
    since_trim: u64,
    last_trim: Option<Instant>,
}

/// Trim at least this often while events are written anywhere.
const TRIM_EVERY: Duration = Duration::from_secs(30);

impl EventLog {
    /// A new writer keeping at most `capacity` events. Nothing is read: its keys never collide
    /// with other writers' or with its own before a restart (a new writer id).
    pub fn new(capacity: u64) -> Self {
        EventLog {
            inner: Arc::new(Mutex::new(State {
                last_nanos: 0,
                since_trim: 0,
                last_trim: None,
            })),
            writer: rand::random(),
            capacity: capacity.max(1),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The write that records `event`.
    pub fn ops(&self, event: &Event) -> Vec<TxnOp> {
        // u64 nanoseconds since 1970 last until 2554.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let nanos = {
            let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            state.last_nanos = now.max(state.last_nanos + 1);
            state.since_trim += 1;
            state.last_nanos
        };
        let value = match serde_json::to_vec(event) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "an event could not be encoded; dropped");
                return Vec::new();
            }
        };
        vec![TxnOp::put(keys::event(nanos, self.writer), value)]
    }

    /// Delete the events older than the newest `capacity`. Safe beside other writers and other
    /// trimmers: a key deleted twice is deleted once, and a newer event is never older than
    /// the ones kept.
    pub async fn trim(&self, store: &dyn StateStore) -> Result<usize> {
        {
            let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            state.since_trim = 0;
            state.last_trim = Some(Instant::now());
        }
        let listing = store.list(keys::EVENTS).await?;
        let excess = listing.kvs.len().saturating_sub(self.capacity as usize);
        let mut oldest: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
        oldest.sort_unstable();
        for batch in oldest[..excess].chunks(TRIM_BATCH) {
            let ops: Vec<TxnOp> = batch.iter().map(|k| TxnOp::delete(k.to_string())).collect();
            store.txn(Txn::new().and_then(ops)).await?;
        }
        Ok(excess)
    }

    /// Trim when it is due: this writer wrote a twentieth of the capacity since the last
    /// trim, or [`TRIM_EVERY`] has passed (other writers' events count then).
    pub async fn maintain(&self, store: &dyn StateStore) -> Result<usize> {
        let due = {
            let state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            state.since_trim >= (self.capacity / 20).max(1)
                || state.last_trim.is_none_or(|t| t.elapsed() >= TRIM_EVERY)
        };
        if !due {
            return Ok(0);
        }
        self.trim(store).await
    }
}

/// Build an event.
pub fn event(
    timestamp: Timestamp,
    event_type: EventType,
    reason: &str,
    object: ObjectReference,
    message: impl Into<String>,
) -> Event {
    Event {
        timestamp,
        event_type,
        reason: reason.to_string(),
        involved_object: object,
        message: message.into(),
    }
}

pub fn workload_ref(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        kind: "Workload".into(),
        name: name.to_string(),
        namespace: Some(ns.to_string()),
        uid: None,
    }
}

pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        kind: "Node".into(),
        name: name.to_string(),
        namespace: None,
        uid: None,
    }
}

/// Filters of `GET /events` and `katcall events`.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub resource_type: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

impl EventFilter {
    pub fn matches(&self, e: &Event) -> bool {
        let o = &e.involved_object;
        self.resource_type
            .as_ref()
            .is_none_or(|t| t.eq_ignore_ascii_case(&o.kind))
            && self.name.as_ref().is_none_or(|n| *n == o.name)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| o.namespace.as_ref() == Some(ns))
    }
}

/// Events recorded after `from_revision` that match `filter`, as they are written: the
/// source of `katcall events --watch`. Ends when the underlying watch ends.
pub async fn watch(
    store: &dyn StateStore,
    filter: EventFilter,
    from_revision: i64,
) -> Result<tokio::sync::mpsc::Receiver<Event>> {
    let mut stream = store
        .watch(
            keys::EVENTS,
            kat_store::WatchOptions::prefix().from_revision(from_revision),
        )
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        while let Some(Ok(e)) = stream.next().await {
            if e.kind != kat_store::EventKind::Put {
                continue; // trimming the oldest entry
            }
            if let Some(event) = kat_store::decode_or_skip::<Event>(&e.kv) {
                if filter.matches(&event) && tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// The newest `capacity` events in the store that match `filter`, oldest first.
pub async fn list(
    store: &dyn StateStore,
    filter: &EventFilter,
    capacity: u64,
) -> Result<Vec<Event>> {
    Ok(list_at(store, filter, capacity).await?.0)
}

/// As [`list`], with the store revision of the listing: [`watch`] from the next revision
/// continues it without a gap or a repeat.
pub async fn list_at(
    store: &dyn StateStore,
    filter: &EventFilter,
    capacity: u64,
) -> Result<(Vec<Event>, i64)> {
    let listing = store.list(keys::EVENTS).await?;
    // Keys sort by time; readers never see more than the cap, even before a trim.
    let mut kvs: Vec<_> = listing.kvs.iter().collect();
    kvs.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let newest = kvs.len().saturating_sub(capacity as usize);
    let events = kvs[newest..]
        .iter()
        .filter_map(|kv| kat_store::decode_or_skip::<Event>(kv))
        .filter(|e| filter.matches(e))
        .collect();
    Ok((events, listing.revision))
}
