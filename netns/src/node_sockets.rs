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
use std::os::unix::fs::OpenOptionsExt;
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

/// The request for the overlay's TUN device.
const TUN_REQUEST: u8 = b'w';

/// The keeper's loop: one socket (or the overlay's TUN device) per connection, for as long
/// as it lives.
pub(crate) fn serve(listener: UnixListener) -> ! {
    loop {
        let Ok((mut connection, _)) = listener.accept() else {
            continue;
        };
        let mut request = [0u8; 1];
        if connection.read_exact(&mut request).is_err() {
            continue;
        }
        let made: std::io::Result<OwnedFd> = match (request[0], kind(request[0])) {
            (TUN_REQUEST, _) => open_tun(crate::overlay::TUN_DEVICE),
            (_, Some((domain, ty))) => Socket::new(domain, ty, None).map(OwnedFd::from),
            _ => continue,
        };
        match made {
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

/// Opens (creating) the TUN device `name` in this network namespace, non-blocking, each
/// packet behind a virtio-net header, with checksum and TCPv4 segmentation offload offered
/// (the overlay's `segment` and `coalesce`: whole TCP super-packets in and out). A kernel
/// that refuses the offloads still gives a header, all zeros.
fn open_tun(name: &str) -> std::io::Result<OwnedFd> {
    /// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: i16,
        _pad: [u8; 22],
    }
    const TUNSETIFF: nix::libc::c_ulong = 0x4004_54ca;
    const TUNSETOFFLOAD: nix::libc::c_ulong = 0x4004_54d0;
    const TUN_F_CSUM: nix::libc::c_ulong = 0x01;
    const TUN_F_TSO4: nix::libc::c_ulong = 0x02;
    const TUN_F_TSO_ECN: nix::libc::c_ulong = 0x08;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; 16],
        flags: (nix::libc::IFF_TUN | nix::libc::IFF_NO_PI | nix::libc::IFF_VNET_HDR) as i16,
        _pad: [0; 22],
    };
    let bytes = name.as_bytes();
    if bytes.len() >= req.name.len() {
        return Err(std::io::Error::other("interface name too long"));
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `IfReq` lays out (40 bytes).
    let rc = unsafe { nix::libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: TUNSETOFFLOAD takes its flags as the argument itself.
    let rc = unsafe {
        nix::libc::ioctl(
            file.as_raw_fd(),
            TUNSETOFFLOAD as _,
            TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO_ECN,
        )
    };
    if rc < 0 {
        eprintln!(
            "overlay: the TUN device refused segmentation offload ({}); one packet per read",
            std::io::Error::last_os_error()
        );
    }
    Ok(file.into())
}

/// Asks the keeper listening on `path` for the overlay's TUN device.
pub(crate) fn request_tun(path: &Path) -> std::io::Result<OwnedFd> {
    receive(path, TUN_REQUEST)
}

/// Asks the keeper listening on `path` for a socket. Blocking (a few microseconds).
pub fn request(path: &Path, domain: Domain, ty: Type) -> std::io::Result<Socket> {
    let byte = request_byte(domain, ty)
        .ok_or_else(|| std::io::Error::other("only IPv4/IPv6 stream and datagram sockets"))?;
    let socket = Socket::from(receive(path, byte)?);
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn receive(path: &Path, byte: u8) -> std::io::Result<OwnedFd> {
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
        Some(fd) => Ok(fd),
        None => Err(std::io::Error::other(format!(
            "the node network keeper made no socket: {}",
            String::from_utf8_lossy(data.get(1..n).unwrap_or_default())
        ))),
    }
}
