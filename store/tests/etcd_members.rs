//! The quorum's membership as a join changes it: a learner added is recorded where the
//! members' promotion loops watch (so they need not list the members on a clock), and a
//! learner that has not started is counted as waiting, not promoted.

use std::time::{Duration, Instant};

use kat_api::keys;
use kat_store::etcd::Promotion;
use kat_store::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_learner_wakes_the_watch_and_waits_for_promotion() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(EtcdServerConfig::loopback("node-1", dir.path()).unwrap())
        .await
        .unwrap();
    let store = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    assert_eq!(
        store.promote_learners().await.unwrap(),
        Promotion::default()
    );

    let revision = store.list(keys::etcd_learners()).await.unwrap().revision;
    let watcher = {
        let store = store.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            kat_store::changes::changed_after(
                &store,
                keys::etcd_learners(),
                revision,
                Duration::from_secs(30),
            )
            .await;
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watcher.is_finished(), "the watch returned with no learner");
    // A peer that never starts: nothing listens on port 9 (discard) of loopback here.
    let initial = store
        .add_learner("node-2", "https://127.0.0.1:9")
        .await
        .unwrap();
    assert!(initial.contains("node-2=https://127.0.0.1:9"), "{initial}");
    let waited = tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the learner woke the watch")
        .unwrap();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let recorded = store.get(&keys::etcd_learner("node-2")).await.unwrap();
    assert_eq!(recorded.unwrap().value, b"https://127.0.0.1:9");

    // Not started, so not promoted: still waiting (the loop lists again in 2 s).
    let promotion = store.promote_learners().await.unwrap();
    assert_eq!(
        promotion,
        Promotion {
            promoted: vec![],
            waiting: 1
        }
    );
    server.stop().await;
}
