//! Git repositories for the tests that fetch from one: the `git` CLI with a test identity,
//! and `git daemon` serving a directory on loopback.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runs `git args` in `dir` as a test user; its trimmed output. Panics with git's answer
/// when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=KAT test",
            "-c",
            "user.email=test@kat.invalid",
        ])
        .args(args)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `git daemon` serving every repository under a directory at
/// `git://127.0.0.1:PORT/NAME`; killed with its connection children when dropped.
pub struct GitDaemon {
    child: Child,
    port: u16,
}

impl GitDaemon {
    /// Serves `base`, once it accepts connections.
    pub fn serve(base: &Path) -> GitDaemon {
        let port = crate::free_port();
        let child = Command::new("git")
            .args([
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                &format!("--port={port}"),
                &format!("--base-path={}", base.display()),
            ])
            .arg(base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // It forks a child per connection: its own process group, killed whole.
            .process_group(0)
            .spawn()
            .expect("git daemon");
        let daemon = GitDaemon { child, port };
        crate::wait(
            "git daemon accepting connections",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        daemon
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the repository `name` under the served directory.
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}
