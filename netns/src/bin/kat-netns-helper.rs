//! The network helpers (node holder, attach) as a binary of their own, for programs that
//! use `kat_netns::NodeNetwork` but cannot re-execute themselves (this crate's tests).
//! kat-agent serves as its own helper.

use std::process::ExitCode;

fn main() -> ExitCode {
    kat_netns::run_if_requested().unwrap_or_else(|| {
        eprintln!("usage: kat-netns-helper __kat-netns-holder|__kat-netns-attach REQUEST_JSON");
        ExitCode::from(2)
    })
}
