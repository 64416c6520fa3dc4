//! Serving the API router over HTTPS (rustls), HTTP/1.1 only (one request at a time per
//! connection, so the connection bounds below bound requests too), with upgrades for exec.
//!
//! A node must never stall because of its clients, so every connection is bounded in time
//! and the connections are bounded in number:
//!
//! - the TLS handshake has [`TLS_HANDSHAKE_TIMEOUT`];
//! - the first request's header must be complete within [`HEADER_READ_TIMEOUT`] of the
//!   handshake (a client that sends nothing or a partial request is dropped), and every later
//!   header within [`HEADER_READ_TIMEOUT`] of its first byte (a slowloris that trickles
//!   header lines on a kept-alive connection is dropped too);
//! - a request body must have arrived within its deadline, counted from the end of its
//!   header: [`BODY_TIMEOUT`], plus the time its `Content-Length` takes at
//!   [`BODY_MIN_RATE`], at most [`BODY_TIMEOUT_MAX`]. A handler reading it later gets a 408
//!   and the connection is closed (`crate::http::deadline`);
//! - a keep-alive connection that sits idle between requests is closed after
//!   [`IDLE_TIMEOUT`]: hyper's header-read timer, which hyper starts when a connection goes
//!   idle. No timer runs on a response in flight, so streams (`logs -f`, `events --watch`)
//!   are never cut, however quiet; an upgraded connection (`exec`) leaves hyper and these
//!   timers altogether;
//! - at most [`MAX_CONNECTIONS`] connections are open at once, upgraded ones included (each
//!   holds a slot for as long as its socket lives). When all are taken, up to
//!   [`MAX_WAITING`] new connections wait [`CONNECTION_WAIT`] for a slot and are then
//!   closed; beyond that they are closed at once. The accept loop itself never waits, and
//!   neither tasks nor memory grow with a flood of connections;
//! - at most [`MAX_PER_ADDRESS`] of them come from one address without a node certificate:
//!   a flood from one host (a container's egress leaves from its node's address) cannot take
//!   every slot. A connection past that is still given a short handshake
//!   ([`OVER_CAP_HANDSHAKE`]), so that a node at that address can connect, and closed
//!   right after it unless it showed a node certificate; certified connections are never
//!   counted.
//!
//! Requests themselves are bounded elsewhere: the rate limit per node certificate or client
//! address, the token check before any body is read, and body size limits
//! (`crate::http`).

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use crate::http::{deadline, ClientAddr, ClientNode, ClientSerial};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a client has to complete the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has, after the handshake, to send the complete header of its first
/// request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a keep-alive connection may sit idle between requests. Longer than the header
/// timeout so that clients reusing a pooled connection seconds later rarely race its close.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long any request body may take, from the end of its header, before its size counts.
/// Most bodies are small JSON (a heartbeat is a few KiB, at most 256 KiB), sent at once.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The slowest pace (bytes per second) at which a body's declared `Content-Length` earns
/// more time. The largest bodies the API takes are git push hooks (at most 4 MiB: 128 s
/// more) and workload bundles (at most 1 MiB compressed: 32 s more); backups are made on
/// the leader and upload nothing. A body without a length (chunked) has [`BODY_TIMEOUT`].
pub const BODY_MIN_RATE: u64 = 32 << 10;
/// The longest any request body may take, whatever its declared length (a length beyond a
/// route's limit is refused before its body is read anyway).
pub const BODY_TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// Connections open at once, upgraded (exec) ones included.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections that may wait for a slot when [`MAX_CONNECTIONS`] are open.
pub const MAX_WAITING: usize = 64;
/// How long a waiting connection waits for a slot before it is closed.
pub const CONNECTION_WAIT: Duration = Duration::from_secs(2);
/// Connections from one address that have shown no node certificate (or have not finished
/// their handshake yet): half of [`MAX_CONNECTIONS`], so one host can never hold them all,
/// while a busy client host (a CI runner, a node's local users) still has plenty.
pub const MAX_PER_ADDRESS: usize = MAX_CONNECTIONS / 2;
/// The handshake a connection past [`MAX_PER_ADDRESS`] gets to show a node certificate.
pub const OVER_CAP_HANDSHAKE: Duration = Duration::from_secs(1);
/// At most one warning about the connection limit per this period.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The bounds of [`serve_with_limits`]; the defaults are the constants of this module.
#[derive(Debug, Clone)]
pub struct ServeLimits {
    pub max_connections: usize,
    pub max_per_address: usize,
    pub max_waiting: usize,
    pub connection_wait: Duration,
    pub tls_handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_timeout: Duration,
    pub body_min_rate: u64,
    pub body_timeout_max: Duration,
}

impl ServeLimits {
    /// The deadline of the body of a request with these headers, from the end of the header.
    fn body_deadline(&self, headers: &axum::http::HeaderMap) -> Duration {
        let declared = headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let more = Duration::from_secs_f64(declared as f64 / self.body_min_rate.max(1) as f64);
        (self.body_timeout.saturating_add(more)).min(self.body_timeout_max.max(self.body_timeout))
    }
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: MAX_CONNECTIONS,
            max_per_address: MAX_PER_ADDRESS,
            max_waiting: MAX_WAITING,
            connection_wait: CONNECTION_WAIT,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            body_min_rate: BODY_MIN_RATE,
            body_timeout_max: BODY_TIMEOUT_MAX,
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
) -> Result<Arc<rustls::ServerConfig>, TlsConfigError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsConfigError::new("parsing the server certificate", e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsConfigError::new("parsing the server key", e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsConfigError::new("TLS protocol versions", e))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                let cert = cert.map_err(|e| TlsConfigError::new("parsing the cluster CA", e))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsConfigError::new("the cluster CA", e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsConfigError::new("the client certificate verifier", e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsConfigError::new("the server certificate and key do not match", e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server's certificate, key or client CA cannot make a TLS configuration.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct TlsConfigError {
    what: &'static str,
    detail: String,
}

impl TlsConfigError {
    fn new(what: &'static str, error: impl std::fmt::Display) -> Self {
        TlsConfigError {
            what,
            detail: error.to_string(),
        }
    }
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
    let per_address = Arc::new(AddressCounts::default());
    let mut warned_full: Option<Instant> = None;
    let mut warned_address: Option<Instant> = None;
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
        let address = per_address.take(peer.ip(), limits.max_per_address);
        if address.is_none() && warned_address.is_none_or(|t| t.elapsed() >= FULL_WARNING_EVERY) {
            warned_address = Some(Instant::now());
            tracing::warn!(
                address = %peer.ip(),
                max = limits.max_per_address,
                "one address holds the most connections without a node certificate; more from it are closed unless they show one"
            );
        }
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
            connection(tcp, peer, acceptor, router, &limits, slot, address).await;
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
    address: Option<AddressSlot>,
) {
    let handshake = if address.is_some() {
        limits.tls_handshake_timeout
    } else {
        OVER_CAP_HANDSHAKE.min(limits.tls_handshake_timeout)
    };
    let tls = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
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
    // A node's connection does not count against its address; past the cap, only a node's
    // is served.
    let address = match (&node, address) {
        (Some(_), _) => None,
        (None, Some(address)) => Some(address),
        (None, None) => {
            tracing::debug!(%peer, "connection closed: too many from this address without a node certificate");
            return;
        }
    };
    let clock = Arc::new(RequestClock::new());
    let on_request = clock.clone();
    let body_limits = Arc::new(limits.clone());
    let app = router
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                // A complete header: its clock stops, its body's starts.
                let clock = on_request.clone();
                clock.busy.store(true, Ordering::SeqCst);
                clock.header_since.store(0, Ordering::SeqCst);
                let after = body_limits.body_deadline(req.headers());
                let req = deadline::with_deadline(req, after);
                async move {
                    let response = next.run(req).await;
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                        // Upgraded (exec): the connection leaves hyper and the header clock.
                        return response;
                    }
                    deadline::on_body_end(response, move || {
                        clock.busy.store(false, Ordering::SeqCst)
                    })
                }
            },
        ))
        .layer(axum::Extension(ClientAddr(peer.ip())))
        .layer(axum::Extension(ClientNode(node)))
        .layer(axum::Extension(ClientSerial(serial)));
    // HTTP/1.1 only, whatever the client sends: HTTP/2 would multiplex up to hundreds of
    // streams (each a request in flight, with its body) over one counted connection, past
    // every bound above. ALPN offers `http/1.1` alone; a prior-knowledge HTTP/2 preface is
    // a malformed HTTP/1.1 request and the connection is closed.
    // (hyper-util's auto builder ignores `http1_only` when it serves upgrades: hence hyper's
    // own HTTP/1 builder.)
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout);
    let io = TokioIo::new(Counted {
        io: tls,
        clock: clock.clone(),
        _slot: slot,
        _address: address,
    });
    let conn = builder
        .serve_connection(io, TowerToHyperService::new(app))
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        ended = conn.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        }
        () = clock.header_overdue(limits.header_read_timeout) => {
            // Dropping the connection closes the socket.
            tracing::debug!(%peer, "no complete request header in time; connection closed");
        }
    }
}

/// When the header a connection awaits began to arrive: at the handshake for the first
/// request, at its first byte for later ones (the time before that is idle, which hyper
/// bounds). Hyper tells when a header is complete (the router runs) and the response body
/// tells when it is sent; the connection's reads tell when the next header begins.
///
/// A header that was read while the previous response was still being sent (pipelining)
/// starts no clock: a partial one is bounded by the idle timeout only.
struct RequestClock {
    opened: Instant,
    /// Milliseconds from `opened` to the first byte of the header awaited, plus one; 0 when
    /// none is awaited.
    header_since: AtomicU64,
    /// A request is in hand: from its complete header to the end of its response.
    busy: AtomicBool,
    started: Notify,
}

impl RequestClock {
    fn new() -> Self {
        RequestClock {
            opened: Instant::now(),
            header_since: AtomicU64::new(1),
            busy: AtomicBool::new(false),
            started: Notify::new(),
        }
    }

    /// Bytes arrived: if no request is in hand and no header clock runs, one starts.
    fn read(&self) {
        if self.busy.load(Ordering::SeqCst) || self.header_since.load(Ordering::SeqCst) != 0 {
            return;
        }
        let since = self.opened.elapsed().as_millis() as u64 + 1;
        if self
            .header_since
            .compare_exchange(0, since, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.started.notify_one();
        }
    }

    /// Resolves once a header has taken longer than `timeout`.
    async fn header_overdue(&self, timeout: Duration) {
        loop {
            let since = self.header_since.load(Ordering::SeqCst);
            if since == 0 {
                self.started.notified().await;
                continue;
            }
            let deadline = self.opened + Duration::from_millis(since - 1) + timeout;
            tokio::select! {
                () = tokio::time::sleep_until(deadline.into()) => {
                    if self.header_since.load(Ordering::SeqCst) == since {
                        return;
                    }
                }
                () = self.started.notified() => {}
            }
        }
    }
}

/// A connection's stream holding its slot: the slot is free again when the socket closes,
/// also when an upgraded (exec) session ends long after hyper let go of it.
/// Its reads start the clock of the next request header.
struct Counted<T> {
    io: T,
    clock: Arc<RequestClock>,
    _slot: OwnedSemaphorePermit,
    _address: Option<AddressSlot>,
}

/// Connections per client address not (yet) known to be a node's.
#[derive(Default)]
struct AddressCounts(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

impl AddressCounts {
    /// One more connection from `ip`, or `None` when it already has `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            counts: self.clone(),
            ip,
        })
    }
}

/// One connection counted against its address until dropped.
struct AddressSlot {
    counts: Arc<AddressCounts>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.read();
        }
        polled
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
mod tests;
