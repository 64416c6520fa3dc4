//! Signing in with a token and out again.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::session::{self, Credential, Session};
use crate::{views, Dashboard};

/// The sign-in page; a browser that is signed in goes to the cluster.
pub async fn form(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    if matches!(d.session(&headers).await, Ok(Some(_))) {
        return Redirect::to(crate::PREFIX).into_response();
    }
    views::sign_in(None).into_response()
}

#[derive(Deserialize)]
pub struct SignIn {
    #[serde(default)]
    token: String,
}

/// `POST /ui/login`: the admin token or a scoped API token opens a session.
pub async fn sign_in(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    let token = form.token.trim();
    let credential = if kat_apiserver::http::token_sha256(token)
        .ct_eq(&d.api.token_sha256)
        .into()
    {
        Some(Credential::Admin)
    } else if kat_apiserver::service::Service::looks_like_api_token(token) {
        match d.api.service.api_token_scope(token).await {
            Ok(Some(scope)) if scope.metrics => {
                tracing::info!(target: "kat::audit", "dashboard sign-in refused: a metrics token");
                return (
                    StatusCode::FORBIDDEN,
                    views::sign_in(Some(
                        "A metrics token reads /metrics only. Sign in with the admin token or one from `katcall create token --read-only`.",
                    )),
                )
                    .into_response();
            }
            Ok(scope) => scope.map(|scope| Credential::Scoped {
                token: token.to_string(),
                scope,
            }),
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    views::sign_in(Some(&format!("The token cannot be checked now: {e}"))),
                )
                    .into_response()
            }
        }
    } else {
        None
    };
    let Some(credential) = credential else {
        tracing::info!(target: "kat::audit", "dashboard sign-in refused");
        return (
            StatusCode::UNAUTHORIZED,
            views::sign_in(Some(
                "That is not a token of this cluster. Use the admin token (the `token` in katcall's config) or one from `katcall create token`.",
            )),
        )
            .into_response();
    };
    tracing::info!(target: "kat::audit", token = credential.holder(), "dashboard sign-in");
    // The browser's earlier session, if any, ends: one browser, one session.
    if let Ok(Some(earlier)) = d.session(&headers).await {
        d.sessions.close(&earlier);
    }
    let secret = d.sessions.open(credential);
    (
        [(header::SET_COOKIE, session::set_cookie(&secret))],
        Redirect::to(crate::PREFIX),
    )
        .into_response()
}

/// `POST /ui/logout`.
pub async fn sign_out(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
) -> Response {
    d.sessions.close(&session);
    (
        [(header::SET_COOKIE, session::clear_cookie())],
        Redirect::to(&format!("{}/login", crate::PREFIX)),
    )
        .into_response()
}
