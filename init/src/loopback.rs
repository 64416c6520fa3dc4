//! The container's loopback interface: up before the workload starts; then the capability
//! that allowed it is gone for good.
//!
//! A new network namespace starts with `lo` down, and without it a workload cannot reach
//! itself on 127.0.0.1. kat-init is the only process of a container that ever holds
//! `CAP_NET_ADMIN` (over the container's own network namespace, which its user namespace
//! owns): it sets `lo` up, then drops the capability from its bounding, permitted, effective,
//! inheritable and ambient sets. The workload, and every `exec` (which copies PID 1's sets),
//! can therefore never change the container's addresses or routes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::libc;

const CAP_NET_ADMIN: u32 = 12;
const IFF_UP: libc::c_short = 0x1;

/// `struct ifreq` as far as the flags go, padded to the kernel's size (40 bytes).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Set `lo` up. Already up: nothing to do.
pub fn bring_up() -> Result<(), String> {
    // SAFETY: socket(2) with constant arguments; the fd is owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a valid, open descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: SIOCGIFFLAGS reads a NUL-terminated name and writes the flags into `req`,
    // which is as large as the kernel's struct ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(format!(
            "reading lo's flags: {}",
            std::io::Error::last_os_error()
        ));
    }
    if req.flags & IFF_UP != 0 {
        return Ok(());
    }
    req.flags |= IFF_UP;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(format!(
            "setting lo up: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The sets that give a capability (the bounding set only limits what can be gained).
const HELD: [&str; 4] = ["CapPrm:", "CapEff:", "CapInh:", "CapAmb:"];

/// Drop `CAP_NET_ADMIN` from every set of this process, for good, and check that it is gone.
/// A process that does not hold it (kat-init outside a container, an ordinary user whose
/// bounding set is full but who has no capability) has nothing to do.
pub fn drop_net_admin() -> Result<(), String> {
    if !holds_net_admin(&HELD) {
        return Ok(());
    }
    // SAFETY: prctl(2) with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_CAPBSET_DROP,
            CAP_NET_ADMIN as libc::c_ulong,
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(format!(
            "dropping CAP_NET_ADMIN from the bounding set: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget(2) fills two CapData for version 3 headers.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } < 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    let bit = 1u32 << CAP_NET_ADMIN;
    data[0].effective &= !bit;
    data[0].permitted &= !bit;
    data[0].inheritable &= !bit;
    // SAFETY: capset(2) reads the header and two CapData; dropping is always allowed.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } < 0 {
        return Err(format!("capset: {}", std::io::Error::last_os_error()));
    }
    // Ambient capabilities need the permitted bit, now gone; clear them all the same.
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if holds_net_admin(&["CapPrm:", "CapEff:", "CapInh:", "CapAmb:", "CapBnd:"]) {
        return Err("CAP_NET_ADMIN is still held after dropping it".into());
    }
    Ok(())
}

/// Whether `CAP_NET_ADMIN` is in any of these sets (`/proc/self/status` line prefixes).
fn holds_net_admin(sets: &[&str]) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .filter(|l| sets.iter().any(|p| l.starts_with(p)))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .any(|mask| mask & (1 << CAP_NET_ADMIN) != 0)
}
