//! Ending what a scoped token opened once the token is deleted: a response that streams
//! (`events --watch`, `logs -f`) and an exec session are authorized when they start, and
//! would otherwise outlive the token by hours.
//!
//! Every API server (one per control-plane node) watches the tokens' prefix in the store, so
//! a token deleted through any member ends its streams on all of them. A deletion bumps a
//! counter; each open stream's [`TokenLife`] then asks the store whether its own token is
//! still there. That costs one read per open stream per deletion (tokens are deleted
//! rarely), and nothing while none is. A watch that breaks or starts makes every stream look
//! again, so a deletion in between is never missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use kat_api::keys;
use kat_store::{EventKind, StateStore, WatchOptions};
use tokio::sync::watch;

/// How long a broken watch of the tokens waits before it is made again.
const REWATCH_AFTER: Duration = Duration::from_secs(1);

pub struct TokenRevocations {
    store: Arc<dyn StateStore>,
    /// Bumped for every deletion under the tokens' prefix (and when the watch restarts).
    deletions: Arc<watch::Sender<u64>>,
    watching: AtomicBool,
}

/// What one request holds of its scoped token: [`TokenLife::revoked`] resolves once the token
/// is gone from the store.
#[derive(Clone)]
pub struct TokenLife {
    id: String,
    store: Arc<dyn StateStore>,
    deletions: watch::Receiver<u64>,
}

impl TokenRevocations {
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        TokenRevocations {
            store,
            deletions: Arc::new(watch::channel(0).0),
            watching: AtomicBool::new(false),
        }
    }

    /// Follows token `id`: call it before the token is checked, so that a deletion between
    /// the check and the stream's start is seen too. Starts the watch on first use (it
    /// needs a Tokio runtime, which a request always has).
    pub fn follow(&self, id: &str) -> TokenLife {
        if !self.watching.swap(true, Ordering::SeqCst) {
            tokio::spawn(watch_deletions(
                self.store.clone(),
                Arc::downgrade(&self.deletions),
            ));
        }
        TokenLife {
            id: id.to_string(),
            store: self.store.clone(),
            deletions: self.deletions.subscribe(),
        }
    }
}

impl TokenLife {
    /// Resolves once the token has been deleted; never while it exists (a store that cannot
    /// be read just now cuts nothing).
    pub async fn revoked(mut self) {
        loop {
            if self.deletions.changed().await.is_err() {
                // The API server is gone: nothing will end this stream but its own end.
                return std::future::pending().await;
            }
            if let Ok(None) = self.store.get(&keys::api_token(&self.id)).await {
                tracing::info!(token = %self.id, "a stream of a deleted API token ended");
                return;
            }
        }
    }
}

/// Until the API server goes: watch the tokens, bump the counter on every deletion.
async fn watch_deletions(store: Arc<dyn StateStore>, deletions: Weak<watch::Sender<u64>>) {
    let bump = |deletions: &Weak<watch::Sender<u64>>| match deletions.upgrade() {
        Some(tx) => {
            tx.send_modify(|n| *n += 1);
            true
        }
        None => false,
    };
    loop {
        match store
            .watch(keys::api_tokens(), WatchOptions::prefix())
            .await
        {
            Ok(mut events) => {
                // Streams that started before the watch was in place look once.
                if !bump(&deletions) {
                    return;
                }
                while let Some(event) = events.next().await {
                    match event {
                        Ok(e) if e.kind == EventKind::Delete => {
                            if !bump(&deletions) {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "the watch of API tokens ended; watching again");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot watch API tokens; retrying in 1 s"),
        }
        if !bump(&deletions) {
            return;
        }
        tokio::time::sleep(REWATCH_AFTER).await;
    }
}
