//! Serving DNS over UDP and TCP: cluster names from the current [`Table`], the rest through
//! the [`Forwarder`].
//!
//! A workload can send anything: a message that does not parse gets FORMERR (or nothing, if
//! not even its header is there), a response sent to it is refused rather than forwarded, at
//! most [`MAX_IN_FLIGHT`] questions are being forwarded at once and at most [`MAX_TCP`]
//! connections served, so a flood costs the node a bounded number of sockets. TCP connections get
//! [`TCP_IDLE`] between messages and carry at most [`TCP_MESSAGES`] of them.

use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{watch, Semaphore};

use super::answer::{answer, encode_for_udp, udp_limit};
use super::{Forwarder, Table};

/// Questions forwarded at once, at most.
pub const MAX_IN_FLIGHT: usize = 256;
/// TCP connections served at once, at most (more wait in the kernel's backlog).
pub const MAX_TCP: usize = 64;
const TCP_IDLE: Duration = Duration::from_secs(10);
const TCP_MESSAGES: usize = 100;

pub struct DnsServer {
    table: watch::Receiver<Arc<Table>>,
    forwarder: Forwarder,
    in_flight: Arc<Semaphore>,
    tcp: Arc<Semaphore>,
}

impl DnsServer {
    /// `table` is swapped by the agent as records change.
    pub fn new(table: watch::Receiver<Arc<Table>>, forwarder: Forwarder) -> Arc<DnsServer> {
        Arc::new(DnsServer {
            table,
            forwarder,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tcp: Arc::new(Semaphore::new(MAX_TCP)),
        })
    }

    /// The answer to one message (`None`: nothing to send back). `udp` limits its size.
    pub async fn respond(&self, raw: &[u8], udp: bool) -> Option<Vec<u8>> {
        let request = match Message::from_vec(raw) {
            Ok(m) => m,
            Err(_) => return format_error(raw),
        };
        let limit = if udp { udp_limit(&request) } else { 65_535 };
        let table = self.table.borrow().clone();
        if let Some(response) = answer(&table, &request) {
            return encode_for_udp(&response, limit);
        }
        if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
            || request.queries.len() != 1
        {
            let mut refused = Message::response(request.metadata.id, request.metadata.op_code);
            refused.metadata.response_code = ResponseCode::Refused;
            return refused.to_vec().ok();
        }
        let _permit = self.in_flight.clone().try_acquire_owned().ok()?;
        let bytes = self.forwarder.forward(&request, raw).await?;
        if udp && bytes.len() > limit {
            let message = Message::from_vec(&bytes).ok()?;
            return message.truncate().to_vec().ok();
        }
        Some(bytes)
    }

    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket) -> std::io::Result<()> {
        let socket = Arc::new(socket);
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = socket.recv_from(&mut buf).await?;
            let raw = buf[..n].to_vec();
            let (server, socket) = (self.clone(), socket.clone());
            tokio::spawn(async move {
                if let Some(reply) = server.respond(&raw, true).await {
                    let _ = socket.send_to(&reply, peer).await;
                }
            });
        }
    }

    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let Ok(permit) = self.tcp.clone().acquire_owned().await else {
                return Ok(());
            };
            let (stream, _) = listener.accept().await?;
            let server = self.clone();
            tokio::spawn(async move {
                let _ = server.tcp_connection(stream).await;
                drop(permit);
            });
        }
    }

    async fn tcp_connection(&self, mut stream: TcpStream) -> std::io::Result<()> {
        for _ in 0..TCP_MESSAGES {
            let mut len = [0u8; 2];
            match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
                Ok(Ok(_)) => {}
                _ => return Ok(()),
            }
            let mut raw = vec![0u8; usize::from(u16::from_be_bytes(len))];
            tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut raw))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            let Some(reply) = self.respond(&raw, false).await else {
                continue;
            };
            let Ok(n) = u16::try_from(reply.len()) else {
                continue;
            };
            stream.write_all(&n.to_be_bytes()).await?;
            stream.write_all(&reply).await?;
        }
        Ok(())
    }
}

/// FORMERR for a message whose header (its id) is there but the rest does not parse.
fn format_error(raw: &[u8]) -> Option<Vec<u8>> {
    let id = u16::from_be_bytes([*raw.first()?, *raw.get(1)?]);
    Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
        .to_vec()
        .ok()
}
