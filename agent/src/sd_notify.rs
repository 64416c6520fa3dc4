//! systemd's readiness and watchdog protocol (`sd_notify`), without libsystemd: a datagram
//! to `$NOTIFY_SOCKET`. Outside systemd (no socket) every call does nothing.
//!
//! The unit is `Type=notify` with `WatchdogSec=`: the agent says `READY=1` once its API
//! serves, pings `WATCHDOG=1` at half the interval systemd asks for from the async runtime
//! (a wedged runtime stops the pings and systemd restarts the agent; containers keep
//! running and are adopted), and `STOPPING=1` on the way out.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Sends one notification; false when there is no socket or it cannot be reached.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let path = path.to_string_lossy().into_owned();
    let address = if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        SocketAddr::from_abstract_name(name.as_bytes())
    } else {
        SocketAddr::from_pathname(&path)
    };
    let Ok(address) = address else {
        return false;
    };
    UnixDatagram::unbound()
        .and_then(|socket| socket.send_to_addr(state.as_bytes(), &address))
        .is_ok()
}

/// Half the watchdog interval systemd set for this process, if it set one.
pub fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Pings the watchdog forever (returns at once when there is no watchdog).
pub async fn watchdog() {
    let Some(interval) = watchdog_interval() else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        notify("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: it changes this process's environment.
    #[test]
    fn notifications_reach_the_socket_and_the_watchdog_interval_is_halved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1"));
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        std::env::set_var("WATCHDOG_USEC", "20000000");
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
        assert_eq!(watchdog_interval(), Some(Duration::from_secs(10)));
        std::env::set_var("WATCHDOG_PID", "1");
        assert_eq!(watchdog_interval(), None, "meant for another process");

        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!notify("READY=1"));
    }
}
