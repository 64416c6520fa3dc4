//! `/v1alpha1/tokens`: scoped API tokens (admin token only), and what a scoped token may
//! reach ([`scope_allows`]), checked by the guard before any handler runs; `/ingress`, what
//! the ingress updater reads with one.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::Method;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use kat_api::routes::{Access, Method as RouteMethod, Route};
use kat_api::wire::{CreateApiToken, TokenScope, WhoAmI};

use super::{json_body, ApiError, ApiState};

/// A scoped API token (`katcall create token --read-only [--namespace NS]`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        post,
        path = "/v1alpha1/tokens",
        tag = "tokens",
        request_body(content = kat_api::wire::CreateApiToken),
        responses((status = 201, description = "The token (shown once)", body = kat_api::wire::NewApiToken), super::openapi::Errors)
    )
)]
pub async fn create(
    State(state): State<Arc<ApiState>>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let request: CreateApiToken = json_body(
        req,
        4096,
        "token body (expected {\"readOnly\": true, \"namespace\": \"NS\", \"description\": \"what it is for\"} or {\"metrics\": true})",
    )
    .await?;
    Ok((
        axum::http::StatusCode::CREATED,
        Json(state.service.create_api_token(&request).await?),
    ))
}

/// `GET /ingress`: what the ingress updater reads (with a read-only token).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/ingress",
        tag = "cluster",
        responses((status = 200, description = "Every ingress rule, resolved", body = [kat_api::wire::IngressRoute]), super::openapi::Errors)
    )
)]
pub async fn ingress_routes(
    State(state): State<Arc<ApiState>>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.ingress_routes().await?))
}

/// The scoped API tokens (`katcall get tokens`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/tokens",
        tag = "tokens",
        responses((status = 200, description = "API tokens, without their secrets", body = [kat_api::wire::ApiTokenInfo]), super::openapi::Errors)
    )
)]
pub async fn list(State(state): State<Arc<ApiState>>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(state.service.api_tokens().await?))
}

/// Revoke an API token (`katcall delete token`).
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        delete,
        path = "/v1alpha1/tokens/{id}",
        tag = "tokens",
        params(("id" = String, Path, description = "Token id")),
        responses((status = 200, description = "`{\"deleted\": ID}`", body = serde_json::Value), super::openapi::Errors)
    )
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    state.service.delete_api_token(&id).await?;
    Ok(Json(serde_json::json!({"deleted": id})))
}

/// Who sent a request, as the guard found out (in the request's extensions).
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    Admin,
    Scoped(TokenScope),
}

/// Who the request's bearer token is: the admin token, or a scoped token and its scope. A
/// worker asks this of the leader for the token its `/metrics` is scraped with.
#[cfg_attr(
    feature = "openapi",
    utoipa::path(
        get,
        path = "/v1alpha1/whoami",
        tag = "tokens",
        responses((status = 200, description = "The admin token, or a scoped token's scope", body = kat_api::wire::WhoAmI), super::openapi::Errors)
    )
)]
pub async fn whoami(caller: Option<Extension<Caller>>) -> Json<WhoAmI> {
    Json(match caller.map(|Extension(c)| c) {
        Some(Caller::Admin) => WhoAmI {
            admin: true,
            scope: None,
        },
        Some(Caller::Scoped(scope)) => WhoAmI {
            admin: false,
            scope: Some(scope),
        },
        None => WhoAmI::default(),
    })
}

/// What an ingress token reads: the routes, and the events that say when they changed.
const INGRESS_READS: [Route; 2] = [Route::Ingress, Route::Events];

/// Whether a token of `scope` may send `method path`; if not, why (the 403's message).
/// The route's access (`kat_api::routes`) comes first: no scoped token reaches an
/// admin-only route (tokens of every kind, backups, a node's administration) or a node's
/// own routes. Then the scope: read-only is GET and HEAD only, and no exec (a command in a
/// container is no read); namespace is that namespace's workloads and instances, and the
/// namespace itself; metrics is `/metrics` only; ingress is [`INGRESS_READS`] only. Every
/// token may ask who it is ([`whoami`]). A method and path the table does not declare is
/// refused.
pub fn scope_allows(scope: &TokenScope, method: &Method, path: &str) -> Result<(), String> {
    let route = RouteMethod::parse(method.as_str())
        .and_then(|m| Route::recognize(m, path))
        .map(|(route, _)| route);
    if route == Some(Route::Whoami) {
        return Ok(());
    }
    if scope.metrics {
        return if route == Some(Route::Metrics) {
            Ok(())
        } else {
            Err(format!(
                "a metrics token reads /metrics only, not {method} {path}"
            ))
        };
    }
    if scope.ingress {
        return if route.is_some_and(|r| INGRESS_READS.contains(&r)) {
            Ok(())
        } else {
            Err(format!(
                "an ingress token reads {} only, not {method} {path}",
                INGRESS_READS.map(Route::template).join(" and ")
            ))
        };
    }
    match route.map(Route::access) {
        // Nothing the table does not declare: the router matches some paths the table does
        // not (an empty segment, `/nodes//dns`), which must not reach a handler unchecked.
        None => return Err(format!("no route {method} {path} for a scoped token")),
        Some(Access::AdminOnly | Access::Public) => {
            return Err(format!("{path} takes the admin token, not a scoped one"))
        }
        // Assignments, templates, DNS records, heartbeats... are for the node's
        // certificate: opening a node's assignment stream ends the one it has.
        Some(Access::OwnNode) => {
            return Err(format!("{path} is a node's own route, not for a token"))
        }
        _ => {}
    }
    if scope.read_only {
        if !matches!(*method, Method::GET | Method::HEAD) {
            return Err(format!("a read-only token cannot {method} {path}"));
        }
        if matches!(route, Some(Route::Exec | Route::ExecUpgrade)) {
            return Err("a read-only token cannot exec into a container".into());
        }
    }
    if let Some(ns) = &scope.namespace {
        let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
        let own =
            under(&format!("/v1alpha1/n/{ns}")) || path == format!("/v1alpha1/namespaces/{ns}");
        if !own {
            return Err(format!(
                "this token is limited to namespace {ns}: {path} is outside it"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHOAMI: &str = Route::Whoami.template();

    fn scope(read_only: bool, namespace: Option<&str>) -> TokenScope {
        TokenScope {
            read_only,
            namespace: namespace.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn a_metrics_token_reads_metrics_only_and_every_token_asks_who_it_is() {
        let metrics = TokenScope {
            read_only: true,
            metrics: true,
            ..Default::default()
        };
        assert_eq!(scope_allows(&metrics, &Method::GET, "/metrics"), Ok(()));
        assert_eq!(scope_allows(&metrics, &Method::HEAD, "/metrics"), Ok(()));
        for path in [
            "/v1alpha1/nodes",
            "/v1alpha1/nodes/n1",
            "/v1alpha1/n/default/workloads",
            "/v1alpha1/ingress",
            "/v1alpha1/tokens",
        ] {
            assert!(
                scope_allows(&metrics, &Method::GET, path).is_err(),
                "{path}"
            );
        }
        assert!(scope_allows(&metrics, &Method::POST, "/metrics").is_err());
        for s in [metrics, scope(true, None), scope(false, Some("team"))] {
            assert_eq!(scope_allows(&s, &Method::GET, WHOAMI), Ok(()), "{s:?}");
            assert!(scope_allows(&s, &Method::POST, WHOAMI).is_err(), "{s:?}");
        }
    }

    #[test]
    fn an_ingress_token_reads_the_routes_and_events_only() {
        let ingress = TokenScope {
            read_only: true,
            ingress: true,
            ..Default::default()
        };
        for path in ["/v1alpha1/ingress", "/v1alpha1/events", WHOAMI] {
            assert_eq!(scope_allows(&ingress, &Method::GET, path), Ok(()), "{path}");
        }
        for path in [
            "/v1alpha1/n/default/workloads",
            "/v1alpha1/n/default/workloads/web/files/workload.kat",
            "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
            "/v1alpha1/nodes",
            "/v1alpha1/namespaces",
            "/metrics",
            "/v1alpha1/tokens",
        ] {
            let refused = scope_allows(&ingress, &Method::GET, path);
            assert!(refused.is_err(), "{path}");
        }
        assert!(scope_allows(&ingress, &Method::POST, "/v1alpha1/ingress").is_err());
    }

    #[test]
    fn read_only_reads_everything_but_tokens_backups_and_exec() {
        let s = scope(true, None);
        for path in [
            "/v1alpha1/n/default/workloads",
            "/v1alpha1/nodes",
            "/v1alpha1/nodes/n1",
            "/v1alpha1/events",
            "/metrics",
            "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
        ] {
            assert_eq!(scope_allows(&s, &Method::GET, path), Ok(()), "{path}");
        }
        for (method, path) in [
            (Method::POST, "/v1alpha1/n/default/workloads"),
            (Method::DELETE, "/v1alpha1/n/default/workloads/web"),
            (Method::PUT, "/v1alpha1/nodes/n1/labels"),
            (
                Method::GET,
                "/v1alpha1/n/default/workloads/web/instances/web-1/exec",
            ),
            (Method::GET, "/v1alpha1/tokens"),
            (Method::GET, "/v1alpha1/join-tokens"),
            (Method::GET, "/v1alpha1/backups"),
            (Method::DELETE, "/v1alpha1/tokens/abc"),
            (Method::GET, "/v1alpha1/nodes/n1/assignments"),
            (Method::GET, "/v1alpha1/nodes/n1/templates/default/web/abc"),
            (Method::GET, "/v1alpha1/nodes/n1/dns"),
            // Empty segments, which the router matches and the table does not.
            (Method::GET, "/v1alpha1/nodes//dns"),
            (Method::GET, "/v1alpha1/nodes//peers"),
            (
                Method::GET,
                "/v1alpha1/n/default/workloads/web/instances//exec",
            ),
        ] {
            assert!(scope_allows(&s, &method, path).is_err(), "{method} {path}");
        }
    }

    #[test]
    fn a_namespace_token_stays_in_its_namespace() {
        let s = scope(false, Some("team"));
        assert_eq!(
            scope_allows(&s, &Method::POST, "/v1alpha1/n/team/workloads"),
            Ok(())
        );
        assert_eq!(
            scope_allows(&s, &Method::GET, "/v1alpha1/namespaces/team"),
            Ok(())
        );
        for path in [
            "/v1alpha1/n/teamb/workloads",
            "/v1alpha1/n/other/workloads",
            "/v1alpha1/nodes",
            "/v1alpha1/instances",
            "/v1alpha1/namespaces",
            "/metrics",
        ] {
            assert!(scope_allows(&s, &Method::GET, path).is_err(), "{path}");
        }
        let ro = scope(true, Some("team"));
        assert!(scope_allows(&ro, &Method::POST, "/v1alpha1/n/team/workloads").is_err());
    }
}
