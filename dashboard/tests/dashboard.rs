//! The dashboard in process, on `MemStore`, behind the API's own router and guard: what is
//! served without a session, sign-in and its cookie, CSRF and origin checks on every state
//! change, what scoped tokens see and may do, and live updates of an open page.
//! (`tests/ui/run.sh` drives the same pages in a real browser against a real node.)

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use futures_util::StreamExt;
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const TOKEN: &str = "admin-token-for-the-dashboard-test";
const HOST: &str = "kat.test:7443";
const ORIGIN: &str = "https://kat.test:7443";
const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

struct Ui {
    router: axum::Router,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

fn bundle(ns: &str, name: &str, image: &str) -> Vec<u8> {
    let mut files = BTreeMap::new();
    files.insert(
        "workload.kat".to_string(),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  type: Service\n  replicas: 1\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Always}}\n  container: {{}}\n"
        )
        .into_bytes(),
    );
    files.insert(
        "namespace.kat".to_string(),
        format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Namespace\nmetadata: {{name: {ns}}}\n")
            .into_bytes(),
    );
    kat_api::bundle::pack(&files)
}

/// The `value` of the first `name="csrf"` input in a page.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..].split('"').next().unwrap_or_default().to_string()
}

impl Ui {
    fn new() -> Ui {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let state = Arc::new(ApiState {
            service: Service::new(
                store,
                kat_leader::events::EventLog::new(1000),
                Clock::system(),
                kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
            ),
            token_sha256: http::token_sha256(TOKEN),
            access: Arc::new(NoInstanceAccess),
            metrics: Default::default(),
            limiter: http::default_rate_limiter(),
        });
        let ui = kat_dashboard::router(state.clone());
        let router = http::router_with_ui(state, Some(ui))
            .layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        Ui { router }
    }

    async fn send(&self, req: Request<Body>) -> Answer {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// The API, with the admin token.
    async fn api(&self, method: Method, path: &str, body: Vec<u8>) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::from(body))
            .unwrap();
        self.send(req).await
    }

    async fn apply(&self, ns: &str, name: &str, image: &str) {
        let create = self
            .api(
                Method::POST,
                &format!("/v1alpha1/n/{ns}/workloads"),
                bundle(ns, name, image),
            )
            .await;
        if create.status == StatusCode::CONFLICT {
            let update = self
                .api(
                    Method::PUT,
                    &format!("/v1alpha1/n/{ns}/workloads/{name}"),
                    bundle(ns, name, image),
                )
                .await;
            assert_eq!(update.status, StatusCode::OK, "{}", update.body);
        } else {
            assert_eq!(create.status, StatusCode::CREATED, "{}", create.body);
        }
    }

    async fn generation(&self, ns: &str, name: &str) -> u64 {
        let a = self
            .api(
                Method::GET,
                &format!("/v1alpha1/n/{ns}/workloads/{name}"),
                vec![],
            )
            .await;
        let w: kat_api::wire::WorkloadObject = serde_json::from_str(&a.body).unwrap();
        w.metadata.generation
    }

    async fn get(&self, path: &str, cookie: Option<&str>) -> Answer {
        let mut req = Request::builder().uri(path).header(header::HOST, HOST);
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, format!("{}={c}", kat_dashboard::COOKIE));
        }
        self.send(req.body(Body::empty()).unwrap()).await
    }

    /// A form posted as a browser would from a page of `origin`.
    async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        fields: &[(&str, &str)],
        origin: &str,
    ) -> Answer {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, HOST)
            .header(header::ORIGIN, origin)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, format!("{}={c}", kat_dashboard::COOKIE));
        }
        let body = serde_urlencoded::to_string(fields).unwrap();
        self.send(req.body(Body::from(body)).unwrap()).await
    }

    /// Sign in with `token`: the session cookie's value.
    async fn sign_in(&self, token: &str) -> String {
        let a = self
            .post("/ui/login", None, &[("token", token)], ORIGIN)
            .await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
        let cookie = a
            .headers
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .expect("a session cookie")
            .to_string();
        let value = cookie
            .split(';')
            .next()
            .and_then(|kv| kv.split_once('='))
            .map(|(_, v)| v.to_string())
            .unwrap();
        assert!(!value.is_empty());
        value
    }

    /// A rollback of default/web by the session `cookie`, with its own CSRF token, is a 403
    /// and the workload stays at generation 2.
    async fn rollback_refused(&self, cookie: &str, csrf: &str) {
        let a = self
            .post(
                "/ui/n/default/workloads/web/rollback",
                Some(cookie),
                &[("csrf", csrf)],
                ORIGIN,
            )
            .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
        assert_eq!(self.generation("default", "web").await, 2);
    }

    async fn scoped_token(&self, body: serde_json::Value) -> String {
        let a = self
            .api(
                Method::POST,
                "/v1alpha1/tokens",
                body.to_string().into_bytes(),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        let t: kat_api::wire::NewApiToken = serde_json::from_str(&a.body).unwrap();
        t.token
    }
}

#[tokio::test]
async fn nothing_but_the_sign_in_page_and_assets_without_a_session() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    assert_eq!(ui.get("/ui/", None).await.location(), "/ui", "/ui/ is /ui");
    for page in [
        "/ui",
        "/ui/n/default",
        "/ui/n/default/workloads/web",
        "/ui/events",
        "/ui/backups",
        "/ui/join-tokens",
        "/ui/no/such/page",
    ] {
        let a = ui.get(page, None).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{page}: {}", a.body);
        assert_eq!(a.location(), "/ui/login", "{page}");
        // A made-up cookie is no session.
        let a = ui.get(page, Some(&"ab".repeat(32))).await;
        assert_eq!(a.location(), "/ui/login", "{page}");
        assert!(!a.body.contains("web"), "{page}: {}", a.body);
    }
    for stream in [
        "/ui/live?page=/ui/",
        "/ui/n/default/workloads/web/instances/web-1/logs",
    ] {
        assert_eq!(ui.get(stream, None).await.status, StatusCode::UNAUTHORIZED);
    }
    let a = ui
        .post("/ui/n/default/workloads/web/rollback", None, &[], ORIGIN)
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    let login = ui.get("/ui/login", None).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(login.body.contains("name=\"token\""), "{}", login.body);
    let csp = login.headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!login.body.contains("<script>"), "no inline script");
    assert!(!login.body.contains("style="), "no inline style");
    for asset in [
        "/ui/assets/kat.css",
        "/ui/assets/kat.js",
        "/ui/assets/kat.svg",
    ] {
        assert_eq!(ui.get(asset, None).await.status, StatusCode::OK, "{asset}");
    }
    assert_eq!(
        ui.get("/ui/assets/../../v1alpha1/nodes", None).await.status,
        StatusCode::NOT_FOUND
    );
    // The API itself still wants its bearer token: a dashboard cookie opens nothing there.
    let cookie = ui.sign_in(TOKEN).await;
    let a = ui.get("/v1alpha1/n/default/workloads", Some(&cookie)).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
}

#[tokio::test]
async fn signing_in_sets_a_strict_cookie_and_signing_out_ends_it() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    for wrong in ["", "nope", "katapi.abc.def", &format!("{TOKEN}x")] {
        let a = ui
            .post("/ui/login", None, &[("token", wrong)], ORIGIN)
            .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
        assert!(a.headers.get(header::SET_COOKIE).is_none());
        assert!(a.body.contains("not a token of this cluster"), "{}", a.body);
    }
    let a = ui
        .post("/ui/login", None, &[("token", TOKEN)], ORIGIN)
        .await;
    assert_eq!(a.location(), "/ui");
    let set = a.headers[header::SET_COOKIE].to_str().unwrap();
    for attribute in [
        "__Host-kat_session=",
        "HttpOnly",
        "Secure",
        "SameSite=Strict",
        "Path=/",
    ] {
        assert!(set.contains(attribute), "{set}");
    }
    // Another site's page cannot sign a browser in (with its own token) either.
    let a = ui
        .post(
            "/ui/login",
            None,
            &[("token", TOKEN)],
            "https://evil.example",
        )
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);

    let cookie = ui.sign_in(TOKEN).await;
    let page = ui.get("/ui", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Cluster"), "{}", page.body);
    assert!(page.headers.contains_key("content-security-policy"));
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");
    let page = ui.get("/ui/n/default", Some(&cookie)).await;
    assert!(page.body.contains("data-workload=\"web\""), "{}", page.body);
    for admin_page in ["/ui/backups", "/ui/join-tokens", "/ui/events"] {
        assert_eq!(
            ui.get(admin_page, Some(&cookie)).await.status,
            StatusCode::OK
        );
    }

    let csrf = csrf_of(&page.body);
    // Sign-out is a state change too: the CSRF token is needed.
    let a = ui.post("/ui/logout", Some(&cookie), &[], ORIGIN).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let a = ui
        .post("/ui/logout", Some(&cookie), &[("csrf", &csrf)], ORIGIN)
        .await;
    assert_eq!(a.location(), "/ui/login");
    assert!(a.headers[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    assert_eq!(ui.get("/ui", Some(&cookie)).await.location(), "/ui/login");
}

#[tokio::test]
async fn a_rollback_needs_the_csrf_token_and_the_same_origin() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    ui.apply("default", "web", "busybox:2").await;
    assert_eq!(ui.generation("default", "web").await, 2);
    let cookie = ui.sign_in(TOKEN).await;
    let page = ui.get("/ui/n/default/workloads/web", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("id=\"rollback\""), "{}", page.body);
    assert!(page.body.contains("busybox:2"), "{}", page.body);
    let csrf = csrf_of(&page.body);
    let rollback = "/ui/n/default/workloads/web/rollback";

    /// What a forged form carries, and the origin it comes from.
    type Forged<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);
    let refused: [Forged; 4] = [
        ("no CSRF token", vec![], ORIGIN),
        ("a wrong CSRF token", vec![("csrf", "0123")], ORIGIN),
        (
            "another origin",
            vec![("csrf", &csrf)],
            "https://evil.example",
        ),
        ("plain http", vec![("csrf", &csrf)], "http://kat.test:7443"),
    ];
    for (what, fields, origin) in &refused {
        let a = ui.post(rollback, Some(&cookie), fields, origin).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{what}: {}", a.body);
        assert_eq!(ui.generation("default", "web").await, 2, "{what}");
    }
    // A browser that says the request is cross-site is refused whatever it carries.
    let req = Request::builder()
        .method(Method::POST)
        .uri(rollback)
        .header(header::HOST, HOST)
        .header("sec-fetch-site", "cross-site")
        .header(
            header::COOKIE,
            format!("{}={cookie}", kat_dashboard::COOKIE),
        )
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}")))
        .unwrap();
    assert_eq!(ui.send(req).await.status, StatusCode::FORBIDDEN);
    assert_eq!(ui.generation("default", "web").await, 2);

    let a = ui
        .post(rollback, Some(&cookie), &[("csrf", &csrf)], ORIGIN)
        .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(a.location(), "/ui/n/default/workloads/web");
    assert_eq!(ui.generation("default", "web").await, 3);
    let page = ui.get("/ui/n/default/workloads/web", Some(&cookie)).await;
    assert!(
        page.body.contains("Rolled back: generation 3"),
        "{}",
        page.body
    );
    assert!(page.body.contains("busybox:1"), "{}", page.body);
}

#[tokio::test]
async fn scoped_tokens_see_what_their_scope_reads_and_no_buttons() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    ui.apply("default", "web", "busybox:2").await;
    ui.apply("team", "api", "busybox:1").await;

    // A metrics token signs in nowhere: it reads /metrics only.
    let metrics = ui.scoped_token(serde_json::json!({"metrics": true})).await;
    let refused = ui
        .post("/ui/login", None, &[("token", &metrics)], ORIGIN)
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.headers.get(header::SET_COOKIE).is_none());
    assert!(refused.body.contains("metrics token"), "{}", refused.body);

    let read_only = ui.scoped_token(serde_json::json!({"readOnly": true})).await;
    let cookie = ui.sign_in(&read_only).await;
    let page = ui.get("/ui/n/default/workloads/web", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("read-only"), "{}", page.body);
    assert!(!page.body.contains("id=\"rollback\""), "no rollback button");
    assert!(!page.body.contains("/ui/backups"), "no link to backups");
    let csrf = csrf_of(&page.body);
    ui.rollback_refused(&cookie, &csrf).await;
    for admin_only in ["/ui/backups", "/ui/join-tokens"] {
        assert_eq!(
            ui.get(admin_only, Some(&cookie)).await.status,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(ui.get("/ui", Some(&cookie)).await.status, StatusCode::OK);

    // A token for one namespace starts there and sees no other.
    let team = ui
        .scoped_token(serde_json::json!({"namespace": "team"}))
        .await;
    let team_cookie = ui.sign_in(&team).await;
    assert_eq!(
        ui.get("/ui", Some(&team_cookie)).await.location(),
        "/ui/n/team"
    );
    let page = ui.get("/ui/n/team", Some(&team_cookie)).await;
    assert!(page.body.contains("data-workload=\"api\""), "{}", page.body);
    assert!(
        !page.body.contains(">default<"),
        "no other namespace offered"
    );
    for other in ["/ui/n/default", "/ui/n/default/workloads/web", "/ui/events"] {
        let a = ui.get(other, Some(&team_cookie)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{other}");
        assert!(!a.body.contains("busybox"), "{other}: {}", a.body);
    }
    let live = ui
        .get("/ui/live?page=/ui/n/default", Some(&team_cookie))
        .await;
    assert_eq!(live.status, StatusCode::NOT_FOUND);

    // A token that may write in its namespace may not roll back in another, nor read there.
    let team_page = ui.get("/ui/n/team/workloads/api", Some(&team_cookie)).await;
    assert_eq!(team_page.status, StatusCode::OK, "{}", team_page.body);
    assert!(
        !team_page.body.contains("Events"),
        "the API gives a namespace token no events"
    );
    let team_csrf = csrf_of(&team_page.body);
    ui.rollback_refused(&team_cookie, &team_csrf).await;
    for other in [
        "/ui/n/default/workloads/web/instances/web-1",
        "/ui/n/default/workloads/web/instances/web-1/logs",
    ] {
        let a = ui.get(other, Some(&team_cookie)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{other}: {}", a.body);
    }

    // Names are checked as they decode: no slash, no control character gets through.
    let admin = ui.sign_in(TOKEN).await;
    let admin_csrf = csrf_of(&ui.get("/ui/n/default", Some(&admin)).await.body);
    for path in [
        "/ui/n/default/workloads/web/instances/x%0D/logs",
        "/ui/n/default/workloads/web/instances/x%0Aevent:%20content/logs",
        "/ui/n/team%2Fx/workloads/web/instances/web-1/logs",
    ] {
        let a = ui.get(path, Some(&admin)).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}: {}", a.body);
    }
    for path in [
        "/ui/n/default/workloads/x%01/rollback",
        "/ui/n/team%2Fx/workloads/web/rollback",
    ] {
        let a = ui
            .post(path, Some(&admin), &[("csrf", &admin_csrf)], ORIGIN)
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}: {}", a.body);
    }

    // A token holds a bounded number of sessions: its own oldest go, the admin's stays
    // (session.rs tests the table's limits themselves).
    for _ in 0..40 {
        ui.sign_in(&read_only).await;
    }
    assert_eq!(ui.get("/ui", Some(&cookie)).await.location(), "/ui/login");
    assert_eq!(ui.get("/ui", Some(&admin)).await.status, StatusCode::OK);

    // Deleting a token ends the sessions it opened: one that works until then is refused.
    let current = ui.sign_in(&read_only).await;
    assert_eq!(ui.get("/ui", Some(&current)).await.status, StatusCode::OK);
    let id = read_only.split('.').nth(1).unwrap();
    let a = ui
        .api(Method::DELETE, &format!("/v1alpha1/tokens/{id}"), vec![])
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(ui.get("/ui", Some(&current)).await.location(), "/ui/login");
    assert_eq!(ui.get("/ui", Some(&admin)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn an_open_page_receives_what_changed() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    let cookie = ui.sign_in(TOKEN).await;
    let req = Request::builder()
        .uri("/ui/live?page=/ui/n/default/workloads/web")
        .header(header::HOST, HOST)
        .header(
            header::COOKIE,
            format!("{}={cookie}", kat_dashboard::COOKIE),
        )
        .body(Body::empty())
        .unwrap();
    let resp = ui.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = resp.into_body().into_data_stream();
    let mut seen = String::new();
    let mut next_event = async || -> String {
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .expect("an event within 10 s")
                .expect("the stream goes on")
                .expect("a chunk");
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(end) = seen.find("\n\n") {
                let event: String = seen[..end].to_string();
                seen.drain(..end + 2);
                if event.starts_with(':') {
                    continue;
                }
                return event;
            }
        }
    };
    // The page as it is, first.
    let first = next_event().await;
    assert!(first.starts_with("event: content"), "{first}");
    assert!(first.contains("busybox:1"), "{first}");
    ui.apply("default", "web", "busybox:2").await;
    let update = next_event().await;
    assert!(update.contains("busybox:2"), "{update}");
    assert!(
        update.contains("id=\"generation\">2<"),
        "the new generation: {update}"
    );

    // Signed out, the stream ends at the next change: nothing more is sent to it.
    let page = ui.get("/ui/n/default", Some(&cookie)).await;
    let a = ui
        .post(
            "/ui/logout",
            Some(&cookie),
            &[("csrf", &csrf_of(&page.body))],
            ORIGIN,
        )
        .await;
    assert_eq!(a.location(), "/ui/login");
    ui.apply("default", "web", "busybox:3").await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.expect("a chunk");
            let text = String::from_utf8_lossy(&chunk);
            assert!(!text.contains("busybox:3"), "sent after sign-out: {text}");
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ended after the sign-out");
}

#[tokio::test]
async fn a_session_past_its_stream_cap_ends_its_oldest_stream_with_replaced() {
    let ui = Ui::new();
    ui.apply("default", "web", "busybox:1").await;
    let cookie = ui.sign_in(TOKEN).await;
    let open = || {
        let req = Request::builder()
            .uri("/ui/live?page=/ui/n/default")
            .header(header::HOST, HOST)
            .header(
                header::COOKIE,
                format!("{}={cookie}", kat_dashboard::COOKIE),
            )
            .body(Body::empty())
            .unwrap();
        ui.router.clone().oneshot(req)
    };
    let mut streams = Vec::new();
    for _ in 0..9 {
        let resp = open().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        streams.push(resp.into_body().into_data_stream());
    }
    // The first of the nine: told it was replaced, then ended (kat.js leaves it closed).
    let oldest = &mut streams[0];
    let mut text = String::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = oldest.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
        }
    })
    .await;
    assert!(ended.is_ok(), "the oldest stream ended: {text}");
    assert!(text.contains("event: replaced"), "{text}");
}
