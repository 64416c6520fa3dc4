//! MemStore under tokio's paused clock: lease expiry and leader handover in simulated time,
//! the way controller simulations will use it. No test here waits in real time.

use std::sync::Arc;
use std::time::Duration;

use kat_store::*;
use tokio::time::{advance, Instant};

#[tokio::test(start_paused = true)]
async fn lease_expires_exactly_at_its_ttl() {
    let s = MemStore::new();
    let lease = s.grant_lease(Duration::from_secs(10)).await.unwrap();
    s.put("/node/a", b"up".to_vec(), Some(lease)).await.unwrap();
    let mut w = s.watch("/node/", WatchOptions::prefix()).await.unwrap();

    advance(Duration::from_secs(9)).await;
    assert!(s.get("/node/a").await.unwrap().is_some(), "alive at 9s");
    s.keep_alive(lease).await.unwrap();
    advance(Duration::from_secs(9)).await;
    assert!(
        s.get("/node/a").await.unwrap().is_some(),
        "refreshed at 9s, alive at 18s"
    );

    let before = Instant::now();
    let e = w.next().await.unwrap().unwrap(); // auto-advances the paused clock to the expiry
    assert_eq!(e.kind, EventKind::Delete);
    assert_eq!(e.prev.unwrap().value, b"up");
    assert_eq!(
        Instant::now() - before,
        Duration::from_secs(1),
        "expires 10s after the last keep-alive"
    );
    assert!(matches!(
        s.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn leader_handover_in_simulated_time() {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let ttl = Duration::from_secs(15);
    let a = campaign(store.clone(), "/el/", "a", ttl).await.unwrap();
    let b = tokio::spawn(campaign(store.clone(), "/el/", "b", ttl));

    // An hour of simulated time: a keeps its leadership by refreshing its lease.
    advance(Duration::from_secs(3600)).await;
    assert!(a.is_leader());
    assert!(!b.is_finished());

    let killed_at = Instant::now();
    a.abandon();
    let b = b.await.unwrap().unwrap();
    let handover = Instant::now() - killed_at;
    assert!(
        handover <= ttl + Duration::from_secs(1),
        "handover took {handover:?}"
    );
    assert_eq!(
        current_leader(&*store, "/el/").await.unwrap().as_deref(),
        Some("b")
    );
    assert!(b.is_leader());
}

#[tokio::test]
async fn compaction_rules() {
    let s = MemStore::new();
    let r1 = s.put("/k", b"1".to_vec(), None).await.unwrap();
    let r2 = s.put("/k", b"2".to_vec(), None).await.unwrap();
    assert!(matches!(
        s.compact(r2 + 5).await,
        Err(StoreError::InvalidRequest(_))
    ));
    s.compact(r2).await.unwrap();
    assert!(matches!(
        s.compact(r1).await,
        Err(StoreError::Compacted { .. })
    ));
}
