//! The overlay's datagrams in batches on the underlay: UDP segmentation offload on the way
//! out (`UDP_SEGMENT`: one `sendmsg` carries up to 64 equal-sized datagrams, the last one
//! possibly shorter, and the kernel splits them as late as it can: in the NIC, or not at all
//! on a veth), UDP GRO on the way in (`UDP_GRO`: one `recvmsg` returns a run of datagrams
//! of one size from one sender). A kernel without either (before 4.18 and 5.0) gets one
//! system call per datagram, as before.

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn,
};

/// The most bytes one `sendmsg` carries: an IPv4 UDP datagram's largest payload, less a
/// margin.
pub(super) const MAX_BYTES: usize = 65_000;
/// The most datagrams in one `sendmsg` (the kernel's `UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 64;

/// Datagrams for one destination, gathered until they can be sent in one call.
pub(super) struct Sender {
    buf: Vec<u8>,
    len: usize,
    /// The first datagram's size: every one but the last has it.
    size: usize,
    count: usize,
    /// A shorter datagram was added: it must be the last.
    closed: bool,
    to: Option<SocketAddr>,
    /// Whether `UDP_SEGMENT` works here (cleared by the first refusal).
    gso: bool,
    /// System calls made and datagrams sent, for the tests.
    pub calls: u64,
    pub datagrams: u64,
}

impl Sender {
    pub fn new() -> Sender {
        Sender {
            buf: vec![0u8; MAX_BYTES],
            len: 0,
            size: 0,
            count: 0,
            closed: false,
            to: None,
            gso: true,
            calls: 0,
            datagrams: 0,
        }
    }

    /// Room for the next datagram to `to`, of at most `max` bytes: fill it, then
    /// [`Sender::commit`] its length.
    pub fn room(&mut self, udp: &UdpSocket, to: SocketAddr, max: usize) -> &mut [u8] {
        let max = max.min(MAX_BYTES);
        if self.to != Some(to)
            || self.closed
            || self.count == MAX_SEGMENTS
            || self.len + max > MAX_BYTES
        {
            self.flush(udp);
        }
        self.to = Some(to);
        &mut self.buf[self.len..self.len + max]
    }

    /// The datagram written at the start of the last [`Sender::room`] is `n` bytes.
    pub fn commit(&mut self, udp: &UdpSocket, n: usize) {
        if self.count > 0 && n > self.size {
            // Larger than those before it: they go first, it starts the next batch.
            let at = self.len;
            self.flush(udp);
            self.buf.copy_within(at..at + n, 0);
        }
        if self.count == 0 {
            self.size = n;
        } else if n < self.size {
            self.closed = true;
        }
        self.len += n;
        self.count += 1;
    }

    /// Sends what was gathered.
    pub fn flush(&mut self, udp: &UdpSocket) {
        if self.count == 0 {
            return;
        }
        let (data, size, count) = (&self.buf[..self.len], self.size, self.count);
        self.len = 0;
        self.count = 0;
        self.closed = false;
        let Some(to) = self.to else { return };
        self.datagrams += count as u64;
        if count > 1 && self.gso && size > 0 {
            let segment = size as u16;
            let address = match to {
                SocketAddr::V4(a) => SockaddrIn::from(a),
                SocketAddr::V6(_) => return,
            };
            self.calls += 1;
            match sendmsg(
                udp.as_raw_fd(),
                &[IoSlice::new(data)],
                &[ControlMessage::UdpGsoSegments(&segment)],
                MsgFlags::empty(),
                Some(&address),
            ) {
                Ok(_) => return,
                // Not supported on this path (no checksum offload, an old kernel): one by
                // one from now on.
                Err(Errno::EIO | Errno::EINVAL | Errno::ENOPROTOOPT | Errno::EOPNOTSUPP) => {
                    eprintln!(
                        "overlay: UDP segmentation offload refused; sending datagrams one by one"
                    );
                    self.gso = false;
                }
                // Dropped, as a full socket buffer drops a single datagram.
                Err(_) => return,
            }
        }
        for datagram in data.chunks(size.max(1)) {
            self.calls += 1;
            let _ = udp.send_to(datagram, to);
        }
    }
}

/// Asks for runs of datagrams in one receive (`UDP_GRO`); whether the kernel took it.
pub(super) fn enable_gro(udp: &UdpSocket) -> bool {
    setsockopt(udp, sockopt::UdpGroSegment, &true).is_ok()
}

/// One receive: the bytes, their sender, and the size of each datagram in them when the
/// kernel handed over a run (`None`: one datagram).
pub(super) fn receive(
    udp: &UdpSocket,
    buf: &mut [u8],
    control: &mut Vec<u8>,
) -> Option<(usize, SocketAddr, Option<usize>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let message = recvmsg::<SockaddrIn>(
        udp.as_raw_fd(),
        &mut iov,
        Some(control),
        MsgFlags::MSG_DONTWAIT,
    )
    .ok()?;
    let from = SocketAddr::V4((*message.address.as_ref()?).into());
    let mut size = None;
    if let Ok(cmsgs) = message.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::UdpGroSegments(s) = c {
                size = usize::try_from(s).ok().filter(|s| *s > 0);
            }
        }
    }
    Some((message.bytes, from, size))
}
