//! The web dashboard: `https://NODE:apiPort/ui/` on every control-plane node.
//!
//! Server-rendered HTML ([`maud`]) over the API's own [`kat_apiserver::Service`], so a page
//! shows exactly what `katcall` would, and a scoped token sees and may do on a page exactly
//! what [`kat_apiserver::http::scope_allows`] lets it do through the API.
//!
//! - **Sign-in** with a token (the admin token or a scoped one) makes a session held in this
//!   node's memory ([`session`]); its cookie is `HttpOnly`, `Secure`, `SameSite=Strict` and
//!   `__Host-` prefixed. Nothing but the sign-in page and the assets is served without one.
//! - **State changes** (rollback, sign-out) are `POST` forms that carry the session's CSRF
//!   token; [`guard`] refuses a `POST` without it or from another origin, before any
//!   handler runs. Buttons a token may not use are not drawn.
//! - **Every response** carries a strict Content-Security-Policy: scripts, styles and
//!   connections from this origin only, no inline script or style, no framing.
//! - **Live updates** come over server-sent events: one watch of the store per node
//!   ([`live::Changes`]), running only while a page is open, wakes each open page, which is
//!   rendered again and sent if it changed; logs stream from the instance's node.
//!
//! The pages need no build step: the stylesheet and the one small script are ours, in
//! `assets/`, compiled into the binary.

mod actions;
mod assets;
mod guard;
mod live;
mod pages;
mod session;
mod sign_in;
mod views;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use kat_apiserver::http::ApiState;

pub use session::COOKIE;

/// Where the dashboard is served (what the API's guard leaves to [`guard`]).
pub const PREFIX: &str = kat_apiserver::http::UI_PREFIX;

/// What the dashboard's handlers share.
pub struct Dashboard {
    pub(crate) api: Arc<ApiState>,
    pub(crate) sessions: Arc<session::Sessions>,
    pub(crate) changes: live::Changes,
}

/// The dashboard's routes, to be nested at [`PREFIX`] in the API's router
/// (`kat_apiserver::http::router_with_ui`).
pub fn router(api: Arc<ApiState>) -> Router<Arc<ApiState>> {
    let dashboard = Arc::new(Dashboard {
        changes: live::Changes::new(api.service.store.clone()),
        sessions: Default::default(),
        api,
    });
    Router::new()
        .route("/", get(pages::show))
        .route("/n/:ns", get(pages::show))
        .route("/n/:ns/workloads/:name", get(pages::show))
        .route("/n/:ns/workloads/:name/rollback", post(actions::rollback))
        .route("/n/:ns/workloads/:name/instances/:id", get(pages::show))
        .route("/n/:ns/workloads/:name/instances/:id/logs", get(live::logs))
        .route("/events", get(pages::show))
        .route("/backups", get(pages::show))
        .route("/join-tokens", get(pages::show))
        .route("/live", get(live::page_updates))
        .route("/login", get(sign_in::form).post(sign_in::sign_in))
        .route("/logout", post(sign_in::sign_out))
        .route("/assets/:file", get(assets::serve))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            dashboard.clone(),
            guard::guard,
        ))
        .with_state(dashboard)
}
