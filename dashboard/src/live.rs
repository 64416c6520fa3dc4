//! Live pages over server-sent events.
//!
//! [`Changes`] is one watch of the store per node, whatever the number of open pages, and
//! only while one is open: every write (a heartbeat, a status, an event) bumps a counter
//! that wakes each open page's stream, which renders the page again (at most every
//! [`SETTLE`]) and sends it when it differs from what it sent last. Nothing polls: a page
//! costs a render per change of the cluster, not a request per tab per second.
//! Logs come from the instance's node, line by line, as `katcall logs -f` gets them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use kat_api::keys;
use kat_api::wire::LogLine;
use kat_api::WorkloadKey;
use kat_node::exec_logs::LogQuery;
use kat_store::{StateStore, WatchOptions};
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::pages::{self, Page};
use crate::session::{self, Session, StreamSlot};
use crate::Dashboard;

/// How long a page waits after a change for the ones that come with it (a rollout writes
/// a status, instances and events in a burst), and so the most often it is rendered.
const SETTLE: Duration = Duration::from_millis(400);
/// How long the store watch waits before it starts again after it ended.
const RESTART: Duration = Duration::from_secs(2);
/// How often a stream checks that its session is still current, and the watch that a page
/// is still open, when nothing else wakes them.
const RECHECK: Duration = Duration::from_secs(15);
/// Lines of an instance's output a log panel starts with.
const LOG_TAIL: usize = 500;

/// Changes of the store, counted, for the open pages.
pub struct Changes {
    store: Arc<dyn StateStore>,
    tx: Arc<watch::Sender<u64>>,
    watching: Arc<AtomicBool>,
}

impl Changes {
    pub fn new(store: Arc<dyn StateStore>) -> Changes {
        Changes {
            store,
            tx: Arc::new(watch::channel(0).0),
            watching: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A receiver that sees every change from now on; starts the store watch if none runs.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        let rx = self.tx.subscribe();
        if !self.watching.swap(true, Ordering::SeqCst) {
            tokio::spawn(watch_store(
                self.store.clone(),
                self.tx.clone(),
                self.watching.clone(),
            ));
        }
        rx
    }
}

/// Watch the whole store while anyone listens; bump the counter on every write.
async fn watch_store(
    store: Arc<dyn StateStore>,
    tx: Arc<watch::Sender<u64>>,
    watching: Arc<AtomicBool>,
) {
    loop {
        match store.watch(keys::ROOT, WatchOptions::prefix()).await {
            Ok(mut stream) => {
                // What changed while there was no watch shows with the first render.
                tx.send_modify(|n| *n += 1);
                loop {
                    match tokio::time::timeout(RECHECK, stream.next()).await {
                        Ok(Some(Ok(_))) => tx.send_modify(|n| *n += 1),
                        Ok(Some(Err(e))) => {
                            tracing::debug!(error = %e, "the dashboard's store watch ended");
                            break;
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                    if tx.receiver_count() == 0 {
                        break;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "the dashboard cannot watch the store"),
        }
        if tx.receiver_count() == 0 {
            // Stop; but a page that subscribed between the count and here saw the flag
            // still set and started nothing: then this watch goes on.
            watching.store(false, Ordering::SeqCst);
            if tx.receiver_count() == 0 || watching.swap(true, Ordering::SeqCst) {
                return;
            }
            continue;
        }
        tokio::time::sleep(RESTART).await;
    }
}

#[derive(Deserialize)]
pub struct LiveQuery {
    /// The page's address (`/ui/n/default`).
    page: String,
}

/// `GET /ui/live?page=PATH`: the page's content again whenever it changes, as `content`
/// events; the stream ends when the session does.
pub async fn page_updates(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    Query(q): Query<LiveQuery>,
) -> Response {
    let page = q.page.strip_prefix(crate::PREFIX).and_then(Page::from_path);
    let Some(page) = page.filter(|p| p.visible_to(&session)) else {
        return (StatusCode::NOT_FOUND, "no such page for this session\n").into_response();
    };
    let Some((secret, slot)) = open_stream(&d, &session, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let mut changes = d.changes.subscribe();
    // The page may have changed between its first render and this stream.
    changes.mark_changed();
    struct Stream {
        d: Arc<Dashboard>,
        secret: String,
        page: Page,
        changes: watch::Receiver<u64>,
        sent: String,
        slot: StreamSlot,
        replaced: bool,
    }
    let start = Stream {
        d,
        secret,
        page,
        changes,
        sent: String::new(),
        slot,
        replaced: false,
    };
    let events = futures_util::stream::unfold(start, |mut s| async move {
        if s.replaced {
            return None;
        }
        loop {
            let changed = tokio::select! {
                changed = tokio::time::timeout(RECHECK, s.changes.changed()) => changed,
                () = s.slot.ended() => {
                    s.replaced = true;
                    return Some((Ok(replaced()), s));
                }
            };
            match changed {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return None,
                Err(_) => {
                    s.d.still_signed_in(&s.secret).await?;
                    continue;
                }
            }
            tokio::time::sleep(SETTLE).await;
            s.changes.borrow_and_update();
            let session = s.d.still_signed_in(&s.secret).await?;
            if !s.page.visible_to(&session) {
                return None;
            }
            let html = match pages::render(&s.d, &session, &s.page).await {
                Ok(content) => content.into_string(),
                Err(e) => {
                    crate::views::problem("This page cannot be shown", &e.message).into_string()
                }
            };
            if html != s.sent {
                s.sent = html.clone();
                let event = Event::default().event("content").data(event_data(&html));
                return Some((Ok::<_, std::convert::Infallible>(event), s));
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `GET /ui/n/{ns}/workloads/{name}/instances/{id}/logs`: the instance's last lines, then
/// each new one, as `line` events (`{"stream","text"}`); `end` when the output ends.
pub async fn logs(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    Path((ns, name, id)): Path<(String, String, String)>,
) -> Response {
    // What the path decodes to must be what an instance page's address may carry.
    let Some(page) = (Page::Instance { ns, name, id }).checked() else {
        return (StatusCode::NOT_FOUND, "no such instance\n").into_response();
    };
    if !page.visible_to(&session) {
        return (StatusCode::FORBIDDEN, "this token cannot read these logs\n").into_response();
    }
    let Some((secret, slot)) = open_stream(&d, &session, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let Page::Instance { ns, name, id } = &page else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let key = WorkloadKey::new(ns, name);
    let record = match d.api.service.instance(&key, id).await {
        Ok(r) => r,
        Err(e) => return line_stream_error(e.message),
    };
    let query = LogQuery {
        follow: true,
        tail: Some(LOG_TAIL),
        ..Default::default()
    };
    let lines = match d.api.access.logs(&record, query).await {
        Ok(lines) => lines,
        Err(e) => return line_stream_error(e.to_string()),
    };
    struct Stream {
        d: Arc<Dashboard>,
        secret: String,
        lines: Option<mpsc::Receiver<LogLine>>,
        checked: Instant,
        slot: StreamSlot,
        replaced: bool,
    }
    let start = Stream {
        d,
        secret,
        lines: Some(lines),
        checked: Instant::now(),
        slot,
        replaced: false,
    };
    let events = futures_util::stream::unfold(start, |mut s| async move {
        if s.replaced {
            return None;
        }
        loop {
            // However busy the output, the session is checked again every RECHECK: a
            // sign-out or a deleted token ends the stream.
            if s.checked.elapsed() >= RECHECK {
                s.d.still_signed_in(&s.secret).await?;
                s.checked = Instant::now();
            }
            let lines = s.lines.as_mut()?;
            let next = tokio::select! {
                next = tokio::time::timeout(RECHECK, lines.recv()) => next,
                () = s.slot.ended() => {
                    s.replaced = true;
                    return Some((Ok(replaced()), s));
                }
            };
            match next {
                Ok(Some(line)) => {
                    // JSON: a carriage return in the output is escaped, not a line break.
                    let data = serde_json::json!({"stream": line.stream, "text": line.text});
                    let event = Event::default().event("line").data(data.to_string());
                    return Some((Ok::<_, std::convert::Infallible>(event), s));
                }
                Ok(None) => {
                    s.lines = None;
                    let event = Event::default().event("end").data("");
                    return Some((Ok(event), s));
                }
                Err(_) => {}
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The cookie's secret, to check the session again as the stream goes, and a slot among
/// the session's streams; `None` without them (the stream is refused as unauthorized).
fn open_stream(
    d: &Dashboard,
    session: &Session,
    headers: &HeaderMap,
) -> Option<(String, StreamSlot)> {
    let secret = session::cookie(headers)?.to_string();
    Some((secret, d.sessions.stream_slot(session)?))
}

/// The last event of a stream a newer page of its session took the place of: `kat.js`
/// closes it instead of connecting again.
fn replaced() -> Event {
    Event::default().event("replaced").data("")
}

/// Rendered HTML as event data: a line break is a new `data:` line, which the browser joins
/// again, but a carriage return has no place in an event (and maud leaves it as it is).
fn event_data(html: &str) -> String {
    html.replace('\r', "&#13;")
}

/// A log stream that says why there is no output, as one `problem` event.
fn line_stream_error(message: String) -> Response {
    let event = Event::default()
        .event("problem")
        .data(message.replace(['\r', '\n'], " "));
    let once = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(event)]);
    Sse::new(once).into_response()
}
