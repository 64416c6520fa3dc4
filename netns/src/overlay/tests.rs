//! The receiving side of the overlay against a real boringtun peer over real UDP
//! sockets: the overlay is the holder's own code; its TUN is a packet socket pair, so the
//! test sees exactly what would reach the node network namespace.

use super::*;
use nix::sys::socket::{recv, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

const OWN: &str = "10.231.11.0/24";
const PEER: &str = "10.231.12.0/24";

/// An IPv4/UDP packet from `src` to `dst` carrying `payload` (checksums are not checked
/// on this path; the header's are right anyway).
fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = 0;
    for pair in p[..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p[20..22].copy_from_slice(&4000u16.to_be_bytes());
    p[22..24].copy_from_slice(&9000u16.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    p
}

/// A node holding a peer's key, as an attacker who took that node would.
struct Attacker {
    tunn: Tunn,
    udp: UdpSocket,
    to: SocketAddr,
    out: Vec<u8>,
    /// Packets the overlay sent us, decrypted.
    received: Vec<Vec<u8>>,
}

impl Attacker {
    fn send(&mut self, packet: &[u8]) {
        if let TunnResult::WriteToNetwork(d) = self.tunn.encapsulate(packet, &mut self.out) {
            self.udp.send_to(d, self.to).unwrap();
        }
    }

    /// Handles whatever the overlay sent (handshake answers, data).
    fn pump(&mut self) {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, _)) = self.udp.recv_from(&mut buf) {
            let mut datagram: &[u8] = &buf[..n];
            loop {
                match self.tunn.decapsulate(None, datagram, &mut self.out) {
                    TunnResult::WriteToNetwork(d) => {
                        self.udp.send_to(d, self.to).unwrap();
                        datagram = &[];
                        continue;
                    }
                    TunnResult::WriteToTunnelV4(p, _) => self.received.push(p.to_vec()),
                    _ => {}
                }
                break;
            }
        }
    }
}

/// Runs the overlay and the attacker until `done` says so (or 5 s).
fn run_until(
    overlay: &mut Overlay,
    attacker: &mut Attacker,
    tun: &OwnedFd,
    delivered: &mut Vec<Vec<u8>>,
    done: impl Fn(&[Vec<u8>], &[Vec<u8>]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(delivered, &attacker.received) {
        assert!(
            Instant::now() < deadline,
            "the tunnel did not carry the packet"
        );
        overlay.step(Duration::from_millis(5));
        attacker.pump();
        let mut buf = vec![0u8; 65_536];
        while let Ok(n) = recv(tun.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            delivered.push(buf[..n].to_vec());
        }
    }
}

fn carries(packets: &[Vec<u8>], marker: &[u8]) -> bool {
    packets
        .iter()
        .any(|p| p.windows(marker.len()).any(|w| w == marker))
}

/// An overlay for subnet [`OWN`] whose one peer, for [`PEER`], is the returned attacker;
/// its "TUN" is a packet socket pair (the other end returned), each packet behind a
/// virtio-net header.
fn overlay_with_peer() -> (tempfile::TempDir, Overlay, OwnedFd, Attacker) {
    let dir = tempfile::tempdir().unwrap();
    let own: Ipv4Net = OWN.parse().unwrap();
    let (tun_overlay, tun_node) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    // The holder's TUN is non-blocking (`node_sockets`), and the overlay reads until
    // it has no more.
    nix::fcntl::fcntl(
        tun_overlay.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut overlay = Overlay::new(dir.path(), own, tun_overlay, 0).unwrap();
    let overlay_port = overlay.udp.local_addr().unwrap().port();
    let (_, overlay_public) = load_or_make_key(dir.path()).unwrap();

    let secret = StaticSecret::from(rand::random::<[u8; 32]>());
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    write_peers(
        dir.path(),
        &[Peer {
            node: "b".into(),
            public_key: encode_key(&PublicKey::from(&secret)),
            endpoint: udp.local_addr().unwrap(),
            subnet: PEER.parse().unwrap(),
        }],
    )
    .unwrap();
    overlay.reload_peers();
    assert_eq!(overlay.peers.len(), 1);
    let attacker = Attacker {
        tunn: Tunn::new(secret, overlay_public, None, None, 7, None),
        udp,
        to: SocketAddr::from(([127, 0, 0, 1], overlay_port)),
        out: vec![0u8; 65_536 + 256],
        received: Vec::new(),
    };
    (dir, overlay, tun_node, attacker)
}

#[test]
fn a_peer_reaches_only_this_nodes_containers() {
    let (dir, mut overlay, tun_node, mut attacker) = overlay_with_peer();
    let src = Ipv4Addr::new(10, 231, 12, 2);
    let mut delivered = Vec::new();

    // An honest packet for one of this node's containers: delivered (and it completes
    // the handshake first).
    attacker.send(&udp_packet(src, Ipv4Addr::new(10, 231, 11, 2), b"honest-1"));
    run_until(
        &mut overlay,
        &mut attacker,
        &tun_node,
        &mut delivered,
        |d, _| carries(d, b"honest-1"),
    );

    // From an allowed source, to everything that is not a container of this node.
    let forbidden = [
        (Ipv4Addr::new(169, 254, 169, 254), "metadata-service"),
        (Ipv4Addr::new(192, 168, 1, 10), "lan-host"),
        (Ipv4Addr::new(10, 0, 2, 2), "slirp-gateway"),
        (Ipv4Addr::new(127, 0, 0, 1), "loopback"),
        (Ipv4Addr::new(10, 231, 13, 5), "third-node"),
        (Ipv4Addr::new(10, 231, 11, 255), "broadcast"),
    ];
    for (dst, marker) in forbidden {
        attacker.send(&udp_packet(src, dst, marker.as_bytes()));
    }
    // And a forged source (the rule that was already there).
    attacker.send(&udp_packet(
        Ipv4Addr::new(10, 231, 11, 7),
        Ipv4Addr::new(10, 231, 11, 2),
        b"forged-source",
    ));
    // The honest packet after them comes through, so they were all handled.
    attacker.send(&udp_packet(src, Ipv4Addr::new(10, 231, 11, 3), b"honest-2"));
    run_until(
        &mut overlay,
        &mut attacker,
        &tun_node,
        &mut delivered,
        |d, _| carries(d, b"honest-2"),
    );
    for (dst, marker) in forbidden {
        assert!(
            !carries(&delivered, marker.as_bytes()),
            "a packet for {dst} reached the node network namespace"
        );
    }
    assert!(!carries(&delivered, b"forged-source"));
    assert_eq!(delivered.len(), 2, "only the two honest packets");
    assert_eq!(overlay.peers[0].dropped, 7);
    overlay.write_state();
    assert_eq!(read_state(dir.path())[0].dropped_packets, 7);

    // Outbound: a packet from this node's subnet goes to the peer; one whose source is
    // not this node's does not.
    let to_peer = |s: Ipv4Addr, marker: &[u8]| {
        let header = segment::VnetHeader::default().to_bytes();
        nix::unistd::write(
            &tun_node,
            &[&header[..], &udp_packet(s, src, marker)].concat(),
        )
        .unwrap();
    };
    to_peer(Ipv4Addr::new(10, 0, 2, 100), b"outgoing-forged");
    to_peer(Ipv4Addr::new(10, 231, 11, 2), b"outgoing-honest");
    run_until(
        &mut overlay,
        &mut attacker,
        &tun_node,
        &mut delivered,
        |_, r| carries(r, b"outgoing-honest"),
    );
    assert!(!carries(&attacker.received, b"outgoing-forged"));
    assert_eq!(overlay.peers[0].dropped, 8);
}

#[test]
fn container_addresses_are_the_subnets_hosts() {
    let s: Ipv4Net = OWN.parse().unwrap();
    assert!(is_container_address(&s, Ipv4Addr::new(10, 231, 11, 1)));
    assert!(is_container_address(&s, Ipv4Addr::new(10, 231, 11, 254)));
    assert!(!is_container_address(&s, Ipv4Addr::new(10, 231, 11, 0)));
    assert!(!is_container_address(&s, Ipv4Addr::new(10, 231, 11, 255)));
    assert!(!is_container_address(&s, Ipv4Addr::new(10, 231, 12, 1)));
    assert!(!is_container_address(&s, Ipv4Addr::new(169, 254, 169, 254)));
}

/// A TCP super-packet as the kernel hands it over with TSO: IPv4, a TCP header with the
/// timestamp option (32 bytes), `payload`, PSH on; the TCP checksum field holds the
/// pseudo-header's sum (`NEEDS_CSUM`).
fn super_packet(payload: &[u8], mss: u16) -> (segment::VnetHeader, Vec<u8>) {
    let total = 20 + 32 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&0xfff0u16.to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[10, 231, 11, 2]);
    p[16..20].copy_from_slice(&[10, 231, 12, 2]);
    checksum::set_ipv4_header(&mut p[..20]);
    p[20..22].copy_from_slice(&40000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5201u16.to_be_bytes());
    p[24..28].copy_from_slice(&0xffff_ff00u32.to_be_bytes());
    p[28..32].copy_from_slice(&77u32.to_be_bytes());
    p[32] = 8 << 4;
    p[33] = 0x10 | 0x08;
    p[34..36].copy_from_slice(&502u16.to_be_bytes());
    p[40..52].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7]);
    p[52..].copy_from_slice(payload);
    let partial = checksum::fold(checksum::pseudo_header(&p[12..20], 6, total - 20));
    p[36..38].copy_from_slice(&partial.to_be_bytes());
    let header = segment::VnetHeader {
        flags: segment::F_NEEDS_CSUM,
        gso_type: segment::GSO_TCPV4,
        hdr_len: 52,
        gso_size: mss,
        csum_start: 20,
        csum_offset: 16,
    };
    (header, p)
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Whether `p`'s IP and TCP checksums are right.
fn checksums_hold(p: &[u8]) -> bool {
    checksum::ipv4_tcp_hold(p, 20)
}

fn split(header: &segment::VnetHeader, packet: &mut [u8]) -> Result<Vec<Vec<u8>>, &'static str> {
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    segment::for_each_packet(header, packet, &mut scratch, |p| out.push(p.to_vec()))?;
    Ok(out)
}

#[test]
fn a_super_packet_splits_into_whole_segments() {
    let data = payload(5000);
    let (header, mut packet) = super_packet(&data, 1368);
    packet[33] |= 0x01; // FIN (outside the partial sum, which is the pseudo-header's)
    let segments = split(&header, &mut packet).unwrap();
    assert_eq!(segments.len(), 4);
    let mut joined = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let last = i == segments.len() - 1;
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        assert_eq!(s.len(), 52 + if last { 5000 - 3 * 1368 } else { 1368 });
        assert_eq!(
            u16::from_be_bytes([s[4], s[5]]),
            0xfff0u16.wrapping_add(i as u16)
        );
        let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
        assert_eq!(
            seq,
            0xffff_ff00u32.wrapping_add(i as u32 * 1368),
            "sequence wraps"
        );
        // PSH and FIN only on the last segment; ACK on all.
        assert_eq!(s[33], if last { 0x19 } else { 0x10 });
        assert_eq!(s[40..52], packet[40..52], "options kept");
        assert!(checksums_hold(s), "segment {i}");
        joined.extend_from_slice(&s[52..]);
    }
    assert_eq!(joined, data);

    // A packet that only needs its checksum completed goes as it is, completed.
    let (mut header, mut small) = super_packet(b"one segment", 1368);
    header.gso_type = segment::GSO_NONE;
    let one = split(&header, &mut small).unwrap();
    assert_eq!(one.len(), 1);
    assert!(checksums_hold(&one[0]));
}

#[test]
fn malformed_offload_headers_are_errors_not_panics() {
    let (header, packet) = super_packet(&payload(3000), 1368);
    let cases: Vec<(segment::VnetHeader, Vec<u8>)> = vec![
        (
            segment::VnetHeader {
                gso_size: 0,
                ..header
            },
            packet.clone(),
        ),
        (
            segment::VnetHeader {
                gso_type: 3,
                ..header
            },
            packet.clone(),
        ),
        (
            segment::VnetHeader {
                gso_type: segment::GSO_NONE,
                csum_start: 65_000,
                ..header
            },
            packet.clone(),
        ),
        (
            segment::VnetHeader {
                gso_type: segment::GSO_NONE,
                csum_offset: 65_535,
                ..header
            },
            packet.clone(),
        ),
        // A "checksum" to complete inside the IP header (over the addresses already judged),
        // or at an offset that is no TCP or UDP checksum.
        (
            segment::VnetHeader {
                gso_type: segment::GSO_NONE,
                csum_start: 10,
                csum_offset: 6,
                ..header
            },
            packet.clone(),
        ),
        (
            segment::VnetHeader {
                gso_type: segment::GSO_NONE,
                csum_offset: 2,
                ..header
            },
            packet.clone(),
        ),
        (header, packet[..30].to_vec()),
        (header, packet[..packet.len() - 1].to_vec()),
        (header, {
            let mut p = packet[..70].to_vec();
            p[2..4].copy_from_slice(&70u16.to_be_bytes());
            p[32] = 15 << 4; // a TCP header of 60 bytes in a packet of 70
            p
        }),
        (header, {
            let mut p = packet.clone();
            p[0] = 0x4f; // an IP header of 60 bytes, past the TCP header
            p[2..4].copy_from_slice(&40u16.to_be_bytes());
            p.truncate(40);
            p
        }),
    ];
    for (h, mut p) in cases {
        assert!(split(&h, &mut p).is_err(), "{h:?} accepted");
    }
    // Every length of every prefix of a super-packet: an error or whole packets, no panic.
    for len in 0..200 {
        let mut p = packet[..len.min(packet.len())].to_vec();
        let _ = split(&header, &mut p);
        let mut q = p.clone();
        let _ = split(
            &segment::VnetHeader {
                gso_size: 1,
                ..header
            },
            &mut q,
        );
    }
}

/// What the coalescer wrote to the "TUN" (a packet socket pair): each write's header and
/// packet.
fn written(tun: &OwnedFd) -> Vec<(segment::VnetHeader, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while let Ok(n) = recv(tun.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        let header = segment::VnetHeader::parse(&buf[..n]).unwrap();
        out.push((header, buf[VNET_HDR_LEN..n].to_vec()));
    }
    out
}

fn packet_pair() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

/// Pushes `packets` through `c` onto the "TUN" `mine`, flushes, and returns what the other
/// end, `node`, read.
fn coalesce_all<'a>(
    c: &mut coalesce::Coalescer,
    (mine, node): (&OwnedFd, &OwnedFd),
    packets: impl IntoIterator<Item = &'a Vec<u8>>,
) -> Vec<(segment::VnetHeader, Vec<u8>)> {
    for p in packets {
        c.push(mine, p);
    }
    c.flush(mine);
    written(node)
}

#[test]
fn consecutive_segments_are_written_as_one_super_packet() {
    let data = payload(40 * 1368 + 100);
    let (header, mut packet) = super_packet(&data, 1368);
    let segments = split(&header, &mut packet).unwrap();
    let (mine, node) = packet_pair();
    let tun = (&mine, &node);
    let mut c = coalesce::Coalescer::default();
    let writes = coalesce_all(&mut c, tun, &segments);
    assert_eq!(writes.len(), 1, "41 segments, one write");
    let (h, mut merged) = writes.into_iter().next().unwrap();
    assert_eq!(
        (
            h.flags,
            h.gso_type,
            h.gso_size,
            h.hdr_len,
            h.csum_start,
            h.csum_offset
        ),
        (segment::F_NEEDS_CSUM, segment::GSO_TCPV4, 1368, 52, 20, 16)
    );
    assert_eq!(merged[52..], data[..]);
    // What the kernel will do with it: split again, the very segments that came in.
    assert_eq!(split(&h, &mut merged).unwrap(), segments);

    // A segment whose checksum is wrong is not merged (the kernel would not trust it
    // inside a super-packet): it is written alone, to be dropped there.
    let mut run = segments[..6].to_vec();
    run[3][100] ^= 0xff;
    let writes = coalesce_all(&mut c, tun, &run);
    assert_eq!(writes.len(), 3, "three, the bad one alone");
    assert_eq!(writes[1], (segment::VnetHeader::default(), run[3].clone()));

    // Out of order, another connection, a SYN, a non-TCP packet: written as they came,
    // each whole, in order.
    let mut reordered = segments[..4].to_vec();
    reordered.swap(1, 2);
    let mut other = segments[0].clone();
    other[23] ^= 1; // another destination port
    let mut syn = segments[0].clone();
    syn[33] = 0x02;
    let udp = udp_packet(
        Ipv4Addr::new(10, 231, 11, 2),
        Ipv4Addr::new(10, 231, 12, 2),
        b"u",
    );
    let writes = coalesce_all(&mut c, tun, reordered.iter().chain([&other, &syn, &udp]));
    let plain: Vec<&Vec<u8>> = writes.iter().map(|(_, p)| p).collect();
    assert_eq!(
        plain,
        vec![
            &segments[0],
            &segments[2],
            &segments[1],
            &segments[3],
            &other,
            &syn,
            &udp
        ]
    );
    assert!(writes
        .iter()
        .all(|(h, _)| *h == segment::VnetHeader::default()));
}

#[test]
fn the_offloads_carry_a_stream_in_batches_both_ways() {
    let (_dir, mut overlay, tun_node, mut attacker) = overlay_with_peer();
    let with_header = |h: segment::VnetHeader, p: &[u8]| [&h.to_bytes()[..], p].concat();
    // The handshake first: one small packet, as any connection's SYN would be.
    let src = Ipv4Addr::new(10, 231, 11, 2);
    let first = udp_packet(src, Ipv4Addr::new(10, 231, 12, 2), b"first");
    nix::unistd::write(&tun_node, &with_header(Default::default(), &first)).unwrap();
    let mut delivered = Vec::new();
    run_until(
        &mut overlay,
        &mut attacker,
        &tun_node,
        &mut delivered,
        |_, r| carries(r, b"first"),
    );

    // Out: a 60 KiB super-packet, one read, leaves as 45 datagrams in a few system calls;
    // the peer (no GRO) gets every segment whole.
    let data = payload(60_000);
    let (header, packet) = super_packet(&data, 1368);
    let (calls, datagrams) = (overlay.sender.calls, overlay.sender.datagrams);
    nix::unistd::write(&tun_node, &with_header(header, &packet)).unwrap();
    let expected = 60_000usize.div_ceil(1368);
    let before = attacker.received.len();
    run_until(
        &mut overlay,
        &mut attacker,
        &tun_node,
        &mut delivered,
        |_, r| r.len() >= before + expected,
    );
    let segments = &attacker.received[before..];
    assert!(segments.iter().all(|s| checksums_hold(s)));
    let joined: Vec<u8> = segments.iter().flat_map(|s| s[52..].to_vec()).collect();
    assert_eq!(joined, data);
    assert_eq!(overlay.sender.datagrams - datagrams, expected as u64);
    assert!(
        overlay.sender.calls - calls <= 2,
        "{} system calls for {expected} datagrams",
        overlay.sender.calls - calls
    );

    // In: the peer's 45 segments of a stream to this node's container, sent before the
    // overlay looks, reach the node namespace as one super-packet that splits back into them.
    let (header, mut packet) = super_packet(&data, 1368);
    packet[12..16].copy_from_slice(&[10, 231, 12, 2]);
    packet[16..20].copy_from_slice(&[10, 231, 11, 2]);
    checksum::set_ipv4_header(&mut packet[..20]);
    let partial = checksum::fold(checksum::pseudo_header(
        &packet[12..20],
        6,
        packet.len() - 20,
    ));
    packet[36..38].copy_from_slice(&partial.to_be_bytes());
    let incoming = split(&header, &mut packet).unwrap();
    for s in &incoming {
        attacker.send(s);
    }
    let writes = overlay.coalescer.writes;
    let mut got: Vec<Vec<u8>> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got
        .iter()
        .map(|p| p.len() - VNET_HDR_LEN - 52)
        .sum::<usize>()
        < data.len()
    {
        assert!(Instant::now() < deadline, "the stream did not arrive");
        overlay.step(Duration::from_millis(5));
        let mut buf = vec![0u8; 70_000];
        while let Ok(n) = recv(tun_node.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            got.push(buf[..n].to_vec());
        }
    }
    assert!(
        overlay.coalescer.writes - writes <= 3,
        "{} writes for {} segments",
        overlay.coalescer.writes - writes,
        incoming.len()
    );
    let mut again = Vec::new();
    for w in &got {
        let h = segment::VnetHeader::parse(w).unwrap();
        let mut p = w[VNET_HDR_LEN..].to_vec();
        again.extend(split(&h, &mut p).unwrap());
    }
    assert_eq!(again, incoming);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = segment::VnetHeader> {
        (
            any::<u8>(),
            prop_oneof![Just(0u8), Just(1), Just(0x81), any::<u8>()],
            any::<u16>(),
            prop_oneof![1u16..2000, any::<u16>()],
            any::<u16>(),
            any::<u16>(),
        )
            .prop_map(
                |(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)| {
                    segment::VnetHeader {
                        flags,
                        gso_type,
                        hdr_len,
                        gso_size,
                        csum_start,
                        csum_offset,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Whatever a container makes its stack hand the overlay: an error or whole
        /// packets, never a panic; a split super-packet's segments are right.
        #[test]
        fn any_read_from_the_tun_splits_or_is_refused(
            h in header(),
            len in 0usize..3000,
            mss in 1u16..1500,
            noise in proptest::collection::vec(any::<u8>(), 0..3000),
            flips in proptest::collection::vec((0usize..80, any::<u8>()), 0..6),
        ) {
            // Noise, or a real super-packet with a few header bytes changed.
            let (_, mut p) = super_packet(&payload(len), mss);
            for (at, value) in flips {
                if at < p.len() { p[at] = value; }
            }
            for mut packet in [p, noise] {
                if let Ok(out) = split(&h, &mut packet) {
                    prop_assert!(!out.is_empty());
                    for s in &out {
                        prop_assert!(s.len() <= packet.len().max(120 + usize::from(h.gso_size)));
                    }
                }
            }
        }

        /// Segments of any size split and merged come back the same; anything pushed into
        /// the coalescer comes out as writes the kernel can take, never a panic.
        #[test]
        fn split_and_merge_are_inverse(len in 1usize..62_000, mss in 536u16..1500) {
            let (header, mut packet) = super_packet(&payload(len), mss);
            let segments = split(&header, &mut packet).unwrap();
            let (mine, node) = packet_pair();
            let mut c = coalesce::Coalescer::default();
            let mut again = Vec::new();
            for (h, mut p) in coalesce_all(&mut c, (&mine, &node), &segments) {
                prop_assert!(h.gso_type == segment::GSO_NONE || usize::from(h.gso_size) == usize::from(mss).min(len));
                again.extend(split(&h, &mut p).unwrap());
            }
            prop_assert_eq!(again, segments);
        }

        #[test]
        fn the_coalescer_takes_anything(
            packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20),
            seeds in proptest::collection::vec((0usize..52, any::<u8>()), 0..10),
        ) {
            let (mine, node) = packet_pair();
            let mut c = coalesce::Coalescer::default();
            // Real segments with bytes changed, between random ones.
            let (header, mut packet) = super_packet(&payload(5000), 1368);
            let mut segments = split(&header, &mut packet).unwrap();
            for (i, (at, value)) in seeds.into_iter().enumerate() {
                let n = segments.len();
                segments[i % n][at] = value;
            }
            for (h, mut p) in coalesce_all(&mut c, (&mine, &node), segments.iter().chain(packets.iter())) {
                if h.gso_type == segment::GSO_TCPV4 {
                    prop_assert!(split(&h, &mut p).is_ok());
                }
            }
        }
    }
}
