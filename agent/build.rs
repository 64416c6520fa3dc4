//! Links the agent's binaries with packed relative relocations (`DT_RELR`) where the
//! toolchain and the C library support them, and with the functions a node runs side by side
//! (`link-order.txt`) where the linker is lld.
//!
//! **Link order.** The kernel maps a binary's code 64 KiB around each page a process runs
//! (fault-around), so functions that run once here and once there, spread over 17 MB of text,
//! keep most of it resident in the agent and in each of its helper processes.
//! `link-order.txt` (written by `scripts/link-order.sh` from an instrumented run of a node)
//! names the functions that ran; lld's `--symbol-ordering-file` places them first, the
//! network holder's ahead of the rest. A name the linker does not find (code changed since
//! the list was made, or a debug build, whose names differ) is skipped: a stale list places
//! less code and breaks nothing. GNU ld has no such option; the probe below links a small
//! program with the flags, with the linker rustc uses, and leaves them out if it fails.
//!
//! The agent is a position-independent executable (ASLR), so the loader relocates ~33,000
//! pointers at every exec. As classic `RELA` entries (24 bytes each) their table is ~0.8 MB,
//! read in full at every start of the agent, the network holder, its namespace keeper and
//! the create helper (three execs per container). `DT_RELR` encodes the same relocations in a
//! few KiB: less to read and keep resident in every process of this binary, and a faster
//! exec. glibc has understood it since 2.36 (Debian 12) and GNU ld writes it since 2.38. The
//! probe below links and runs a small program with it, with the linker rustc uses, on the
//! machine it is built for; an older linker (which only warns that it ignores the flag), an
//! older glibc, or a cross build links the binary as before.
use std::path::PathBuf;
use std::process::Command;

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link-order.txt");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux")
        || std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu")
        // The probes link (and run) for this machine: only where the binary will run.
        || std::env::var("HOST").ok() != std::env::var("TARGET").ok()
    {
        return;
    }
    link_order();
    if loader_accepts_packed_relocs() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    } else {
        println!("cargo:warning=linking without {FLAG}: this toolchain or C library lacks DT_RELR");
    }
}

/// Links a tiny position-independent program with the flag and runs it: both the linker and
/// this system's loader must accept it (a glibc older than 2.36 refuses to load the result).
fn loader_accepts_packed_relocs() -> bool {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let source = out.join("relr_probe.c");
    let program = out.join("relr_probe");
    // A pointer in writable data makes the linker emit a relative relocation to pack.
    if std::fs::write(
        &source,
        "static int x;\nint *p = &x;\nint main(void) { return *p; }\n",
    )
    .is_err()
    {
        return false;
    }
    // The linker rustc links with: the configured one (cargo passes it on), else `cc`.
    let linker = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_owned());
    let linked = Command::new(linker)
        .args(["-pie", "-fPIE", FLAG, "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .is_ok_and(|out| {
            // GNU ld before 2.38 warns that it ignores the flag, and succeeds.
            out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("ignored")
        });
    linked
        && Command::new(&program)
            .status()
            .is_ok_and(|status| status.success())
}

/// Lays out the functions `link-order.txt` names first, if the linker is lld.
fn link_order() {
    let Some(list) = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|dir| PathBuf::from(dir).join("link-order.txt"))
        .filter(|list| list.is_file())
    else {
        return;
    };
    // The path goes inside a `-Wl,` argument, which the compiler driver splits at commas.
    let Some(list) = list.to_str().filter(|list| !list.contains(',')) else {
        println!(
            "cargo:warning=linking without the link order: its path is not UTF-8 or has a comma"
        );
        return;
    };
    let flags = [
        format!("-Wl,--symbol-ordering-file={list}"),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    if rustc_links_with(&flags) {
        for flag in flags {
            println!("cargo:rustc-link-arg-bins={flag}");
        }
    } else {
        println!("cargo:warning=linking without the link order: the linker is not lld");
    }
}

/// Links an empty Rust program with these linker flags, the way this build links.
fn rustc_links_with(flags: &[String]) -> bool {
    let (Some(out), Some(rustc)) = (
        std::env::var_os("OUT_DIR").map(PathBuf::from),
        std::env::var_os("RUSTC"),
    ) else {
        return false;
    };
    let source = out.join("order_probe.rs");
    if std::fs::write(&source, "fn main() {}\n").is_err() {
        return false;
    }
    let mut command = Command::new(rustc);
    command
        .arg("--crate-type=bin")
        .arg("-o")
        .arg(out.join("order_probe"))
        .arg(&source);
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        command.arg(format!("-Clinker={linker}"));
    }
    for flag in flags {
        command.arg(format!("-Clink-arg={flag}"));
    }
    command.output().is_ok_and(|out| out.status.success())
}
