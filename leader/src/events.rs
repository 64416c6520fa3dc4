//! The capped event log in etcd (RFC 001 §9.3).
//!
//! Events are keys `/kat/events/{sequence}`; the writer of event `n` deletes event
//! `n - capacity` in the same transaction, so the log never grows past its capacity and
//! needs no separate clean-up. Readers list or watch the prefix and filter.

use std::sync::{Arc, Mutex};

use kat_api::keys;
use kat_api::wire::{Event, EventType, ObjectReference};
use kat_store::{Result, StateStore, TxnOp};

pub const DEFAULT_CAPACITY: u64 = 1000;

/// Allocates sequence numbers; shared by everything in the leader process that records events.
#[derive(Clone)]
pub struct EventLog {
    inner: Arc<Mutex<State>>,
}

struct State {
    next: u64,
    capacity: u64,
}

impl EventLog {
    /// Continue after the newest event in the store.
    pub async fn open(store: &dyn StateStore, capacity: u64) -> Result<Self> {
        let listing = store.list(keys::EVENTS).await?;
        let next = listing
            .kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(keys::EVENTS)?.parse::<u64>().ok())
            .max()
            .map_or(0, |n| n + 1);
        Ok(EventLog {
            inner: Arc::new(Mutex::new(State {
                next,
                capacity: capacity.max(1),
            })),
        })
    }

    /// The writes that record `event` (and drop the oldest beyond capacity).
    pub fn ops(&self, event: &Event) -> Vec<TxnOp> {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let seq = state.next;
        state.next += 1;
        let mut ops = vec![TxnOp::put(
            keys::event(seq),
            serde_json::to_vec(event).unwrap_or_default(),
        )];
        if seq >= state.capacity {
            ops.push(TxnOp::delete(keys::event(seq - state.capacity)));
        }
        ops
    }
}

/// Build an event.
pub fn event(
    timestamp: String,
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
            if let Ok(event) = serde_json::from_slice::<Event>(&e.kv.value) {
                if filter.matches(&event) && tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// Events in the store that match `filter`, oldest first.
pub async fn list(store: &dyn StateStore, filter: &EventFilter) -> Result<Vec<Event>> {
    let listing = store.list(keys::EVENTS).await?;
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Event>(&kv.value).ok())
        .filter(|e| filter.matches(e))
        .collect())
}
