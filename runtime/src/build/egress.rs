//! A build's egress: a `slirp4netns` of its own, attached to the network namespace of the
//! build's sandbox, so that `RUN` steps reach the outside world the way the node's
//! containers do (the node network's egress, `kat_netns`'s holder, starts slirp4netns the
//! same way: `--configure --disable-host-loopback`, ready-fd; that crate is a sibling of
//! this one, so the few lines are repeated here rather than shared).
//!
//! - `--disable-host-loopback`: `10.0.2.2`, slirp4netns's alias of the host's loopback, is
//!   refused, and `127.0.0.1` inside the namespace is the build's own `lo`: etcd's client
//!   port, the agent's API and anything else listening on the host's loopback are out of
//!   reach. The host's other addresses, the LAN and the internet are not.
//! - `--enable-sandbox --enable-seccomp`: slirp4netns parses packets from the build; it
//!   runs in a mount namespace of its own with a syscall filter.
//! - It runs as root of the **build's** user namespace (through `nsenter --user`), not as
//!   the agent: `--enable-sandbox` needs to be root of a user namespace (an unprivileged
//!   agent outside one cannot use it), and a root agent gives it no host privilege that way.
//!   Its sockets stay in the host's network namespace (nsenter changes only the user
//!   namespace); the build's network namespace is passed as a descriptor opened by the
//!   agent.
//! - It ends when the build does: its `--exit-fd` is a pipe whose other end the agent
//!   holds in [`Egress`] (and it is killed when that is dropped).
//!
//! The build's `/etc/resolv.conf` names slirp4netns's DNS forwarder, `10.0.2.3`
//! ([`RESOLV_CONF`]), since the host's resolver may listen on its loopback.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// The egress device in the build's network namespace.
const DEVICE: &str = "tap0";
/// slirp4netns is fastest with a large MTU (the node's egress uses the same).
const MTU: u32 = 65520;
/// How long slirp4netns may take to configure its device.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// `/etc/resolv.conf` of a build with egress: slirp4netns's DNS forwarder.
pub const RESOLV_CONF: &str = "nameserver 10.0.2.3\n";

/// A build's slirp4netns; it ends when this is dropped.
pub struct Egress {
    child: tokio::process::Child,
    /// The write end of slirp4netns's `--exit-fd`.
    _exit: OwnedFd,
}

impl Egress {
    /// The slirp4netns process's pid (for tests and logs).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Starts slirp4netns for the network namespace of the sandbox `pid` (its user namespace
/// mapped already) and waits until its device is configured.
pub async fn start(pid: u32) -> std::io::Result<Egress> {
    let io = |what: &str, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"));
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| io("opening the build's network namespace", e))?;
    let (ready_r, ready_w) = pipe()?;
    let (exit_r, exit_w) = pipe()?;
    let inherited = [netns.as_raw_fd(), ready_w.as_raw_fd(), exit_r.as_raw_fd()];
    let mut c = tokio::process::Command::new("nsenter");
    c.arg(format!("--user=/proc/{pid}/ns/user"))
        .arg("--")
        .arg("slirp4netns")
        .args([
            "--configure".to_string(),
            format!("--mtu={MTU}"),
            "--disable-host-loopback".into(),
            "--enable-sandbox".into(),
            "--enable-seccomp".into(),
            "--netns-type=path".into(),
            format!("--ready-fd={}", ready_w.as_raw_fd()),
            format!("--exit-fd={}", exit_r.as_raw_fd()),
            format!("/proc/self/fd/{}", netns.as_raw_fd()),
            DEVICE.into(),
        ])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: between fork and exec only fcntl(2) runs, on descriptors open in the parent.
    unsafe {
        c.as_std_mut().pre_exec(move || {
            // These three, and only in this child, survive the exec.
            for fd in inherited {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    use std::os::unix::process::CommandExt as _;
    let mut child = c.spawn().map_err(|e| {
        io(
            "starting slirp4netns (packages slirp4netns and util-linux) for the build's network; \
             a build.kat with `network: none` needs none",
            e,
        )
    })?;
    drop((ready_w, exit_r, netns));
    // slirp4netns writes "1" once its device is configured; EOF means it ended.
    let ready = tokio::task::spawn_blocking(move || {
        let mut answer = [0u8; 1];
        let got = nix::unistd::read(ready_r.as_raw_fd(), &mut answer).unwrap_or(0);
        got == 1 && answer[0] == b'1'
    });
    let ok = match tokio::time::timeout(READY_TIMEOUT, ready).await {
        Ok(Ok(ok)) => ok,
        // Killing it below closes the pipe and ends the read.
        _ => false,
    };
    if !ok {
        let _ = child.start_kill();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), e.read_to_string(&mut err)).await;
        }
        let status = child
            .wait()
            .await
            .map(|s| s.to_string())
            .unwrap_or_default();
        let tail: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with('*') && !l.contains("WARNING"))
            .collect();
        return Err(std::io::Error::other(format!(
            "slirp4netns for the build's network ended ({status}) before its device was up: {} \
             (is /dev/net/tun usable? `kat-agent setup --dry-run` checks; a build.kat with \
             `network: none` needs no egress)",
            tail.join("; ")
        )));
    }
    // Its chatter is read and dropped, so that it never blocks on a full pipe.
    if let Some(mut e) = child.stderr.take() {
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while matches!(e.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }
    Ok(Egress {
        child,
        _exit: exit_w,
    })
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| std::io::Error::other(format!("pipe: {e}")))
}
