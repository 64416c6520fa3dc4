//! The few route-netlink requests a container's attach makes, sent by the attach helper
//! itself instead of through `ip`.
//!
//! Each `ip -batch` was an exec (~1.5 ms of a loaded core), two per container; a netlink
//! socket belongs to the network namespace it was opened in, so one socket before and one
//! after `setns` do the same work in-process. The messages come from `netlink-packet-route`,
//! which libcontainer already links into the agent's binary. Every request asks for an
//! acknowledgement, and a refusal comes back as the kernel's error with what was asked.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use netlink_packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// A route-netlink socket of the network namespace this thread is in when it is opened.
pub(crate) struct RouteSocket {
    socket: Socket,
    sequence: u32,
}

/// One end of a veth pair to make: its name, MTU and, if given, hardware address.
pub(crate) struct VethEnd<'a> {
    pub name: &'a str,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
}

impl RouteSocket {
    pub(crate) fn open() -> Result<RouteSocket, String> {
        let mut socket =
            Socket::new(NETLINK_ROUTE).map_err(|e| format!("opening a netlink socket: {e}"))?;
        socket
            .bind_auto()
            .map_err(|e| format!("binding a netlink socket: {e}"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| format!("connecting a netlink socket to the kernel: {e}"))?;
        Ok(RouteSocket {
            socket,
            sequence: 0,
        })
    }

    /// A veth pair: `host` in this namespace, enslaved to the bridge `bridge_index` and up;
    /// `peer` in the network namespace of process `peer_pid`, down.
    pub(crate) fn add_veth(
        &mut self,
        host: &VethEnd<'_>,
        bridge_index: u32,
        peer: &VethEnd<'_>,
        peer_pid: u32,
    ) -> Result<(), String> {
        let mut peer_message = LinkMessage::default();
        peer_message.attributes = vec![
            LinkAttribute::IfName(peer.name.to_string()),
            LinkAttribute::Mtu(peer.mtu),
            LinkAttribute::NetNsPid(peer_pid),
        ];
        if let Some(mac) = peer.mac {
            peer_message
                .attributes
                .push(LinkAttribute::Address(mac.to_vec()));
        }
        let mut message = LinkMessage::default();
        message.header.flags = LinkFlags::Up;
        message.header.change_mask = LinkFlags::Up;
        message.attributes = vec![
            LinkAttribute::IfName(host.name.to_string()),
            LinkAttribute::Mtu(host.mtu),
            LinkAttribute::Controller(bridge_index),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_message))),
            ]),
        ];
        self.request(
            RouteNetlinkMessage::NewLink(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map_err(|e| {
            format!(
                "adding the veth pair {} / {} on bridge index {bridge_index}: {e}",
                host.name, peer.name
            )
        })
    }

    /// Sets the link `index` (named `name`, for errors) up.
    pub(crate) fn set_up(&mut self, index: u32, name: &str) -> Result<(), String> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        message.header.flags = LinkFlags::Up;
        message.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(message), 0)
            .map_err(|e| format!("setting {name} up: {e}"))
    }

    /// Gives the link `index` (named `name`) the address `address`, as `ip addr add` does.
    pub(crate) fn add_address(
        &mut self,
        index: u32,
        name: &str,
        address: Ipv4Net,
    ) -> Result<(), String> {
        let mut message = AddressMessage::default();
        message.header.family = AddressFamily::Inet;
        message.header.prefix_len = address.prefix_len();
        message.header.index = index;
        let ip = IpAddr::V4(address.addr());
        message.attributes = vec![AddressAttribute::Local(ip), AddressAttribute::Address(ip)];
        self.request(
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map_err(|e| format!("adding {address} to {name}: {e}"))
    }

    /// The default route via `gateway` in the main table.
    pub(crate) fn add_default_route(&mut self, gateway: Ipv4Addr) -> Result<(), String> {
        let mut message = RouteMessage::default();
        message.header.address_family = AddressFamily::Inet;
        message.header.table = RouteHeader::RT_TABLE_MAIN;
        message.header.protocol = RouteProtocol::Boot;
        message.header.scope = RouteScope::Universe;
        message.header.kind = RouteType::Unicast;
        message.attributes = vec![RouteAttribute::Gateway(RouteAddress::Inet(gateway))];
        self.request(
            RouteNetlinkMessage::NewRoute(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map_err(|e| format!("adding the default route via {gateway}: {e}"))
    }

    /// Sends `message` with `flags` and waits for the kernel's acknowledgement.
    fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> Result<(), String> {
        self.sequence += 1;
        let mut packet = NetlinkMessage::from(message);
        packet.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        packet.header.sequence_number = self.sequence;
        packet.finalize();
        let mut buffer = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buffer);
        self.socket
            .send(&buffer, 0)
            .map_err(|e| format!("sending to the kernel: {e}"))?;
        let mut answer = vec![0u8; 8192];
        loop {
            let n = self
                .socket
                .recv(&mut &mut answer[..], 0)
                .map_err(|e| format!("reading the kernel's answer: {e}"))?;
            let mut offset = 0;
            while offset < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[offset..n])
                    .map_err(|e| format!("reading the kernel's answer: {e}"))?;
                let length = reply.header.length as usize;
                if reply.header.sequence_number == self.sequence {
                    if let NetlinkPayload::Error(error) = reply.payload {
                        return match error.code {
                            None => Ok(()),
                            Some(_) => Err(error.to_io().to_string()),
                        };
                    }
                }
                if length == 0 {
                    break;
                }
                // Messages in a datagram start at 4-byte boundaries (NLMSG_ALIGN).
                offset += (length + 3) & !3;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own in a fresh network namespace (root only: a thread of
    /// this multi-threaded test process may not make a user namespace).
    fn in_fresh_namespace<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making a network namespace needs root here");
            return None;
        }
        let outcome = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            f()
        })
        .join();
        // A panic on that thread fails the test.
        Some(outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    }

    #[test]
    fn requests_are_acknowledged_and_refusals_name_what_was_asked() {
        let Some(results) = in_fresh_namespace(|| {
            let mut socket = RouteSocket::open().expect("a netlink socket");
            let lo = nix::net::if_::if_nametoindex("lo").expect("lo");
            let up = socket.set_up(lo, "lo");
            let address = socket.add_address(lo, "lo", "10.9.8.7/8".parse().unwrap());
            let again = socket.add_address(lo, "lo", "10.9.8.7/8".parse().unwrap());
            let missing = socket.set_up(4242, "nothing");
            let route = socket.add_default_route(Ipv4Addr::new(192, 0, 2, 1));
            let addresses =
                std::fs::read_to_string("/proc/thread-self/net/fib_trie").unwrap_or_default();
            (up, address, again, missing, route, addresses)
        }) else {
            return;
        };
        let (up, address, again, missing, route, addresses) = results;
        assert_eq!(up, Ok(()));
        assert_eq!(address, Ok(()));
        assert!(addresses.contains("10.9.8.7"), "{addresses}");
        let again = again.expect_err("the same address twice");
        assert!(
            again.contains("adding 10.9.8.7/8 to lo") && again.contains("exists"),
            "{again}"
        );
        let missing = missing.expect_err("no such link");
        assert!(
            missing.contains("setting nothing up") && missing.contains("No such device"),
            "{missing}"
        );
        let route = route.expect_err("no way to the gateway");
        assert!(
            route.contains("via 192.0.2.1") && route.contains("unreachable"),
            "{route}"
        );
    }
}
