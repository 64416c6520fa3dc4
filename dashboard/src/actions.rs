//! What the dashboard's buttons do. The guard has checked the form's CSRF token; each
//! action checks that the session's token may do the same through the API.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use kat_api::WorkloadKey;

use crate::pages::Page;
use crate::session::{Flash, Session};
use crate::Dashboard;

/// `POST /ui/n/{ns}/workloads/{name}/rollback`: what `katcall rollback` does.
pub async fn rollback(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    // What the path decodes to must be what a workload page's address may carry.
    let Some(page) = (Page::Workload { ns, name }).checked() else {
        return (StatusCode::NOT_FOUND, "no such workload\n").into_response();
    };
    let Page::Workload { ns, name } = &page else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let api_path = kat_api::routes::Route::Rollback.path(&[ns, name]);
    if !session.credential.may(&Method::POST, &api_path) {
        return (
            StatusCode::FORBIDDEN,
            "the token you signed in with cannot roll back this workload\n",
        )
            .into_response();
    }
    let key = WorkloadKey::new(ns, name);
    let flash = match d.api.service.rollback_workload(&key).await {
        Ok(w) => {
            tracing::info!(target: "kat::audit", token = session.credential.holder(), workload = %key, generation = w.metadata.generation, "dashboard rollback");
            Flash {
                ok: true,
                text: format!(
                    "Rolled back: generation {} runs the previous spec.",
                    w.metadata.generation
                ),
            }
        }
        Err(e) => Flash {
            ok: false,
            text: format!("Rollback refused: {}", e.message),
        },
    };
    d.sessions.set_flash(&session, flash);
    Redirect::to(&page.href()).into_response()
}
