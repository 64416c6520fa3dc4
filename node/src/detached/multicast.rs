//! Rejoin requests multicast on the node's LAN (`REJOIN_GROUP` on the cluster's
//! `rejoinPort`, one hop), answers read on the same socket.

use std::net::SocketAddr;

use kat_api::wire::REJOIN_GROUP;
use tokio::net::UdpSocket;

use super::{RejoinChannel, RejoinTransport};

/// The LAN's multicast group on `port`.
pub struct Multicast {
    /// `rejoinPort`.
    pub port: u16,
}

#[async_trait::async_trait]
impl RejoinTransport for Multicast {
    async fn open(&self) -> std::io::Result<Box<dyn RejoinChannel>> {
        let socket = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0))).await?;
        // One hop: the parent's control plane is on this LAN. Where the option cannot be set
        // the default (1) holds.
        if let Err(e) = socket.set_multicast_ttl_v4(1) {
            tracing::debug!(error = %e, "cannot set the rejoin requests' multicast TTL");
        }
        Ok(Box::new(GroupSocket {
            socket,
            group: SocketAddr::from((REJOIN_GROUP, self.port)),
        }))
    }
}

struct GroupSocket {
    socket: UdpSocket,
    group: SocketAddr,
}

#[async_trait::async_trait]
impl RejoinChannel for GroupSocket {
    async fn send(&mut self, datagram: &[u8]) -> std::io::Result<()> {
        self.socket.send_to(datagram, self.group).await.map(drop)
    }

    async fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, String)> {
        let (n, from) = self.socket.recv_from(buf).await?;
        Ok((n, from.to_string()))
    }
}
