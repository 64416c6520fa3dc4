//! Joining through the service layer on `MemStore` and on a real etcd: a worker is
//! registered with a worker's certificate; a token admits no more nodes than its limit, even
//! resumed; a worker token never makes an etcd member (which would be sent the CA's key); the
//! address in a certificate is the one the join came from or one the token lists; refused
//! joins write nothing (no record, no certificate, no use counted, no etcd member).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kat_api::keys;
use kat_api::wire::{ErrorCode, JoinRequest, JoinRole, JoinTokenInfo, NewJoinToken};
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::service::{Admission, JoinTokenOptions};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_pki::{Authority, NodeRole, Pki};
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, MemStore, StateStore};
use tower::ServiceExt;

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

/// Where the joining nodes of these tests are, and what they advertise.
const NODE_IP: &str = "10.0.0.9";

fn node_ip() -> IpAddr {
    NODE_IP.parse().unwrap()
}

fn service_on(
    dir: &std::path::Path,
    store: Arc<dyn StateStore>,
    etcd: Option<EtcdStore>,
) -> Service {
    Pki::generate(dir, "test", "cp1", &[]).unwrap();
    let mut service = Service::new(
        store,
        kat_leader::events::EventLog::new(1000),
        Clock::system(),
        kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
    );
    service.admission = Some(Admission {
        node: "cp1".into(),
        authority: Arc::new(Authority::load(dir).unwrap()),
        etcd,
    });
    service
}

fn service(dir: &std::path::Path) -> (Service, Arc<dyn StateStore>) {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    (service_on(dir, store.clone(), None), store)
}

fn request(token: &str, node: &str) -> JoinRequest {
    let (_, csr) = kat_pki::key_and_csr(node).unwrap();
    JoinRequest {
        token: token.into(),
        node_name: node.into(),
        csr,
        address: NODE_IP.into(),
        etcd_peer: false,
        node_type: None,
    }
}

fn worker_token(max_uses: Option<u32>) -> JoinTokenOptions {
    JoinTokenOptions {
        ttl: Some(Duration::from_secs(3600)),
        max_uses,
        ..Default::default()
    }
}

fn control_plane_token() -> JoinTokenOptions {
    JoinTokenOptions {
        role: JoinRole::ControlPlane,
        ..Default::default()
    }
}

async fn dump(store: &dyn StateStore) -> Vec<(String, Vec<u8>)> {
    store
        .list("/")
        .await
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect()
}

#[tokio::test]
async fn a_token_admits_up_to_its_limit_and_a_worker_gets_a_workers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (service, store) = service(dir.path());
    let token = service
        .create_join_token(&worker_token(Some(1)))
        .await
        .unwrap();
    assert_eq!(token.role, JoinRole::Worker);

    let admitted = service
        .join(request(&token.token, "w1"), node_ip())
        .await
        .unwrap();
    assert_eq!(
        kat_pki::role_of_pem(&admitted.certificate),
        Some(NodeRole::Worker)
    );
    assert!(admitted.etcd.is_none(), "a worker gets no etcd credentials");
    let reg: kat_api::wire::NodeRegistration = kat_store::decode(
        &store
            .get(&keys::node_registration("w1"))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(reg.labels[kat_api::wire::CLUSTER_ROLE_LABEL], "worker");
    assert!(!reg.labels.contains_key(kat_api::wire::ROLE_LABEL));
    assert_eq!(
        store
            .get(&keys::node_certificate("w1"))
            .await
            .unwrap()
            .map(|kv| String::from_utf8(kv.value).unwrap()),
        kat_pki::serial_of(&admitted.certificate)
    );

    // The same name again (a leaked token, or a node that lost its data): refused, since
    // w1 holds a certificate; nothing written.
    let before = dump(&*store).await;
    let refused = service
        .join(request(&token.token, "w1"), node_ip())
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Conflict);
    assert!(
        refused.message.contains("has joined before"),
        "{}",
        refused.message
    );
    assert_eq!(dump(&*store).await, before);

    // A second node: past the limit, refused, nothing written.
    let before = dump(&*store).await;
    let refused = service
        .join(request(&token.token, "w2"), node_ip())
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    assert!(refused.message.contains("its limit"), "{}", refused.message);
    assert_eq!(dump(&*store).await, before);

    // A garbage CSR with a good token: refused before the use is counted.
    let open = service
        .create_join_token(&worker_token(Some(1)))
        .await
        .unwrap();
    let before = dump(&*store).await;
    let mut bad = request(&open.token, "w3");
    bad.csr = "not a csr".into();
    let refused = service.join(bad, node_ip()).await.unwrap_err();
    assert!(refused.message.starts_with("csr:"), "{}", refused.message);
    assert_eq!(dump(&*store).await, before);
    service
        .join(request(&open.token, "w3"), node_ip())
        .await
        .unwrap();

    // A limit of zero makes no sense: refused with the field named.
    let zero = service
        .create_join_token(&worker_token(Some(0)))
        .await
        .unwrap_err();
    assert!(zero.message.starts_with("maxUses:"), "{}", zero.message);
}

/// The attack: any token holder asks for etcd membership and gets the CA's key. A worker
/// token (what `kat-agent init` prints) gets 403 and nothing is written.
#[tokio::test]
async fn a_worker_token_asking_for_the_control_plane_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (service, store) = service(dir.path());
    let token = service
        .create_join_token(&worker_token(Some(1)))
        .await
        .unwrap();
    let before = dump(&*store).await;
    let mut greedy = request(&token.token, "evil");
    greedy.etcd_peer = true;
    let refused = service.join(greedy, node_ip()).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden, "{}", refused.message);
    assert_eq!(refused.code.http_status(), 403);
    for said in [
        "is a worker token",
        "--etcd-peer",
        "katcall create join-token --control-plane",
    ] {
        assert!(
            refused.message.contains(said),
            "{said}: {}",
            refused.message
        );
    }
    assert_eq!(dump(&*store).await, before, "nothing written");
    assert!(store
        .get(&keys::node_certificate("evil"))
        .await
        .unwrap()
        .is_none());
    let listed = service.join_tokens().await.unwrap();
    assert!(listed[0].used_by.is_empty(), "no use counted: {listed:?}");
    // The token's one use is still there for what it is for: a worker.
    let worker = service
        .join(request(&token.token, "evil"), node_ip())
        .await
        .unwrap();
    assert_eq!(
        kat_pki::role_of_pem(&worker.certificate),
        Some(NodeRole::Worker)
    );
}

/// The attack: a node advertises another machine's address and gets a certificate for it.
#[tokio::test]
async fn an_address_the_join_does_not_come_from_is_refused_unless_the_token_lists_it() {
    let dir = tempfile::tempdir().unwrap();
    let (service, store) = service(dir.path());
    let token = service
        .create_join_token(&worker_token(None))
        .await
        .unwrap();
    let before = dump(&*store).await;
    let elsewhere: IpAddr = "10.0.0.66".parse().unwrap();
    let refused = service
        .join(request(&token.token, "w1"), elsewhere)
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden, "{}", refused.message);
    for said in [
        "comes from 10.0.0.66",
        "advertised address 10.0.0.9",
        "--advertise-address 10.0.0.66",
        "katcall create join-token --address 10.0.0.9",
    ] {
        assert!(
            refused.message.contains(said),
            "{said}: {}",
            refused.message
        );
    }
    assert_eq!(dump(&*store).await, before, "nothing written");

    // An IPv4 client of a dual-stack socket is the same address.
    let mapped: IpAddr = "::ffff:10.0.0.9".parse().unwrap();
    service
        .join(request(&token.token, "w1"), mapped)
        .await
        .unwrap();

    // A node behind NAT: the token lists the address it is reached at.
    let natted = service
        .create_join_token(&JoinTokenOptions {
            addresses: vec![node_ip()],
            ..worker_token(None)
        })
        .await
        .unwrap();
    assert_eq!(natted.addresses, [NODE_IP]);
    let admitted = service
        .join(request(&natted.token, "w2"), elsewhere)
        .await
        .unwrap();
    let reg: kat_api::wire::NodeRegistration = kat_store::decode(
        &store
            .get(&keys::node_registration("w2"))
            .await
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(reg.addresses, [NODE_IP]);
    assert_eq!(
        kat_pki::role_of_pem(&admitted.certificate),
        Some(NodeRole::Worker)
    );

    // A token cannot list an address no node has.
    let bad = service
        .create_join_token(&JoinTokenOptions {
            addresses: vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            ..worker_token(None)
        })
        .await
        .unwrap_err();
    assert!(bad.message.starts_with("addresses:"), "{}", bad.message);
}

/// On a real etcd: the refused control-plane join adds no member; a control-plane token
/// makes a learner with the CA's key; a control-plane join from the wrong address adds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_only_a_control_plane_token_adds_a_member() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(EtcdServerConfig::loopback("cp1", dir.path()).unwrap())
        .await
        .expect("start etcd");
    let etcd = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    let store: Arc<dyn StateStore> = Arc::new(etcd.clone());
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let service = service_on(&pki, store.clone(), Some(etcd.clone()));
    let members = etcd.members().await.unwrap();
    assert_eq!(members.len(), 1);

    // A worker token asking for membership: 403, no member, nothing stored.
    let worker = service
        .create_join_token(&worker_token(None))
        .await
        .unwrap();
    let before = dump(&*store).await;
    let mut greedy = request(&worker.token, "cp2");
    greedy.etcd_peer = true;
    let refused = service.join(greedy, node_ip()).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden, "{}", refused.message);
    assert_eq!(
        etcd.members().await.unwrap(),
        members,
        "no etcd member added"
    );
    assert_eq!(dump(&*store).await, before, "nothing written");

    // A control-plane token, but the join comes from elsewhere: 403, no member.
    let cp = service
        .create_join_token(&control_plane_token())
        .await
        .unwrap();
    assert_eq!(cp.role, JoinRole::ControlPlane);
    let before = dump(&*store).await;
    let mut member = request(&cp.token, "cp2");
    member.etcd_peer = true;
    let refused = service
        .join(member.clone(), "10.0.0.66".parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden, "{}", refused.message);
    assert_eq!(
        etcd.members().await.unwrap(),
        members,
        "no etcd member added"
    );
    assert_eq!(dump(&*store).await, before, "nothing written");

    // The control-plane token from the node's own address: a learner, the CA's key, a
    // control-plane certificate.
    let admitted = service.join(member, node_ip()).await.unwrap();
    assert_eq!(
        kat_pki::role_of_pem(&admitted.certificate),
        Some(NodeRole::ControlPlane)
    );
    let etcd_join = admitted.etcd.expect("etcd credentials for a member");
    assert!(etcd_join.ca_key.contains("PRIVATE KEY"));
    assert!(
        etcd_join
            .initial_cluster
            .contains("cp2=https://10.0.0.9:2380"),
        "{}",
        etcd_join.initial_cluster
    );
    let now = etcd.members().await.unwrap();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now
        .iter()
        .any(|(_, urls, learner)| *learner && urls == &["https://10.0.0.9:2380"]));
    let listed = service.join_tokens().await.unwrap();
    let cp_listed = listed.iter().find(|t| t.id == cp.id).unwrap();
    assert_eq!(cp_listed.used_by, ["cp2"]);
    assert_eq!(cp_listed.role, JoinRole::ControlPlane);
    server.stop().await;
}

/// Over HTTP: `POST /join-tokens` with a role (a control-plane token lives 1 h unless told
/// otherwise), the list shows it, a bad role or address names the field, and `/join` judges
/// the address the connection came from.
#[tokio::test]
async fn over_http_tokens_carry_their_role_and_joins_their_source() {
    let dir = tempfile::tempdir().unwrap();
    let (service, store) = service(dir.path());
    let state = Arc::new(ApiState {
        service,
        token_sha256: http::token_sha256("admin-token"),
        access: Arc::new(NoInstanceAccess),
        metrics: Default::default(),
        limiter: http::default_rate_limiter(),
    });
    let router = http::router(state);
    let send = |method: Method, path: &str, body: String, from: IpAddr| {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .header("authorization", "Bearer admin-token")
            .body(Body::from(body))
            .unwrap();
        req.extensions_mut().insert(ClientAddr(from));
        let router = router.clone();
        async move {
            let resp = router.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);

    let (status, body) = send(
        Method::POST,
        "/v1alpha1/join-tokens",
        r#"{"role":"control-plane"}"#.into(),
        local,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let cp: NewJoinToken = serde_json::from_str(&body).unwrap();
    assert_eq!(cp.role, JoinRole::ControlPlane);
    let expires = cp.expires_at.system_time();
    let left = expires
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        left <= Duration::from_secs(3600) && left > Duration::from_secs(3500),
        "a control-plane token lives 1 h by default: {left:?}"
    );
    let (status, body) = send(Method::POST, "/v1alpha1/join-tokens", String::new(), local).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let worker: NewJoinToken = serde_json::from_str(&body).unwrap();
    assert_eq!(worker.role, JoinRole::Worker);
    let (_, body) = send(Method::GET, "/v1alpha1/join-tokens", String::new(), local).await;
    let listed: Vec<JoinTokenInfo> = serde_json::from_str(&body).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(body.contains(r#""role":"control-plane""#), "{body}");
    assert!(body.contains(r#""role":"worker""#), "{body}");

    for (bad, field) in [
        (r#"{"role":"admin"}"#, "join token body"),
        (r#"{"addresses":["nope"]}"#, "addresses[0]"),
        (r#"{"ttl":"soon"}"#, "ttl"),
    ] {
        let (status, body) = send(Method::POST, "/v1alpha1/join-tokens", bad.into(), local).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body.contains(field), "{bad}: {body}");
    }

    // The worker token asking for membership: 403 over HTTP too, nothing written.
    let before = dump(&*store).await;
    let mut greedy = request(&worker.token, "evil");
    greedy.etcd_peer = true;
    let (status, body) = send(
        Method::POST,
        "/v1alpha1/join",
        serde_json::to_string(&greedy).unwrap(),
        node_ip(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("worker token"), "{body}");
    assert_eq!(dump(&*store).await, before);

    // A join whose connection comes from loopback advertising 10.0.0.9: refused.
    let (status, body) = send(
        Method::POST,
        "/v1alpha1/join",
        serde_json::to_string(&request(&worker.token, "w1")).unwrap(),
        local,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("comes from 127.0.0.1"), "{body}");
    assert_eq!(dump(&*store).await, before);

    // From the node's own address: admitted.
    let (status, body) = send(
        Method::POST,
        "/v1alpha1/join",
        serde_json::to_string(&request(&worker.token, "w1")).unwrap(),
        node_ip(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
