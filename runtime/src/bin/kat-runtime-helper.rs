//! The runtime's create helper as a binary of its own, for programs that embed
//! `NativeRuntime` but cannot re-execute themselves (the runtime's own tests). kat-agent
//! serves as its own helper.

use std::process::ExitCode;

fn main() -> ExitCode {
    kat_runtime::create_helper::run_if_requested().unwrap_or_else(|| {
        eprintln!(
            "usage: kat-runtime-helper {} REQUEST_JSON",
            kat_runtime::create_helper::HELPER_ARG
        );
        ExitCode::from(2)
    })
}
