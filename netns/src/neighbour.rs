//! Hardware addresses and neighbour announcements on the node bridge.
//!
//! Every interface KAT puts on a node's bridge — the bridge itself and each container's
//! `eth0` — gets a hardware address derived from its IPv4 address ([`mac_for`]):
//! locally administered `02:4b:` and the four bytes of the address. An instance that takes
//! over an address (a replacement after a rolling update, a restart) therefore has the same
//! MAC as the one before it, and the neighbour entries the bridge and the other containers
//! still hold for that address stay right.
//!
//! Entries can still be wrong (an address last used by a container made before this rule, or
//! one whose MAC changed for any other reason), so a container also announces itself when its
//! interface comes up: a few gratuitous ARP requests ([`announce`]), as `arping -U` sends.
//! The kernel takes a gratuitous ARP as an override of an existing entry at once (it is
//! exempt from the one-second `locktime`), so the bridge — whose address the hostPort relays
//! dial from — and every other container of the node switch to the new MAC without waiting
//! for their entries to go stale.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, LinkAddr, MsgFlags, SockFlag, SockType, SockaddrLike};

/// EtherType of ARP.
const ETH_P_ARP: u16 = 0x0806;

/// The hardware address of the interface that carries `address` on a node's bridge.
pub fn mac_for(address: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = address.octets();
    [0x02, 0x4b, a, b, c, d]
}

/// `aa:bb:cc:dd:ee:ff`, as `ip link` takes and shows it.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A gratuitous ARP request for `address` at `mac`: an Ethernet broadcast frame whose sender
/// and target protocol addresses are both `address` (padded to Ethernet's 60-byte minimum).
pub fn gratuitous_arp(address: Ipv4Addr, mac: [u8; 6]) -> [u8; 60] {
    let mut frame = [0u8; 60];
    frame[0..6].copy_from_slice(&[0xff; 6]);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    frame[14..16].copy_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    frame[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // protocol: IPv4
    frame[18] = 6;
    frame[19] = 4;
    frame[20..22].copy_from_slice(&1u16.to_be_bytes()); // request
    frame[22..28].copy_from_slice(&mac);
    frame[28..32].copy_from_slice(&address.octets());
    // Target hardware address: zero (unknown), as arping -U sends.
    frame[38..42].copy_from_slice(&address.octets());
    frame
}

/// Sends one gratuitous ARP for `address` out of `interface` (in the calling thread's
/// network namespace; needs CAP_NET_RAW there).
pub fn announce(interface: &str, address: Ipv4Addr) -> Result<(), String> {
    let what = || format!("announcing {address} on {interface}");
    let index = nix::net::if_::if_nametoindex(interface)
        .map_err(|e| format!("{}: no interface {interface}: {e}", what()))?;
    let fd = socket::socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("{}: opening a packet socket: {e}", what()))?;
    let mut raw: nix::libc::sockaddr_ll = nix::libc::sockaddr_ll {
        sll_family: nix::libc::AF_PACKET as u16,
        sll_protocol: ETH_P_ARP.to_be(),
        sll_ifindex: i32::try_from(index).map_err(|e| format!("{}: {e}", what()))?,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0],
    };
    let len = std::mem::size_of::<nix::libc::sockaddr_ll>() as nix::libc::socklen_t;
    // SAFETY: `raw` is a complete, initialised sockaddr_ll of the length given.
    let to = unsafe {
        LinkAddr::from_raw(
            std::ptr::addr_of_mut!(raw).cast::<nix::libc::sockaddr>(),
            Some(len),
        )
    }
    .ok_or_else(|| format!("{}: a bad link address", what()))?;
    let frame = gratuitous_arp(address, mac_for(address));
    socket::sendto(fd.as_raw_fd(), &frame, &to, MsgFlags::empty())
        .map_err(|e| format!("{}: {e}", what()))?;
    Ok(())
}

/// When [`announce_repeatedly`] sends, after the interface came up: a first one at once (it
/// may meet a link whose carrier the kernel has not yet switched on), then as `arping -U -c`
/// would, so that a lost frame costs little.
pub const ANNOUNCE_AT: [Duration; 4] = [
    Duration::from_millis(0),
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_millis(2000),
];

/// Sends the announcements of [`ANNOUNCE_AT`] from a thread of its own (which stays in the
/// calling thread's network namespace). Failures go to standard error: a missed announcement
/// costs time, not correctness, since the MAC is derived from the address.
pub fn announce_repeatedly(interface: String, address: Ipv4Addr) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut previous = Duration::ZERO;
        for at in ANNOUNCE_AT {
            std::thread::sleep(at.saturating_sub(previous));
            previous = at;
            if let Err(e) = announce(&interface, address) {
                eprintln!("{e}");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mac_is_the_address_behind_a_local_prefix() {
        let mac = mac_for(Ipv4Addr::new(10, 231, 1, 1));
        assert_eq!(format_mac(mac), "02:4b:0a:e7:01:01");
        // Locally administered, unicast.
        assert_eq!(mac[0] & 0b11, 0b10);
        assert_ne!(
            mac_for(Ipv4Addr::new(10, 0, 0, 2)),
            mac_for(Ipv4Addr::new(10, 0, 0, 3))
        );
    }

    #[test]
    fn a_gratuitous_arp_names_the_address_as_sender_and_target() {
        let ip = Ipv4Addr::new(10, 77, 0, 9);
        let f = gratuitous_arp(ip, mac_for(ip));
        assert_eq!(&f[0..6], &[0xff; 6]);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1]);
        assert_eq!(&f[22..28], &mac_for(ip));
        assert_eq!(&f[28..32], &ip.octets());
        assert_eq!(&f[32..38], &[0; 6]);
        assert_eq!(&f[38..42], &ip.octets());
    }
}
