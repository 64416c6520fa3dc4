//! A join token given through the environment cannot be read back from a running
//! `kat-agent join`: neither its command line nor `/proc/PID/environ` (the environment block
//! the process started with, which every process of the same user, and root, can read)
//! shows it while the join waits on the leader.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn a_join_token_from_the_environment_is_not_left_in_proc_environ() {
    // A "leader" that takes the connection and never answers: the join waits in its CA fetch.
    let leader = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let address = leader.local_addr().expect("address");
    let data = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kat-agent"))
        .args(["join", "--leader-api", &address.to_string()])
        .args(["--ca-pin", &format!("sha256:{}", "0".repeat(64))])
        .args(["--advertise-address", "127.0.0.1"])
        .arg("--data-dir")
        .arg(data.path())
        .env("KAT_JOIN_TOKEN", format!("katjoin.0123456789ab.{SECRET}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kat-agent join");
    leader.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(20);
    let _held = loop {
        match leader.accept() {
            Ok((connection, _)) => break connection,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                    panic!("kat-agent join ended ({status}) before it asked the leader: {err}");
                }
                assert!(Instant::now() < deadline, "kat-agent join never connected");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let pid = child.id();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("read environ");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read cmdline");
    let _ = child.kill();
    let _ = child.wait();
    for (what, bytes) in [("environ", environ), ("cmdline", cmdline)] {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SECRET),
            "the token is readable in /proc/{pid}/{what}"
        );
    }
}
