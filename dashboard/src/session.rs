//! Dashboard sessions: who signed in with which token, held in this node's memory.
//!
//! The cookie carries 32 random bytes; the table keys a session by their SHA-256, so the
//! table holds nothing a browser could present. A session ends on sign-out, after
//! [`LIFETIME`], and for a scoped token as soon as that token is deleted (every request
//! checks it again, [`crate::Dashboard::session`]). A restart of the node signs everyone
//! out: sessions are a convenience over the token, which is the credential.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue, Method};
use kat_api::wire::TokenScope;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

/// The cookie's name: `__Host-` makes the browser refuse it unless it is `Secure`, for
/// `Path=/` and set by this host itself (no sibling domain can plant one).
pub const COOKIE: &str = "__Host-kat_session";
/// How long a session lasts from sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Most sessions one credential (the admin token, or one scoped token) holds; its oldest makes
/// room for a new one, so no token can push another's sessions out.
const MAX_PER_CREDENTIAL: usize = 16;
/// Most sessions a node keeps; the one closest to its end makes room for a new one.
const MAX_SESSIONS: usize = 1024;
/// Most live streams (pages and logs) one session holds open; a new one ends the oldest. A
/// browser holds six connections to a host at most, but the server learns that a page was
/// left only when it next writes to its stream: the newest pages win.
pub const MAX_STREAMS: usize = 8;

/// What a session was opened with.
#[derive(Debug, Clone)]
pub enum Credential {
    Admin,
    /// A scoped API token: kept to check, on every request, that it still exists.
    Scoped {
        token: String,
        scope: TokenScope,
    },
}

impl Credential {
    /// Whether this credential may send `method api_path` to the API: the dashboard offers
    /// only what the API would accept from the same token.
    pub fn may(&self, method: &Method, api_path: &str) -> bool {
        match self {
            Credential::Admin => true,
            Credential::Scoped { scope, .. } => {
                kat_apiserver::http::scope_allows(scope, method, api_path).is_ok()
            }
        }
    }

    /// The namespace a scoped token is limited to.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Credential::Scoped { scope, .. } => scope.namespace.as_deref(),
            Credential::Admin => None,
        }
    }

    pub fn read_only(&self) -> bool {
        matches!(self, Credential::Scoped { scope, .. } if scope.read_only)
    }

    /// Whose sessions these are: `admin`, or the scoped token's id (for the audit log and
    /// the per-credential cap; never the secret).
    pub fn holder(&self) -> &str {
        match self {
            Credential::Admin => "admin",
            Credential::Scoped { token, .. } => token.split('.').nth(1).unwrap_or("?"),
        }
    }
}

/// A signed-in session, as a request sees it.
#[derive(Debug, Clone)]
pub struct Session {
    pub credential: Credential,
    /// The token every form of this session carries (`csrf`).
    pub csrf: String,
    key: [u8; 32],
}

/// A message for the next page the session is shown (what a form did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    pub ok: bool,
    pub text: String,
}

struct Entry {
    credential: Credential,
    csrf: String,
    ends: Instant,
    flash: Option<Flash>,
    /// Live streams open now, oldest first: their ids and how to end them.
    streams: Vec<(u64, Arc<Notify>)>,
}

#[derive(Default)]
pub struct Sessions {
    table: Mutex<HashMap<[u8; 32], Entry>>,
    next_stream: AtomicU64,
}

impl Sessions {
    /// A new session for `credential`: the cookie's value.
    pub fn open(&self, credential: Credential) -> String {
        let secret = random_hex(32);
        let now = Instant::now();
        let mut table = self.lock();
        table.retain(|_, e| e.ends > now);
        let holder = credential.holder().to_string();
        let own = table
            .iter()
            .filter(|(_, e)| e.credential.holder() == holder);
        if own.clone().count() >= MAX_PER_CREDENTIAL {
            if let Some(oldest) = own.min_by_key(|(_, e)| e.ends).map(|(k, _)| *k) {
                table.remove(&oldest);
            }
        }
        if table.len() >= MAX_SESSIONS {
            if let Some(soonest) = table.iter().min_by_key(|(_, e)| e.ends).map(|(k, _)| *k) {
                table.remove(&soonest);
            }
        }
        table.insert(
            key_of(&secret),
            Entry {
                credential,
                csrf: random_hex(32),
                ends: now + LIFETIME,
                flash: None,
                streams: Vec::new(),
            },
        );
        secret
    }

    /// A slot for one more live stream of `session`, held until dropped; at
    /// [`MAX_STREAMS`] the session's oldest stream is told to end. `None`: no such session.
    pub fn stream_slot(self: &Arc<Self>, session: &Session) -> Option<StreamSlot> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let end = Arc::new(Notify::new());
        let mut table = self.lock();
        let entry = table.get_mut(&session.key)?;
        if entry.streams.len() >= MAX_STREAMS {
            let (_, oldest) = entry.streams.remove(0);
            // A permit: the stream ends at its next wait if it is not waiting now.
            oldest.notify_one();
        }
        entry.streams.push((id, end.clone()));
        Some(StreamSlot {
            sessions: self.clone(),
            key: session.key,
            id,
            end,
        })
    }

    /// The session a cookie's value opens, if it is current.
    pub fn get(&self, secret: &str) -> Option<Session> {
        let key = key_of(secret);
        let mut table = self.lock();
        let entry = table.get(&key)?;
        if entry.ends <= Instant::now() {
            table.remove(&key);
            return None;
        }
        Some(Session {
            credential: entry.credential.clone(),
            csrf: entry.csrf.clone(),
            key,
        })
    }

    pub fn close(&self, session: &Session) {
        self.lock().remove(&session.key);
    }

    pub fn set_flash(&self, session: &Session, flash: Flash) {
        if let Some(e) = self.lock().get_mut(&session.key) {
            e.flash = Some(flash);
        }
    }

    pub fn take_flash(&self, session: &Session) -> Option<Flash> {
        self.lock().get_mut(&session.key)?.flash.take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        // A panic elsewhere while holding the lock leaves the table as consistent as any
        // single insert or remove does.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One open live stream of a session; its slot is given back when the stream ends.
pub struct StreamSlot {
    sessions: Arc<Sessions>,
    key: [u8; 32],
    id: u64,
    end: Arc<Notify>,
}

impl StreamSlot {
    /// Completes when a newer stream of the session took this one's place.
    pub async fn ended(&self) {
        self.end.notified().await
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(e) = self.sessions.lock().get_mut(&self.key) {
            e.streams.retain(|(id, _)| *id != self.id);
        }
    }
}

fn key_of(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// `n` random bytes from the operating system, as hex.
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The session cookie's value in a request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// `Set-Cookie` for a new session.
pub fn set_cookie(secret: &str) -> HeaderValue {
    cookie_header(secret, LIFETIME.as_secs())
}

/// `Set-Cookie` that ends the session's cookie.
pub fn clear_cookie() -> HeaderValue {
    cookie_header("", 0)
}

fn cookie_header(value: &str, max_age: u64) -> HeaderValue {
    // Only hex and decimal digits go in: always a valid header value.
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("__Host-kat_session=; Path=/; Max-Age=0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_with_its_cookie_only_and_closes() {
        let sessions = Sessions::default();
        let secret = sessions.open(Credential::Admin);
        assert_eq!(secret.len(), 64);
        let session = sessions.get(&secret).expect("open");
        assert_eq!(session.csrf.len(), 64);
        assert!(sessions.get(&random_hex(32)).is_none());
        assert!(sessions.get("").is_none());
        sessions.set_flash(
            &session,
            Flash {
                ok: true,
                text: "done".into(),
            },
        );
        assert_eq!(
            sessions.take_flash(&session).map(|f| f.text),
            Some("done".into())
        );
        assert_eq!(sessions.take_flash(&session), None);
        sessions.close(&session);
        assert!(sessions.get(&secret).is_none());
    }

    fn scoped(id: usize) -> Credential {
        Credential::Scoped {
            token: format!("katapi.{id:012x}.secret"),
            scope: TokenScope {
                read_only: true,
                ..TokenScope::default()
            },
        }
    }

    #[test]
    fn the_table_is_bounded_and_no_token_pushes_out_anothers_sessions() {
        let sessions = Sessions::default();
        let admin = sessions.open(Credential::Admin);
        let first = sessions.open(scoped(0));
        for _ in 0..MAX_SESSIONS {
            sessions.open(scoped(0));
        }
        assert_eq!(sessions.lock().len(), MAX_PER_CREDENTIAL + 1);
        assert!(sessions.get(&first).is_none(), "its own oldest made room");
        assert!(sessions.get(&admin).is_some(), "the admin's session stays");
        for id in 1..=MAX_SESSIONS {
            sessions.open(scoped(id));
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
    }

    #[tokio::test]
    async fn a_new_stream_past_the_cap_ends_the_oldest() {
        let sessions = Arc::new(Sessions::default());
        let secret = sessions.open(Credential::Admin);
        let session = sessions.get(&secret).unwrap();
        let slots: Vec<StreamSlot> = (0..MAX_STREAMS)
            .map(|_| sessions.stream_slot(&session).expect("a slot"))
            .collect();
        let newest = sessions.stream_slot(&session).expect("a slot past the cap");
        async fn within(slot: &StreamSlot) -> bool {
            tokio::time::timeout(std::time::Duration::from_millis(100), slot.ended())
                .await
                .is_ok()
        }
        assert!(within(&slots[0]).await, "the oldest is told to end");
        assert!(!within(&slots[1]).await, "the others go on");
        assert!(!within(&newest).await);
        drop(slots);
        let count = sessions.lock().get(&session.key).map(|e| e.streams.len());
        assert_eq!(count, Some(1), "dropped slots are given back");
    }
}
