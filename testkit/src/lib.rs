//! What KAT's end-to-end tests share, so that each test file holds its scenarios and not its
//! own copy of the plumbing: the workspace's built binaries, a free loopback port, waits
//! on a condition (never a fixed sleep before an assertion), katcall with typed answers
//! ([`katcall`]) and git repositories served by `git daemon` ([`git`]).

pub mod git;
pub mod katcall;

pub use git::GitDaemon;

pub use katcall::Katcall;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A binary of this workspace (`kat-agent`, `katcall`, …) beside the running test's own
/// target directory; panics with what to do when it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/debug/deps/<test> → target/debug/<name>
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("the target directory")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (scripts/test.sh does: cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// `N` distinct TCP ports free on loopback now: all bound at once, so two calls of
/// [`free_port`] in a row cannot hand out the same port twice.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port on loopback"))
        .collect();
    std::array::from_fn(|i| {
        listeners[i]
            .local_addr()
            .map(|a| a.port())
            .expect("a bound port")
    })
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on loopback")
}

/// How often a wait checks its condition.
pub const POLL: Duration = Duration::from_millis(200);

/// Checks `ok` until it holds (returns how long that took) or `timeout` passes (`None`).
pub fn wait_until(timeout: Duration, mut ok: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    loop {
        if ok() {
            return Some(started.elapsed());
        }
        if started.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// This process's resident memory now, in bytes (`VmRSS`): what a test measures an attack
/// by.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .expect("VmRSS in /proc/self/status")
        * 1024
}

/// [`wait_until`], panicking with `what` on a timeout.
pub fn wait(what: &str, timeout: Duration, ok: impl FnMut() -> bool) -> Duration {
    wait_until(timeout, ok)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Checks `ok` for the whole of `window` and panics with `what` the first time it does
/// not hold: how a test says "this never happens" (an instance running twice, a build
/// repeated) instead of sleeping and looking once.
pub fn holds_for(what: &str, window: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        assert!(ok(), "{what} stopped holding after {:?}", started.elapsed());
        if started.elapsed() >= window {
            return;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_returns_when_the_condition_holds_and_gives_up_at_its_timeout() {
        let mut n = 0;
        assert!(wait_until(Duration::from_secs(5), || {
            n += 1;
            n == 3
        })
        .is_some());
        assert_eq!(n, 3);
        let started = Instant::now();
        assert!(wait_until(Duration::from_millis(300), || false).is_none());
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[test]
    fn holding_is_checked_through_the_window() {
        let mut n = 0;
        holds_for("n below 100", Duration::from_millis(500), || {
            n += 1;
            n < 100
        });
        assert!(n >= 2, "checked more than once: {n}");
        let failed = std::panic::catch_unwind(|| {
            let mut n = 0;
            holds_for("n below 3", Duration::from_secs(5), || {
                n += 1;
                n < 3
            })
        });
        assert!(
            failed.is_err(),
            "a condition that stops holding fails the check"
        );
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port();
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}
