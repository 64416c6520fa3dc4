//! The HTTPS server against real sockets and TLS: slow, silent and half-sent clients, idle
//! and streamed connections, the connection caps, and client certificates.
//!
//! One file because its eleven tests share two loopback TLS fixtures, `server` (a few test
//! routes) and `api` (the whole leader API), both on `serve_with_limits`, and the readers
//! `eof` and `read_until`; as a child of `serve` it also reaches `ServeLimits::body_deadline`.

use super::*;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

struct Server {
    addr: SocketAddr,
    connector: TlsConnector,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server on loopback with a self-signed certificate and three routes: `/ok`, `/slow`
/// (answers after 1.5 s) and `/echo` (streams the request body back as it arrives).
async fn server(limits: ServeLimits) -> Server {
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "slow"
            }),
        )
        .route(
            "/echo",
            post(|req: Request| async move {
                axum::body::Body::from_stream(req.into_body().into_data_stream())
            }),
        )
        .route(
            "/stream",
            get(|| async {
                // Five parts, 300 ms apart: 1.5 s in all.
                let parts = futures_util::stream::unfold(0, |i| async move {
                    if i == 5 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Some((
                        Ok::<_, std::convert::Infallible>(format!("part{i};")),
                        i + 1,
                    ))
                });
                axum::body::Body::from_stream(parts)
            }),
        );
    serving(|listener, tls| tokio::spawn(serve_with_limits(listener, tls, router, limits))).await
}

/// A server on loopback with a self-signed certificate, run by `start`.
async fn serving(
    start: impl FnOnce(TcpListener, Arc<rustls::ServerConfig>) -> tokio::task::JoinHandle<()>,
) -> Server {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let tls =
        tls_config_with_clients(&cert.cert.pem(), &cert.key_pair.serialize_pem(), None).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = start(listener, tls);
    Server {
        addr,
        connector: TlsConnector::from(Arc::new(client)),
        task,
    }
}

impl Server {
    async fn connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        self.connector.connect(name, tcp).await
    }
}

/// Read until end of file; how long that took.
async fn eof(stream: &mut (impl AsyncRead + Unpin)) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    started.elapsed()
}

/// Read until `text` has arrived.
async fn read_until(stream: &mut (impl AsyncRead + Unpin), text: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains(text) {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before {text:?}: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn limits(header: u64, idle: u64) -> ServeLimits {
    ServeLimits {
        header_read_timeout: Duration::from_millis(header),
        idle_timeout: Duration::from_millis(idle),
        ..ServeLimits::default()
    }
}

#[tokio::test]
async fn a_switchable_server_takes_each_request_to_the_router_of_the_moment() {
    let (routers, rx) = watch::channel(Router::new().route("/which", get(|| async { "parent" })));
    let server = serving(|listener, tls| tokio::spawn(serve_switchable(listener, tls, rx))).await;
    let mut stream = server.connect().await.unwrap();
    let ask = b"GET /which HTTP/1.1\r\nhost: localhost\r\n\r\n";
    stream.write_all(ask).await.unwrap();
    read_until(&mut stream, "parent").await;
    // Detached: the same kept-alive connection now reaches the local cluster's API.
    let _ = routers.send_replace(Router::new().route("/which", get(|| async { "local" })));
    stream.write_all(ask).await.unwrap();
    let answer =
        tokio::time::timeout(Duration::from_secs(5), read_until(&mut stream, "local")).await;
    assert!(
        answer.is_ok(),
        "the kept-alive connection still reaches the old router"
    );
}

/// An HTTP/2 client (prior knowledge, after TLS) gets no HTTP/2 connection: hyper answers
/// its preface as a malformed HTTP/1.1 request and closes, where the auto-detecting server
/// used to answer with HTTP/2 SETTINGS and take 200 streams on the one counted connection.
#[tokio::test]
async fn an_http2_client_gets_no_http2_connection() {
    let server = server(limits(2_000, 5_000)).await;
    let mut stream = server.connect().await.unwrap();
    // The client preface, then an empty SETTINGS frame (RFC 9113 §3.4).
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream.write_all(&preface).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection is closed, not held open");
    // An HTTP/2 server's first frame is SETTINGS: a 3-byte length, then type 4.
    let settings = got.len() >= 4 && got[3] == 4 && !got.starts_with(b"HTTP/1.1");
    assert!(
        !settings,
        "the server spoke HTTP/2: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        got.is_empty() || got.starts_with(b"HTTP/1.1 4"),
        "an HTTP/1.1 error or nothing: {:?}",
        String::from_utf8_lossy(&got)
    );
}

#[tokio::test]
async fn silent_and_partial_clients_are_dropped_after_the_header_timeout() {
    let s = server(limits(300, 5000)).await;
    let opened = Instant::now();
    let mut silent = s.connect().await.unwrap();
    let mut partial = s.connect().await.unwrap();
    partial
        .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut raw = TcpStream::connect(s.addr).await.unwrap();
    eof(&mut silent).await;
    let silent_took = opened.elapsed();
    eof(&mut partial).await;
    let partial_took = opened.elapsed();
    for (what, took) in [("silent", silent_took), ("partial", partial_took)] {
        assert!(
            took >= Duration::from_millis(150) && took < Duration::from_secs(2),
            "{what}: closed after {took:?}"
        );
    }
    // A plain TCP client that never starts TLS is still held by the handshake timeout.
    let held = tokio::time::timeout(Duration::from_millis(300), eof(&mut raw)).await;
    assert!(held.is_err(), "the handshake timeout is 10 s");
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    let s = server(limits(300, 1200)).await;
    let mut c = s.connect().await.unwrap();
    for _ in 0..2 {
        c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_until(&mut c, "\r\n\r\nok").await;
    }
    // Idle past the header timeout: still open.
    let open = tokio::time::timeout(Duration::from_millis(700), eof(&mut c)).await;
    assert!(open.is_err(), "closed before the idle timeout");
    let took = eof(&mut c).await;
    assert!(
        took < Duration::from_secs(2),
        "open {took:?} after the idle timeout"
    );
}

#[tokio::test]
async fn requests_in_flight_are_never_cut() {
    let s = server(limits(300, 600)).await;
    let mut c = s.connect().await.unwrap();
    c.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut c, "\r\n\r\nslow").await;
    // A request body and a response that stream with pauses longer than both timeouts.
    c.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        c.write_all(format!("6\r\npart{i};\r\n").as_bytes())
            .await
            .unwrap();
        read_until(&mut c, &format!("part{i};")).await;
    }
    c.write_all(b"0\r\n\r\n").await.unwrap();
    read_until(&mut c, "0\r\n\r\n").await;
    let took = eof(&mut c).await;
    assert!(
        took < Duration::from_secs(2),
        "idle after the stream: {took:?}"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_then_are_closed() {
    let s = server(ServeLimits {
        max_connections: 2,
        max_waiting: 1,
        connection_wait: Duration::from_millis(300),
        ..ServeLimits::default()
    })
    .await;
    let first = s.connect().await.unwrap();
    let _second = s.connect().await.unwrap();
    // The third waits for a slot, then is closed without a handshake.
    let started = Instant::now();
    assert!(s.connect().await.is_err());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // One waits while another is closed at once.
    let (a, b) = tokio::join!(
        async {
            let t = Instant::now();
            (s.connect().await.is_err(), t.elapsed())
        },
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            (s.connect().await.is_err(), t.elapsed())
        }
    );
    assert!(a.0 && b.0);
    assert!(b.1 < Duration::from_millis(200), "refused at once: {b:?}");
    // A slot freed is a slot taken: the next client is served.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Ok(mut c) = s.connect().await {
            c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            read_until(&mut c, "\r\n\r\nok").await;
            break;
        }
        assert!(Instant::now() < deadline, "no slot after a close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_a_node_only_if_the_cluster_ca_signed_it() {
    let cluster = tempfile::tempdir().unwrap();
    let pki = kat_pki::Pki::generate(cluster.path(), "lab", "node-a", &[]).unwrap();
    let other = tempfile::tempdir().unwrap();
    let intruder = kat_pki::Pki::generate(other.path(), "evil", "node-a", &[]).unwrap();
    let tls =
        tls_config_with_clients(&pki.node_cert_pem, &pki.node_key_pem, Some(&pki.ca_pem)).unwrap();
    let router = Router::new().route(
        "/who",
        get(
            |axum::Extension(node): axum::Extension<ClientNode>| async move {
                node.0
                    .map_or_else(|| "nobody".into(), |(n, role)| format!("{n} {role}"))
            },
        ),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/who", listener.local_addr().unwrap());
    let task = tokio::spawn(serve(listener, tls, router));
    let client = |identity: Option<&kat_pki::Pki>| {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap());
        if let Some(p) = identity {
            let pem = format!("{}\n{}", p.node_cert_pem, p.node_key_pem);
            b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        b.build().unwrap()
    };
    let who = |c: reqwest::Client| {
        let url = url.clone();
        async move { c.get(url).send().await?.text().await }
    };
    // No certificate (katcall, with its bearer token): served, no node.
    assert_eq!(who(client(None)).await.unwrap(), "nobody");
    // A certificate from the cluster CA names its node.
    assert_eq!(
        who(client(Some(&pki))).await.unwrap(),
        "node-a control-plane"
    );
    // The same name from another CA: the handshake fails, nothing is served.
    assert!(who(client(Some(&intruder))).await.is_err());
    task.abort();
}

#[test]
fn a_body_has_more_time_for_its_declared_length_up_to_a_cap() {
    let limits = ServeLimits::default();
    let deadline = |len: Option<&str>| {
        let mut headers = axum::http::HeaderMap::new();
        if let Some(len) = len {
            headers.insert(
                axum::http::header::CONTENT_LENGTH,
                axum::http::HeaderValue::from_str(len).unwrap(),
            );
        }
        limits.body_deadline(&headers)
    };
    assert_eq!(deadline(None), Duration::from_secs(30));
    assert_eq!(deadline(Some("garbage")), Duration::from_secs(30));
    // A bundle (1 MiB at most) and a push hook (5 MiB at most).
    assert_eq!(deadline(Some("1048576")), Duration::from_secs(62));
    assert_eq!(deadline(Some("5242880")), Duration::from_secs(190));
    assert_eq!(deadline(Some("1000000000000")), Duration::from_secs(300));
}

#[tokio::test]
async fn a_streaming_response_outlives_the_request_deadlines() {
    let s = server(ServeLimits {
        body_timeout: Duration::from_millis(300),
        body_timeout_max: Duration::from_millis(300),
        ..limits(300, 600)
    })
    .await;
    let mut c = s.connect().await.unwrap();
    c.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    read_until(&mut c, "part4;").await;
    assert!(started.elapsed() >= Duration::from_millis(1400));
    // And the connection is still good for another request.
    c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut c, "\r\n\r\nok").await;
}

/// The leader's whole API (on `MemStore`), served with the cluster's TLS and `limits`,
/// and a rate limit of 5 requests per client, hardly refilled.
struct Api {
    addr: SocketAddr,
    pki: kat_pki::Pki,
    /// A worker `w1`'s certificate and key, from the same CA.
    worker: String,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const TOKEN: &str = "admin-token";

async fn api(limits: ServeLimits) -> Api {
    use crate::http;
    let dir = tempfile::tempdir().unwrap();
    let pki = kat_pki::Pki::generate(dir.path(), "lab", "node-a", &[]).unwrap();
    let (key, csr) = kat_pki::key_and_csr("w1").unwrap();
    let cert = kat_pki::Authority::load(dir.path())
        .unwrap()
        .sign_csr(&csr, "w1", &[], kat_pki::NodeRole::Worker)
        .unwrap();
    let cluster = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: lab}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";
    let service = crate::Service::new(
        Arc::new(kat_store::MemStore::new()),
        kat_leader::events::EventLog::new(100),
        kat_leader::Clock::system(),
        kat_api::parse_cluster("cluster.kat", cluster.as_bytes()).unwrap(),
    );
    let state = Arc::new(http::ApiState {
        service,
        token_sha256: http::token_sha256(TOKEN),
        access: Arc::new(kat_node::exec_logs::NoInstanceAccess),
        metrics: Default::default(),
        limiter: http::RateLimiter::new(5, 0.001, Duration::from_secs(300)),
    });
    let tls =
        tls_config_with_clients(&pki.node_cert_pem, &pki.node_key_pem, Some(&pki.ca_pem)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(serve_with_limits(
        listener,
        tls,
        http::router(state),
        limits,
    ));
    Api {
        addr,
        worker: format!("{cert}\n{key}"),
        pki,
        task,
        _dir: dir,
    }
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// A client from 127.0.0.1, with `identity` (certificate and key PEM) if given.
    fn client(&self, identity: Option<&str>) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.pki.ca_pem.as_bytes()).unwrap(),
            );
        if let Some(pem) = identity {
            b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        b.build().unwrap()
    }

    /// A raw TLS connection without a client certificate.
    async fn connect(&self) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.pki.ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap()
    }
}

fn heartbeat(node: &str) -> String {
    serde_json::to_string(&kat_api::wire::NodeHeartbeat {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_a_nodes_address_does_not_starve_the_nodes_own_requests() {
    let api = api(ServeLimits::default()).await;
    let anonymous = api.client(None);
    let w1 = api.client(Some(&api.worker));
    let node_a = format!("{}\n{}", api.pki.node_cert_pem, api.pki.node_key_pem);
    let node_a = api.client(Some(&node_a));

    // A container on the node floods the leader from the node's address (127.0.0.1
    // here) without a certificate: 401 while its bucket lasts, then 429.
    let mut limited = 0;
    for _ in 0..30 {
        let r = anonymous
            .get(api.url("/v1alpha1/nodes"))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            401 => {}
            429 => {
                assert!(r.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("{other}: {}", r.text().await.unwrap()),
        }
    }
    assert_eq!(limited, 25, "a burst of 5, then 429");
    // The admin token without a certificate is counted by address as well.
    let r = anonymous
        .get(api.url("/v1alpha1/nodes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);

    // The node's heartbeat from the same address, with its certificate: served.
    let r = w1
        .post(api.url("/v1alpha1/nodes/w1/status"))
        .body(heartbeat("w1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    // Its other own records too, until its own bucket (5) is spent.
    for _ in 0..4 {
        let r = w1
            .get(api.url("/v1alpha1/nodes/w1/dns"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    }
    let r = w1
        .get(api.url("/v1alpha1/nodes/w1/dns"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(
        r.text().await.unwrap().contains("from node w1"),
        "counted against the node"
    );
    // Another node at the same address has its own bucket as well.
    let r = node_a
        .post(api.url("/v1alpha1/nodes/node-a/status"))
        .body(heartbeat("node-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    // And the flood is still held back.
    let r = anonymous.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "healthz is never limited");
    let r = anonymous.get(api.url("/v1alpha1/ca")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_slot_but_a_node_there_still_connects() {
    let api = api(ServeLimits {
        max_per_address: 2,
        ..ServeLimits::default()
    })
    .await;
    // Two idle connections without a certificate from 127.0.0.1 (a flood, held open).
    let _held = [api.connect().await, api.connect().await];
    // A third from there: closed right after its handshake, with no answer.
    let mut third = api.connect().await;
    let _ = third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let took = tokio::time::timeout(Duration::from_secs(3), eof(&mut third))
        .await
        .expect("the third connection from one address is closed");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Another address is served.
    let elsewhere = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(api.pki.ca_pem.as_bytes()).unwrap())
        .local_address(IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let r = elsewhere.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // A node at the flooded address shows its certificate and is served, on several
    // connections at once (none of them counts against the address).
    for _ in 0..3 {
        let w1 = api.client(Some(&api.worker));
        let r = w1
            .post(api.url("/v1alpha1/nodes/w1/status"))
            .body(heartbeat("w1"))
            .send()
            .await
            .unwrap();
        assert_ne!(r.status().as_u16(), 401, "{}", r.text().await.unwrap());
    }
    // And the address gets its slots back as its connections close.
    drop(_held);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r = api.client(None).get(api.url("/healthz")).send().await;
        if r.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the address never got a slot back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Send `head`, then `slow` one byte every 100 ms, while reading: what was answered and
/// how long after the first slow byte the server closed the connection.
async fn trickle(mut stream: TlsStream<TcpStream>, head: &[u8], slow: &[u8]) -> (String, Duration) {
    stream.write_all(head).await.unwrap();
    stream.flush().await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let slow = slow.to_vec();
    let writing = tokio::spawn(async move {
        for byte in slow {
            if writer.write_all(&[byte]).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // All sent: hold the connection open.
        std::future::pending::<()>().await;
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    writing.abort();
    assert!(closed.is_ok(), "still open after 10 s");
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_slow_bodies_are_cut_off_at_their_deadline() {
    let api = api(ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_millis(800),
        body_min_rate: 1 << 20,
        ..ServeLimits::default()
    })
    .await;
    let margin = Duration::from_millis(700);

    // A header trickled from the start.
    let (got, took) = trickle(
        api.connect().await,
        b"",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    )
    .await;
    assert!(got.is_empty(), "{got}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(500) + margin,
        "slow first header closed after {took:?}"
    );

    // A header trickled after a first, quick request on a kept-alive connection, and
    // after an idle pause longer than the header deadline: its clock starts with its
    // first byte, and stops it at the deadline (not the 5 s idle timeout).
    let mut kept = api.connect().await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut kept, "\"ok\"").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (got, took) = trickle(
        kept,
        b"",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    )
    .await;
    assert!(got.is_empty(), "{got}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(500) + margin,
        "slow later header closed after {took:?}"
    );

    // A body of 1000 bytes, one byte every 100 ms: 408 at the body deadline, and the
    // connection closed.
    let head = format!(
        "POST /v1alpha1/namespaces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    let (got, took) = trickle(api.connect().await, head.as_bytes(), &[b' '; 1000]).await;
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(800) + margin,
        "slow body closed after {took:?}"
    );

    // The server still serves: a normal request.
    let r = api
        .client(None)
        .post(api.url("/v1alpha1/namespaces"))
        .bearer_auth(TOKEN)
        .body(r#"{"metadata":{"name":"team-a"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
}
