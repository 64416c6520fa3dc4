//! What the overlay reads from its TUN device: each packet behind a virtio-net header
//! (`IFF_VNET_HDR`). With checksum and TCP segmentation offload offered (`TUNSETOFFLOAD`),
//! the kernel hands over a container's TCP stream as "super-packets" of up to 64 KiB, one
//! read instead of ~45, and leaves their checksums to be completed. This module turns one
//! such read back into the packets the wire carries, each whole: this is where the
//! overlay's throughput comes from (see `docs/benchmarks.md`, container network).
//!
//! Everything here parses what the node network namespace's stack wrote, which forwards
//! what containers send: a container with `CAP_NET_RAW` in its namespaces can shape much of
//! it. Every length is checked; a malformed packet is an `Err` and is dropped.

use super::checksum;

/// The size of `struct virtio_net_hdr` (the TUN device's default, `TUNSETVNETHDRSZ`).
pub(crate) const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds only the
/// pseudo-header's sum, the rest is to be added.
pub(super) const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_*`.
pub(super) const GSO_NONE: u8 = 0;
pub(super) const GSO_TCPV4: u8 = 1;
const GSO_ECN: u8 = 0x80;

const TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// `struct virtio_net_hdr`, in the host's byte order (little-endian: the TUN device's
/// legacy order on the hosts KAT runs on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct VnetHeader {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHeader {
    pub fn parse(bytes: &[u8]) -> Option<VnetHeader> {
        let b = bytes.get(..VNET_HDR_LEN)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHeader {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b
    }
}

/// Hands `each` every packet that `packet` stands for, as `header` describes it: itself with
/// its checksum completed, or the TCP segments of a super-packet, each with its own IP
/// length, id and checksum, sequence number and TCP checksum. `scratch` holds one segment at
/// a time. Returns how many packets `each` saw.
pub(super) fn for_each_packet(
    header: &VnetHeader,
    packet: &mut [u8],
    scratch: &mut Vec<u8>,
    mut each: impl FnMut(&[u8]),
) -> Result<usize, &'static str> {
    match header.gso_type & !GSO_ECN {
        GSO_NONE => {
            if header.flags & F_NEEDS_CSUM != 0 {
                complete_checksum(
                    packet,
                    usize::from(header.csum_start),
                    usize::from(header.csum_offset),
                )?;
            }
            each(packet);
            Ok(1)
        }
        GSO_TCPV4 => split_tcp(packet, usize::from(header.gso_size), scratch, each),
        _ => Err("a segmentation offload the overlay did not offer"),
    }
}

/// Adds the bytes from `start` to the partial checksum at `start + offset`: a TCP or UDP
/// checksum after the IPv4 header, nowhere else (the header comes from a container's
/// stack, and the overlay has already judged the packet's addresses).
fn complete_checksum(packet: &mut [u8], start: usize, offset: usize) -> Result<(), &'static str> {
    let ip = match packet.first() {
        Some(b) if b >> 4 == 4 => usize::from(b & 0x0f) * 4,
        _ => return Err("a checksum to complete in a packet that is not IPv4"),
    };
    if start < ip.max(20) || !matches!(offset, 6 | 16) {
        return Err("its checksum offsets are not a TCP or UDP checksum");
    }
    let field = start
        .checked_add(offset)
        .filter(|f| f.checked_add(2).is_some_and(|end| end <= packet.len()))
        .ok_or("its checksum offsets are outside the packet")?;
    let value = !checksum::fold(checksum::sum(&packet[start..], 0));
    // 0 and 0xffff are the same sum; UDP reserves 0 for "no checksum".
    let value = if value == 0 { 0xffff } else { value };
    packet[field..field + 2].copy_from_slice(&value.to_be_bytes());
    Ok(())
}

/// The lengths of an IPv4/TCP packet's headers: (IP header, both headers).
fn tcp_headers(packet: &[u8]) -> Result<(usize, usize), &'static str> {
    if packet.len() < 40 || packet[0] >> 4 != 4 || packet[9] != TCP {
        return Err("a TCP super-packet that is not IPv4/TCP");
    }
    let ip = usize::from(packet[0] & 0x0f) * 4;
    if ip < 20 || ip + 20 > packet.len() {
        return Err("a TCP super-packet with a bad IP header length");
    }
    let tcp = usize::from(packet[ip + 12] >> 4) * 4;
    if tcp < 20 || ip + tcp > packet.len() {
        return Err("a TCP super-packet with a bad TCP header length");
    }
    Ok((ip, ip + tcp))
}

fn split_tcp(
    packet: &[u8],
    mss: usize,
    scratch: &mut Vec<u8>,
    mut each: impl FnMut(&[u8]),
) -> Result<usize, &'static str> {
    let (ip, headers) = tcp_headers(packet)?;
    if usize::from(u16::from_be_bytes([packet[2], packet[3]])) != packet.len() {
        return Err("a TCP super-packet whose IP length is not its size");
    }
    if mss == 0 {
        return Err("a TCP super-packet with a segment size of 0");
    }
    let payload = &packet[headers..];
    let id = u16::from_be_bytes([packet[4], packet[5]]);
    let seq = u32::from_be_bytes([
        packet[ip + 4],
        packet[ip + 5],
        packet[ip + 6],
        packet[ip + 7],
    ]);
    let flags = packet[ip + 13];
    let chunks = payload.len().div_ceil(mss).max(1);
    for i in 0..chunks {
        let chunk = payload
            .get(i * mss..payload.len().min((i + 1) * mss))
            .unwrap_or(&[]);
        scratch.clear();
        scratch.extend_from_slice(&packet[..headers]);
        scratch.extend_from_slice(chunk);
        let total = scratch.len() as u16;
        scratch[2..4].copy_from_slice(&total.to_be_bytes());
        scratch[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        checksum::set_ipv4_header(&mut scratch[..ip]);
        let offset = (i * mss) as u32;
        scratch[ip + 4..ip + 8].copy_from_slice(&seq.wrapping_add(offset).to_be_bytes());
        let mut f = flags;
        if i + 1 < chunks {
            f &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            f &= !TCP_CWR;
        }
        scratch[ip + 13] = f;
        scratch[ip + 16..ip + 18].fill(0);
        let segment_len = scratch.len() - ip;
        let sum = checksum::sum(
            &scratch[ip..],
            checksum::pseudo_header(&scratch[12..20], TCP, segment_len),
        );
        let value = !checksum::fold(sum);
        scratch[ip + 16..ip + 18].copy_from_slice(&value.to_be_bytes());
        each(scratch);
    }
    Ok(chunks)
}
