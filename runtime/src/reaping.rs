//! Which containers' kat-init the runtime's reapers still wait for, with a way to
//! wait until one is reaped. A kat-init that died without writing its exit record gets one
//! from its reaper a moment after the process is gone; a status read in that moment waits
//! for the reaper's word (a condition variable) instead of polling; an async stop waits on
//! the same word through [`Reaping::reaped`].

use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Which containers' kat-init the reapers still wait for (see the module).
pub struct Reaping {
    ids: Mutex<HashSet<String>>,
    reaped: Condvar,
    reaped_async: tokio::sync::Notify,
    /// How many reapers are done: followers of containers wait for it to change.
    exits: tokio::sync::watch::Sender<u64>,
}

impl Default for Reaping {
    fn default() -> Self {
        Reaping {
            ids: Mutex::default(),
            reaped: Condvar::new(),
            reaped_async: tokio::sync::Notify::new(),
            exits: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Reaping {
    /// A reaper starts waiting for `id`'s kat-init.
    pub fn started(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.insert(id.to_string());
        }
    }

    /// `id`'s reaper is done (its exit record is written); wakes whoever waits for it.
    pub fn done(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.remove(id);
        }
        self.reaped.notify_all();
        self.reaped_async.notify_waiters();
        self.exits.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether a reaper waits for `id`'s kat-init (its end will count in [`Reaping::exits`]).
    pub fn is_reaping(&self, id: &str) -> bool {
        self.ids.lock().is_ok_and(|ids| ids.contains(id))
    }

    /// Changes when any reaper is done.
    pub fn exits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.exits.subscribe()
    }

    /// Resolves at the next reaper's word (any container's). Enable the returned future
    /// (`Notified::enable`) before checking a container's state, so that a word between the
    /// check and the wait is not missed.
    pub fn reaped(&self) -> tokio::sync::futures::Notified<'_> {
        self.reaped_async.notified()
    }

    /// Blocks until `id` is not being reaped, at most `timeout`; true if it is not.
    /// Blocking: call it from a blocking context.
    pub fn wait_until_reaped(&self, id: &str, timeout: Duration) -> bool {
        let Ok(ids) = self.ids.lock() else {
            return false;
        };
        match self
            .reaped
            .wait_timeout_while(ids, timeout, |ids| ids.contains(id))
        {
            Ok((_, result)) => !result.timed_out(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_waiter_wakes_when_its_container_is_reaped_not_later() {
        let reaping = Arc::new(Reaping::default());
        reaping.started("a");
        reaping.started("b");
        let r = reaping.clone();
        let reaper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            r.done("b");
            std::thread::sleep(Duration::from_millis(50));
            r.done("a");
        });
        let t0 = Instant::now();
        assert!(reaping.wait_until_reaped("a", Duration::from_secs(5)));
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(90),
            "woke early: {waited:?}"
        );
        assert!(waited < Duration::from_secs(2), "woke late: {waited:?}");
        reaper.join().unwrap();
        // Not being reaped at all: no wait.
        assert!(reaping.wait_until_reaped("c", Duration::from_secs(5)));
    }

    #[test]
    fn a_reaper_that_never_ends_gives_up_at_the_timeout() {
        let reaping = Reaping::default();
        reaping.started("stuck");
        let t0 = Instant::now();
        assert!(!reaping.wait_until_reaped("stuck", Duration::from_millis(100)));
        assert!(t0.elapsed() >= Duration::from_millis(100));
    }

    #[test]
    fn each_reaper_done_counts_as_an_exit_notice() {
        let reaping = Reaping::default();
        let mut exits = reaping.exits();
        reaping.started("a");
        assert!(reaping.is_reaping("a"));
        assert!(!exits.has_changed().unwrap());
        reaping.done("a");
        assert!(!reaping.is_reaping("a"));
        assert!(exits.has_changed().unwrap());
        assert_eq!(*exits.borrow_and_update(), 1);
        assert!(!reaping.is_reaping("never-started"));
    }

    /// An async waiter that enabled its wait before checking is woken by the reaper's word,
    /// at once, not at some poll.
    #[tokio::test]
    async fn an_async_waiter_wakes_at_the_reapers_word() {
        let reaping = Arc::new(Reaping::default());
        reaping.started("a");
        let waiter = {
            let reaping = reaping.clone();
            tokio::spawn(async move {
                let reaped = reaping.reaped();
                tokio::pin!(reaped);
                reaped.as_mut().enable();
                let t0 = Instant::now();
                reaped.await;
                t0.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        reaping.done("a");
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }
}
