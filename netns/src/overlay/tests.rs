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

#[test]
fn a_peer_reaches_only_this_nodes_containers() {
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
    let mut attacker = Attacker {
        tunn: Tunn::new(secret, overlay_public, None, None, 7, None),
        udp,
        to: SocketAddr::from(([127, 0, 0, 1], overlay_port)),
        out: vec![0u8; 65_536 + 256],
        received: Vec::new(),
    };
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
        nix::unistd::write(&tun_node, &udp_packet(s, src, marker)).unwrap();
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
