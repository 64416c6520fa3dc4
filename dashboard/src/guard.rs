//! What every dashboard request passes before a handler: same-origin and CSRF checks on
//! `POST`, the session, and the security headers on the way out.
//!
//! The API's own guard has already rate-limited the request (it leaves the bearer token to
//! this one: a browser signs in once and then sends its cookie).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use kat_apiserver::service;
use subtle::ConstantTimeEq;

use crate::pages::Page;
use crate::session::{self, Credential, Session};
use crate::Dashboard;

/// Scripts, styles, images and connections from this origin only; no inline script or
/// style (the pages have none), no plugins, no framing, forms post here only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// Largest form body the dashboard reads (its forms carry a token and a CSRF token).
const MAX_FORM: usize = 16 * 1024;

pub async fn guard(State(d): State<Arc<Dashboard>>, req: Request, next: Next) -> Response {
    let mut response = check(&d, req, next).await;
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with a same-origin form.
        ("referrer-policy", "same-origin"),
        ("cross-origin-opener-policy", "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn check(d: &Dashboard, req: Request, next: Next) -> Response {
    let post = req.method() == Method::POST;
    if post {
        if let Err(why) = same_origin(req.headers()) {
            return refuse(StatusCode::FORBIDDEN, why);
        }
    }
    let path = req.uri().path();
    if path == "/login" || path.starts_with("/assets/") {
        return next.run(req).await;
    }
    let session = match d.session(req.headers()).await {
        Ok(session) => session,
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, &e.message),
    };
    let Some(session) = session else {
        // A page opened without a session goes to the sign-in page; a stream or a form
        // gets a plain refusal (the page's script reloads on it).
        return if req.method() == Method::GET && !is_stream(path) {
            Redirect::to(&format!("{}/login", crate::PREFIX)).into_response()
        } else {
            refuse(
                StatusCode::UNAUTHORIZED,
                "not signed in, or the session ended: sign in again",
            )
        };
    };
    let mut req = req;
    if post {
        match with_csrf_checked(req, &session).await {
            Ok(checked) => req = checked,
            Err(response) => return response,
        }
    }
    req.extensions_mut().insert(session);
    next.run(req).await
}

/// The server-sent event streams: the page's script, not a person, opens them.
fn is_stream(path: &str) -> bool {
    path == "/live"
        || path
            .strip_suffix("/logs")
            .and_then(Page::from_path)
            .is_some_and(|p| matches!(p, Page::Instance { .. }))
}

/// A `POST` must come from a page of this origin: the browser says so in `Origin` (and in
/// `Sec-Fetch-Site`). A request without either is no browser's cross-site request.
fn same_origin(headers: &HeaderMap) -> Result<(), &'static str> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        if site != "same-origin" {
            return Err("a form from another site cannot change anything here");
        }
    }
    if let Some(origin) = get("origin") {
        let host = get("host").unwrap_or_default();
        if origin != format!("https://{host}") {
            return Err("a form from another origin cannot change anything here");
        }
    }
    Ok(())
}

/// The request again with its form body, if the body's `csrf` is the session's token.
async fn with_csrf_checked(req: Request, session: &Session) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM).await.map_err(|_| {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the form is larger than the dashboard takes",
        )
    })?;
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(&bytes).unwrap_or_default();
    let sent = fields
        .iter()
        .find(|(name, _)| name == "csrf")
        .map(|(_, v)| v.as_bytes())
        .unwrap_or_default();
    if !bool::from(sent.ct_eq(session.csrf.as_bytes())) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale: reload the page and try again",
        ));
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, format!("{why}\n")).into_response()
}

impl Dashboard {
    /// The session a request's cookie opens. A scoped token's session ends here once the
    /// token was deleted; its scope is read again, so a changed token applies at once. `Err`:
    /// the store cannot say (nothing is shown on a token it cannot check).
    pub(crate) async fn session(&self, headers: &HeaderMap) -> service::Result<Option<Session>> {
        match session::cookie(headers) {
            Some(secret) => self.session_of(secret).await,
            None => Ok(None),
        }
    }

    pub(crate) async fn session_of(&self, secret: &str) -> service::Result<Option<Session>> {
        let Some(mut session) = self.sessions.get(secret) else {
            return Ok(None);
        };
        if let Credential::Scoped { token, scope } = &mut session.credential {
            match self.api.service.api_token_scope(token).await? {
                Some(now) => *scope = now,
                None => {
                    self.sessions.close(&session);
                    return Ok(None);
                }
            }
        }
        Ok(Some(session))
    }

    /// As [`Dashboard::session_of`], for a stream: it goes on only while this is `Some`.
    pub(crate) async fn still_signed_in(&self, secret: &str) -> Option<Session> {
        self.session_of(secret).await.ok().flatten()
    }
}
