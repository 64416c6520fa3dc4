//! Many writers, one event log: the API's and the leader's logs in this process and a third
//! in another process, all writing to a real etcd at once. No event is lost or overwritten,
//! a listing is in time order, and the cap holds once the leader trims.

use std::sync::Arc;

use kat_api::wire::EventType;
use kat_leader::events::{self, event, node_ref, EventFilter, EventLog};
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, StateStore, Txn};

const PER_WRITER: usize = 334;
const ENDPOINT_VAR: &str = "KAT_TEST_EVENTS_ENDPOINT";

async fn write(store: Arc<dyn StateStore>, log: EventLog, writer: &'static str, n: usize) {
    for i in 0..n {
        // The time the writer made the event as its timestamp.
        let e = event(
            std::time::SystemTime::now().into(),
            EventType::Normal,
            "Test",
            node_ref(writer),
            format!("{writer} {i}"),
        );
        store.txn(Txn::new().and_then(log.ops(&e))).await.unwrap();
    }
}

/// The third writer: this test binary run again, with the endpoint in the environment. Does
/// nothing in a normal run.
#[tokio::test]
async fn second_process_writer() {
    let Ok(endpoint) = std::env::var(ENDPOINT_VAR) else {
        return;
    };
    let store: Arc<dyn StateStore> = Arc::new(EtcdStore::connect(&[endpoint], None).await.unwrap());
    let log = EventLog::new(1000);
    write(store, log, "process", 1000 - 2 * PER_WRITER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_concurrent_writers_lose_nothing_and_list_in_order() {
    if std::env::var(ENDPOINT_VAR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(EtcdServerConfig::loopback("events", dir.path()).unwrap())
        .await
        .expect("start etcd (apt-get install etcd-server)");
    let endpoint = server.client_url().to_string();
    let store: Arc<dyn StateStore> = Arc::new(
        EtcdStore::connect(std::slice::from_ref(&endpoint), None)
            .await
            .unwrap(),
    );
    let api = EventLog::new(1000);
    let leader = EventLog::new(1000);

    let other = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "second_process_writer", "--test-threads", "1"])
        .env(ENDPOINT_VAR, &endpoint)
        .kill_on_drop(true)
        .status();
    let (status, (), ()) = tokio::join!(
        other,
        write(store.clone(), api.clone(), "api", PER_WRITER),
        write(store.clone(), leader.clone(), "leader", PER_WRITER),
    );
    assert!(status.unwrap().success(), "the second process failed");

    let listing = store.list("/kat/events/").await.unwrap();
    assert_eq!(listing.kvs.len(), 1000, "every event has its own key");
    let all = events::list(&*store, &EventFilter::default(), 1000)
        .await
        .unwrap();
    assert_eq!(all.len(), 1000);
    let mut keys: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
    keys.sort_unstable();
    // Time order: every writer's own events come in the order it wrote them, and the keys
    // follow the commit order (etcd's revisions) within a writer.
    for writer in ["api", "leader", "process"] {
        let mine: Vec<usize> = all
            .iter()
            .filter(|e| e.involved_object.name == writer)
            .map(|e| e.message.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        let expected = if writer == "process" {
            1000 - 2 * PER_WRITER
        } else {
            PER_WRITER
        };
        assert_eq!(
            mine,
            (0..expected).collect::<Vec<_>>(),
            "{writer}'s events in order"
        );
    }
    // Across writers: the listing is in the order the events were made. (Per-process
    // counters, as before, put one writer's events after another's, seconds apart.) A writer
    // can be preempted between taking the time and allocating the key: 50 ms of slack.
    let mut latest = 0u128;
    for e in &all {
        let made = u128::from(e.timestamp.unix_millis()) * 1_000_000;
        assert!(
            made + 50_000_000 >= latest,
            "{} listed after an event made {} ms later",
            e.message,
            (latest - made) / 1_000_000
        );
        latest = latest.max(made);
    }

    // The cap: 100 more, then the leader trims; the newest 1000 stay, the oldest went.
    write(store.clone(), leader.clone(), "late", 100).await;
    assert_eq!(
        events::list(&*store, &EventFilter::default(), 1000)
            .await
            .unwrap()
            .len(),
        1000,
        "a reader never sees more than the cap"
    );
    let trimmed = leader.trim(&*store).await.unwrap();
    assert_eq!(trimmed, 100);
    let kept = store.list("/kat/events/").await.unwrap();
    assert_eq!(kept.kvs.len(), 1000);
    let newest = events::list(&*store, &EventFilter::default(), 1000)
        .await
        .unwrap();
    assert_eq!(newest.last().unwrap().message, "late 99");
    let oldest_kept = &keys[100];
    assert_eq!(
        kept.kvs.iter().map(|kv| kv.key.as_str()).min().unwrap(),
        *oldest_kept,
        "the oldest 100 went"
    );
    drop(server);
}
