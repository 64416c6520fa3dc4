//! The node's DNS server on real sockets: cluster names from the table (following changes at
//! once), NXDOMAIN with the SOA for names that do not exist, other names through a resolver
//! standing in for the internet (answers and negative answers cached), SERVFAIL when it is
//! down, garbage answered with FORMERR, big answers truncated over UDP and whole over TCP,
//! and a workload's addresses answered in rotation.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use kat_api::wire::DnsRecord;
use kat_netns::dns::{DnsServer, Forwarder, Table};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;

fn record(workload: &str, id: &str, ip: &str, ready: bool) -> DnsRecord {
    DnsRecord {
        namespace: "default".into(),
        workload: workload.into(),
        instance_id: id.parse().unwrap(),
        ip: ip.parse().unwrap(),
        ready,
    }
}

/// A resolver for `example.test` standing in for the internet: `www.example.test` is
/// 192.0.2.7 (TTL 60), every other name NXDOMAIN (SOA minimum 30). Counts the questions.
async fn internet() -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = socket.recv_from(&mut buf).await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let q = Message::from_vec(&buf[..n]).unwrap();
            let mut r = Message::response(q.metadata.id, q.metadata.op_code);
            r.add_queries(q.queries.iter().cloned());
            let name = q.queries[0].name().clone();
            if name == Name::from_ascii("www.example.test.").unwrap() {
                r.add_answer(Record::from_rdata(
                    name,
                    60,
                    RData::A(A([192, 0, 2, 7].into())),
                ));
            } else {
                r.metadata.response_code = ResponseCode::NXDomain;
                let zone = Name::from_ascii("example.test.").unwrap();
                let soa = SOA::new(zone.clone(), zone.clone(), 1, 1, 1, 1, 30);
                r.add_authority(Record::from_rdata(zone, 300, RData::SOA(soa)));
            }
            socket.send_to(&r.to_vec().unwrap(), peer).await.unwrap();
        }
    });
    (addr, asked)
}

struct Node {
    udp: SocketAddr,
    tcp: SocketAddr,
    table: watch::Sender<Arc<Table>>,
}

async fn node(records: &[DnsRecord], upstreams: Vec<SocketAddr>) -> Node {
    let (table, rx) = watch::channel(Arc::new(Table::new("cluster.local", records).unwrap()));
    let server = DnsServer::new(rx, Forwarder::new(upstreams, Duration::from_millis(500)));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = Node {
        udp: udp.local_addr().unwrap(),
        tcp: tcp.local_addr().unwrap(),
        table,
    };
    tokio::spawn(server.clone().serve_udp(udp));
    tokio::spawn(server.serve_tcp(tcp));
    node
}

fn question(id: u16, name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m.to_vec().unwrap()
}

async fn udp_ask(server: SocketAddr, raw: &[u8]) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(raw, server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), socket.recv(&mut buf))
        .await
        .expect("an answer within 3 s")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn ask(server: SocketAddr, name: &str) -> Message {
    udp_ask(server, &question(4242, name, RecordType::A)).await
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[tokio::test]
async fn cluster_names_follow_the_records() {
    let n = node(
        &[
            record("web", "web-1", "10.100.0.2", true),
            record("web", "web-2", "10.100.2.2", true),
        ],
        vec![],
    )
    .await;
    let m = ask(n.udp, "web.default.cluster.local.").await;
    assert_eq!(m.metadata.id, 4242);
    assert_eq!(addresses(&m), ips(&["10.100.0.2", "10.100.2.2"]));
    let m = ask(n.udp, "web-2.web.default.cluster.local.").await;
    assert_eq!(addresses(&m), ips(&["10.100.2.2"]));

    // web-2 turns unhealthy: it leaves the workload's answers at once, keeps its own name.
    n.table.send_replace(Arc::new(
        Table::new(
            "cluster.local",
            &[
                record("web", "web-1", "10.100.0.2", true),
                record("web", "web-2", "10.100.2.2", false),
            ],
        )
        .unwrap(),
    ));
    assert_eq!(
        addresses(&ask(n.udp, "web.default.cluster.local.").await),
        ips(&["10.100.0.2"])
    );
    assert_eq!(
        addresses(&ask(n.udp, "web-2.web.default.cluster.local.").await),
        ips(&["10.100.2.2"])
    );

    // The workload is deleted: NXDOMAIN, with the SOA that tells clients for how long.
    n.table
        .send_replace(Arc::new(Table::empty("cluster.local").unwrap()));
    for name in [
        "web.default.cluster.local.",
        "web-1.web.default.cluster.local.",
    ] {
        let m = ask(n.udp, name).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.metadata.authoritative);
        match &m.authorities[0].data {
            RData::SOA(soa) => assert_eq!(soa.minimum, kat_netns::dns::NEGATIVE_TTL),
            other => panic!("an SOA, not {other:?}"),
        }
    }
}

/// Answers rotate per question, over UDP and TCP alike: of three questions in a row each
/// instance comes first once, so clients that take the first address spread over them.
#[tokio::test]
async fn answers_rotate_so_clients_spread_over_the_instances() {
    let n = node(
        &[
            record("web", "web-1", "10.100.0.2", true),
            record("web", "web-2", "10.100.2.2", true),
            record("web", "web-3", "10.100.4.2", true),
        ],
        vec![],
    )
    .await;
    let in_order = |m: &Message| -> Vec<IpAddr> {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect()
    };
    let mut firsts = Vec::new();
    for _ in 0..3 {
        let m = ask(n.udp, "web.default.cluster.local.").await;
        let order = in_order(&m);
        assert_eq!(order.len(), 3, "every ready instance in every answer");
        firsts.push(order[0]);
    }
    firsts.sort();
    assert_eq!(firsts, ips(&["10.100.0.2", "10.100.2.2", "10.100.4.2"]));
    // Over TCP the rotation goes on (one count per name and type, whatever the transport).
    let mut tcp_firsts = Vec::new();
    let mut tcp = TcpStream::connect(n.tcp).await.unwrap();
    for id in 0..3u16 {
        let raw = question(id, "web.default.cluster.local.", RecordType::A);
        tcp.write_all(&(raw.len() as u16).to_be_bytes())
            .await
            .unwrap();
        tcp.write_all(&raw).await.unwrap();
        let mut len = [0u8; 2];
        tcp.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
        tcp.read_exact(&mut body).await.unwrap();
        tcp_firsts.push(in_order(&Message::from_vec(&body).unwrap())[0]);
    }
    tcp_firsts.sort();
    assert_eq!(tcp_firsts, ips(&["10.100.0.2", "10.100.2.2", "10.100.4.2"]));
}

#[tokio::test]
async fn other_names_go_to_the_hosts_resolvers_and_are_cached() {
    let (internet, asked) = internet().await;
    let n = node(&[], vec![internet]).await;
    let m = ask(n.udp, "www.example.test.").await;
    assert_eq!(addresses(&m), ips(&["192.0.2.7"]));
    assert_eq!(m.metadata.id, 4242, "the client's id, not ours");
    // Again, with another id: from the cache.
    let m = udp_ask(n.udp, &question(7, "WWW.example.test.", RecordType::A)).await;
    assert_eq!((m.metadata.id, addresses(&m)), (7, ips(&["192.0.2.7"])));
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the second answer came from the cache"
    );
    // A name that does not exist out there: NXDOMAIN, cached too (RFC 2308).
    for _ in 0..3 {
        let m = ask(n.udp, "nothing.example.test.").await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the negative answer was cached"
    );

    // No resolver answers: SERVFAIL, not silence.
    let dead = {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.local_addr().unwrap()
    };
    let lonely = node(&[], vec![dead]).await;
    let m = ask(lonely.udp, "www.example.test.").await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}

#[tokio::test]
async fn garbage_gets_formerr_and_big_answers_go_over_tcp() {
    let records: Vec<DnsRecord> = (1..=80)
        .map(|i| record("big", &format!("big-{i}"), &format!("10.100.1.{i}"), true))
        .collect();
    let n = node(&records, vec![]).await;
    // A header and junk: FORMERR with that id. The server goes on answering.
    let m = udp_ask(n.udp, &[0x12, 0x34, 0xff, 0xff, 0xff]).await;
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0x1234, ResponseCode::FormErr)
    );
    // 80 addresses do not fit a plain UDP answer: truncated, so the client asks over TCP.
    let m = ask(n.udp, "big.default.cluster.local.").await;
    assert!(m.metadata.truncation);
    let raw = question(9, "big.default.cluster.local.", RecordType::A);
    let mut tcp = TcpStream::connect(n.tcp).await.unwrap();
    tcp.write_all(&(raw.len() as u16).to_be_bytes())
        .await
        .unwrap();
    tcp.write_all(&raw).await.unwrap();
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).await.unwrap();
    let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut body).await.unwrap();
    let m = Message::from_vec(&body).unwrap();
    assert_eq!(m.answers.len(), 80);
    assert!(!m.metadata.truncation);
}

/// Whatever a workload sends, the server answers or stays silent; it never falls over.
#[tokio::test]
async fn random_bytes_never_break_the_server() {
    let (_tx, rx) = watch::channel(Arc::new(
        Table::new(
            "cluster.local",
            &[record("web", "web-1", "10.100.0.2", true)],
        )
        .unwrap(),
    ));
    let server = DnsServer::new(rx, Forwarder::new(vec![], Duration::from_millis(50)));
    let valid = question(1, "web.default.cluster.local.", RecordType::A);
    for i in 0..3000u32 {
        let len = (i as usize * 7) % 300;
        let mut raw: Vec<u8> = (0..len).map(|_| rand_byte()).collect();
        // Half of them: a valid question with bytes flipped.
        if i % 2 == 0 {
            raw = valid.clone();
            let at = i as usize % raw.len();
            raw[at] ^= rand_byte() | 1;
        }
        let _ = server.respond(&raw, i % 3 == 0).await;
    }
    let m = Message::from_vec(&server.respond(&valid, true).await.unwrap()).unwrap();
    assert_eq!(addresses(&m), ips(&["10.100.0.2"]));
}

fn rand_byte() -> u8 {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) });
    STATE.with(|s| {
        // xorshift64: deterministic, so a failure repeats.
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 32) as u8
    })
}
