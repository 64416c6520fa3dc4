//! The overlay between nodes: WireGuard in userspace (boringtun's Noise implementation),
//! run by the node network holder so that it outlives agent restarts.
//!
//! Packets for another node's subnet leave the node network namespace through the TUN
//! device `kat-wg` (route: `clusterCIDR dev kat-wg`; the node's own subnet is more specific
//! and stays on the bridge). The holder reads them, finds the peer whose subnet holds the
//! destination, encrypts and sends them from its UDP socket on the host (the node's address,
//! port `wireguardPort`) to the peer's endpoint. Datagrams arriving there are matched to a
//! peer by source address, decrypted, and written to the TUN only if their inner source
//! belongs to that peer's subnet (a peer cannot speak for another node's containers) **and**
//! their inner destination is one of this node's container addresses.
//!
//! Why the destination rule, and why this one: the node network namespace forwards (it is
//! the containers' router, with a default route out through slirp4netns), so a packet
//! written to the TUN goes wherever its destination says: to the host's LAN, to a link-local
//! metadata service (169.254.169.254), or back into the overlay to a third node. Checking
//! only the source would let anyone holding one node's key use every other node as a relay
//! into its network. The tightest rule that carries all legitimate traffic is "the
//! destination is a host address of *this node's* subnet": peers send into the overlay only
//! packets for the subnet of the node they send to (see `outgoing`: the peer is chosen by
//! the destination's subnet), nothing is relayed node-to-node (every node peers with every
//! other), and no container is reached at its subnet's network or broadcast address. The
//! whole cluster CIDR would be looser for no use: it would admit relaying through this node
//! to a third one. Dropped packets are counted per peer (`overlay.json`, `droppedPackets`)
//! and logged at most every ten seconds.
//!
//! Outbound, the destination is already confined (a packet goes to the peer whose subnet
//! holds its destination, or nowhere); its source must be one of this node's subnet too,
//! which the receiving node checks anyway: dropping it here keeps a container with a forged
//! source from spending the tunnel and makes the count visible on the sending node.
//!
//! Why not the kernel module or wireguard-go: the first needs root (and is missing on some
//! hosts, this project's CI among them), the second is a separate daemon with its own
//! configuration protocol; boringtun's `noise::Tunn` is the protocol alone, and the loop
//! around it is ours, so it can run in this single-threaded holder with `poll`.
//!
//! Peers come from the agent (`peers.json`, rewritten when the control plane's list
//! changes); the holder's state (`overlay.json`: per peer its last handshake, bytes, and
//! handshakes seen) is written every couple of seconds for the agent and for tests.

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnet::Ipv4Net;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

mod checksum;
mod coalesce;
mod segment;
mod udp_batch;

pub(crate) use segment::VNET_HDR_LEN;

/// The TUN device of the overlay in the node network namespace.
pub const TUN_DEVICE: &str = "kat-wg";
/// The overlay's MTU: a 1500-byte underlay less WireGuard's 80 bytes of IPv6+UDP+header.
pub const MTU: u32 = 1420;
/// The node's private key, in the network directory (mode 0600; never leaves the node).
pub const KEY_FILE: &str = "wireguard.key";
/// What the agent says the peers are.
pub const PEERS_FILE: &str = "peers.json";
/// What the holder says about them.
pub const STATE_FILE: &str = "overlay.json";

/// Another node, as the overlay needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    pub node: String,
    /// Base64, as `wg` writes keys.
    pub public_key: String,
    pub endpoint: SocketAddr,
    pub subnet: Ipv4Net,
}

/// What the overlay knows of one peer (`overlay.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerState {
    pub node: String,
    pub endpoint: String,
    /// Seconds since the last completed handshake, if one completed.
    pub last_handshake_seconds: Option<u64>,
    /// Handshakes completed since the holder started (rekeys included).
    pub handshakes: u64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Packets dropped for this peer since the holder started: from it, a source outside
    /// its subnet or a destination outside ours; towards it, a source outside ours.
    #[serde(default)]
    pub dropped_packets: u64,
}

/// The node's key pair: read from `dir/wireguard.key`, or made and saved (0600) on first use.
pub fn load_or_make_key(dir: &Path) -> Result<(StaticSecret, PublicKey), String> {
    let path = dir.join(KEY_FILE);
    let engine = base64::engine::general_purpose::STANDARD;
    let secret = match fs::read_to_string(&path) {
        Ok(text) => {
            let bytes: [u8; 32] = engine
                .decode(text.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    format!("{} is not a base64 WireGuard private key", path.display())
                })?;
            StaticSecret::from(bytes)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bytes: [u8; 32] = rand::random();
            let secret = StaticSecret::from(bytes);
            let text = engine.encode(secret.to_bytes()) + "\n";
            write_private(&path, text.as_bytes())?;
            secret
        }
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let public = PublicKey::from(&secret);
    Ok((secret, public))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

pub fn encode_key(key: &PublicKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
}

pub fn decode_key(text: &str) -> Option<PublicKey> {
    let bytes: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?
        .try_into()
        .ok()?;
    Some(PublicKey::from(bytes))
}

struct Live {
    peer: Peer,
    tunn: Tunn,
    handshakes: u64,
    /// The last handshake age seen, to count new handshakes.
    last_age: Option<Duration>,
    /// Packets dropped by the address rules (see the module's documentation).
    dropped: u64,
}

/// Why a packet was not delivered, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drop {
    /// From a peer, its inner source is not in that peer's subnet.
    ForeignSource,
    /// From a peer, its inner destination is not a container address of this node.
    ForeignDestination,
    /// Towards a peer, its source is not an address of this node's subnet.
    ForgedOutgoingSource,
    /// Towards a peer, an offload header that does not describe the packet (not counted
    /// per peer: no address rule refused it).
    Malformed(&'static str),
}

/// The rule for a decrypted packet from a peer whose subnet is `peer_subnet`, arriving at the
/// node whose subnet is `own_subnet` (module documentation: why this rule).
fn check_incoming(
    packet: &[u8],
    source: Ipv4Addr,
    peer_subnet: &Ipv4Net,
    own_subnet: &Ipv4Net,
) -> Result<(), Drop> {
    if !peer_subnet.contains(&source) {
        return Err(Drop::ForeignSource);
    }
    match Tunn::dst_address(packet) {
        Some(IpAddr::V4(dst)) if is_container_address(own_subnet, dst) => Ok(()),
        _ => Err(Drop::ForeignDestination),
    }
}

/// A host address of `subnet`: inside it, and neither its network nor its broadcast address.
fn is_container_address(subnet: &Ipv4Net, address: Ipv4Addr) -> bool {
    subnet.contains(&address)
        && (subnet.prefix_len() >= 31
            || (address != subnet.network() && address != subnet.broadcast()))
}

/// The source address of an IPv4 packet.
fn src_address(packet: &[u8]) -> Option<Ipv4Addr> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(
        packet[12], packet[13], packet[14], packet[15],
    ))
}

/// How often at most the overlay writes a line about dropped packets.
const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// Dropped packets not yet logged, and when the last line about them was written.
#[derive(Default)]
struct DropLog {
    unlogged: u64,
    last: Option<Instant>,
}

impl DropLog {
    /// Counts a dropped packet and says so in the log, at most every [`DROP_LOG_EVERY`]
    /// (a peer sending a flood of them must not fill the disk with the holder's log).
    fn note(&mut self, subnet: &Ipv4Net, why: Drop, node: &str, packet: &[u8]) {
        self.unlogged += 1;
        if self.last.is_some_and(|t| t.elapsed() < DROP_LOG_EVERY) {
            return;
        }
        let src = src_address(packet).map_or("?".to_string(), |a| a.to_string());
        let dst = Tunn::dst_address(packet).map_or("?".to_string(), |a| a.to_string());
        let reason = match why {
            Drop::ForeignSource => format!("from peer {node}: source outside its subnet"),
            Drop::ForeignDestination => {
                format!("from peer {node}: destination outside this node's subnet {subnet}")
            }
            Drop::ForgedOutgoingSource => {
                format!("towards peer {node}: source outside this node's subnet {subnet}")
            }
            Drop::Malformed(why) => format!("towards peer {node}: {why}"),
        };
        eprintln!(
            "overlay: dropped {} packet(s) since the last report; the latest {src} -> {dst}, {reason}",
            self.unlogged
        );
        self.unlogged = 0;
        self.last = Some(Instant::now());
    }
}

/// The overlay's state in the holder.
pub(crate) struct Overlay {
    dir: PathBuf,
    /// This node's container subnet: the only destinations delivered from peers.
    subnet: Ipv4Net,
    secret: StaticSecret,
    tun: OwnedFd,
    udp: UdpSocket,
    peers: Vec<Live>,
    peers_mtime: Option<SystemTime>,
    next_index: u32,
    /// Forces a new handshake with every peer this often (tests: `KAT_WG_REKEY_SECONDS`);
    /// WireGuard's own rekey is every 2 minutes.
    forced_rekey: Option<Duration>,
    last_forced: Instant,
    last_timers: Instant,
    last_state: Instant,
    buffer: Vec<u8>,
    out: Vec<u8>,
    /// One TCP segment of a super-packet being split.
    segment: Vec<u8>,
    sender: udp_batch::Sender,
    coalescer: coalesce::Coalescer,
    /// Room for `UDP_GRO`'s control message.
    control: Vec<u8>,
    drops: DropLog,
}

impl Overlay {
    /// The overlay of the node whose container subnet is `subnet`, reading and writing
    /// packets on `tun` (each behind a virtio-net header: `IFF_VNET_HDR`, with checksum and
    /// TCP segmentation offload, see `segment` and `coalesce`) and datagrams on UDP `port` of
    /// every host address.
    pub(crate) fn new(
        dir: &Path,
        subnet: Ipv4Net,
        tun: OwnedFd,
        port: u16,
    ) -> Result<Overlay, String> {
        let (secret, _) = load_or_make_key(dir)?;
        let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))
            .map_err(|e| format!("the overlay's UDP port {port} (wireguardPort): {e}"))?;
        udp.set_nonblocking(true).map_err(|e| e.to_string())?;
        // Without it each datagram is a receive of its own, as before.
        udp_batch::enable_gro(&udp);
        // Room for a few batches of 64 datagrams each way (the kernel caps it at its
        // `wmem_max`/`rmem_max`): a full buffer drops a whole batch.
        let socket = socket2::SockRef::from(&udp);
        let _ = socket.set_send_buffer_size(4 << 20);
        let _ = socket.set_recv_buffer_size(4 << 20);
        let forced_rekey = std::env::var("KAT_WG_REKEY_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        let now = Instant::now();
        Ok(Overlay {
            dir: dir.to_path_buf(),
            subnet,
            secret,
            tun,
            udp,
            peers: Vec::new(),
            peers_mtime: None,
            next_index: 1,
            forced_rekey,
            last_forced: now,
            last_timers: now,
            last_state: now,
            buffer: vec![0u8; VNET_HDR_LEN + 65_536],
            out: vec![0u8; 65_536 + 256],
            segment: Vec::with_capacity(MTU as usize),
            sender: udp_batch::Sender::new(),
            coalescer: coalesce::Coalescer::default(),
            control: nix::cmsg_space!(i32),
            drops: DropLog::default(),
        })
    }

    /// Waits up to `timeout` for packets and handles them, then whatever timers are due.
    pub(crate) fn step(&mut self, timeout: Duration) {
        let (tun_ready, udp_ready) = {
            let mut fds = [
                PollFd::new(self.tun.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.udp.as_fd(), PollFlags::POLLIN),
            ];
            let ms = PollTimeout::try_from(timeout.as_millis().min(1000) as i32)
                .unwrap_or(PollTimeout::ZERO);
            if poll(&mut fds, ms).is_err() {
                (false, false)
            } else {
                let ready = |f: &PollFd| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN));
                (ready(&fds[0]), ready(&fds[1]))
            }
        };
        if tun_ready {
            self.outgoing();
        }
        if udp_ready {
            self.incoming();
        }
        let now = Instant::now();
        if now.duration_since(self.last_timers) >= Duration::from_millis(250) {
            self.last_timers = now;
            self.reload_peers();
            self.timers();
        }
        if now.duration_since(self.last_state) >= Duration::from_secs(2) {
            self.last_state = now;
            self.write_state();
        }
    }

    /// Packets from containers towards other nodes, until the TUN has no more: each read
    /// is one packet or a TCP super-packet (`segment`); the datagrams go out in batches.
    fn outgoing(&mut self) {
        for _ in 0..256 {
            let n = match nix::unistd::read(self.tun.as_raw_fd(), &mut self.buffer) {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            let Some(header) = segment::VnetHeader::parse(&self.buffer[..n]) else {
                continue;
            };
            let packet = &mut self.buffer[VNET_HDR_LEN..n];
            let Some(IpAddr::V4(dst)) = Tunn::dst_address(packet) else {
                continue;
            };
            let Some(live) = self.peers.iter_mut().find(|p| p.peer.subnet.contains(&dst)) else {
                continue;
            };
            if !src_address(packet).is_some_and(|s| self.subnet.contains(&s)) {
                live.dropped += 1;
                let why = Drop::ForgedOutgoingSource;
                self.drops.note(&self.subnet, why, &live.peer.node, packet);
                continue;
            }
            let (udp, sender) = (&self.udp, &mut self.sender);
            let endpoint = live.peer.endpoint;
            let sent = segment::for_each_packet(&header, packet, &mut self.segment, |p| {
                // Nothing the MTU lets through is this large; boringtun would panic on it.
                if p.len() + 32 > udp_batch::MAX_BYTES {
                    return;
                }
                // Room for WireGuard's 32 bytes, or a handshake initiation (148) when the
                // session is not up yet (boringtun queues the packet then).
                let room = sender.room(udp, endpoint, (p.len() + 32).max(148));
                if let TunnResult::WriteToNetwork(d) = live.tunn.encapsulate(p, room) {
                    let n = d.len();
                    sender.commit(udp, n);
                }
            });
            if let Err(why) = sent {
                self.drops
                    .note(&self.subnet, Drop::Malformed(why), &live.peer.node, packet);
            }
        }
        self.sender.flush(&self.udp);
    }

    /// Datagrams from other nodes, until the socket has no more; what they carry for this
    /// node's containers goes to the TUN, consecutive TCP segments merged (`coalesce`).
    fn incoming(&mut self) {
        for _ in 0..256 {
            let Some((n, from, size)) =
                udp_batch::receive(&self.udp, &mut self.buffer, &mut self.control)
            else {
                break;
            };
            let Some(live) = self
                .peers
                .iter_mut()
                .find(|p| p.peer.endpoint.ip() == from.ip())
            else {
                continue;
            };
            for mut datagram in self.buffer[..n].chunks(size.unwrap_or(n).max(1)) {
                loop {
                    match live
                        .tunn
                        .decapsulate(Some(from.ip()), datagram, &mut self.out)
                    {
                        TunnResult::WriteToNetwork(packet) => {
                            let _ = self.udp.send_to(packet, live.peer.endpoint);
                            // Queued packets may follow a completed handshake.
                            datagram = &[];
                            continue;
                        }
                        TunnResult::WriteToTunnelV4(packet, source) => {
                            // Only the peer's own containers may speak through its tunnel,
                            // and only to this node's containers.
                            match check_incoming(packet, source, &live.peer.subnet, &self.subnet) {
                                Ok(()) => self.coalescer.push(&self.tun, packet),
                                Err(why) => {
                                    live.dropped += 1;
                                    self.drops.note(&self.subnet, why, &live.peer.node, packet);
                                }
                            }
                        }
                        TunnResult::WriteToTunnelV6(..) | TunnResult::Done | TunnResult::Err(_) => {
                        }
                    }
                    break;
                }
            }
        }
        self.coalescer.flush(&self.tun);
    }

    fn timers(&mut self) {
        let force = self
            .forced_rekey
            .is_some_and(|every| self.last_forced.elapsed() >= every);
        if force {
            self.last_forced = Instant::now();
        }
        for live in &mut self.peers {
            if force {
                if let TunnResult::WriteToNetwork(packet) =
                    live.tunn.format_handshake_initiation(&mut self.out, true)
                {
                    let _ = self.udp.send_to(packet, live.peer.endpoint);
                }
            }
            if let TunnResult::WriteToNetwork(packet) = live.tunn.update_timers(&mut self.out) {
                let _ = self.udp.send_to(packet, live.peer.endpoint);
            }
            let age = live.tunn.stats().0;
            if let Some(age) = age {
                if live.last_age.is_none_or(|last| age < last) {
                    live.handshakes += 1;
                }
            }
            live.last_age = age;
        }
    }

    /// Re-reads `peers.json` when it changed; a peer whose key and endpoint are unchanged
    /// keeps its session.
    fn reload_peers(&mut self) {
        let path = self.dir.join(PEERS_FILE);
        let mtime = fs::metadata(&path).and_then(|m| m.modified()).ok();
        if mtime == self.peers_mtime {
            return;
        }
        self.peers_mtime = mtime;
        let wanted: Vec<Peer> = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut old: BTreeMap<(String, SocketAddr), Live> = self
            .peers
            .drain(..)
            .map(|l| ((l.peer.public_key.clone(), l.peer.endpoint), l))
            .collect();
        for peer in wanted {
            let Some(public) = decode_key(&peer.public_key) else {
                eprintln!(
                    "overlay: peer {} has a malformed public key; skipped",
                    peer.node
                );
                continue;
            };
            let live = match old.remove(&(peer.public_key.clone(), peer.endpoint)) {
                Some(mut live) => {
                    live.peer = peer;
                    live
                }
                None => {
                    let index = self.next_index;
                    self.next_index = self.next_index.wrapping_add(1) & 0x00ff_ffff;
                    eprintln!(
                        "overlay: peer {} at {} for {}",
                        peer.node, peer.endpoint, peer.subnet
                    );
                    Live {
                        tunn: Tunn::new(self.secret.clone(), public, None, Some(25), index, None),
                        peer,
                        handshakes: 0,
                        last_age: None,
                        dropped: 0,
                    }
                }
            };
            self.peers.push(live);
        }
    }

    fn write_state(&self) {
        let state: Vec<PeerState> = self
            .peers
            .iter()
            .map(|l| {
                let (age, tx, rx, _, _) = l.tunn.stats();
                PeerState {
                    node: l.peer.node.clone(),
                    endpoint: l.peer.endpoint.to_string(),
                    last_handshake_seconds: age.map(|a| a.as_secs()),
                    handshakes: l.handshakes,
                    tx_bytes: tx as u64,
                    rx_bytes: rx as u64,
                    dropped_packets: l.dropped,
                }
            })
            .collect();
        if let Ok(json) = serde_json::to_vec_pretty(&state) {
            let path = self.dir.join(STATE_FILE);
            let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
            let _ = fs::write(&tmp, json).and_then(|()| fs::rename(&tmp, &path));
        }
    }
}

/// Reads the holder's overlay state.
pub fn read_state(dir: &Path) -> Vec<PeerState> {
    fs::read(dir.join(STATE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the peers the holder should have (atomically; the holder notices within 250 ms).
pub fn write_peers(dir: &Path, peers: &[Peer]) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(peers).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{PEERS_FILE}.tmp"));
    fs::write(&tmp, json)?;
    fs::rename(&tmp, dir.join(PEERS_FILE))
}

#[cfg(test)]
mod tests;
