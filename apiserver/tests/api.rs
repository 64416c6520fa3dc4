//! The HTTP API in process, on `MemStore`: a request that fails changes nothing stored.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const TOKEN: &str = "test-token";

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

fn workload(ns: &str, name: &str, host_path: &str) -> String {
    format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  type: Service\n  replicas: 1\n  source: {{image: busybox}}\n  restartPolicy: {{condition: Always}}\n  container:\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n    - name: data\n      hostMount: {{hostPath: {host_path}, ensureType: DirectoryOrCreate}}\n"
    )
}

fn namespace(ns: &str) -> String {
    format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Namespace\nmetadata: {{name: {ns}}}\n")
}

fn bundle(files: &[(&str, String)]) -> Vec<u8> {
    let files: BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone().into_bytes()))
        .collect();
    kat_api::bundle::pack(&files)
}

struct Api {
    store: Arc<dyn StateStore>,
    router: axum::Router,
}

impl Api {
    fn new() -> Api {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let state = Arc::new(ApiState {
            service: Service::new(
                store.clone(),
                kat_leader::events::EventLog::new(1000),
                Clock::system(),
                kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
            ),
            token_sha256: http::token_sha256(TOKEN),
            access: Arc::new(NoInstanceAccess),
            metrics: Default::default(),
            limiter: http::default_rate_limiter(),
        });
        let router =
            http::router(state).layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        Api { store, router }
    }

    async fn send(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, String) {
        self.send_as(TOKEN, method, path, body).await
    }

    /// As [`Api::send`], with bearer `token`.
    async fn send_as(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/gzip")
            .body(Body::from(body))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Every key and value in the store.
    async fn dump(&self) -> BTreeMap<String, Vec<u8>> {
        let listing = self.store.list("/").await.unwrap();
        listing
            .kvs
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect()
    }
}

#[tokio::test]
async fn a_refused_request_stores_nothing_not_even_its_namespace() {
    let api = Api::new();
    let before = api.dump().await;

    // A bundle that carries its namespace.kat but whose hostMount is outside the allow-list.
    let refused = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/etc")),
    ]);
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", refused.clone())
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("spec.volumes[0].hostMount.hostPath"),
        "{body}"
    );
    assert_eq!(api.dump().await, before, "nothing stored");

    // A hostPort that is KAT's own API port (9115, the default apiPort): 400, nothing stored.
    let lb = "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 80, hostPort: 9115}]\n".to_string();
    let refused = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/web")),
        ("lb.kat", lb),
    ]);
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", refused)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("spec.ports[0].hostPort: 9115 is KAT's own apiPort"),
        "{body}"
    );
    assert_eq!(api.dump().await, before, "nothing stored");

    // An update of a workload that does not exist, with a namespace.kat: 404, nothing stored.
    let update = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, body) = api
        .send(
            Method::PUT,
            "/v1alpha1/n/team/workloads/web",
            update.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(api.dump().await, before, "nothing stored");

    // A name that does not match the path, and a namespace that does not exist.
    let (status, _) = api
        .send(
            Method::PUT,
            "/v1alpha1/n/team/workloads/other",
            update.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let no_ns = bundle(&[("workload.kat", workload("team", "web", "/srv/web"))]);
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", no_ns.clone())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("namespace team not found"), "{body}");
    assert_eq!(api.dump().await, before, "nothing stored");

    // The valid bundle creates the namespace and the workload together.
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", update)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let after = api.dump().await;
    assert!(after.contains_key("/kat/namespaces/team"));
    assert!(after.contains_key("/kat/workloads/desired/team/web/meta"));

    // A second create of the same workload is a conflict that changes nothing.
    let (status, _) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", no_ns)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(api.dump().await, after);
}

/// `?dryRun=true` checks a create or an update as the real request would and says what it
/// would change, and stores nothing: not the workload, not its namespace, not an event.
#[tokio::test]
async fn a_dry_run_checks_everything_and_stores_nothing() {
    let api = Api::new();
    let before = api.dump().await;
    let create = "/v1alpha1/n/team/workloads?dryRun=true";
    let new = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, body) = api.send(Method::POST, create, new.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let preview: kat_api::wire::ApplyPreview = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            preview.generation,
            preview.changed,
            preview.current_generation
        ),
        (1, true, None)
    );
    assert!(preview.current.is_none());
    assert_eq!(preview.desired.workload.metadata.name, "web");
    assert_eq!(api.dump().await, before, "a dry run stores nothing");

    // What the real request refuses, the dry run refuses alike.
    let off_list = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/etc")),
    ]);
    let (status, body) = api.send(Method::POST, create, off_list).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("spec.volumes[0].hostMount.hostPath"),
        "{body}"
    );
    let no_ns = bundle(&[("workload.kat", workload("team", "web", "/srv/web"))]);
    let (status, body) = api.send(Method::POST, create, no_ns.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("namespace team not found"), "{body}");
    let (status, body) = api
        .send(
            Method::PUT,
            "/v1alpha1/n/team/workloads/web?dryRun=true",
            new.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = api
        .send(
            Method::POST,
            "/v1alpha1/n/team/workloads?dryRun=maybe",
            new.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("dryRun"), "{body}");
    assert_eq!(api.dump().await, before, "a refused dry run stores nothing");

    // Created for real; the same bundle again is no change, another host path a new
    // generation whose instances run something new.
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", new.clone())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let stored = api.dump().await;
    let update = "/v1alpha1/n/team/workloads/web?dryRun=true";
    let (status, body) = api.send(Method::PUT, update, new.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let same: kat_api::wire::ApplyPreview = serde_json::from_str(&body).unwrap();
    assert_eq!((same.generation, same.changed), (1, false));
    assert_eq!(same.current.as_ref(), Some(&same.desired));
    let moved = bundle(&[("workload.kat", workload("team", "web", "/srv/elsewhere"))]);
    let (status, body) = api.send(Method::PUT, update, moved).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let next: kat_api::wire::ApplyPreview = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            next.current_generation,
            next.generation,
            next.changed,
            next.template_changed
        ),
        (Some(1), 2, true, true)
    );
    assert_eq!((next.current_replicas, next.replicas), (Some(1), Some(1)));
    let (status, body) = api.send(Method::POST, create, new).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        api.dump().await,
        stored,
        "dry runs of an update store nothing"
    );
}

/// A namespace.kat's labels are kept with the namespace, shown by `GET namespaces/NS`, set
/// again by a later apply whose namespace.kat says otherwise, and left as they are by an
/// apply without one.
#[tokio::test]
async fn namespace_labels_are_kept_and_updated_by_apply() {
    let api = Api::new();
    let labelled = |labels: &str| {
        format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Namespace\nmetadata: {{name: team, labels: {{{labels}}}}}\n")
    };
    let labels = |api: &Api| {
        let store = api.store.clone();
        async move {
            let kv = store.get("/kat/namespaces/team").await.unwrap().unwrap();
            let ns: kat_api::wire::NamespaceObject = kat_store::decode(&kv).unwrap();
            ns.metadata.labels
        }
    };
    let first = bundle(&[
        ("namespace.kat", labelled("team: blue, tier: web")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", first)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        labels(&api).await,
        BTreeMap::from([
            ("team".into(), "blue".into()),
            ("tier".into(), "web".into())
        ])
    );
    let (status, body) = api
        .send(Method::GET, "/v1alpha1/namespaces/team", vec![])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"tier\":\"web\""), "{body}");
    let relabelled = bundle(&[
        ("namespace.kat", labelled("team: green")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, body) = api
        .send(Method::PUT, "/v1alpha1/n/team/workloads/web", relabelled)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        labels(&api).await,
        BTreeMap::from([("team".into(), "green".into())])
    );
    let without = bundle(&[("workload.kat", workload("team", "web", "/srv/other"))]);
    let (status, body) = api
        .send(Method::PUT, "/v1alpha1/n/team/workloads/web", without)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        labels(&api).await,
        BTreeMap::from([("team".into(), "green".into())])
    );
}

/// Scoped tokens: a read-only token reads and is refused every write, exec, the token and
/// backup routes; a namespace token works in its namespace only; a token restricted by
/// neither is never made; a wrong secret or a deleted token is 401; scoped tokens cannot
/// make tokens.
#[tokio::test]
async fn scoped_tokens_reach_only_their_scope() {
    let api = Api::new();
    let ns = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, body) = api
        .send(Method::POST, "/v1alpha1/n/team/workloads", ns)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let create = |body: serde_json::Value| {
        let api = &api;
        async move {
            let (status, text) = api
                .send(
                    Method::POST,
                    "/v1alpha1/tokens",
                    body.to_string().into_bytes(),
                )
                .await;
            (status, text)
        }
    };
    let (status, body) = create(serde_json::json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("admin token again"), "{body}");
    let (status, body) =
        create(serde_json::json!({"readOnly": true, "description": "ingress"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let read_only: kat_api::wire::NewApiToken = serde_json::from_str(&body).unwrap();
    assert!(read_only.token.starts_with("katapi."), "{body}");
    let (status, body) = create(serde_json::json!({"namespace": "team"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let team: kat_api::wire::NewApiToken = serde_json::from_str(&body).unwrap();

    // A metrics token: /metrics and who it is, nothing else; never with a namespace.
    let (status, body) = create(serde_json::json!({"metrics": true, "namespace": "team"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = create(serde_json::json!({"metrics": true})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let metrics: kat_api::wire::NewApiToken = serde_json::from_str(&body).unwrap();
    assert!(
        metrics.info.scope.metrics && metrics.info.scope.read_only,
        "{body}"
    );
    let m = metrics.token.as_str();
    let (status, body) = api.send_as(m, Method::GET, "/metrics", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Its own prefix: what a binary from before metrics tokens refuses. The same id and
    // secret under the read-only prefix are no token at all.
    assert!(m.starts_with("katmetrics."), "{m}");
    let renamed = m.replacen("katmetrics.", "katapi.", 1);
    let (status, body) = api
        .send_as(&renamed, Method::GET, "/v1alpha1/nodes", vec![])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    for path in [
        "/v1alpha1/nodes",
        "/v1alpha1/n/team/workloads",
        "/v1alpha1/ingress",
    ] {
        let (status, body) = api.send_as(m, Method::GET, path, vec![]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    // A path the router matches but the route table does not declare (an empty segment)
    // reaches no handler with a scoped token: a node's own routes stay the node's.
    for path in [
        "/v1alpha1/nodes//dns",
        "/v1alpha1/nodes//peers",
        "/v1alpha1/nodes//assignments",
        "/v1alpha1/n/team/workloads/web/instances//exec",
    ] {
        let (status, body) = api
            .send_as(&read_only.token, Method::GET, path, vec![])
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    // Who each token is (a worker asks this of the leader for its /metrics).
    let whoami = |token: String| {
        let api = &api;
        async move {
            let (status, body) = api
                .send_as(&token, Method::GET, "/v1alpha1/whoami", vec![])
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            serde_json::from_str::<kat_api::wire::WhoAmI>(&body).unwrap()
        }
    };
    let who = whoami(metrics.token.clone()).await;
    assert!(!who.admin && who.scope.is_some_and(|s| s.metrics));
    let who = whoami(team.token.clone()).await;
    assert_eq!(who.scope.and_then(|s| s.namespace).as_deref(), Some("team"));
    let (status, body) = api.send(Method::GET, "/v1alpha1/whoami", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let who: kat_api::wire::WhoAmI = serde_json::from_str(&body).unwrap();
    assert!(who.admin && who.scope.is_none(), "{body}");
    let (status, _) = api
        .send_as(
            "katapi.nosuch.secret",
            Method::GET,
            "/v1alpha1/whoami",
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let ro = read_only.token.as_str();
    for path in [
        "/v1alpha1/n/team/workloads",
        "/v1alpha1/nodes",
        "/v1alpha1/namespaces",
        "/metrics",
    ] {
        let (status, body) = api.send_as(ro, Method::GET, path, vec![]).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let refused = [
        (Method::DELETE, "/v1alpha1/n/team/workloads/web"),
        (Method::POST, "/v1alpha1/namespaces"),
        (Method::GET, "/v1alpha1/tokens"),
        (Method::POST, "/v1alpha1/tokens"),
        (Method::GET, "/v1alpha1/join-tokens"),
        (Method::GET, "/v1alpha1/backups"),
        (
            Method::GET,
            "/v1alpha1/n/team/workloads/web/instances/web-1/exec",
        ),
    ];
    for (method, path) in refused.clone() {
        let (status, body) = api.send_as(ro, method.clone(), path, vec![]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
    }
    let t = team.token.as_str();
    let (status, body) = api
        .send_as(t, Method::GET, "/v1alpha1/n/team/workloads", vec![])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for path in [
        "/v1alpha1/n/default/workloads",
        "/v1alpha1/nodes",
        "/v1alpha1/tokens",
    ] {
        let (status, body) = api.send_as(t, Method::GET, path, vec![]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    let (status, _) = api
        .send_as(t, Method::DELETE, "/v1alpha1/n/team/workloads/web", vec![])
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a namespace token without --read-only may write there"
    );

    // A wrong secret, a made-up id, a deleted token: 401.
    let mut wrong = ro.to_string();
    wrong.replace_range(wrong.len() - 4.., "0000");
    let made_up = format!("katapi.{}.{}", "0".repeat(12), "0".repeat(32));
    for bad in [wrong.as_str(), made_up.as_str()] {
        let (status, _) = api
            .send_as(bad, Method::GET, "/v1alpha1/nodes", vec![])
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
    }
    let (status, body) = api.send(Method::GET, "/v1alpha1/tokens", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("ingress") && !body.contains("secret") && !body.contains(&read_only.token),
        "{body}"
    );
    let (status, _) = api
        .send(
            Method::DELETE,
            &format!("/v1alpha1/tokens/{}", read_only.info.id),
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api
        .send_as(ro, Method::GET, "/v1alpha1/nodes", vec![])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a deleted token");
}

/// `GET /nodes` marks the node named by the leader record, and only it; with no record (between
/// leaders) none is marked, and a record that does not parse marks none rather than failing.
#[tokio::test]
async fn nodes_mark_the_leader_from_its_record() {
    use kat_api::keys;
    use kat_api::wire::{LeaderRecord, Node, NodeRegistration};
    let api = Api::new();
    for name in ["cp1", "cp2", "w1"] {
        let reg = NodeRegistration::new(name);
        api.store
            .put(
                &keys::node_registration(name),
                serde_json::to_vec(&reg).unwrap(),
                None,
            )
            .await
            .unwrap();
    }
    let leaders = |body: &str| -> Vec<(String, Option<kat_api::wire::Timestamp>)> {
        let nodes: Vec<Node> = serde_json::from_str(body).unwrap();
        assert_eq!(nodes.len(), 3, "{body}");
        nodes
            .into_iter()
            .filter(|n| n.leader)
            .map(|n| (n.metadata.name, n.leader_since))
            .collect()
    };
    let (status, body) = api.send(Method::GET, "/v1alpha1/nodes", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(leaders(&body).is_empty(), "{body}");
    // The JSON field is there for every node, false where it does not lead.
    assert!(body.contains("\"leader\":false"), "{body}");

    let record = LeaderRecord {
        node: "cp2".into(),
        endpoint: "https://10.0.0.2:9443".into(),
        since: "2025-01-02T03:04:05.000Z".parse().unwrap(),
    };
    api.store
        .put(keys::LEADER, serde_json::to_vec(&record).unwrap(), None)
        .await
        .unwrap();
    let (_, body) = api.send(Method::GET, "/v1alpha1/nodes", vec![]).await;
    assert_eq!(
        leaders(&body),
        vec![("cp2".to_string(), Some(record.since))]
    );
    let (status, body) = api.send(Method::GET, "/v1alpha1/nodes/cp2", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cp2: Node = serde_json::from_str(&body).unwrap();
    assert!(cp2.leader);

    api.store
        .put(keys::LEADER, b"not json".to_vec(), None)
        .await
        .unwrap();
    let (status, body) = api.send(Method::GET, "/v1alpha1/nodes", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(leaders(&body).is_empty(), "{body}");
}

/// Logs of a finished instance: the API finds its kept record; when the node that ran it has
/// left the cluster, or is NotReady, the error names that node. `finished-instances` lists
/// what is kept and refuses unknown parameters.
#[tokio::test]
async fn logs_of_a_finished_instance_name_its_node_when_it_is_gone() {
    use kat_api::finished::FinishedInstance;
    use kat_api::keys;
    use kat_api::wire::{ErrorBody, InstanceRecord, InstanceState, NodeRegistration};
    let api = Api::new();
    api.store
        .put(
            &keys::namespace("default"),
            br#"{"metadata":{"name":"default","uid":"u","creationTimestamp":"2025-01-01T00:00:00Z"}}"#.to_vec(),
            None,
        )
        .await
        .unwrap();
    let kept = |id: &str, node: &str| FinishedInstance {
        record: InstanceRecord {
            instance_id: id.parse().unwrap(),
            namespace: "default".into(),
            workload: "report".into(),
            node: node.parse().unwrap(),
            generation: 1,
            spec_hash: "h".into(),
            workload_type: kat_api::workload::WorkloadType::Job,
            requests: Default::default(),
            job_run: Some("0000000001".into()),
            created_at: "2025-01-01T00:00:00Z".parse().unwrap(),
            ip: None,
            host_ports: vec![],
            gpus: vec![],
        },
        state: InstanceState::Succeeded,
        exit_code: Some(0),
        reason: None,
        started_at: None,
        finished_at: "2025-01-01T00:01:00Z".parse().unwrap(),
        finished_ms: 1,
    };
    for (id, node) in [("report-a", "gone"), ("report-b", "quiet")] {
        api.store
            .put(
                &keys::finished_instance("default", "report", id),
                serde_json::to_vec(&kept(id, node)).unwrap(),
                None,
            )
            .await
            .unwrap();
    }
    // "quiet" is registered but has never sent a heartbeat: NotReady.
    let reg = NodeRegistration::new("quiet");
    api.store
        .put(
            &keys::node_registration("quiet"),
            serde_json::to_vec(&reg).unwrap(),
            None,
        )
        .await
        .unwrap();

    let logs = |id: &str| format!("/v1alpha1/n/default/workloads/report/instances/{id}/logs");
    let (status, body) = api.send(Method::GET, &logs("report-a"), vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let e: ErrorBody = serde_json::from_str(&body).unwrap();
    assert!(
        e.message
            .contains("ran on node gone, which is no longer in the cluster"),
        "{}",
        e.message
    );
    let (status, body) = api.send(Method::GET, &logs("report-b"), vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let e: ErrorBody = serde_json::from_str(&body).unwrap();
    assert!(
        e.message.contains("ran on node quiet, which is NotReady"),
        "{}",
        e.message
    );
    // An id nothing knows: 404 that points at --all.
    let (status, body) = api.send(Method::GET, &logs("report-zzz"), vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("get instances --all"), "{body}");

    let (status, body) = api
        .send(
            Method::GET,
            "/v1alpha1/n/default/finished-instances?workload=report",
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Vec<FinishedInstance> = serde_json::from_str(&body).unwrap();
    assert_eq!(listed.len(), 2);
    let (status, _) = api
        .send(
            Method::GET,
            "/v1alpha1/n/default/finished-instances?bogus=1",
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// `katcall apply` in one call (`PUT …/workloads/{name}?create=true`): created, then
/// unchanged, then configured, each said in the `kat-apply-outcome` header; a workload of
/// another name in the bundle is refused and nothing is stored; with dryRun it is refused.
#[tokio::test]
async fn apply_in_one_call_creates_updates_or_changes_nothing() {
    let api = Api::new();
    let apply = |body: Vec<u8>, query: &'static str| {
        let router = api.router.clone();
        async move {
            let req = Request::builder()
                .method(Method::PUT)
                .uri(format!("/v1alpha1/n/team/workloads/web?{query}"))
                .header("authorization", format!("Bearer {TOKEN}"))
                .header("content-type", "application/gzip")
                .body(Body::from(body))
                .unwrap();
            let resp = router.oneshot(req).await.unwrap();
            let outcome = resp
                .headers()
                .get(kat_api::wire::APPLY_OUTCOME_HEADER)
                .map(|v| v.to_str().unwrap().to_string());
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            (
                status,
                outcome,
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        }
    };
    let first = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/web")),
    ]);
    let (status, outcome, body) = apply(first.clone(), "create=true").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(outcome.as_deref(), Some("created"));
    let object: kat_api::wire::WorkloadObject = serde_json::from_str(&body).unwrap();
    assert_eq!(object.metadata.generation, 1);
    let (status, outcome, body) = apply(first, "create=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(outcome.as_deref(), Some("unchanged"));
    let changed = bundle(&[
        ("namespace.kat", namespace("team")),
        ("workload.kat", workload("team", "web", "/srv/other")),
    ]);
    let (status, outcome, body) = apply(changed.clone(), "create=true").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(outcome.as_deref(), Some("configured"));
    let object: kat_api::wire::WorkloadObject = serde_json::from_str(&body).unwrap();
    assert_eq!(object.metadata.generation, 2);

    let before = api.dump().await;
    let other = bundle(&[("workload.kat", workload("team", "api", "/srv/web"))]);
    let (status, _, body) = apply(other, "create=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _, body) = apply(changed, "create=true&dryRun=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("dryRun and create"), "{body}");
    assert_eq!(api.dump().await, before, "nothing stored by a refusal");
}

/// Every route of the table (`kat_api::routes`, from which the router is built and
/// `kat-client` fills its paths) is served with its method: the answer may be a refusal,
/// e.g. a workload that does not exist, but never `no_route` or 405.
#[tokio::test]
async fn every_declared_route_is_served() {
    use kat_api::routes::Route;
    let api = Api::new();
    for route in Route::ALL {
        let params: Vec<&str> = route
            .template()
            .split('/')
            .filter_map(|s| s.strip_prefix('{'))
            .map(|p| match p.trim_end_matches('}') {
                "ns" => "default",
                "name" if route.template().starts_with("/v1alpha1/nodes/") => "n1",
                "name" | "workload" => "web",
                "id" => "web-1",
                "file" => "workload.kat",
                _ => "ab",
            })
            .collect();
        let path = route.path(&params);
        let method = Method::from_bytes(route.method().as_str().as_bytes()).unwrap();
        // A stream that has started (events, assignments) never ends: its route exists.
        let sent = api.send(method.clone(), &path, Vec::new());
        let Ok((status, body)) = tokio::time::timeout(Duration::from_secs(2), sent).await else {
            continue;
        };
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {body}"
        );
        let code = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from));
        assert_ne!(code.as_deref(), Some("no_route"), "{method} {path}: {body}");
    }
}

/// The OpenAPI document is served without a token (as the CA certificate is), and it is
/// the checked file.
#[tokio::test]
async fn the_openapi_document_needs_no_token() {
    let api = Api::new();
    let req = Request::builder()
        .method(Method::GET)
        .uri("/openapi.json")
        .body(Body::empty())
        .unwrap();
    let resp = api.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .unwrap();
    assert_eq!(bytes, kat_apiserver::http::OPENAPI_JSON.as_bytes());
    let doc: serde_json::Value = serde_json::from_str(kat_apiserver::http::OPENAPI_JSON).unwrap();
    assert!(doc["paths"]["/v1alpha1/n/{ns}/workloads"]["post"].is_object());
}
