//! What an unauthenticated sender can make the API hold through the push-hook route: a body
//! past 4 MiB is refused before it is read (413), no more than 8 bodies are read at once
//! (the ninth gets a 503 at once) and no more than 2 from one source (an IPv4 address or an
//! IPv6 /64), so a flood of slow notifications from many connections holds at most 32 MiB,
//! and a few senders from one place cannot keep everyone else's out. Its own test binary:
//! the bounds are per process.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";
const HOOK: &str = "/v1alpha1/hooks/git/default/web";

/// The bounds are per process: the tests take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Sent = tokio::task::JoinHandle<Result<axum::response::Response, std::convert::Infallible>>;

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
    http::router(state)
}

/// A push notification from `from` (as the server records each connection's address).
fn hook_from(from: IpAddr, body: Body, length: Option<usize>) -> Request<Body> {
    let mut req = Request::post(HOOK)
        .header("x-hub-signature-256", "sha256=00")
        .header("content-type", "application/json");
    if let Some(length) = length {
        req = req.header("content-length", length.to_string());
    }
    let mut req = req.body(body).unwrap();
    req.extensions_mut().insert(ClientAddr(from));
    req
}

fn hook(body: Body, length: Option<usize>) -> Request<Body> {
    hook_from(IpAddr::V4(Ipv4Addr::LOCALHOST), body, length)
}

/// A sender that sends `first`, then nothing more until its channel is dropped.
fn slow(
    router: &axum::Router,
    from: IpAddr,
    first: Vec<u8>,
    length: usize,
) -> (tokio::sync::mpsc::Sender<Vec<u8>>, Sent) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    tx.try_send(first).unwrap();
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        let part = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(part), rx))
    }));
    let task = tokio::spawn(router.clone().oneshot(hook_from(from, body, Some(length))));
    (tx, task)
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

async fn status_of(router: &axum::Router, from: IpAddr) -> (StatusCode, String) {
    let resp = router
        .clone()
        .oneshot(hook_from(from, Body::from("{}"), Some(2)))
        .await
        .unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A notification from `from` while slow senders hold the slots it would need: polled until
/// it is turned away (the senders start when the test yields, later on a busy machine), at
/// most 10 s; the answer and how long the last request took.
async fn turned_away(router: &axum::Router, from: IpAddr) -> (StatusCode, String, Duration) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let started = std::time::Instant::now();
        let (status, body) = status_of(router, from).await;
        if status == StatusCode::SERVICE_UNAVAILABLE || std::time::Instant::now() > deadline {
            return (status, body, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_hook_body_is_small_and_few_are_read_at_once() {
    let _turn = TURN.lock().await;
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

    // Two slow senders from one address hold that address's share...
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(slow(&router, v4(1), b"{".to_vec(), 1000));
    }
    let (status, body, took) = turned_away(&router, v4(1)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("from 10.0.0.1"), "{body}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // ...and two addresses of one IPv6 /64 count as one sender.
    for host in ["2001:db8::1", "2001:db8::2"] {
        held.push(slow(&router, host.parse().unwrap(), b"{".to_vec(), 1000));
    }
    let (status, body, _) = turned_away(&router, "2001:db8::3".parse().unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Another sender is still read (unsigned: 401).
    let (status, body) = status_of(&router, v4(2)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    // Eight slow senders from four places hold every slot, so a ninth from anywhere is
    // turned away at once, without reading its body.
    for last in [3, 3, 4, 4] {
        held.push(slow(&router, v4(last), b"{".to_vec(), 1000));
    }
    let (status, body, _) = turned_away(&router, v4(9)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Once they are done (unsigned: 401 each), notifications are read again.
    for (tx, task) in held {
        drop(tx);
        let status = task.await.unwrap().unwrap().status();
        assert_ne!(status, StatusCode::OK);
    }
    let (status, body) = status_of(&router, v4(9)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}

/// The memory a flood costs: 64 senders from 32 addresses, each sending just under the body
/// limit and then stalling. Eight are read (32 MiB of body), the rest are turned away
/// unread: the process grows by tens of megabytes (45 MiB measured), not by the 256 MiB on
/// offer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_notifications_holds_at_most_eight_bodies() {
    let _turn = TURN.lock().await;
    let router = router();
    let before = kat_testkit::resident_bytes();
    let almost = (4 << 20) - 1;
    let mut sent = Vec::new();
    for i in 0..64u8 {
        sent.push(slow(
            &router,
            v4(100 + i / 2),
            vec![b' '; almost],
            almost + 1,
        ));
    }
    // Those turned away finish at once; the eight read wait for their last byte.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sent.iter().filter(|(_, t)| t.is_finished()).count() < 56
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut refused = 0;
    for (_, task) in &mut sent {
        if task.is_finished() {
            let status = task.await.unwrap().unwrap().status();
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            refused += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grew = kat_testkit::resident_bytes().saturating_sub(before);
    eprintln!(
        "64 slow senders of 4 MiB: {refused} turned away, the process grew by {} MiB",
        grew >> 20
    );
    assert_eq!(refused, 56);
    // Eight bodies (each held once by the reader, and once more while collected) against
    // the 256 MiB sixty-four would take.
    assert!(grew < 96 << 20, "grew by {grew} bytes");
    // The eight read end before the next test takes its turn: the bounds are the process's,
    // and a task left to the runtime's shutdown would still hold its slot then.
    for (tx, task) in sent {
        drop(tx);
        if !task.is_finished() {
            let _ = task.await;
        }
    }
}
