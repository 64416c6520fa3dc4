//! Sockets made inside the node network namespace, for the agent.
//!
//! The agent serves DNS on the node's bridge address and dials containers for published
//! ports, both from sockets that live in the node network namespace. A thread cannot join
//! that namespace on its own (`setns` of a network namespace needs `CAP_SYS_ADMIN` in the
//! caller's own user namespace, which an unprivileged agent lacks), so the node's keeper
//! process, which lives there, makes them: it listens on a Unix socket in the agent's
//! private network directory and answers each one-byte request with a new socket, passed
//! as `SCM_RIGHTS`. A socket keeps the namespace it was made in wherever it goes.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use socket2::{Domain, Socket, Type};

/// What a request byte asks for.
fn kind(request: u8) -> Option<(Domain, Type)> {
    match request {
        b't' => Some((Domain::IPV4, Type::STREAM)),
        b'u' => Some((Domain::IPV4, Type::DGRAM)),
        b'T' => Some((Domain::IPV6, Type::STREAM)),
        b'U' => Some((Domain::IPV6, Type::DGRAM)),
        _ => None,
    }
}

fn request_byte(domain: Domain, ty: Type) -> Option<u8> {
    (b"tuTU")
        .iter()
        .copied()
        .find(|&b| kind(b) == Some((domain, ty)))
}

/// The keeper's loop: one socket per connection, for as long as it lives.
pub(crate) fn serve(listener: UnixListener) -> ! {
    loop {
        let Ok((mut connection, _)) = listener.accept() else {
            continue;
        };
        let mut request = [0u8; 1];
        if connection.read_exact(&mut request).is_err() {
            continue;
        }
        let Some((domain, ty)) = kind(request[0]) else {
            continue;
        };
        match Socket::new(domain, ty, None) {
            Ok(socket) => {
                let fds = [socket.as_raw_fd()];
                let _ = sendmsg::<()>(
                    connection.as_raw_fd(),
                    &[IoSlice::new(b"k")],
                    &[ControlMessage::ScmRights(&fds)],
                    MsgFlags::empty(),
                    None,
                );
            }
            Err(e) => {
                let _ = connection.write_all(format!("e{e}").as_bytes());
            }
        }
    }
}

/// Asks the keeper listening on `path` for a socket. Blocking (a few microseconds).
pub fn request(path: &Path, domain: Domain, ty: Type) -> std::io::Result<Socket> {
    let byte = request_byte(domain, ty)
        .ok_or_else(|| std::io::Error::other("only IPv4/IPv6 stream and datagram sockets"))?;
    let mut connection = UnixStream::connect(path)?;
    connection.write_all(&[byte])?;
    let mut data = [0u8; 256];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut data)];
    let message = recvmsg::<()>(
        connection.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received: Option<OwnedFd> = None;
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                received.get_or_insert(owned);
            }
        }
    }
    let n = message.bytes;
    match received {
        Some(fd) => {
            let socket = Socket::from(fd);
            socket.set_nonblocking(true)?;
            Ok(socket)
        }
        None => Err(std::io::Error::other(format!(
            "the node network keeper made no socket: {}",
            String::from_utf8_lossy(data.get(1..n).unwrap_or_default())
        ))),
    }
}
