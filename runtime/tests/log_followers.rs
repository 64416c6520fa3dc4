//! `logs -f` at scale: many followers of a log cost tasks, not threads, and each one sees a
//! new line at once and ends when the container does. Alone in its binary: the thread count
//! it measures is the whole process's.

mod log_common;

use log_common::{agent_runtime, line};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kat_runtime::log_watch::LogWatcher;
use kat_runtime::logs;
use kat_runtime::LogOptions;

const STREAMS: usize = 200;

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Two worker threads, as on the agent's runtime.
#[test]
fn two_hundred_followers_hold_no_thread_each() {
    let runtime = agent_runtime();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdio.log");
        std::fs::write(&log, format!("{}{}", line("one"), line("two"))).unwrap();
        let watcher = LogWatcher::new().unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let before = threads();

        let mut streams = Vec::new();
        for _ in 0..STREAMS {
            let flag = running.clone();
            let options = LogOptions {
                follow: true,
                ..Default::default()
            };
            let rx = logs::stream(
                dir.path().to_path_buf(),
                options,
                move || flag.load(Ordering::SeqCst),
                Some(&watcher),
            )
            .unwrap();
            streams.push(rx);
        }
        for rx in &mut streams {
            for want in ["one", "two"] {
                let r = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                    .await
                    .expect("the backlog arrives")
                    .expect("the stream is open");
                assert_eq!(r.text, want);
            }
        }
        assert_eq!(watcher.watched(), 1, "one watch for one directory");
        // Every stream is now waiting for more: let any transient reader threads settle.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let during = threads();
        eprintln!("threads: {before} before {STREAMS} followers, {during} while they wait");
        assert!(
            during <= before + 4,
            "{STREAMS} followers took {} threads ({before} -> {during})",
            during - before
        );

        // A new line reaches every follower promptly (a change notice, not a poll).
        let written = Instant::now();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(line("three").as_bytes())
            .unwrap();
        for rx in &mut streams {
            let r = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the new line arrives")
                .expect("the stream is open");
            assert_eq!(r.text, "three");
        }
        let latency = written.elapsed();
        eprintln!("a new line reached all {STREAMS} followers in {latency:?}");
        assert!(
            latency < Duration::from_secs(1),
            "the new line took {latency:?} (a timer, not a change notice)"
        );

        // The container ends: every stream ends, and the watch goes with the last one.
        running.store(false, Ordering::SeqCst);
        for rx in &mut streams {
            let end = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the stream ends after the container");
            assert!(end.is_none(), "nothing more was written: {end:?}");
        }
        drop(streams);
        assert_eq!(watcher.watched(), 0, "no follower left, no watch left");
        assert!(threads() <= before + 4);
    });
}
