//! KAT's networking, without root: the node network namespace ([`node`], [`holder`]),
//! containers' links to it ([`attach`]), the WireGuard overlay between nodes ([`overlay`]),
//! and the DNS server every node runs for its
//! containers ([`dns`]). `docs/networking.md` has the layout.

pub mod attach;
pub mod dns;
pub mod holder;
pub mod host_ports;
mod ip;
pub mod neighbour;
mod netlink;
pub mod node;
pub mod node_sockets;
pub mod overlay;

use std::process::ExitCode;

pub use attach::Attachment;
pub use node::{NodeNetwork, NodeNetworkConfig};

/// A network operation that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {message}")]
pub struct NetError {
    pub context: String,
    pub message: String,
}

impl NetError {
    pub fn new(context: impl Into<String>, message: impl std::fmt::Display) -> NetError {
        NetError {
            context: context.into(),
            message: message.to_string(),
        }
    }
}

/// A helper's life: parse its JSON request (2 when it is not one), run it, and say why it
/// failed on standard error (the caller shows or logs that text).
fn run_request<T: serde::de::DeserializeOwned>(
    name: &str,
    request: &str,
    run: impl FnOnce(&T) -> Result<(), String>,
) -> ExitCode {
    let request: T = match serde_json::from_str(request) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: bad request: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&request) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// When this process was started as one of the network helpers (the node holder or the
/// attach helper), runs it and returns its exit code. Call it first in `main`, before any
/// thread starts: both join user namespaces, which a multi-threaded process cannot.
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args().skip(1);
    let first = args.next()?;
    let request = args.next().unwrap_or_default();
    match first.as_str() {
        holder::HOLDER_ARG => Some(holder::main(&request)),
        attach::ATTACH_ARG => Some(attach::main(&request)),
        _ => None,
    }
}
