//! Push hooks against replays, in process on `MemStore`, with a real repository served by
//! `git daemon` on loopback (the hook resolves the branch there): a signed delivery is
//! accepted once; the same delivery again is refused with 409 and triggers nothing, even
//! when the branch has moved meanwhile (a replay would deploy it); a new push deploys. A
//! service that does not allow loopback never connects to the repository there.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_store::{MemStore, StateStore};
use kat_testkit::git::{git, GitDaemon};
use tower::ServiceExt;

const TOKEN: &str = "test-token";
const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

fn commit(work: &Path, text: &str) -> String {
    std::fs::create_dir_all(work.join("app")).unwrap();
    std::fs::write(
        work.join("app/Dockerfile"),
        format!("FROM busybox\n# {text}\n"),
    )
    .unwrap();
    git(work, &["add", "-A"]);
    git(work, &["commit", "-q", "-m", text]);
    git(work, &["rev-parse", "HEAD"])
}

/// A repository `base/app` on branch main, served at the returned `git://` URL.
fn serve_repository(base: &Path) -> (GitDaemon, String) {
    let work = base.join("app");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    commit(&work, "first");
    let daemon = GitDaemon::serve(base);
    let url = daemon.url("app");
    (daemon, url)
}

struct Api {
    store: Arc<dyn StateStore>,
    router: axum::Router,
}

impl Api {
    /// The tests' repositories are on loopback: allowed, as `--allow-fetch-from` does.
    fn new() -> Api {
        Api::with(kat_git::OutboundPolicy::allow(["127.0.0.0/8"
            .parse()
            .unwrap()]))
    }

    fn with(outbound: kat_git::OutboundPolicy) -> Api {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let state = Arc::new(ApiState {
            service: Service {
                outbound,
                ..Service::new(
                    store.clone(),
                    kat_leader::events::EventLog::new(1000),
                    Clock::system(),
                    kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
                )
            },
            token_sha256: http::token_sha256(TOKEN),
            access: Arc::new(NoInstanceAccess),
            metrics: Default::default(),
            limiter: http::default_rate_limiter(),
        });
        let router =
            http::router(state).layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        Api { store, router }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let mut req = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = self
            .router
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn admin(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, String) {
        let auth = format!("Bearer {TOKEN}");
        self.send(
            method,
            path,
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/gzip"),
            ],
            body,
        )
        .await
    }

    /// The generation and commit the workload runs.
    async fn deployed(&self) -> (u64, String) {
        let (status, body) = self
            .admin(Method::GET, "/v1alpha1/n/default/workloads/app", Vec::new())
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let generation = v["metadata"]["generation"].as_u64().unwrap();
        let commit = v["commit"].as_str().unwrap_or_default().to_string();
        (generation, commit)
    }
}

fn bundle(files: &[(&str, String)]) -> Vec<u8> {
    let files: BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone().into_bytes()))
        .collect();
    kat_api::bundle::pack(&files)
}

/// A push notification as GitHub sends it (signed body, delivery id header).
fn delivery(secret: &str, body: &str, id: &str) -> Vec<(String, String)> {
    let signature = kat_pki::webhook::sign(secret, body.as_bytes());
    vec![
        ("content-type".into(), "application/json".into()),
        ("x-github-event".into(), "push".into()),
        ("x-github-delivery".into(), id.into()),
        ("x-hub-signature-256".into(), format!("sha256={signature}")),
    ]
}

async fn push(api: &Api, headers: &[(String, String)], body: &str) -> (StatusCode, String) {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    api.send(
        Method::POST,
        "/v1alpha1/hooks/git/default/app",
        &headers,
        body.as_bytes().to_vec(),
    )
    .await
}

fn git_workload(url: &str) -> Vec<u8> {
    let workload = format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: app, namespace: default}}\nspec:\n  type: Service\n  source:\n    git: {{repository: \"{url}\", branch: main}}\n  replicas: 1\n  restartPolicy: {{condition: Always}}\n  container: {{command: [/bin/true]}}\n"
    );
    let build = "apiVersion: kat.dws.rip/v1alpha1\nkind: BuildDefinition\nspec:\n  buildContext: app\n  dockerfilePath: Dockerfile\n".to_string();
    bundle(&[("workload.kat", workload), ("build.kat", build)])
}

/// A namespace token cannot aim the leader at its own loopback services through
/// `source.git`: the apply is refused with what to allow, nothing is stored, and the
/// repository never sees a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_on_loopback_is_not_resolved_unless_allowed() {
    let base = tempfile::tempdir().unwrap();
    let (_daemon, url) = serve_repository(base.path());
    let api = Api::with(kat_git::OutboundPolicy::default());
    for url in [
        url.clone(),
        url.replace("127.0.0.1", "localhost"),
        "https://169.254.169.254/x".into(),
    ] {
        let (status, body) = api
            .admin(
                Method::POST,
                "/v1alpha1/n/default/workloads",
                git_workload(&url),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        assert!(
            body.contains("spec.source.git") && body.contains("--allow-fetch-from"),
            "{url}: {body}"
        );
    }
    let (status, _) = api
        .admin(Method::GET, "/v1alpha1/n/default/workloads/app", Vec::new())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_push_notification_is_refused_and_triggers_nothing() {
    let base = tempfile::tempdir().unwrap();
    let (_daemon, url) = serve_repository(base.path());
    let work = base.path().join("app");
    let api = Api::new();
    let (status, body) = api
        .admin(
            Method::POST,
            "/v1alpha1/n/default/workloads",
            git_workload(&url),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = api
        .admin(
            Method::POST,
            "/v1alpha1/n/default/workloads/app/webhook",
            Vec::new(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let secret = serde_json::from_str::<serde_json::Value>(&body).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let (generation, _) = api.deployed().await;
    assert_eq!(generation, 1);

    // A push, and its signed notification: accepted, deployed.
    let second = commit(&work, "second");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let first_body = format!(
        "{{\"ref\":\"refs/heads/main\",\"after\":\"{second}\",\"repository\":{{\"pushed_at\":{}}}}}",
        now()
    );
    let first = delivery(&secret, &first_body, "delivery-1");
    let (status, body) = push(&api, &first, &first_body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"redeployed\":true"), "{body}");
    let (generation, running) = api.deployed().await;
    assert_eq!(generation, 2);
    assert_eq!(running, second);

    // The branch moves; the same delivery is replayed (as captured, and with a fresh
    // delivery id, which is not signed): refused, nothing deployed.
    let third = commit(&work, "third");
    let relabelled = delivery(&secret, &first_body, "delivery-forged");
    for replay in [&first, &relabelled] {
        let (status, body) = push(&api, replay, &first_body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("replayed push notification"), "{body}");
        assert!(body.contains("nothing was done"), "{body}");
        let (generation, running) = api.deployed().await;
        assert_eq!(generation, 2, "a replay deployed");
        assert_eq!(running, second);
    }

    // A notification of a push from beyond the window: refused, nothing deployed.
    let old_body = format!(
        "{{\"ref\":\"refs/heads/main\",\"after\":\"{third}\",\"repository\":{{\"pushed_at\":{}}}}}",
        now() - 2 * 24 * 3600
    );
    let (status, body) = push(&api, &delivery(&secret, &old_body, "old"), &old_body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("replay window"), "{body}");
    assert_eq!(api.deployed().await.0, 2);

    // The genuine notification of the new push: deployed.
    let new_body = format!(
        "{{\"ref\":\"refs/heads/main\",\"after\":\"{third}\",\"repository\":{{\"pushed_at\":{}}}}}",
        now()
    );
    let (status, body) = push(&api, &delivery(&secret, &new_body, "delivery-2"), &new_body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (generation, running) = api.deployed().await;
    assert_eq!(generation, 3);
    assert_eq!(running, third);

    // Two copies of one delivery at once: one accepted, one refused.
    let fourth = commit(&work, "fourth");
    let race_body = format!(
        "{{\"ref\":\"refs/heads/main\",\"after\":\"{fourth}\",\"repository\":{{\"pushed_at\":{}}}}}",
        now()
    );
    let race = delivery(&secret, &race_body, "delivery-3");
    let (a, b) = tokio::join!(push(&api, &race, &race_body), push(&api, &race, &race_body));
    let mut codes = [a.0, b.0];
    codes.sort();
    assert_eq!(codes, [StatusCode::OK, StatusCode::CONFLICT], "{a:?} {b:?}");
    assert_eq!(api.deployed().await.0, 4);

    // The records are leased (they go by themselves after the window).
    let records = api
        .store
        .list(&kat_api::keys::workload_hook_deliveries("default", "app"))
        .await
        .unwrap();
    assert_eq!(records.kvs.len(), 3);
    assert!(records.kvs.iter().all(|kv| kv.lease != 0));
}
