//! Following a log: a follower that goes away leaves nothing behind; without change notices
//! it reads on a timer.

mod log_common;

use log_common::{agent_runtime, line};
use std::time::{Duration, Instant};

use kat_runtime::log_watch::LogWatcher;
use kat_runtime::logs;
use kat_runtime::LogOptions;

/// A follower that goes away (the client hung up) ends its task and its watch even though
/// the container still runs and writes nothing.
#[test]
fn a_dropped_follower_leaves_nothing_behind() {
    let runtime = agent_runtime();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdio.log"), line("only")).unwrap();
        let watcher = LogWatcher::new().unwrap();
        let options = LogOptions {
            follow: true,
            ..Default::default()
        };
        let mut rx =
            logs::stream(dir.path().to_path_buf(), options, || true, Some(&watcher)).unwrap();
        assert_eq!(rx.recv().await.unwrap().text, "only");
        assert_eq!(watcher.watched(), 1);
        drop(rx);
        let deadline = Instant::now() + Duration::from_secs(5);
        while watcher.watched() != 0 {
            assert!(Instant::now() < deadline, "the watch outlived its follower");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Without change notices (no inotify), following still works by reading on a timer.
#[test]
fn without_a_watcher_following_reads_on_a_timer() {
    let runtime = agent_runtime();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdio.log");
        std::fs::write(&log, "").unwrap();
        let options = LogOptions {
            follow: true,
            ..Default::default()
        };
        let mut rx = logs::stream(dir.path().to_path_buf(), options, || true, None).unwrap();
        std::fs::write(&log, line("late")).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.text, "late");
    });
}

/// kat-init writes its exit record, then exits: a follower ends a moment later, not a
/// whole recheck interval later.
#[test]
fn a_follower_ends_soon_after_the_exit_record() {
    let runtime = agent_runtime();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdio.log"), line("last")).unwrap();
        let watcher = LogWatcher::new().unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = running.clone();
        let options = LogOptions {
            follow: true,
            ..Default::default()
        };
        let mut rx = logs::stream(
            dir.path().to_path_buf(),
            options,
            move || flag.load(std::sync::atomic::Ordering::SeqCst),
            Some(&watcher),
        )
        .unwrap();
        assert_eq!(rx.recv().await.unwrap().text, "last");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        std::fs::write(dir.path().join("exit.json"), "{}").unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        let end = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the stream ends");
        assert!(end.is_none());
        let took = t0.elapsed();
        assert!(
            took < Duration::from_millis(600),
            "ended {took:?} after the exit record"
        );
    });
}
