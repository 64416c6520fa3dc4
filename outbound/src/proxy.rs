//! libgit2 and buildah under the policy. Both resolve names themselves, with no hook, so
//! neither is given a name it could resolve differently from the check:
//!
//! - `https://` goes through [`PinnedProxy`], a `CONNECT` proxy on loopback that lives for
//!   one fetch: it resolves the target, checks every address and connects to a checked one;
//!   TLS stays end to end under the repository's own name. Redirects come back through it
//!   and are checked the same way. buildah's HTTPS pulls and pushes go through it too
//!   (`HTTPS_PROXY`; Go connects to loopback directly, which the policy refuses anyway
//!   unless an admin allowed it).
//! - `git://` has no proxy in libgit2 and no TLS, and libgit2 1.9 connects straight to the
//!   server for plain HTTP even with a proxy set: [`pin_url`] replaces the host with a
//!   checked address.
//!
//! The proxy is ours, not a crate's, because what it must do is the check between resolving
//! and connecting, which is the whole of it; the rest is copying bytes.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{OutboundError, OutboundPolicy};

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;
/// Connections one fetch may hold open through the proxy at once.
const MAX_CONNECTIONS: usize = 16;
/// How long connecting to one target may take, all its addresses together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send its `CONNECT` head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection silent this long in either direction is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A `CONNECT` proxy on loopback for one fetch, pull or push; stops when dropped.
pub struct PinnedProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    refusal: Arc<Mutex<Option<OutboundError>>>,
    thread: Option<JoinHandle<()>>,
}

impl PinnedProxy {
    pub fn start(policy: OutboundPolicy) -> io::Result<PinnedProxy> {
        let listener = TcpListener::bind((IpAddr::from([127, 0, 0, 1]), 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let refusal = Arc::new(Mutex::new(None));
        let thread = {
            let stop = stop.clone();
            let refusal = refusal.clone();
            let policy = Arc::new(policy);
            std::thread::Builder::new()
                .name("kat-out-proxy".into())
                .spawn(move || accept(listener, &policy, &stop, &refusal))?
        };
        Ok(PinnedProxy {
            addr,
            stop,
            refusal,
            thread: Some(thread),
        })
    }

    /// The proxy URL to hand libgit2 or buildah.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The first connection the policy refused, if any (the client only sees a 403).
    pub fn refusal(&self) -> Option<OutboundError> {
        self.refusal.lock().ok().and_then(|r| r.clone())
    }
}

impl Drop for PinnedProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag; if the wake-up cannot connect, the
        // thread is left to end at its next connection rather than joined forever.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(thread) = self.thread.take() {
            if woke {
                let _ = thread.join();
            }
        }
    }
}

fn accept(
    listener: TcpListener,
    policy: &Arc<OutboundPolicy>,
    stop: &AtomicBool,
    refusal: &Arc<Mutex<Option<OutboundError>>>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else {
            // EMFILE and the like: not a busy loop.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = conn.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            );
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let (policy, refusal, held) = (policy.clone(), refusal.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("kat-out-proxy-conn".into())
            .spawn(move || {
                if let Err(e) = serve(conn, &policy, &refusal) {
                    tracing::debug!("outbound proxy connection: {e}");
                }
                held.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// One client connection: read the `CONNECT` head, check and connect, then copy bytes.
fn serve(
    mut client: TcpStream,
    policy: &OutboundPolicy,
    refusal: &Mutex<Option<OutboundError>>,
) -> io::Result<()> {
    client.set_read_timeout(Some(HEAD_TIMEOUT))?;
    client.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let (head, rest) = read_head(&mut client)?;
    client.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let Some(target) = Target::parse(&head) else {
        return client.write_all(
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        );
    };
    let addrs = match policy.resolve_endpoint(&target.host, target.port) {
        Ok(addrs) => addrs,
        Err(e) => {
            tracing::warn!("refused a connection through the outbound proxy: {e}");
            if let Ok(mut first) = refusal.lock() {
                first.get_or_insert(e);
            }
            return client.write_all(
                b"HTTP/1.1 403 Forbidden\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            );
        }
    };
    let mut upstream = connect(&addrs)?;
    upstream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    upstream.set_write_timeout(Some(IDLE_TIMEOUT))?;
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    upstream.write_all(&rest)?;
    splice(client, upstream)
}

/// Reads up to the end of the request head; returns the head and what followed it.
fn read_head(client: &mut TcpStream) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Where a tunnel goes.
#[derive(Debug, PartialEq)]
struct Target {
    host: String,
    port: u16,
}

impl Target {
    fn parse(head: &[u8]) -> Option<Target> {
        let line = head.split(|&b| b == b'\r').next()?;
        let line = std::str::from_utf8(line).ok()?;
        let mut words = line.split(' ');
        let (method, target) = (words.next()?, words.next()?);
        if method != "CONNECT" {
            return None;
        }
        let url = url::Url::parse(&format!("https://{target}")).ok()?;
        let host = match url.host()? {
            url::Host::Domain(d) => d.to_string(),
            url::Host::Ipv4(v4) => v4.to_string(),
            url::Host::Ipv6(v6) => v6.to_string(),
        };
        Some(Target {
            host,
            port: url.port_or_known_default()?,
        })
    }
}

/// The first address that answers, all of them within [`CONNECT_TIMEOUT`].
fn connect(addrs: &[SocketAddr]) -> io::Result<TcpStream> {
    let deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in addrs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no address answered in time",
            ));
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Copies both ways until either side closes.
fn splice(client: TcpStream, upstream: TcpStream) -> io::Result<()> {
    let (mut client_r, mut upstream_w) = (client.try_clone()?, upstream.try_clone()?);
    let up = std::thread::Builder::new()
        .name("kat-out-proxy-up".into())
        .spawn(move || {
            let _ = io::copy(&mut client_r, &mut upstream_w);
            let _ = upstream_w.shutdown(Shutdown::Write);
        })?;
    let (mut upstream_r, mut client_w) = (upstream, client);
    let _ = io::copy(&mut upstream_r, &mut client_w);
    let _ = client_w.shutdown(Shutdown::Both);
    let _ = upstream_r.shutdown(Shutdown::Both);
    let _ = up.join();
    Ok(())
}

/// `SCHEME://REST` (`git` or `http`) with its host replaced by a checked address (the port,
/// default or not, and the path kept).
pub fn pin_url(scheme: &str, rest: &str, policy: &OutboundPolicy) -> Result<String, OutboundError> {
    let bad = |message: &str| OutboundError::Resolve {
        host: format!("{scheme}://{rest}"),
        message: message.to_string(),
    };
    let default_port = match scheme {
        "git" => 9418,
        "http" => 80,
        _ => return Err(bad("not a git:// or http:// URL")),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    // Credentials in the URL stay with it; only the host is replaced.
    let (userinfo, authority) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let parsed = url::Url::parse(&format!("http://{authority}/"))
        .map_err(|e| bad(&format!("bad host: {e}")))?;
    let host = match parsed.host().ok_or_else(|| bad("no host"))? {
        url::Host::Domain(d) => d.to_string(),
        url::Host::Ipv4(v4) => v4.to_string(),
        url::Host::Ipv6(v6) => v6.to_string(),
    };
    let port = parsed.port().unwrap_or(default_port);
    let addr = policy.resolve(&host, port)?[0];
    let host = match addr.ip() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    Ok(format!("{scheme}://{userinfo}{host}:{port}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_names_its_target() {
        let connect = Target::parse(b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(
            connect,
            Some(Target {
                host: "example.com".into(),
                port: 443
            })
        );
        let v6 = Target::parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n");
        assert_eq!(
            v6,
            Some(Target {
                host: "::1".into(),
                port: 8443
            })
        );
        // Only tunnels: libgit2 sends plain HTTP to the server itself.
        assert_eq!(
            Target::parse(b"GET http://example.com/r HTTP/1.1\r\n\r\n"),
            None
        );
        assert_eq!(
            Target::parse(b"GET file:///etc/passwd HTTP/1.1\r\n\r\n"),
            None
        );
    }

    /// A server on loopback that answers one request with `body`.
    fn server(body: &'static str) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let _ = read_head(&mut s);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        port
    }

    fn through(proxy: &PinnedProxy, request: String) -> String {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    }

    #[test]
    fn the_proxy_refuses_loopback_and_says_why() {
        let port = server("secret");
        let proxy = PinnedProxy::start(OutboundPolicy::default()).unwrap();
        let answer = through(
            &proxy,
            format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        );
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(!answer.contains("secret"));
        let answer = through(&proxy, format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"));
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let why = proxy.refusal().unwrap().to_string();
        assert!(why.contains("loopback"), "{why}");
    }

    #[test]
    fn the_proxy_forwards_where_the_policy_allows() {
        let port = server("hello");
        let policy =
            OutboundPolicy::allow(["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
        let proxy = PinnedProxy::start(policy).unwrap();
        let answer = through(
            &proxy,
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        );
        assert!(
            answer.starts_with("HTTP/1.1 200 Connection established"),
            "{answer}"
        );
        assert!(answer.ends_with("hello"), "{answer}");
        assert!(proxy.refusal().is_none());
    }

    #[test]
    fn a_url_is_pinned_to_a_checked_address() {
        let allow =
            OutboundPolicy::allow(["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
        let pinned = pin_url("git", "localhost:9999/app", &allow).unwrap();
        assert!(
            pinned == "git://127.0.0.1:9999/app" || pinned == "git://[::1]:9999/app",
            "{pinned}"
        );
        assert_eq!(
            pin_url("git", "127.0.0.1/a/b", &allow).unwrap(),
            "git://127.0.0.1:9418/a/b"
        );
        assert_eq!(
            pin_url("http", "127.0.0.1/a", &allow).unwrap(),
            "http://127.0.0.1:80/a"
        );
        let pinned = pin_url("http", "user:tok@localhost:8080/a", &allow).unwrap();
        assert!(
            pinned == "http://user:tok@127.0.0.1:8080/a"
                || pinned == "http://user:tok@[::1]:8080/a",
            "{pinned}"
        );
        assert!(pin_url("http", "user:tok@127.0.0.1/a", &allow)
            .unwrap()
            .starts_with("http://user:tok@127.0.0.1:80/"));
        let e = pin_url("git", "127.0.0.1:9418/app", &OutboundPolicy::default()).unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
    }
}
