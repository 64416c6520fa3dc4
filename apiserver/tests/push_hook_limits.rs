//! What an unauthenticated sender can make the API hold through the push-hook route: a body
//! past 4 MiB is refused before it is read (413), and no more than 8 bodies are read at once
//! (the ninth gets a 503 at once), so a flood of slow notifications from many connections
//! holds at most 32 MiB. Its own test binary: the bound is one per process.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kat_apiserver::http::{self, ApiState, ClientAddr, NoInstanceAccess};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";
const HOOK: &str = "/v1alpha1/hooks/git/default/web";

fn router() -> axum::Router {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let state = Arc::new(ApiState {
        service: Service::new(
            store,
            kat_leader::events::EventLog::new(100),
            Clock::system(),
            kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
        ),
        token_sha256: http::token_sha256("admin"),
        access: Arc::new(NoInstanceAccess),
        metrics: Default::default(),
        limiter: http::default_rate_limiter(),
    });
    http::router(state).layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))))
}

fn hook(body: Body, length: Option<usize>) -> Request<Body> {
    let mut req = Request::post(HOOK)
        .header("x-hub-signature-256", "sha256=00")
        .header("content-type", "application/json");
    if let Some(length) = length {
        req = req.header("content-length", length.to_string());
    }
    req.body(body).unwrap()
}

#[tokio::test]
async fn a_hook_body_is_small_and_few_are_read_at_once() {
    let router = router();
    // Declared too large: refused before a byte of it is read.
    let resp = router
        .clone()
        .oneshot(hook(Body::empty(), Some((4 << 20) + 1)))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Sent too large without a length: cut off at the limit.
    let resp = router
        .clone()
        .oneshot(hook(Body::from(vec![b' '; (4 << 20) + 1]), None))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // Eight senders that never finish their bodies hold every reading slot...
    let mut held = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..8 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
        tx.send(b"{".to_vec()).await.unwrap();
        senders.push(tx);
        let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            let part = rx.recv().await?;
            Some((Ok::<_, std::io::Error>(part), rx))
        }));
        held.push(tokio::spawn(router.clone().oneshot(hook(body, Some(1000)))));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...so a ninth is turned away at once, without reading its body.
    let started = std::time::Instant::now();
    let resp = router
        .clone()
        .oneshot(hook(Body::from("{}"), Some(2)))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(1));
    // Once they are done (unsigned: 401 each), notifications are read again.
    drop(senders);
    for h in held {
        let status = h.await.unwrap().unwrap().status();
        assert_ne!(status, StatusCode::OK);
    }
    let resp = router
        .oneshot(hook(Body::from("{}"), Some(2)))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}
