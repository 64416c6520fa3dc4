//! What a node's certificate opens on the leader's API, in process on `MemStore`: its own
//! heartbeat, assignments, templates and template problems; nothing of another node's, no
//! workload, token or admin route; and a control-plane node that does not lead sends it to
//! the leader.
//!
//! One file because its eight tests share one fixture: `Api`, the router on a `MemStore`
//! seeded with two workers' instances and templates, whose `send` presents a node's
//! certificate (or none), with `heartbeat` and `pinned_bundle` to make the bodies.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kat_api::keys;
use kat_api::wire::{
    AssignmentUpdate, ErrorBody, ErrorCode, HeartbeatAnswer, InstanceRecord, NodeHeartbeat,
};
use kat_apiserver::http::{self, ApiState, ClientAddr, ClientNode};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_pki::NodeRole;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

struct Api {
    store: Arc<dyn StateStore>,
    router: axum::Router,
}

fn record(node: &str, id: &str, workload: &str, hash: &str) -> InstanceRecord {
    InstanceRecord {
        instance_id: id.parse().unwrap(),
        namespace: "default".into(),
        workload: workload.into(),
        node: node.parse().unwrap(),
        generation: 1,
        spec_hash: hash.into(),
        workload_type: kat_api::workload::WorkloadType::Service,
        requests: Default::default(),
        job_run: None,
        created_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        ip: None,
        host_ports: vec![],
        gpus: vec![],
    }
}

impl Api {
    async fn new(endpoint: Option<&str>) -> Api {
        Self::with(endpoint, None).await
    }

    /// `pin`: a detached node's local API.
    async fn with(endpoint: Option<&str>, pin: Option<&str>) -> Api {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let mut service = Service::new(
            store.clone(),
            kat_leader::events::EventLog::new(1000),
            Clock::system(),
            kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
        );
        service.api_endpoint = endpoint.map(str::to_string);
        service.pin_to_node = pin.map(str::to_string);
        let state = Arc::new(ApiState {
            service,
            token_sha256: http::token_sha256("admin-token"),
            access: Arc::new(NoInstanceAccess),
            metrics: Default::default(),
            limiter: http::default_rate_limiter(),
        });
        let router =
            http::router(state).layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        // Two workers' instances, each with its own template.
        for r in [
            record("w1", "web-1", "web", "hash-web"),
            record("w2", "db-1", "db", "hash-db"),
        ] {
            store
                .put(
                    &keys::instance(&r.node, &r.instance_id),
                    serde_json::to_vec(&r).unwrap(),
                    None,
                )
                .await
                .unwrap();
            store
                .put(
                    &keys::template("default", &r.workload, &r.spec_hash),
                    format!("{{\"template\":\"{}\"}}", r.workload).into_bytes(),
                    None,
                )
                .await
                .unwrap();
        }
        Api { store, router }
    }

    async fn send(
        &self,
        node: Option<(&str, NodeRole)>,
        method: Method,
        path: &str,
        body: &str,
    ) -> (StatusCode, String) {
        self.send_bytes(
            node,
            method,
            path,
            "application/json",
            body.as_bytes().to_vec(),
        )
        .await
    }

    async fn send_bytes(
        &self,
        node: Option<(&str, NodeRole)>,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap();
        req.extensions_mut()
            .insert(ClientNode(node.map(|(n, r)| (n.to_string(), r))));
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        // A stream never ends by itself: read its first line only.
        let mut body = resp.into_body().into_data_stream();
        let mut bytes = Vec::new();
        while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut body).await {
            bytes.extend_from_slice(&chunk);
            if bytes.contains(&b'\n') || status.is_success() && path.ends_with("/assignments") {
                break;
            }
        }
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// GET `path` as `node`: the status, the `kat-revision` header, the body.
    async fn get_at(
        &self,
        node: Option<(&str, NodeRole)>,
        path: &str,
    ) -> (StatusCode, Option<i64>, String) {
        let mut req = Request::builder().uri(path).body(Body::empty()).unwrap();
        req.extensions_mut()
            .insert(ClientNode(node.map(|(n, r)| (n.to_string(), r))));
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let revision = resp
            .headers()
            .get(kat_api::wire::REVISION_HEADER)
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            revision,
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    /// POST `body` with the admin token.
    async fn post_as_admin(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        self.as_admin(Method::POST, path, content_type, body).await
    }

    /// A request with the admin token.
    async fn as_admin(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("authorization", "Bearer admin-token")
            .body(Body::from(body))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        self.store
            .list("/")
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect()
    }
}

fn heartbeat(node: &str) -> String {
    serde_json::to_string(&NodeHeartbeat {
        node: node.parse().unwrap(),
        timestamp: "2026-01-01T00:00:00Z".parse().unwrap(),
        capacity: Default::default(),
        allocatable: Default::default(),
        gpus: vec![],
        instances: vec![],
        usage: None,
        builds: vec![],
        detached: None,
        overlay: vec![],
    })
    .unwrap()
}

const W1: Option<(&str, NodeRole)> = Some(("w1", NodeRole::Worker));
const W2: Option<(&str, NodeRole)> = Some(("w2", NodeRole::Worker));

#[tokio::test]
async fn a_worker_reaches_its_own_records_and_nothing_else() {
    let api = Api::new(None).await;

    // Its own heartbeat: stored, answered with the control plane's endpoints.
    let (status, body) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/status",
            &heartbeat("w1"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let _: HeartbeatAnswer = serde_json::from_str(&body).unwrap();
    assert!(api
        .store
        .get(&keys::node_status("w1"))
        .await
        .unwrap()
        .is_some());
    // A burst, then at most one every 100 ms: a worker cannot fill etcd with heartbeats.
    // (The first of the burst went above. Requests in a row drain the bucket faster than
    // it refills, however slow the machine.)
    let mut refused = None;
    for n in 1..=100 {
        let (status, body) = api
            .send(
                W1,
                Method::POST,
                "/v1alpha1/nodes/w1/status",
                &heartbeat("w1"),
            )
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((n, body));
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (n, body) = refused.expect("a heartbeat past the burst is refused");
    assert!(
        n >= kat_api::node_limits::HEARTBEAT_BURST - 1,
        "refused after only {n} heartbeats: {body}"
    );
    assert!(body.contains("heartbeats more often"), "{body}");

    // Its own assignments: a snapshot of its records only.
    let (status, body) = api
        .send(W1, Method::GET, "/v1alpha1/nodes/w1/assignments", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first: AssignmentUpdate = serde_json::from_str(body.lines().next().unwrap()).unwrap();
    let AssignmentUpdate::Snapshot { records, .. } = first else {
        panic!("a snapshot first: {body}")
    };
    assert_eq!(records, vec![record("w1", "web-1", "web", "hash-web")]);

    // The template its instance runs, and not another's.
    let (status, body) = api
        .send(
            W1,
            Method::GET,
            "/v1alpha1/nodes/w1/templates/default/web/hash-web",
            "",
        )
        .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "{\"template\":\"web\"}")
    );
    let (status, body) = api
        .send(
            W1,
            Method::GET,
            "/v1alpha1/nodes/w1/templates/default/db/hash-db",
            "",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // Template problems: of its own instance, an event; of another node's, refused.
    let (status, body) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/template-problems",
            r#"[{"instanceID": "db-1", "reason": "planted"}]"#,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/template-problems",
            r#"[{"instanceID": "web-1", "reason": "template gone"}]"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = kat_leader::events::list(&*api.store, &Default::default(), 100)
        .await
        .unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.reason == "TemplateMissing")
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>(),
        vec!["instance web-1 on node w1: template gone"]
    );

    // Another node's certificate on w1's records: 403 each, and nothing changes.
    let before = api.dump().await;
    for (method, path, body) in [
        (Method::POST, "/v1alpha1/nodes/w1/status", heartbeat("w1")),
        (Method::POST, "/v1alpha1/nodes/w1/status", heartbeat("w2")),
        (Method::GET, "/v1alpha1/nodes/w1/assignments", String::new()),
        (
            Method::GET,
            "/v1alpha1/nodes/w1/templates/default/web/hash-web",
            String::new(),
        ),
        (
            Method::POST,
            "/v1alpha1/nodes/w1/template-problems",
            r#"[{"instanceID": "web-1", "reason": "x"}]"#.to_string(),
        ),
    ] {
        let (status, answer) = api.send(W2, method.clone(), path, &body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
        let e: ErrorBody = serde_json::from_str(&answer).unwrap();
        assert_eq!(e.error, ErrorCode::Forbidden);
        assert!(
            e.message.contains("cannot act for node w1"),
            "{}",
            e.message
        );
    }
    // And on workloads, tokens, nodes, streams and every admin route.
    for (method, path) in [
        (Method::GET, "/v1alpha1/n/default/workloads"),
        (Method::POST, "/v1alpha1/n/default/workloads"),
        (Method::DELETE, "/v1alpha1/n/default/workloads/web"),
        (Method::GET, "/v1alpha1/join-tokens"),
        (Method::POST, "/v1alpha1/join-tokens"),
        (Method::GET, "/v1alpha1/nodes"),
        (Method::DELETE, "/v1alpha1/nodes/w1"),
        (Method::PUT, "/v1alpha1/nodes/w1/labels"),
        (Method::GET, "/v1alpha1/events"),
        (Method::GET, "/v1alpha1/config/cluster"),
        (
            Method::GET,
            "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
        ),
        (
            Method::POST,
            "/v1alpha1/n/default/workloads/web/instances/web-1/exec",
        ),
    ] {
        let (status, answer) = api.send(W2, method.clone(), path, "{}").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {answer}");
    }
    assert_eq!(
        api.dump().await,
        before,
        "refused requests changed the store"
    );

    // A heartbeat that names another node than its path: refused, nothing stored.
    let (status, _) = api
        .send(
            W2,
            Method::POST,
            "/v1alpha1/nodes/w2/status",
            &heartbeat("w1"),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // No certificate and no token: 401.
    let (status, _) = api
        .send(None, Method::GET, "/v1alpha1/nodes/w1/assignments", "")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A control-plane certificate passes to the instance streams (which this API cannot
    // reach: no instance access here), a worker's does not.
    let (status, _) = api
        .send(
            Some(("cp1", NodeRole::ControlPlane)),
            Method::GET,
            "/v1alpha1/n/default/workloads/web/instances/web-1/logs",
            "",
        )
        .await;
    assert_ne!(status, StatusCode::FORBIDDEN);
    assert_ne!(status, StatusCode::UNAUTHORIZED);

    // Revoked (the node was removed): 401 even on its own records.
    api.store
        .put(&keys::revoked_node("w1"), b"{}".to_vec(), None)
        .await
        .unwrap();
    let (status, _) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/status",
            &heartbeat("w1"),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_node_that_does_not_lead_names_the_leader() {
    let api = Api::new(Some("https://10.0.0.2:9443")).await;
    let (status, body) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/status",
            &heartbeat("w1"),
        )
        .await;
    assert_eq!(status.as_u16(), 421, "{body}");
    let e: ErrorBody = serde_json::from_str(&body).unwrap();
    assert_eq!((e.error, e.leader), (ErrorCode::NotLeader, None));
    assert!(api
        .store
        .get(&keys::node_status("w1"))
        .await
        .unwrap()
        .is_none());

    api.store
        .put(
            keys::LEADER_ENDPOINT,
            b"https://10.0.0.1:9443".to_vec(),
            None,
        )
        .await
        .unwrap();
    let (status, body) = api
        .send(W1, Method::GET, "/v1alpha1/nodes/w1/assignments", "")
        .await;
    assert_eq!(status.as_u16(), 421, "{body}");
    let e: ErrorBody = serde_json::from_str(&body).unwrap();
    assert_eq!(e.leader.as_deref(), Some("https://10.0.0.1:9443"));

    // Once it leads, it answers.
    api.store
        .put(
            keys::LEADER_ENDPOINT,
            b"https://10.0.0.2:9443".to_vec(),
            None,
        )
        .await
        .unwrap();
    let (status, body) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/status",
            &heartbeat("w1"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A worker publishes its own WireGuard key (validated) and reads the overlay's peers; it
/// cannot set another node's key, and nothing is stored on a refusal.
#[tokio::test]
async fn a_worker_publishes_its_own_wireguard_key_and_reads_the_peers() {
    let api = Api::new(None).await;
    for (node, address, subnet) in [
        ("w1", "10.0.0.1", "10.100.0.0/23"),
        ("w2", "10.0.0.2", "10.100.2.0/23"),
    ] {
        let reg = format!(r#"{{"name":"{node}","addresses":["{address}"]}}"#);
        api.store
            .put(&keys::node_registration(node), reg.into_bytes(), None)
            .await
            .unwrap();
        api.store
            .put(&keys::node_subnet(node), subnet.as_bytes().to_vec(), None)
            .await
            .unwrap();
    }
    let (k1, k2) = (
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBA=",
    );
    let body = |k: &str| format!(r#"{{"publicKey":"{k}"}}"#);

    let (status, text) = api
        .send(W1, Method::POST, "/v1alpha1/nodes/w1/wireguard", &body(k1))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let before = api.dump().await;
    // Another node's key: forbidden; a malformed key: 400 naming the field; nothing stored.
    let (status, _) = api
        .send(W1, Method::POST, "/v1alpha1/nodes/w2/wireguard", &body(k2))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for bad in [
        "short",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=",
        "!AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    ] {
        let (status, text) = api
            .send(W1, Method::POST, "/v1alpha1/nodes/w1/wireguard", &body(bad))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {text}");
        assert!(text.contains("publicKey"), "{text}");
    }
    let (status, _) = api
        .send(
            W1,
            Method::POST,
            "/v1alpha1/nodes/w1/wireguard",
            r#"{"publicKey":"x","endpoint":"6.6.6.6:1"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an endpoint cannot be set");
    assert_eq!(api.dump().await, before, "a refused key changed the store");

    let (status, _) = api
        .send(W2, Method::POST, "/v1alpha1/nodes/w2/wireguard", &body(k2))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, text) = api
        .send(W1, Method::GET, "/v1alpha1/nodes/w1/peers", "")
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let peers: Vec<kat_api::wire::OverlayPeer> = serde_json::from_str(&text).unwrap();
    let w2 = peers
        .iter()
        .find(|p| p.node == "w2")
        .expect("w2 among the peers");
    assert_eq!(
        (
            w2.public_key.as_str(),
            w2.endpoint.as_str(),
            w2.subnet.as_str()
        ),
        (k2, "10.0.0.2:51820", "10.100.2.0/23")
    );
    assert_eq!(peers.len(), 2);
    let (status, _) = api
        .send(W1, Method::GET, "/v1alpha1/nodes/w2/peers", "")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A worker's read of the DNS records or the peers waits for a change after the revision of
/// its last answer (a long poll), instead of reading on a clock: a change made before the wait
/// or during it answers at once, a change elsewhere does not, no change answers after the
/// wait; a newer wait of the same node ends the older (a conflict); a revision the store has
/// not reached answers at once; bad arguments are refused by name.
#[tokio::test]
async fn a_workers_read_waits_for_a_change_after_its_last_answer() {
    use std::time::{Duration, Instant};
    let api = Arc::new(Api::new(None).await);
    let record = |ip: &str| {
        format!(
            r#"{{"namespace":"default","workload":"web","instanceID":"web-1","ip":"{ip}","ready":true}}"#
        )
    };
    let put = |key: String, value: String| {
        let api = api.clone();
        async move {
            api.store.put(&key, value.into_bytes(), None).await.unwrap();
        }
    };
    let dns_key = |ip: &str| keys::dns_record("default", "web", "A", ip);

    let (status, revision, text) = api.get_at(W1, "/v1alpha1/nodes/w1/dns").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let first = revision.expect("a revision header");
    assert_eq!(text, "[]");

    // Nothing changes: the answer comes after the wait, with the same records.
    let start = Instant::now();
    let (status, revision, text) = api
        .get_at(W1, &format!("/v1alpha1/nodes/w1/dns?after={first}&wait=1"))
        .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "[]"));
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(revision, Some(first));

    // A change between the answer and the wait: at once.
    put(dns_key("10.100.0.5"), record("10.100.0.5")).await;
    let start = Instant::now();
    let (status, revision, text) = api
        .get_at(W1, &format!("/v1alpha1/nodes/w1/dns?after={first}&wait=30"))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("10.100.0.5"), "{text}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let second = revision.unwrap();
    assert!(second > first);

    // A change while it waits; a write elsewhere does not end the wait.
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let answer = api
                .get_at(
                    W1,
                    &format!("/v1alpha1/nodes/w1/dns?after={second}&wait=30"),
                )
                .await;
            (answer, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    put("/kat/elsewhere".into(), "x".into()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a write elsewhere ended the wait");
    put(dns_key("10.100.0.6"), record("10.100.0.6")).await;
    let ((status, _, text), took) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("10.100.0.6"), "{text}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // The peers: a node's subnet is a change to them.
    let (_, revision, _) = api.get_at(W1, "/v1alpha1/nodes/w1/peers").await;
    let peers_at = revision.expect("a revision header");
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move {
            api.get_at(W1, &format!("/v1alpha1/nodes/w1/peers?after={peers_at}"))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    put(keys::node_subnet("w2"), "10.100.2.0/23".into()).await;
    let (status, revision, text) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the peers' wait ended with the change")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(revision.unwrap() > peers_at);

    // A newer wait of the same node ends the older one at once (a client that reconnected
    // leaves no watch behind); another node's wait is its own.
    let (_, revision, _) = api.get_at(W1, "/v1alpha1/nodes/w1/dns").await;
    let now = revision.unwrap();
    let wait_of = |node: Option<(&'static str, NodeRole)>, name: &'static str| {
        let api = api.clone();
        tokio::spawn(async move {
            api.get_at(
                node,
                &format!("/v1alpha1/nodes/{name}/dns?after={now}&wait=30"),
            )
            .await
        })
    };
    let older = wait_of(W1, "w1");
    let other = wait_of(W2, "w2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newer = wait_of(W1, "w1");
    let (status, _, text) = tokio::time::timeout(Duration::from_secs(5), older)
        .await
        .expect("the older wait ended")
        .unwrap();
    // Not an answer to use: its client backs off before it reads again.
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("newer read"), "{text}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!newer.is_finished() && !other.is_finished());
    newer.abort();
    other.abort();

    // A revision the store has not reached (the worker's, from before a restore): the answer
    // at once, with the store's revision to wait from next.
    let start = Instant::now();
    let (status, revision, _) = api
        .get_at(
            W1,
            "/v1alpha1/nodes/w1/dns?after=9223372036854775807&wait=30",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(revision, Some(now));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );

    // Bad arguments, by name; another node's records are not this node's to wait on.
    for (query, names) in [
        ("after=-1", "after"),
        ("after=x", "after"),
        ("wait=5", "wait"),
        ("after=1&wait=0", "wait"),
        ("after=1&wait=31", "wait"),
    ] {
        let (status, _, text) = api
            .get_at(W1, &format!("/v1alpha1/nodes/w1/dns?{query}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(names), "{query}: {text}");
    }
    let (status, _, _) = api
        .get_at(W1, &format!("/v1alpha1/nodes/w2/dns?after={now}&wait=1"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A one-file bundle: Service `name` in namespace `ns`, pinned to `node` if given.
fn pinned_bundle(name: &str, ns: &str, node: Option<&str>, command: &str) -> Vec<u8> {
    let selector = node
        .map(|n| format!("  nodeSelector: {{kat.dws.rip/nodeName: {n}}}\n"))
        .unwrap_or_default();
    let text = format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  type: Service\n  replicas: 1\n{selector}  source: {{image: busybox:1}}\n  restartPolicy: {{condition: Always}}\n  container: {{command: [{command}]}}\n");
    kat_api::bundle::pack(&std::collections::BTreeMap::from([(
        "workload.kat".to_string(),
        text.into_bytes(),
    )]))
}

/// A rejoining node's submission of what it created while detached: only workloads pinned
/// to itself, under its own path, into namespaces that exist (not KAT's own); the same bundle
/// again is no change; a different workload of that name is refused and the stored one kept.
#[tokio::test]
async fn a_rejoining_node_submits_only_workloads_pinned_to_itself() {
    let api = Api::new(None).await;
    for ns in kat_api::namespace::SYSTEM_NAMESPACES {
        kat_leader::desired::namespaces::create(&*api.store, &Clock::system(), ns, true)
            .await
            .unwrap();
    }
    let gz = "application/gzip";
    let path = "/v1alpha1/nodes/w1/workloads/default";
    let notes = pinned_bundle("notes", "default", Some("w1"), "httpd");
    let (status, body) = api
        .send_bytes(W1, Method::POST, path, gz, notes.clone())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body.contains("\"created\":true"), "{body}");
    let (status, body) = api
        .send_bytes(W1, Method::POST, path, gz, notes.clone())
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a repeated submission changes nothing: {body}"
    );
    let before = api.dump().await;

    let refusals = [
        // Another node's path.
        (W2, path, notes.clone(), StatusCode::FORBIDDEN),
        // Its own path, but pinned to another node, or not pinned at all.
        (
            W2,
            "/v1alpha1/nodes/w2/workloads/default",
            notes.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            W1,
            path,
            pinned_bundle("free", "default", None, "httpd"),
            StatusCode::FORBIDDEN,
        ),
        // A namespace this cluster does not have, or KAT's own.
        (
            W1,
            "/v1alpha1/nodes/w1/workloads/team",
            pinned_bundle("x", "team", Some("w1"), "httpd"),
            StatusCode::NOT_FOUND,
        ),
        (
            W1,
            "/v1alpha1/nodes/w1/workloads/kat-core",
            pinned_bundle("x", "kat-core", Some("w1"), "httpd"),
            StatusCode::FORBIDDEN,
        ),
        // Another workload under a name the cluster already has.
        (
            W1,
            path,
            pinned_bundle("notes", "default", Some("w1"), "sh"),
            StatusCode::CONFLICT,
        ),
        // No certificate and no token.
        (None, path, notes.clone(), StatusCode::UNAUTHORIZED),
    ];
    for (node, path, bundle, expected) in refusals {
        let (status, body) = api.send_bytes(node, Method::POST, path, gz, bundle).await;
        assert_eq!(status, expected, "{node:?} {path}: {body}");
        let error: ErrorBody = serde_json::from_str(&body).unwrap();
        assert!(!error.message.is_empty());
    }
    assert_eq!(
        api.dump().await,
        before,
        "a refused submission writes nothing"
    );

    // At most MAX_PINNED_PER_NODE from one node: a compromised worker cannot fill the store.
    let cap = kat_apiserver::service::MAX_PINNED_PER_NODE;
    for i in 1..cap {
        let bundle = pinned_bundle(&format!("w{i}"), "default", Some("w1"), "httpd");
        let (status, body) = api.send_bytes(W1, Method::POST, path, gz, bundle).await;
        assert_eq!(status, StatusCode::CREATED, "{i}: {body}");
    }
    let more = pinned_bundle("one-too-many", "default", Some("w1"), "httpd");
    let (status, body) = api.send_bytes(W1, Method::POST, path, gz, more).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("at most 64"), "{body}");
}

/// A node's hand-back cannot carry routes: no ingress rule (the reported takeover: a
/// workload `0` pinned to the node, claiming `hello.example.com`, which `hello` serves) and
/// no hostPort another workload publishes. Its own free port is its business.
#[tokio::test]
async fn a_node_certificate_cannot_take_an_ingress_host_or_a_published_port() {
    let api = Api::new(None).await;
    kat_leader::desired::namespaces::create(&*api.store, &Clock::system(), "default", true)
        .await
        .unwrap();
    let lb = |ingress: &str, host_port: u32| {
        format!("apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{{name: http, containerPort: 80, hostPort: {host_port}}}]\n{ingress}")
    };
    let workload = |name: &str, node: Option<&str>| {
        let selector = node
            .map(|n| format!("  nodeSelector: {{kat.dws.rip/nodeName: {n}}}\n"))
            .unwrap_or_default();
        format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  replicas: 1\n{selector}  source: {{image: busybox:1}}\n  restartPolicy: {{condition: Always}}\n  container: {{command: [httpd]}}\n")
    };
    let files = |name: &str, node: Option<&str>, lb: String| {
        std::collections::BTreeMap::from([
            (
                "workload.kat".to_string(),
                workload(name, node).into_bytes(),
            ),
            ("VirtualLoadBalancer.kat".to_string(), lb.into_bytes()),
        ])
    };
    let hello = kat_api::WorkloadBundle::parse(files(
        "hello",
        None,
        lb(
            "  ingress: [{host: hello.example.com, servicePortName: http}]\n",
            8080,
        ),
    ))
    .unwrap();
    kat_leader::desired::workloads::apply(
        &*api.store,
        &kat_leader::events::EventLog::new(10),
        &Clock::system(),
        &hello,
    )
    .await
    .unwrap();
    let before = api.dump().await;
    let path = "/v1alpha1/nodes/w1/workloads/default";
    let gz = "application/gzip";
    for (what, bundle, expected) in [
        (
            "an ingress host another workload serves",
            files(
                "0",
                Some("w1"),
                lb(
                    "  ingress: [{host: hello.example.com, servicePortName: http}]\n",
                    9090,
                ),
            ),
            "may not submit ingress rules",
        ),
        (
            "a free ingress host",
            files(
                "1",
                Some("w1"),
                lb(
                    "  ingress: [{host: mine.example.com, servicePortName: http}]\n",
                    9090,
                ),
            ),
            "may not submit ingress rules",
        ),
        (
            "a published port another workload holds",
            files("2", Some("w1"), lb("", 8080)),
            "hostPort 8080/TCP is published by workload default/hello",
        ),
    ] {
        let (status, body) = api
            .send_bytes(W1, Method::POST, path, gz, kat_api::bundle::pack(&bundle))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
        assert!(body.contains(expected), "{what}: {body}");
    }
    assert_eq!(
        api.dump().await,
        before,
        "a refused hand-back writes nothing"
    );
    let (status, body) = api
        .send_bytes(
            W1,
            Method::POST,
            path,
            gz,
            kat_api::bundle::pack(&files("own", Some("w1"), lb("", 9090))),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "its own free port: {body}");
}

/// On a detached node's local API no node certificate opens anything, its own records
/// included: only the local admin token does (the cluster test applies with it).
#[tokio::test]
async fn a_detached_nodes_local_api_takes_no_node_certificate() {
    let api = Api::with(None, Some("w1")).await;
    for (node, path) in [
        (W1, "/v1alpha1/nodes/w1/status"),
        (W2, "/v1alpha1/nodes/w2/status"),
        (
            Some(("n1", NodeRole::ControlPlane)),
            "/v1alpha1/nodes/n1/status",
        ),
    ] {
        let (status, body) = api
            .send(node, Method::POST, path, &heartbeat(node.unwrap().0))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(body.contains("runs detached"), "{body}");
    }
}

/// A detached node's local API takes at most as many workloads as its parent will take from
/// it at rejoin (each is pinned to the node), and says so when it refuses.
#[tokio::test]
async fn a_detached_nodes_local_api_takes_no_more_than_its_parent_will() {
    let api = Api::with(None, Some("w1")).await;
    for ns in kat_api::namespace::SYSTEM_NAMESPACES {
        kat_leader::desired::namespaces::create(&*api.store, &Clock::system(), ns, true)
            .await
            .unwrap();
    }
    let path = "/v1alpha1/n/default/workloads";
    let gz = "application/gzip";
    for i in 0..kat_apiserver::service::MAX_PINNED_PER_NODE {
        let bundle = pinned_bundle(&format!("local-{i}"), "default", None, "httpd");
        let (status, body) = api.post_as_admin(path, gz, bundle).await;
        assert_eq!(status, StatusCode::CREATED, "{i}: {body}");
    }
    let before = api.dump().await;
    let more = pinned_bundle("one-too-many", "default", None, "httpd");
    let (status, body) = api.post_as_admin(path, gz, more).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body.contains("runs detached") && body.contains("delete some"),
        "{body}"
    );
    assert_eq!(
        api.dump().await,
        before,
        "a refused workload writes nothing"
    );
}

/// The cap holds under parallel submissions too: a compromised worker sending many at once
/// gets no more than MAX_PINNED_PER_NODE in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_pinned_submissions_stop_at_the_cap() {
    let api = Arc::new(Api::new(None).await);
    for ns in kat_api::namespace::SYSTEM_NAMESPACES {
        kat_leader::desired::namespaces::create(&*api.store, &Clock::system(), ns, true)
            .await
            .unwrap();
    }
    let cap = kat_apiserver::service::MAX_PINNED_PER_NODE;
    let tasks: Vec<_> = (0..cap * 3)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                let bundle = pinned_bundle(&format!("p{i}"), "default", Some("w1"), "httpd");
                api.send_bytes(
                    W1,
                    Method::POST,
                    "/v1alpha1/nodes/w1/workloads/default",
                    "application/gzip",
                    bundle,
                )
                .await
                .0
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::CREATED => created += 1,
            StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected answer {other}"),
        }
    }
    let stored = api
        .store
        .list("/kat/workloads/desired/default/")
        .await
        .unwrap()
        .kvs
        .iter()
        .filter_map(|kv| kv.key.split('/').nth(5).map(str::to_string))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert!(created <= cap, "{created} accepted, more than {cap}");
    assert!(stored <= cap, "{stored} stored, more than {cap}");
    assert_eq!(
        created, stored,
        "every 201 is a stored workload, and only those"
    );
}

/// A worker's heartbeat cannot raise what the scheduler gives it: the first one after it
/// joined is recorded as its approved capacity; a later claim of 100 times the CPU and a GPU
/// is stored as its report, with one Warning event (not one per heartbeat), and changes
/// nothing approved; its own certificate cannot approve it; an administrator can, and
/// approves what they saw, not a claim raised since.
#[tokio::test]
async fn a_heartbeat_cannot_raise_a_nodes_approved_capacity() {
    let api = Api::new(None).await;
    kat_leader::desired::node_admin::register(&*api.store, "w1", vec![], Default::default())
        .await
        .unwrap();
    let claim = |cpu: u64, gpus: usize| {
        let mut hb: NodeHeartbeat = serde_json::from_str(&heartbeat("w1")).unwrap();
        hb.allocatable.cpu_millis = cpu;
        hb.allocatable.memory_bytes = 1 << 30;
        hb.gpus = (0..gpus)
            .map(|i| kat_api::wire::GpuInfo {
                driver: kat_api::workload::GpuDriver::Nvidia,
                vram_mb: 81920,
                model: "H100".into(),
                device: format!("nvidia.com/gpu={i}"),
            })
            .collect();
        serde_json::to_string(&hb).unwrap()
    };
    let approved = |api: &Api| {
        let store = api.store.clone();
        async move {
            let kv = store
                .get(&keys::node_registration("w1"))
                .await
                .unwrap()
                .unwrap();
            kat_store::decode::<kat_api::wire::NodeRegistration>(&kv)
                .unwrap()
                .capacity
        }
    };
    let warnings = |api: &Api| {
        let store = api.store.clone();
        async move {
            kat_leader::events::list(&*store, &Default::default(), 100)
                .await
                .unwrap()
                .into_iter()
                .filter(|e| e.reason == "NodeCapacityNotApproved")
                .count()
        }
    };
    let status = "/v1alpha1/nodes/w1/status";
    let (code, body) = api.send(W1, Method::POST, status, &claim(2000, 0)).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let first = approved(&api)
        .await
        .expect("recorded from the first heartbeat");
    assert_eq!(first.allocatable.cpu_millis, 2000);
    for _ in 0..3 {
        let (code, body) = api.send(W1, Method::POST, status, &claim(200_000, 1)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    assert_eq!(
        approved(&api).await,
        Some(first.clone()),
        "a claim approves nothing"
    );
    assert_eq!(warnings(&api).await, 1, "one warning for the new claim");
    let approve = "/v1alpha1/nodes/w1/approve-capacity";
    // What the administrator sees the node claim (as `katcall approve` reads it).
    let (code, body) = api
        .as_admin(
            Method::GET,
            "/v1alpha1/nodes/w1",
            "application/json",
            vec![],
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let seen: kat_api::wire::Node = serde_json::from_str(&body).unwrap();
    let looked_at = serde_json::to_string(&kat_api::wire::ApprovedCapacity {
        allocatable: seen.allocatable,
        gpus: seen.gpus,
    })
    .unwrap();
    let (code, body) = api.send(W1, Method::POST, approve, &looked_at).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        approved(&api).await,
        Some(first),
        "its own approval is refused"
    );
    // The node raises its claim again between the look and the approval: the approval is
    // of what was looked at.
    let (code, body) = api.send(W1, Method::POST, status, &claim(400_000, 2)).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = api
        .post_as_admin(approve, "application/json", looked_at.into_bytes())
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let now = approved(&api).await.unwrap();
    assert_eq!((now.allocatable.cpu_millis, now.gpus.len()), (200_000, 1));
    // A body that is not a capacity is refused with what is expected.
    let (code, body) = api
        .post_as_admin(approve, "application/json", b"{}".to_vec())
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("approved capacity"), "{body}");
}
