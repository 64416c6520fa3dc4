//! The receiving half of the TUN offloads: consecutive TCP segments of one connection,
//! decrypted from one batch of datagrams, are written to the TUN device as one super-packet
//! (a virtio-net header saying "TCPv4, segment size N, checksum to complete"), as the
//! kernel's own GRO would merge them. One write and one trip through the node namespace's
//! stack instead of one per segment.
//!
//! The rules are the kernel's (`tcp_gro_receive`), kept narrow: IPv4 without options,
//! unfragmented, checksums right, the same addresses, ports, TOS, TTL, DF bit,
//! acknowledgment number, window and TCP options; each segment starting where the last
//! ended; every segment but the last the size of the first; only ACK and PSH set, a PSH or
//! a short segment ending the run. (The kernel also wants IP ids that count up; the merged
//! packet takes the first's, and the split side counts up from it.) Anything else is
//! written as it came.

use std::os::fd::AsFd;

use super::checksum;
use super::segment::{VnetHeader, F_NEEDS_CSUM, GSO_TCPV4, VNET_HDR_LEN};

const TCP: u8 = 6;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
/// An IP packet's largest size.
const MAX_TOTAL: usize = 65_535;
/// Segments per super-packet at most (the kernel's GRO stops at 64 too).
const MAX_SEGMENTS: usize = 64;

/// The run being built.
struct Run {
    /// Both headers' length (IP is 20: no options).
    headers: usize,
    /// The first segment's payload: every one but the last has this size.
    mss: usize,
    next_seq: u32,
    segments: usize,
    /// A short segment or a PSH ended it.
    closed: bool,
}

/// Merges segments before they are written to the TUN device.
pub(super) struct Coalescer {
    /// The virtio-net header's room, then the packet being built.
    buf: Vec<u8>,
    run: Option<Run>,
    /// Writes made and segments written, for the tests and the state file.
    pub writes: u64,
    pub segments: u64,
}

impl Default for Coalescer {
    fn default() -> Self {
        Coalescer {
            buf: Vec::with_capacity(VNET_HDR_LEN + MAX_TOTAL),
            run: None,
            writes: 0,
            segments: 0,
        }
    }
}

/// The header length of a TCP segment that may join a run, with its payload's length.
fn mergeable(p: &[u8]) -> Option<(usize, usize)> {
    if p.len() < 40 || p[0] != 0x45 || p[9] != TCP {
        return None;
    }
    // Neither more fragments nor an offset (the DF bit may be anything).
    if u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0 {
        return None;
    }
    if usize::from(u16::from_be_bytes([p[2], p[3]])) != p.len() {
        return None;
    }
    let headers = 20 + usize::from(p[32] >> 4) * 4;
    if headers < 40 || headers >= p.len() {
        return None;
    }
    if p[33] & !(TCP_ACK | TCP_PSH) != 0 || p[33] & TCP_ACK == 0 {
        return None;
    }
    // The kernel checks a segment's checksums before it merges it, and trusts the merged
    // packet's (`NEEDS_CSUM`): a segment with a wrong one is written alone, to be dropped.
    if !checksum::ipv4_tcp_hold(p, 20) {
        return None;
    }
    Some((headers, p.len() - headers))
}

fn seq_of(p: &[u8]) -> u32 {
    u32::from_be_bytes([p[24], p[25], p[26], p[27]])
}

impl Coalescer {
    /// Takes one decrypted packet; writes what can no longer grow.
    pub fn push(&mut self, tun: impl AsFd + Copy, packet: &[u8]) {
        self.segments += 1;
        let Some((headers, payload)) = mergeable(packet) else {
            self.flush(tun);
            self.writes += 1;
            let header = VnetHeader::default().to_bytes();
            let _ = nix::sys::uio::writev(
                tun,
                &[
                    std::io::IoSlice::new(&header),
                    std::io::IoSlice::new(packet),
                ],
            );
            return;
        };
        if let Some(run) = &mut self.run {
            let current = &self.buf[VNET_HDR_LEN..];
            let joins = !run.closed
                && run.segments < MAX_SEGMENTS
                && headers == run.headers
                && payload <= run.mss
                && current.len() + payload <= MAX_TOTAL
                && seq_of(packet) == run.next_seq
                // TOS; DF; TTL; addresses; ports; acknowledgment number; options.
                && current[1] == packet[1]
                && current[6] & 0x40 == packet[6] & 0x40
                && current[8] == packet[8]
                && current[12..24] == packet[12..24]
                && current[28..32] == packet[28..32]
                && current[34..36] == packet[34..36]
                && current[40..headers] == packet[40..headers];
            if joins {
                self.buf.extend_from_slice(&packet[headers..]);
                run.next_seq = run.next_seq.wrapping_add(payload as u32);
                run.segments += 1;
                if packet[33] & TCP_PSH != 0 {
                    self.buf[VNET_HDR_LEN + 33] |= TCP_PSH;
                    run.closed = true;
                }
                if payload < run.mss {
                    run.closed = true;
                }
                return;
            }
        }
        self.flush(tun);
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; VNET_HDR_LEN]);
        self.buf.extend_from_slice(packet);
        self.run = Some(Run {
            headers,
            mss: payload,
            next_seq: seq_of(packet).wrapping_add(payload as u32),
            segments: 1,
            closed: packet[33] & TCP_PSH != 0,
        });
    }

    /// Writes the run being built, if any.
    pub fn flush(&mut self, tun: impl AsFd) {
        let Some(run) = self.run.take() else {
            return;
        };
        self.writes += 1;
        let header = if run.segments == 1 {
            // As it came: its checksums are the sender's.
            VnetHeader::default()
        } else {
            let packet = &mut self.buf[VNET_HDR_LEN..];
            let total = packet.len();
            packet[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            checksum::set_ipv4_header(&mut packet[..20]);
            // The pseudo-header's sum, for the kernel to complete (`NEEDS_CSUM`).
            let partial = checksum::fold(checksum::pseudo_header(&packet[12..20], TCP, total - 20));
            packet[36..38].copy_from_slice(&partial.to_be_bytes());
            VnetHeader {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: run.headers as u16,
                gso_size: run.mss as u16,
                csum_start: 20,
                csum_offset: 16,
            }
        };
        self.buf[..VNET_HDR_LEN].copy_from_slice(&header.to_bytes());
        let _ = nix::unistd::write(tun, &self.buf);
    }
}
