//! Links the agent's binaries with packed relative relocations (`DT_RELR`) where the
//! toolchain and the C library support them.
//!
//! The agent is a position-independent executable (ASLR), so the loader relocates ~33,000
//! pointers at every exec. As classic `RELA` entries (24 bytes each) their table is ~0.8 MB,
//! read in full at every start of the agent, the network holder, its namespace keeper and
//! the create helper (three execs per container). `DT_RELR` encodes the same relocations in a
//! few KiB: less to read and keep resident in every process of this binary, and a faster
//! exec. glibc has understood it since 2.36 (Debian 12) and GNU ld writes it since 2.38; on an
//! older system the probe below fails and the binary is linked as before.
use std::path::PathBuf;
use std::process::Command;

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux")
        || std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu")
    {
        return;
    }
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
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let linked = Command::new(cc)
        .args(["-pie", "-fPIE", FLAG, "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .is_ok_and(|status| status.success());
    linked
        && Command::new(&program)
            .status()
            .is_ok_and(|status| status.success())
}
