//! The Internet checksum (RFC 1071) as the overlay's segmenting and coalescing need it.

/// The one's-complement sum of `bytes` (as big-endian 16-bit words, an odd last byte
/// padded with zero) added to `initial`, not yet folded. Words are summed four bytes at a
/// time: 2^16 ≡ 1 modulo 2^16 - 1, so a 32-bit word counts as the sum of its halves.
pub(super) fn sum(bytes: &[u8], initial: u64) -> u64 {
    let mut total = initial;
    let mut words = bytes.chunks_exact(4);
    for w in &mut words {
        total += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    total + u64::from(u32::from_be_bytes(tail))
}

/// `total` folded to 16 bits (not inverted).
pub(super) fn fold(mut total: u64) -> u16 {
    while total > 0xffff {
        total = (total & 0xffff) + (total >> 16);
    }
    total as u16
}

/// The TCP/UDP pseudo-header's sum for IPv4 `source` and `destination` (bytes 12..20 of the
/// IP header), `protocol` and the transport `length`.
pub(super) fn pseudo_header(addresses: &[u8], protocol: u8, length: usize) -> u64 {
    sum(addresses, u64::from(protocol) + length as u64)
}

/// Writes the IPv4 header checksum of `header` (its whole length, options included).
pub(super) fn set_ipv4_header(header: &mut [u8]) {
    header[10..12].fill(0);
    let value = !fold(sum(header, 0));
    header[10..12].copy_from_slice(&value.to_be_bytes());
}

/// Whether an IPv4/TCP packet's header checksum (its first `ip` bytes) and TCP checksum
/// hold.
pub(super) fn ipv4_tcp_hold(packet: &[u8], ip: usize) -> bool {
    let tcp = sum(
        &packet[ip..],
        pseudo_header(&packet[12..20], 6, packet.len() - ip),
    );
    fold(sum(&packet[..ip], 0)) == 0xffff && fold(tcp) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's example: the words 0001 f203 f4f5 f6f7 sum to ddf2.
    #[test]
    fn the_rfc_example_sums() {
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&bytes, 0)), 0xddf2);
        // Any split into pieces of even length gives the same sum.
        assert_eq!(fold(sum(&bytes[2..], sum(&bytes[..2], 0))), 0xddf2);
        // An odd tail counts as its byte followed by zero.
        assert_eq!(fold(sum(&[0x12, 0x34, 0x56], 0)), 0x1234 + 0x5600);
    }

    #[test]
    fn a_header_with_its_checksum_sums_to_all_ones() {
        let mut h = [
            0x45, 0, 0, 0x54, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        set_ipv4_header(&mut h);
        assert_eq!(fold(sum(&h, 0)), 0xffff);
    }
}
