//! The leader's backup schedule on a real etcd, in real time with a short interval: backups
//! written and recorded with an event, the newest kept, a failure said as an event and a
//! metric, and a new leader carrying on the schedule instead of starting over.

use std::sync::Arc;
use std::time::Duration;

use kat_leader::backups::{self, BackupConfig};
use kat_leader::metrics::Metrics;
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, StateStore};

async fn events(store: &dyn StateStore, reason: &str) -> Vec<kat_api::wire::Event> {
    kat_leader::events::list(store, &Default::default(), 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == reason)
        .collect()
}

async fn until(limit: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_writes_keeps_fails_loudly_and_carries_over() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(EtcdServerConfig::loopback("backups", dir.path()).unwrap())
        .await
        .expect("start etcd");
    let etcd = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    let store: Arc<dyn StateStore> = Arc::new(etcd.clone());
    let config = BackupConfig {
        cluster: "t".into(),
        node: "n1".into(),
        dir: dir.path().join("backups"),
        interval: Duration::from_millis(700),
        retention: 2,
    };
    // A record whose file is gone (a leader cut short between removing an old file and its
    // record, or an admin deleting it): the schedule deletes it.
    let dangling = kat_api::wire::BackupRecord {
        name: "kat-t-n1-20260101T000000Z.db".into(),
        node: "n1".into(),
        path: config
            .dir
            .join("kat-t-n1-20260101T000000Z.db")
            .display()
            .to_string(),
        taken_at: std::time::SystemTime::UNIX_EPOCH.into(),
        size_bytes: 1,
        sha256: "0".repeat(64),
        trigger: "schedule".into(),
    };
    store
        .put(
            &kat_api::keys::backup(&dangling.name),
            serde_json::to_vec(&dangling).unwrap(),
            None,
        )
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::default());
    let schedule = tokio::spawn(backups::run(
        etcd.clone(),
        store.clone(),
        config.clone(),
        metrics.clone(),
    ));
    // Retention 2, seen while the schedule runs (stopping it can cut a backup short, as a
    // lost lease would): after three backups, two files and two records, the same two, each
    // file with its checksum.
    let mut records = Vec::new();
    assert!(
        until(Duration::from_secs(20), async || {
            records = backups::list(&*store).await.unwrap();
            let files = kat_store::snapshot::list(&config.dir, "kat-t-n1-");
            let names: Vec<String> = files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().to_string()))
                .collect();
            events(&*store, "BackupCreated").await.len() >= 3
                && files.len() == 2
                && records.len() == 2
                && records.iter().all(|r| names.contains(&r.name))
                && files.iter().all(|f| kat_store::snapshot::verify(f).is_ok())
        })
        .await,
        "three scheduled backups, two kept: {records:?}"
    );
    schedule.abort();
    assert!(records.iter().all(|r| r.name != dangling.name));
    assert!(records
        .iter()
        .all(|r| r.trigger == "schedule" && r.node == "n1"));
    assert!(metrics
        .render(&[])
        .contains("kat_backup_last_success_timestamp_seconds 1"));

    // A new leader: the next one comes an interval after the newest record, not at once
    // and not an interval after it took over.
    let newest = records[1].taken_at.system_time();
    let mut other = config.clone();
    other.node = "n2".into();
    other.interval = Duration::from_secs(3);
    let schedule = tokio::spawn(backups::run(
        etcd.clone(),
        store.clone(),
        other.clone(),
        metrics.clone(),
    ));
    assert!(
        until(Duration::from_secs(10), async || {
            backups::list(&*store)
                .await
                .unwrap()
                .iter()
                .any(|r| r.node == "n2")
        })
        .await,
        "the new leader's backup"
    );
    schedule.abort();
    let taken = backups::list(&*store).await.unwrap();
    let n2 = taken.iter().find(|r| r.node == "n2").unwrap();
    let at = n2.taken_at.system_time();
    let after = at.duration_since(newest).unwrap();
    assert!(
        after >= Duration::from_millis(2900) && after < Duration::from_secs(5),
        "due an interval after the newest record: {after:?}"
    );

    // A backup path that cannot be made: BackupFailed and the failure counter, never silence.
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let mut broken = config.clone();
    broken.dir = blocker.join("backups");
    broken.interval = Duration::from_millis(300);
    let failing = Arc::new(Metrics::default());
    let schedule = tokio::spawn(backups::run(
        etcd.clone(),
        store.clone(),
        broken,
        failing.clone(),
    ));
    assert!(
        until(Duration::from_secs(10), async || {
            !events(&*store, "BackupFailed").await.is_empty()
        })
        .await,
        "a BackupFailed event"
    );
    schedule.abort();
    let failed = events(&*store, "BackupFailed").await;
    assert!(failed[0].message.contains("a-file"), "{:?}", failed[0]);
    assert!(failing.render(&[]).contains("kat_backup_failures_total 1"));
    server.stop().await;
}
