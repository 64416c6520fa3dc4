//! The event log: capped, filtered, watchable, continued by a new leader.

use std::sync::Arc;

use kat_api::wire::{EventType, Timestamp};
use kat_leader::events::{self, event, node_ref, workload_ref, EventFilter, EventLog};
use kat_store::{MemStore, StateStore, Txn};

async fn record(store: &dyn StateStore, log: &EventLog, e: kat_api::wire::Event) {
    store.txn(Txn::new().and_then(log.ops(&e))).await.unwrap();
}

#[tokio::test]
async fn capped_filtered_and_watchable() {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let log = EventLog::new(10);
    let start = store.list("/kat/events/").await.unwrap().revision + 1;
    let mut all = events::watch(&*store, EventFilter::default(), start)
        .await
        .unwrap();
    let mut web_only = events::watch(
        &*store,
        EventFilter {
            name: Some("web".into()),
            ..Default::default()
        },
        start,
    )
    .await
    .unwrap();
    for i in 0..25 {
        let (obj, reason) = if i % 5 == 0 {
            (node_ref("n1"), "NodeReady")
        } else {
            (
                workload_ref(if i % 2 == 0 { "prod" } else { "default" }, "web"),
                "Scheduled",
            )
        };
        record(
            &*store,
            &log,
            event(
                Timestamp::now(),
                EventType::Normal,
                reason,
                obj,
                format!("event {i}"),
            ),
        )
        .await;
    }
    let kept = events::list(&*store, &EventFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(kept.len(), 10, "capped at its capacity");
    assert_eq!(
        kept.first().unwrap().message,
        "event 15",
        "the oldest go first"
    );
    assert_eq!(kept.last().unwrap().message, "event 24");

    let nodes = events::list(
        &*store,
        &EventFilter {
            resource_type: Some("node".into()),
            ..Default::default()
        },
        10,
    )
    .await
    .unwrap();
    assert_eq!(
        nodes.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        ["event 15", "event 20"]
    );
    let prod = events::list(
        &*store,
        &EventFilter {
            namespace: Some("prod".into()),
            name: Some("web".into()),
            ..Default::default()
        },
        10,
    )
    .await
    .unwrap();
    assert!(prod
        .iter()
        .all(|e| e.involved_object.namespace.as_deref() == Some("prod")));
    assert_eq!(prod.len(), 4);

    for i in 0..25 {
        assert_eq!(
            all.recv().await.unwrap().message,
            format!("event {i}"),
            "the watch sees every event in order"
        );
    }
    assert_eq!(web_only.recv().await.unwrap().message, "event 1");

    // A new writer continues the sequence instead of overwriting.
    let log2 = EventLog::new(10);
    record(
        &*store,
        &log2,
        event(
            Timestamp::now(),
            EventType::Warning,
            "X",
            node_ref("n2"),
            "after restart",
        ),
    )
    .await;
    let kept = events::list(&*store, &EventFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(kept.len(), 10);
    assert_eq!(kept.last().unwrap().message, "after restart");
}
