//! Idle connections and a stuck exec stall nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::*;
use crate::node::*;
use kat_api::wire::NodeState;
use kat_testkit::bin;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// How often the agent log says this node became the leader.
pub(crate) fn times_elected(c: &Cluster) -> usize {
    std::fs::read_to_string(c.dir.path().join("agent.log"))
        .unwrap_or_default()
        .matches("this node leads the cluster")
        .count()
}

/// Whether the peer closed `tcp`, reading (and dropping) whatever it sent; `wait` at most.
pub(crate) fn closed_within(tcp: &mut TcpStream, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        tcp.set_read_timeout(Some(left)).expect("read timeout");
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// 200 idle connections (plain TCP that never starts TLS, TLS that never sends a request,
/// TLS with a partial request header) and `katcall exec -i` of a command that never reads
/// the megabytes written to its stdin, all held while `katcall get workloads` is timed; the
/// node keeps its heartbeats and its leadership; then the server's handshake and header
/// timeouts close every idle connection.
pub(crate) fn never_stalls(c: &Cluster, instance: &str) {
    let section = Instant::now();
    let elected = times_elected(c);
    let (_, heartbeat_before) = node_heartbeat(c);

    // An exec whose command never reads stdin, fed as fast as katcall takes it.
    let mut exec = Command::new(bin("katcall"))
        .args([
            "exec",
            "-i",
            &format!("web/{instance}"),
            "--",
            "sleep",
            "30",
        ])
        .env("KAT_CONFIG", c.path("katcall.yaml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("katcall exec");
    let mut stdin = exec.stdin.take().expect("exec stdin");
    let written = Arc::new(AtomicUsize::new(0));
    let total = 64 << 20;
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; 64 << 10];
            while written.load(Ordering::Relaxed) < total {
                if stdin.write_all(&chunk).is_err() {
                    return;
                }
                written.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        })
    };
    // Until the stream is full: nothing more accepted for a second.
    let stalled_by = Instant::now() + Duration::from_secs(10);
    let mut last = (0, Instant::now());
    while Instant::now() < stalled_by {
        std::thread::sleep(Duration::from_millis(200));
        let now = written.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if now > 0 && last.1.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    let accepted = written.load(Ordering::Relaxed);
    assert!(
        accepted > 256 << 10 && accepted < total,
        "katcall exec took {accepted} bytes of stdin: expected more than a pipe's worth and \
         then backpressure"
    );

    // 200 idle connections.
    let ca = std::fs::read(c.path("data/pki/ca.crt")).expect("ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let mut idle: Vec<(TcpStream, Instant, &str)> = Vec::new();
    for i in 0..200 {
        let opened = Instant::now();
        let mut tcp = TcpStream::connect(("127.0.0.1", c.api_port)).expect("connect to the API");
        let kind = match i % 4 {
            0 | 1 => "plain TCP",
            2 => "TLS",
            _ => "partial request",
        };
        if kind != "plain TCP" {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let mut conn = rustls::ClientConnection::new(tls.clone(), name).expect("TLS client");
            while conn.is_handshaking() {
                conn.complete_io(&mut tcp)
                    .expect("TLS handshake with the API");
            }
            if kind == "partial request" {
                let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                stream
                    .write_all(b"GET /v1alpha1/nodes HTTP/1.1\r\nHost: e2e\r\n")
                    .expect("partial request");
                stream.flush().expect("flush");
            }
        }
        idle.push((tcp, opened, kind));
    }
    let opened_all = idle[idle.len() - 1].1.duration_since(idle[0].1);

    // Meanwhile: quick answers and fresh heartbeats.
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut heartbeat = false;
    while latencies.len() < 5 || !heartbeat {
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "no new heartbeat under load (last {heartbeat_before:?})\nagent log:\n{}",
            c.agent_log_tail()
        );
        let t = Instant::now();
        let table = c.must(&["get", "workloads"]);
        let took = t.elapsed();
        assert!(table.contains("web"), "{table}");
        assert!(
            took < Duration::from_secs(3),
            "`katcall get workloads` took {took:?} under load"
        );
        latencies.push(took);
        let (state, last) = node_heartbeat(c);
        assert_eq!(state, NodeState::Ready, "the node under load");
        heartbeat |= last != heartbeat_before;
        std::thread::sleep(Duration::from_millis(300));
    }
    // Everything was still held: the exec runs and no idle connection was closed yet.
    assert!(
        exec.try_wait().expect("exec status").is_none(),
        "katcall exec ended early"
    );
    for (tcp, opened, kind) in &mut idle {
        tcp.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => panic!(
                    "a {kind} connection was closed {:?} after it opened, during the measurements",
                    opened.elapsed()
                ),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("a {kind} connection failed during the measurements: {e}"),
            }
        }
        tcp.set_nonblocking(false).expect("blocking");
    }
    let _ = exec.kill();
    let _ = exec.wait();
    writer.join().expect("stdin writer");
    // The exec'd command outlives its client (as with `docker exec`): end it, so that
    // the instance runs one kat-init again.
    for pid in workload_pids(Some(instance)) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.windows(2).any(|w| w == [&b"sleep"[..], &b"30"[..]]) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    c.wait("the exec'd command to end", Duration::from_secs(10), |_| {
        containers_of(instance) == 1
    });
    assert_eq!(times_elected(c), elected, "the node lost its leadership");

    // The idle connections are closed by the handshake and header-read timeouts (10 s).
    let mut slowest_close = Duration::ZERO;
    for (tcp, opened, kind) in &mut idle {
        let limit = *opened + Duration::from_secs(15);
        assert!(
            closed_within(tcp, limit.saturating_duration_since(Instant::now())),
            "a {kind} connection is still open 15 s after it opened"
        );
        slowest_close = slowest_close.max(opened.elapsed());
    }
    c.must(&["get", "nodes"]);
    eprintln!(
        "never_stalls: exec stdin accepted {} KiB before backpressure; 200 idle connections \
         opened in {opened_all:?}; `get workloads` under load: {latencies:?}; idle connections \
         all closed within {slowest_close:?} of opening; section took {:?}",
        accepted >> 10,
        section.elapsed()
    );
}
