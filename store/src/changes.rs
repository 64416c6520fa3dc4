//! Waiting for a prefix to change after a listing: the shape of a loop that reads some keys,
//! acts on them, and reads them again only when they changed (a node's DNS records, the
//! revocation list), instead of reading them on a clock.

use std::time::Duration;

use crate::{Revision, StateStore, WatchOptions};

/// How long [`changed_after`] waits when the store refuses the watch or ends it with an
/// error: the caller reads again soon (the store may be back), but not in a tight loop.
const WATCH_FAILED_WAIT: Duration = Duration::from_millis(500);

/// Returns once a key under `prefix` may have changed after `revision` (the revision a
/// listing of it was read at), or after `at_most`. A watch from `revision + 1` sees every
/// change since that listing, one made before this call included. Its first event returns
/// at once; its end (a lost connection, a compacted revision) or a refused watch returns
/// after half a second, so a caller that reads again at each return never spins. `at_most`
/// bounds a watch the store dropped without saying so.
pub async fn changed_after(
    store: &dyn StateStore,
    prefix: &str,
    revision: Revision,
    at_most: Duration,
) {
    let wait = async {
        let options = WatchOptions::prefix().from_revision(revision.saturating_add(1));
        match store.watch(prefix, options).await {
            Ok(mut watch) => match watch.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!("watching {prefix}: {e}");
                    tokio::time::sleep(WATCH_FAILED_WAIT).await;
                }
                None => tokio::time::sleep(WATCH_FAILED_WAIT).await,
            },
            Err(e) => {
                tracing::debug!("watching {prefix}: {e}");
                tokio::time::sleep(WATCH_FAILED_WAIT).await;
            }
        }
    };
    let _ = tokio::time::timeout(at_most, wait).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::changed_after;
    use crate::{MemStore, StateStore};

    const AT_MOST: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn a_change_after_the_listing_returns_even_one_made_before_the_wait() {
        let store = Arc::new(MemStore::new());
        store.put("/other/x", b"1".to_vec(), None).await.unwrap();
        let revision = store.list("/watched/").await.unwrap().revision;
        // Written between the listing and the wait.
        store.put("/watched/a", b"1".to_vec(), None).await.unwrap();
        let start = Instant::now();
        changed_after(&*store, "/watched/", revision, AT_MOST).await;
        assert!(
            start.elapsed() < Duration::from_millis(10),
            "{:?}",
            start.elapsed()
        );

        // A change while it waits; writes elsewhere do not count.
        let revision = store.list("/watched/").await.unwrap().revision;
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..3u8 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    store.put("/other/x", vec![i], None).await.unwrap();
                }
                store.delete("/watched/a").await.unwrap();
            })
        };
        let start = Instant::now();
        changed_after(&*store, "/watched/", revision, AT_MOST).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        writer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_cannot_go_on_returns_after_a_pause_not_at_once() {
        let store = Arc::new(MemStore::new());
        let old = store.list("/watched/").await.unwrap().revision;
        for i in 0..3u8 {
            store.put("/watched/a", vec![i], None).await.unwrap();
        }
        let now = store.list("/watched/").await.unwrap().revision;
        store.compact(now).await.unwrap();
        // The history after `old` is gone: the watch ends with an error. A caller that
        // reads again at each return must not spin.
        let start = Instant::now();
        changed_after(&*store, "/watched/", old, AT_MOST).await;
        assert_eq!(start.elapsed(), super::WATCH_FAILED_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_change_it_waits_the_whole_bound() {
        let store = Arc::new(MemStore::new());
        let revision = store.list("/watched/").await.unwrap().revision;
        let start = Instant::now();
        changed_after(&*store, "/watched/", revision, AT_MOST).await;
        assert_eq!(start.elapsed(), AT_MOST);
    }
}
