//! One conformance suite for every StateStore: the same cases run on MemStore and on a real
//! etcd started by `EtcdServer` (Debian's `etcd-server` must be installed).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kat_store::*;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

/// What a case needs from the store under test.
#[async_trait::async_trait]
trait Fixture: Send + Sync {
    fn store(&self) -> Arc<dyn StateStore>;
    /// Another client of the same state (a second process, for etcd).
    async fn second_client(&self) -> Arc<dyn StateStore>;
    /// Break every connection (for etcd: SIGKILL etcd and wait for the supervisor to bring it
    /// back). Returns whether open watches must have seen an error.
    async fn disrupt(&self) -> bool;
}

struct MemFixture(MemStore);

#[async_trait::async_trait]
impl Fixture for MemFixture {
    fn store(&self) -> Arc<dyn StateStore> {
        Arc::new(self.0.clone())
    }
    async fn second_client(&self) -> Arc<dyn StateStore> {
        Arc::new(self.0.clone())
    }
    async fn disrupt(&self) -> bool {
        false
    }
}

struct EtcdFixture {
    server: Option<EtcdServer>,
    store: EtcdStore,
    _dir: tempfile::TempDir,
}

impl EtcdFixture {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = EtcdServerConfig::loopback("conformance", dir.path()).unwrap();
        let server = EtcdServer::start(config)
            .await
            .expect("start etcd (apt-get install etcd-server)");
        let store = EtcdStore::connect(&[server.client_url().to_string()], None)
            .await
            .unwrap();
        EtcdFixture {
            server: Some(server),
            store,
            _dir: dir,
        }
    }
}

impl Drop for EtcdFixture {
    fn drop(&mut self) {
        drop(self.server.take());
    }
}

#[async_trait::async_trait]
impl Fixture for EtcdFixture {
    fn store(&self) -> Arc<dyn StateStore> {
        Arc::new(self.store.clone())
    }
    async fn second_client(&self) -> Arc<dyn StateStore> {
        Arc::new(
            EtcdStore::connect(self.store.endpoints(), self.store.tls())
                .await
                .unwrap(),
        )
    }
    async fn disrupt(&self) -> bool {
        let server = self.server.as_ref().unwrap();
        let before = server.restarts();
        let pid = server.pid().expect("etcd pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        while server.restarts() == before || !server.is_healthy().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd did not come back after SIGKILL"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
}

/// Retry an operation while the store is briefly unavailable (etcd restarting).
async fn retry<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match op().await {
            Ok(v) => return v,
            Err(StoreError::Unavailable(e)) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("store error: {e}"),
        }
    }
}

async fn next_event(w: &mut WatchStream) -> WatchEvent {
    timeout(WAIT, w.next())
        .await
        .expect("watch event in time")
        .expect("watch open")
        .expect("watch event")
}

mod cases {
    use super::*;

    pub async fn basic_kv(f: &dyn Fixture) {
        let s = f.store();
        assert_eq!(s.get("/t/a").await.unwrap(), None);
        let r1 = s.put("/t/a", b"1".to_vec(), None).await.unwrap();
        let r2 = s.put("/t/a", b"2".to_vec(), None).await.unwrap();
        assert!(r2 > r1);
        let kv = s.get("/t/a").await.unwrap().unwrap();
        assert_eq!(
            (
                kv.value.as_slice(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
                kv.lease
            ),
            (&b"2"[..], r1, r2, 2, 0)
        );
        s.put("/t/ab", b"x".to_vec(), None).await.unwrap();
        s.put("/t/b/1", b"y".to_vec(), None).await.unwrap();
        s.put("/t/b/2", b"z".to_vec(), None).await.unwrap();
        let listing = s.list("/t/b/").await.unwrap();
        assert_eq!(
            listing
                .kvs
                .iter()
                .map(|k| k.key.as_str())
                .collect::<Vec<_>>(),
            ["/t/b/1", "/t/b/2"]
        );
        assert!(listing.revision >= r2);
        assert_eq!(
            s.list("/t/a").await.unwrap().kvs.len(),
            2,
            "prefix /t/a matches /t/a and /t/ab"
        );
        assert!(s.delete("/t/a").await.unwrap());
        assert!(!s.delete("/t/a").await.unwrap());
        assert_eq!(s.delete_prefix("/t/b/").await.unwrap(), 2);
        assert_eq!(s.list("/t/").await.unwrap().kvs.len(), 1);
        // Re-created keys start over.
        let r3 = s.put("/t/a", b"3".to_vec(), None).await.unwrap();
        let kv = s.get("/t/a").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.version), (r3, 1));
    }

    pub async fn transactions(f: &dyn Fixture) {
        let s = f.store();
        let create = Txn::new()
            .when([Compare::absent("/x")])
            .and_then([TxnOp::put("/x", "1"), TxnOp::get("/x")])
            .or_else([TxnOp::get("/x")]);
        let r = s.txn(create.clone()).await.unwrap();
        assert!(r.succeeded);
        assert_eq!(r.gets.len(), 1);
        assert_eq!(r.gets[0].as_ref().unwrap().value, b"1");
        let again = s.txn(create).await.unwrap();
        assert!(!again.succeeded, "the key exists now");
        assert_eq!(again.gets[0].as_ref().unwrap().value, b"1");
        let kv = s.get("/x").await.unwrap().unwrap();
        assert!(
            !s.txn(
                Txn::new()
                    .when([Compare::mod_revision_is("/x", kv.mod_revision + 1)])
                    .and_then([TxnOp::put("/x", "no")])
            )
            .await
            .unwrap()
            .succeeded
        );
        assert!(
            s.txn(
                Txn::new()
                    .when([Compare::version_is("/x", 1), Compare::value_is("/x", "1")])
                    .and_then([TxnOp::put("/x", "2"), TxnOp::put("/y", "2")])
            )
            .await
            .unwrap()
            .succeeded
        );
        // Both writes landed at one revision.
        let (x, y) = (
            s.get("/x").await.unwrap().unwrap(),
            s.get("/y").await.unwrap().unwrap(),
        );
        assert_eq!(x.mod_revision, y.mod_revision);
        assert!(
            s.txn(
                Txn::new()
                    .when([Compare::create_revision_is("/x", kv.create_revision)])
                    .and_then([TxnOp::delete("/y")])
            )
            .await
            .unwrap()
            .succeeded
        );
        assert_eq!(s.get("/y").await.unwrap(), None);
        let too_big =
            Txn::new().and_then((0..=MAX_TXN_OPS).map(|i| TxnOp::put(format!("/big/{i}"), "x")));
        assert!(matches!(
            s.txn(too_big).await,
            Err(StoreError::InvalidRequest(_))
        ));
    }

    pub async fn watch_events_with_previous_values(f: &dyn Fixture) {
        let s = f.store();
        let start = s.put("/w/a", b"1".to_vec(), None).await.unwrap();
        s.put("/w/a", b"2".to_vec(), None).await.unwrap();
        s.put("/other", b"x".to_vec(), None).await.unwrap();
        s.delete("/w/a").await.unwrap();
        // From an old revision: the whole history, in order, with previous values.
        let mut w = s
            .watch("/w/", WatchOptions::prefix().from_revision(start))
            .await
            .unwrap();
        let e1 = next_event(&mut w).await;
        assert_eq!(
            (e1.kind, e1.kv.value.as_slice(), e1.prev.as_ref()),
            (EventKind::Put, &b"1"[..], None)
        );
        let e2 = next_event(&mut w).await;
        assert_eq!(e2.prev.unwrap().value, b"1");
        let e3 = next_event(&mut w).await;
        assert_eq!((e3.kind, e3.kv.key.as_str()), (EventKind::Delete, "/w/a"));
        assert_eq!(e3.prev.unwrap().value, b"2");
        // Live events, and a key watch that ignores siblings.
        let mut key_watch = s.watch("/w/b", WatchOptions::key()).await.unwrap();
        s.put("/w/bb", b"no".to_vec(), None).await.unwrap();
        s.put("/w/b", b"yes".to_vec(), None).await.unwrap();
        assert_eq!(next_event(&mut key_watch).await.kv.key, "/w/b");
        assert_eq!(next_event(&mut w).await.kv.key, "/w/bb");
        assert_eq!(next_event(&mut w).await.kv.key, "/w/b");
    }

    pub async fn watch_from_compacted_revision_fails(f: &dyn Fixture) {
        let s = f.store();
        let first = s.put("/c/k", b"1".to_vec(), None).await.unwrap();
        s.put("/c/k", b"2".to_vec(), None).await.unwrap();
        let last = s.put("/c/k", b"3".to_vec(), None).await.unwrap();
        s.compact(last).await.unwrap();
        let mut w = s
            .watch("/c/", WatchOptions::prefix().from_revision(first))
            .await
            .unwrap();
        match timeout(WAIT, w.next()).await.unwrap() {
            Some(Err(StoreError::Compacted { compacted, .. })) => assert_eq!(compacted, last),
            other => panic!("expected a compaction error, got {other:?}"),
        }
        // From the compaction revision on, history is there.
        let mut w = s
            .watch("/c/", WatchOptions::prefix().from_revision(last))
            .await
            .unwrap();
        assert_eq!(next_event(&mut w).await.kv.value, b"3");
    }

    pub async fn leases_expire_and_take_their_keys(f: &dyn Fixture) {
        let s = f.store();
        let lease = s.grant_lease(Duration::from_secs(2)).await.unwrap();
        s.put("/l/a", b"1".to_vec(), Some(lease)).await.unwrap();
        s.put("/l/b", b"1".to_vec(), Some(lease)).await.unwrap();
        assert_eq!(s.get("/l/a").await.unwrap().unwrap().lease, lease);
        let mut w = s.watch("/l/", WatchOptions::prefix()).await.unwrap();
        // Kept alive past its TTL, it stays.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(700)).await;
            s.keep_alive(lease).await.unwrap();
        }
        assert!(s.get("/l/a").await.unwrap().is_some());
        // Left alone, it expires with its keys, which watchers see as deletions.
        let e = next_event(&mut w).await;
        assert_eq!(e.kind, EventKind::Delete);
        assert_eq!(next_event(&mut w).await.kind, EventKind::Delete);
        assert_eq!(s.list("/l/").await.unwrap().kvs.len(), 0);
        let ka = s.keep_alive(lease).await;
        assert!(
            matches!(ka, Err(StoreError::LeaseNotFound(l)) if l == lease),
            "{ka:?}"
        );
        assert!(matches!(
            s.put("/l/c", b"1".to_vec(), Some(lease)).await,
            Err(StoreError::LeaseNotFound(_))
        ));
        // Revoking deletes at once.
        let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        s.put("/l/d", b"1".to_vec(), Some(lease)).await.unwrap();
        s.revoke_lease(lease).await.unwrap();
        assert_eq!(s.get("/l/d").await.unwrap(), None);
    }

    pub async fn watcher_resumes_after_reconnect_without_loss_or_duplicates(f: &dyn Fixture) {
        let s = f.store();
        let base = s.list("/r/").await.unwrap().revision;
        let mut w = s
            .watch("/r/", WatchOptions::prefix().from_revision(base + 1))
            .await
            .unwrap();
        for i in 0..100 {
            s.put(&format!("/r/{i:04}"), b"v".to_vec(), None)
                .await
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut last_rev = base;
        for _ in 0..50 {
            let e = next_event(&mut w).await;
            last_rev = e.revision();
            seen.push(e.kv.key);
        }
        if f.disrupt().await {
            // The old stream must end with an error, not hang or go quiet.
            let ended = timeout(WAIT, async {
                loop {
                    match w.next().await {
                        Some(Ok(_)) => continue, // events buffered before the kill
                        Some(Err(_)) | None => return,
                    }
                }
            })
            .await;
            assert!(ended.is_ok(), "watch did not report the broken connection");
        }
        drop(w);
        let s = f.second_client().await;
        for i in 100..200 {
            let key = format!("/r/{i:04}");
            retry(|| s.put(&key, b"v".to_vec(), None)).await;
        }
        let mut w =
            retry(|| s.watch("/r/", WatchOptions::prefix().from_revision(last_rev + 1))).await;
        for _ in 50..200 {
            let e = next_event(&mut w).await;
            assert!(e.revision() > last_rev, "events arrive in revision order");
            last_rev = e.revision();
            seen.push(e.kv.key);
        }
        let expected: Vec<String> = (0..200).map(|i| format!("/r/{i:04}")).collect();
        assert_eq!(seen, expected, "every event exactly once, in order");
        assert!(
            timeout(Duration::from_millis(300), w.next()).await.is_err(),
            "no extra events"
        );
    }

    pub async fn ten_thousand_writes_watched_without_loss(f: &dyn Fixture) {
        let s = f.store();
        let start = s.list("/many/").await.unwrap().revision + 1;
        let mut w = s
            .watch("/many/", WatchOptions::prefix().from_revision(start))
            .await
            .unwrap();
        let writers: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                tokio::spawn(async move {
                    for i in 0..1250 {
                        s.put(&format!("/many/{t}/{i}"), i.to_string().into_bytes(), None)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        let mut keys = BTreeSet::new();
        let mut last = 0;
        while keys.len() < 10_000 {
            let e = next_event(&mut w).await;
            assert!(e.revision() > last, "revisions strictly increase");
            last = e.revision();
            assert!(keys.insert(e.kv.key), "duplicate event");
        }
        for writer in writers {
            writer.await.unwrap();
        }
        assert!(
            timeout(Duration::from_millis(300), w.next()).await.is_err(),
            "no extra events"
        );
    }

    pub async fn cas_races_have_exactly_one_winner(f: &dyn Fixture) {
        let (a, b) = (f.store(), f.second_client().await);
        for round in 0..30 {
            let key = format!("/cas/{round}");
            a.put(&key, b"start".to_vec(), None).await.unwrap();
            let seen = a.get(&key).await.unwrap().unwrap().mod_revision;
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let attempt = |s: Arc<dyn StateStore>, who: &'static str| {
                let (key, barrier) = (key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    s.txn(
                        Txn::new()
                            .when([Compare::mod_revision_is(&key, seen)])
                            .and_then([TxnOp::put(&key, who)]),
                    )
                    .await
                    .unwrap()
                    .succeeded
                })
            };
            let (ra, rb) = (attempt(a.clone(), "a"), attempt(b.clone(), "b"));
            let (wa, wb) = (ra.await.unwrap(), rb.await.unwrap());
            assert!(
                wa ^ wb,
                "round {round}: exactly one must win (a={wa}, b={wb})"
            );
            let winner = if wa { b"a" } else { b"b" };
            assert_eq!(a.get(&key).await.unwrap().unwrap().value, winner);
        }
        // Read-modify-write loops from two clients lose no increment.
        a.put("/cas/counter", b"0".to_vec(), None).await.unwrap();
        let incr = |s: Arc<dyn StateStore>| {
            tokio::spawn(async move {
                for _ in 0..50 {
                    loop {
                        let kv = s.get("/cas/counter").await.unwrap().unwrap();
                        let n: u64 = String::from_utf8(kv.value).unwrap().parse().unwrap();
                        let txn = Txn::new()
                            .when([Compare::mod_revision_is("/cas/counter", kv.mod_revision)])
                            .and_then([TxnOp::put("/cas/counter", (n + 1).to_string())]);
                        if s.txn(txn).await.unwrap().succeeded {
                            break;
                        }
                    }
                }
            })
        };
        let (x, y) = (incr(a.clone()), incr(b.clone()));
        x.await.unwrap();
        y.await.unwrap();
        assert_eq!(a.get("/cas/counter").await.unwrap().unwrap().value, b"100");
    }

    pub async fn leadership_hands_over_when_the_holder_is_killed(f: &dyn Fixture) {
        let (a, b) = (f.store(), f.second_client().await);
        let ttl = Duration::from_secs(2);
        let leader_a = campaign(a.clone(), "/kat/leader_election/", "node-a", ttl)
            .await
            .unwrap();
        assert_eq!(
            current_leader(&*b, "/kat/leader_election/")
                .await
                .unwrap()
                .as_deref(),
            Some("node-a")
        );
        let b_campaign = tokio::spawn(campaign(b.clone(), "/kat/leader_election/", "node-b", ttl));
        // A stays leader while alive, well past its TTL.
        tokio::time::sleep(ttl * 2).await;
        assert!(!b_campaign.is_finished(), "b must wait while a is alive");
        assert!(leader_a.is_leader());
        // Kill a: no resign, no keep-alive. Its lease expires and b takes over.
        let fence = leader_a.fence();
        leader_a.abandon();
        let leader_b = timeout(WAIT, b_campaign)
            .await
            .expect("b leads after a's lease expires")
            .unwrap()
            .unwrap();
        assert!(leader_b.is_leader());
        assert_eq!(
            current_leader(&*a, "/kat/leader_election/")
                .await
                .unwrap()
                .as_deref(),
            Some("node-b")
        );
        // A's fenced writes now fail; b's succeed.
        assert!(
            !a.txn(
                Txn::new()
                    .when([fence])
                    .and_then([TxnOp::put("/kat/fenced", "a")])
            )
            .await
            .unwrap()
            .succeeded
        );
        assert!(
            b.txn(
                Txn::new()
                    .when([leader_b.fence()])
                    .and_then([TxnOp::put("/kat/fenced", "b")])
            )
            .await
            .unwrap()
            .succeeded
        );
        leader_b.resign().await.unwrap();
        assert_eq!(
            current_leader(&*a, "/kat/leader_election/").await.unwrap(),
            None
        );
    }

    pub async fn leadership_loss_is_reported_when_the_lease_expires(f: &dyn Fixture) {
        let (a, b) = (f.store(), f.second_client().await);
        let ttl = Duration::from_secs(2);
        let leader_a = campaign(a.clone(), "/el/", "node-a", ttl).await.unwrap();
        let b_campaign = tokio::spawn(campaign(b.clone(), "/el/", "node-b", ttl));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The holder's lease is gone (as when etcd expires it during a long pause).
        b.revoke_lease(leader_a.lease()).await.unwrap();
        timeout(WAIT, leader_a.lost())
            .await
            .expect("a learns that it lost leadership");
        assert!(!leader_a.is_leader());
        let leader_b = timeout(WAIT, b_campaign).await.unwrap().unwrap().unwrap();
        assert_eq!(
            current_leader(&*a, "/el/").await.unwrap().as_deref(),
            Some("node-b")
        );
        // Resigning hands over at once to a waiting candidate.
        let c_campaign = tokio::spawn(campaign(a.clone(), "/el/", "node-c", ttl));
        tokio::time::sleep(Duration::from_millis(300)).await;
        leader_b.resign().await.unwrap();
        let leader_c = timeout(Duration::from_secs(5), c_campaign)
            .await
            .expect("resign hands over immediately")
            .unwrap()
            .unwrap();
        assert!(leader_c.is_leader());
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod mem_store {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    cases::$case(&MemFixture(MemStore::new())).await;
                }
            )*
        }
        mod etcd_store {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = EtcdFixture::start().await;
                    cases::$case(&fixture).await;
                    if let Some(server) = { let mut f = fixture; f.server.take() } {
                        server.stop().await;
                    }
                }
            )*
        }
    };
}

conformance!(
    basic_kv,
    transactions,
    watch_events_with_previous_values,
    watch_from_compacted_revision_fails,
    leases_expire_and_take_their_keys,
    watcher_resumes_after_reconnect_without_loss_or_duplicates,
    ten_thousand_writes_watched_without_loss,
    cas_races_have_exactly_one_winner,
    leadership_hands_over_when_the_holder_is_killed,
    leadership_loss_is_reported_when_the_lease_expires,
);
