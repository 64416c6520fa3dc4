//! The dashboard's pages: which one a path names, what a session must be allowed to see it,
//! and rendering it (the same for the first response and for every live update).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use kat_api::names::dns_label_problem;
use kat_api::routes::Route;
use kat_apiserver::service;
use maud::Markup;

use crate::session::Session;
use crate::{views, Dashboard};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// Nodes: state, role, leader, usage, GPUs.
    Cluster,
    /// The workloads of a namespace.
    Workloads {
        ns: String,
    },
    Workload {
        ns: String,
        name: String,
    },
    Instance {
        ns: String,
        name: String,
        id: String,
    },
    Events,
    Backups,
    JoinTokens,
}

impl Page {
    /// The page a path under the dashboard names (`/n/default/workloads/web`); names that are
    /// no DNS label name none.
    pub fn from_path(path: &str) -> Option<Page> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let label = |s: &str| dns_label_problem(s).is_none();
        let page = match parts.as_slice() {
            [] => Page::Cluster,
            ["n", ns] if label(ns) => Page::Workloads { ns: ns.to_string() },
            ["n", ns, "workloads", name] if label(ns) && label(name) => Page::Workload {
                ns: ns.to_string(),
                name: name.to_string(),
            },
            ["n", ns, "workloads", name, "instances", id] if label(ns) && label(name) => {
                Page::Instance {
                    ns: ns.to_string(),
                    name: name.to_string(),
                    id: id.to_string(),
                }
            }
            ["events"] => Page::Events,
            ["backups"] => Page::Backups,
            ["join-tokens"] => Page::JoinTokens,
            _ => return None,
        };
        // An instance id is its workload's name and a suffix: letters, digits, `-` and `.`
        // (it is looked up among the workload's instances, never used as a path).
        if let Page::Instance { id, .. } = &page {
            if !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            {
                return None;
            }
        }
        Some(page)
    }

    /// `self`, if its names are what a page's address may carry ([`Page::from_path`]): a page
    /// made of decoded path parameters is checked so before it is used.
    pub fn checked(self) -> Option<Page> {
        let href = self.href();
        let inner = href.strip_prefix(crate::PREFIX)?;
        (Page::from_path(inner).as_ref() == Some(&self)).then_some(self)
    }

    /// Its address, for links.
    pub fn href(&self) -> String {
        let p = crate::PREFIX;
        match self {
            Page::Cluster => p.to_string(),
            Page::Workloads { ns } => format!("{p}/n/{ns}"),
            Page::Workload { ns, name } => format!("{p}/n/{ns}/workloads/{name}"),
            Page::Instance { ns, name, id } => {
                format!("{p}/n/{ns}/workloads/{name}/instances/{id}")
            }
            Page::Events => format!("{p}/events"),
            Page::Backups => format!("{p}/backups"),
            Page::JoinTokens => format!("{p}/join-tokens"),
        }
    }

    /// The API read that shows the same: a session may see the page if its token may send it.
    pub fn api_read(&self) -> String {
        match self {
            Page::Cluster => Route::ListNodes.path(&[]),
            Page::Workloads { ns } => Route::ListWorkloads.path(&[ns]),
            Page::Workload { ns, name } => Route::GetWorkload.path(&[ns, name]),
            Page::Instance { ns, name, id } => Route::Logs.path(&[ns, name, id]),
            Page::Events => Route::Events.path(&[]),
            Page::Backups => Route::Backups.path(&[]),
            Page::JoinTokens => Route::JoinTokens.path(&[]),
        }
    }

    pub fn visible_to(&self, session: &Session) -> bool {
        session.credential.may(&Method::GET, &self.api_read())
    }

    pub fn title(&self) -> String {
        match self {
            Page::Cluster => "Cluster".into(),
            Page::Workloads { ns } => format!("Workloads in {ns}"),
            Page::Workload { ns, name } => format!("{ns}/{name}"),
            Page::Instance { id, .. } => format!("Instance {id}"),
            Page::Events => "Events".into(),
            Page::Backups => "Backups".into(),
            Page::JoinTokens => "Join tokens".into(),
        }
    }
}

/// The page's content (what live updates replace), or why it cannot be shown.
pub async fn render(d: &Dashboard, session: &Session, page: &Page) -> service::Result<Markup> {
    let service = &d.api.service;
    match page {
        Page::Cluster => views::cluster::render(service).await,
        Page::Workloads { ns } => views::workloads::render(service, session, ns).await,
        Page::Workload { ns, name } => views::workload::render(service, session, ns, name).await,
        Page::Instance { ns, name, id } => views::instance::render(service, ns, name, id).await,
        Page::Events => views::events::render(service).await,
        Page::Backups => views::admin::backups(service).await,
        Page::JoinTokens => views::admin::join_tokens(service).await,
    }
}

/// `GET` of any page.
pub async fn show(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
    uri: Uri,
) -> Response {
    let Some(page) = Page::from_path(uri.path()) else {
        return not_found(Some(Extension(session))).await;
    };
    if !page.visible_to(&session) {
        // A token limited to a namespace starts at its workloads.
        if let (Page::Cluster, Some(ns)) = (&page, session.credential.namespace()) {
            let own = Page::Workloads { ns: ns.to_string() };
            return Redirect::to(&own.href()).into_response();
        }
        let content = views::problem(
            "Not for this token",
            "The token you signed in with cannot see this page.",
        );
        return (
            StatusCode::FORBIDDEN,
            views::layout(&session, &page, None, content, false),
        )
            .into_response();
    }
    let flash = d.sessions.take_flash(&session);
    match render(&d, &session, &page).await {
        Ok(content) => views::layout(&session, &page, flash, content, true).into_response(),
        Err(e) => {
            let status = StatusCode::from_u16(e.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let content = views::problem("This page cannot be shown", &e.message);
            (
                status,
                views::layout(&session, &page, flash, content, false),
            )
                .into_response()
        }
    }
}

pub async fn not_found(session: Option<Extension<Session>>) -> Response {
    let content = views::problem("No such page", "Nothing is at this address.");
    match session {
        Some(Extension(session)) => (
            StatusCode::NOT_FOUND,
            views::layout(&session, &Page::Cluster, None, content, false),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such page\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_pages_and_nothing_else() {
        assert_eq!(Page::from_path("/"), Some(Page::Cluster));
        assert_eq!(Page::from_path(""), Some(Page::Cluster));
        assert_eq!(
            Page::from_path("/n/default/workloads/web/instances/web-1a2b"),
            Some(Page::Instance {
                ns: "default".into(),
                name: "web".into(),
                id: "web-1a2b".into()
            })
        );
        for bad in [
            "/n/Default",
            "/n/default/workloads/../x",
            "/n/default/workloads/web/instances/a%2Fb",
            "/n/default/workloads/web/extra",
            "/nodes",
        ] {
            assert_eq!(Page::from_path(bad), None, "{bad}");
        }
        for page in [
            Page::Cluster,
            Page::Events,
            Page::Workloads { ns: "team".into() },
            Page::Workload {
                ns: "team".into(),
                name: "web".into(),
            },
        ] {
            let href = page.href();
            let inner = href.strip_prefix(crate::PREFIX).unwrap();
            assert_eq!(Page::from_path(inner), Some(page));
        }
    }
}
