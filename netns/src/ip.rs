//! Running `ip` (iproute2), `iptables` and friends, here or in a node's namespaces.
//!
//! For the node network, made once per node: a handful of link, address and firewall changes,
//! where iproute2's and iptables' error messages are the ones operators know. The node
//! namespace is entered with `nsenter` (util-linux). A container's links, made at every
//! create, go by netlink from the attach helper instead ([`crate::netlink`]): two execs of
//! `ip` were most of a container's network time.

use std::io::Write;
use std::process::{Command, Stdio};

use nix::unistd::Pid;

/// Runs `program args…` in the user and network namespaces of `keeper`.
pub(crate) fn in_namespaces(keeper: Pid, program: &str, args: &[&str]) -> Result<(), String> {
    let mut command = Command::new("nsenter");
    command
        .args(["--target", &keeper.as_raw().to_string()])
        .args(["--user", "--net", "--preserve-credentials", "--", program])
        .args(args);
    run(command, None, program)
}

/// Runs `ip -batch -` with `commands` (one per line): in `keeper`'s namespaces, or in the
/// calling process's when `None`.
pub(crate) fn run_ip_batch(keeper: Option<Pid>, commands: &[String]) -> Result<(), String> {
    let mut command = match keeper {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.args(["--target", &pid.as_raw().to_string()]).args([
                "--user",
                "--net",
                "--preserve-credentials",
                "--",
                "ip",
            ]);
            c
        }
        None => Command::new("ip"),
    };
    command.args(["-batch", "-"]);
    run(command, Some(commands.join("\n") + "\n"), "ip (iproute2)")
}

fn run(mut command: Command, input: Option<String>, what: &str) -> Result<(), String> {
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("running {what}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("writing to {what}: {e}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {what}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}
