//! Serving the API router over HTTPS (rustls), HTTP/1.1 with upgrades for exec.
//!
//! A node must never stall because of its clients, so every connection is bounded in time
//! and the connections are bounded in number:
//!
//! - the TLS handshake has [`TLS_HANDSHAKE_TIMEOUT`];
//! - the first request's header must be complete within [`HEADER_READ_TIMEOUT`] of the
//!   handshake (a client that sends nothing or a partial request is dropped);
//! - a keep-alive connection that sits idle between requests is closed after
//!   [`IDLE_TIMEOUT`]: hyper's header-read timer, which hyper starts when a connection goes
//!   idle, so it also bounds a partial header after the first request. It never runs while a
//!   response is in flight, so streams (`logs -f`, `events --watch`) are never cut, however
//!   quiet; an upgraded connection (`exec`) leaves hyper and these timers altogether;
//! - at most [`MAX_CONNECTIONS`] connections are open at once, upgraded ones included (each
//!   holds a slot for as long as its socket lives). When all are taken, up to
//!   [`MAX_WAITING`] new connections wait [`CONNECTION_WAIT`] for a slot and are then
//!   closed; beyond that they are closed at once. The accept loop itself never waits, and
//!   neither tasks nor memory grow with a flood of connections.
//!
//! Requests themselves are bounded elsewhere: the per-client rate limit, the token check
//! before any body is read, and body size limits (`kat_apiserver::http`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::extract::Request;
use axum::middleware::Next;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kat_apiserver::http::{ClientAddr, ClientNode, ClientSerial};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a client has to complete the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has, after the handshake, to send the complete header of its first
/// request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a keep-alive connection may sit idle between requests (and how long the header
/// of a later request may take). Longer than the header timeout so that clients reusing a
/// pooled connection seconds later rarely race its close.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections open at once, upgraded (exec) ones included.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections that may wait for a slot when [`MAX_CONNECTIONS`] are open.
pub const MAX_WAITING: usize = 64;
/// How long a waiting connection waits for a slot before it is closed.
pub const CONNECTION_WAIT: Duration = Duration::from_secs(2);
/// At most one warning about the connection limit per this period.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The bounds of [`serve_with_limits`]; the defaults are the constants of this module.
#[derive(Debug, Clone)]
pub struct ServeLimits {
    pub max_connections: usize,
    pub max_waiting: usize,
    pub connection_wait: Duration,
    pub tls_handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: MAX_CONNECTIONS,
            max_waiting: MAX_WAITING,
            connection_wait: CONNECTION_WAIT,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// The server's TLS; with `client_ca`, a client may also show a certificate from that CA (a
/// node of the cluster: see [`ClientNode`]). Clients without one (katcall, with its bearer
/// token) are still served; a certificate from any other CA ends the handshake.
pub fn tls_config_with_clients(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .context("parsing the server certificate")?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("parsing the server key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(cert.context("parsing the cluster CA")?)
                    .context("the cluster CA")?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .context("the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the server certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accept connections until the task is dropped, with the default [`ServeLimits`].
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, router: Router) {
    serve_with_limits(listener, tls, router, ServeLimits::default()).await
}

/// As [`serve`], each request going to the router `routers` holds at that moment (not when
/// its connection came in): a worker's API becomes its local cluster's full API while it
/// runs detached, and back, kept-alive connections included.
pub async fn serve_switchable(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    routers: watch::Receiver<Router>,
) {
    let dispatch = Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let current = routers.borrow().clone();
        async move { tower::ServiceExt::oneshot(current, req).await }
    }));
    serve(listener, tls, dispatch).await
}

/// Accept connections until the task is dropped.
pub async fn serve_with_limits(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    limits: ServeLimits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let limits = Arc::new(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let waiting = Arc::new(Semaphore::new(limits.max_waiting));
    let mut warned_full: Option<Instant> = None;
    loop {
        let (tcp, peer): (_, SocketAddr) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, most likely: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Slot::Ready(slot),
            Err(_) => {
                if warned_full.is_none_or(|t| t.elapsed() >= FULL_WARNING_EVERY) {
                    warned_full = Some(Instant::now());
                    tracing::warn!(
                        max = limits.max_connections,
                        "the API has reached its connection limit; new connections wait {:?} for a slot, then are closed",
                        limits.connection_wait
                    );
                }
                match waiting.clone().try_acquire_owned() {
                    Ok(turn) => Slot::Wait(turn),
                    Err(_) => {
                        tracing::debug!(%peer, "connection refused: too many waiting");
                        continue;
                    }
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let slots = slots.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let slot = match slot {
                Slot::Ready(slot) => slot,
                Slot::Wait(turn) => {
                    let slot =
                        tokio::time::timeout(limits.connection_wait, slots.acquire_owned()).await;
                    drop(turn);
                    match slot {
                        Ok(Ok(slot)) => slot,
                        _ => {
                            tracing::debug!(%peer, "connection closed: no free slot");
                            return;
                        }
                    }
                }
            };
            connection(tcp, peer, acceptor, router, &limits, slot).await;
        });
    }
}

enum Slot {
    Ready(OwnedSemaphorePermit),
    Wait(OwnedSemaphorePermit),
}

/// One client connection, from the TLS handshake to its close or upgrade.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: Router,
    limits: &ServeLimits,
    slot: OwnedSemaphorePermit,
) {
    let tls = match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    // A client certificate (verified against the cluster CA by the handshake) names a node.
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first());
    let node = leaf.and_then(|cert| kat_pki::node_of(cert.as_ref()));
    let serial = leaf.and_then(|cert| kat_pki::serial_of_der(cert.as_ref()));
    // Set once hyper has parsed a complete request header and calls the router.
    let requested = Arc::new(AtomicBool::new(false));
    let seen = requested.clone();
    let app = router
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                seen.store(true, Ordering::Relaxed);
                next.run(req)
            },
        ))
        .layer(axum::Extension(ClientAddr(peer.ip())))
        .layer(axum::Extension(ClientNode(node)))
        .layer(axum::Extension(ClientSerial(serial)));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    let io = TokioIo::new(Counted {
        io: tls,
        _slot: slot,
    });
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    let first_request = async {
        tokio::time::sleep(limits.header_read_timeout).await;
        if requested.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        ended = conn.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        () = first_request => {
            // Dropping the connection closes the socket.
            tracing::debug!(%peer, "no complete request header in time; connection closed");
        }
    }
}

/// A connection's stream holding its slot: the slot is free again when the socket closes,
/// also when an upgraded (exec) session ends long after hyper let go of it.
struct Counted<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
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
            );
        serving(|listener, tls| tokio::spawn(serve_with_limits(listener, tls, router, limits)))
            .await
    }

    /// A server on loopback with a self-signed certificate, run by `start`.
    async fn serving(
        start: impl FnOnce(TcpListener, Arc<rustls::ServerConfig>) -> tokio::task::JoinHandle<()>,
    ) -> Server {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let tls = tls_config_with_clients(&cert.cert.pem(), &cert.key_pair.serialize_pem(), None)
            .unwrap();
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
        let (routers, rx) =
            watch::channel(Router::new().route("/which", get(|| async { "parent" })));
        let server =
            serving(|listener, tls| tokio::spawn(serve_switchable(listener, tls, rx))).await;
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
        let tls = tls_config_with_clients(&pki.node_cert_pem, &pki.node_key_pem, Some(&pki.ca_pem))
            .unwrap();
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
                .add_root_certificate(
                    reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap(),
                );
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
}
