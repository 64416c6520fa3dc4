//! The agent's own heap: how glibc's allocator is told to keep kat-agent small.
//!
//! kat-agent is a long-lived, mostly idle process with bursts of work (a rollout, a pull, a
//! burst of API calls). glibc keeps the pages such a burst touched, in one arena per thread
//! that allocated, up to 8 per core, and in each thread's cache of freed chunks. Three
//! settings keep the idle resident set near what is in use; `bench/apply-to-running.sh`
//! measures the effect.
//!
//! The allocator stays glibc's: it is already mapped (no second allocator's code and
//! metadata in every process of the binary), and with these settings its idle heap is what
//! the agent holds plus little (docs/benchmarks.md, "Agent memory").

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::time::Duration;

/// How often free heap pages go back to the kernel.
const TRIM_EVERY: Duration = Duration::from_secs(20);

/// The tunable that turns off glibc's per-thread caches of freed chunks (tcache).
const NO_THREAD_CACHE: &str = "glibc.malloc.tcache_count=0";
/// Set for the re-executed image: the caller's `GLIBC_TUNABLES` (empty if it had none).
const CALLERS_TUNABLES: &str = "KAT_CALLERS_GLIBC_TUNABLES";

/// Runs this process again with glibc's thread caches off, for the long-lived agent: called
/// first in `main`, before any thread. Measured on the apply benchmark's idle node: the heap
/// keeps 1.4 MiB instead of 2.4 MiB, and the apply p50 does not move (76 ms either way).
/// Each worker thread's cache holds up to 7 freed chunks of each small size, scattered over
/// the heap after a burst of work; those pin the pages around them, which `malloc_trim`
/// then cannot return. The caches only exist as a start-up tunable (there is no `mallopt`
/// for them), hence one `exec` of this binary at the node's start, ~2 ms.
///
/// In the second image the caller's `GLIBC_TUNABLES` is put back, so etcd, helpers and
/// builds start with the environment the agent was given. A caller that sets
/// `glibc.malloc.tcache_count` itself keeps its choice. If the exec fails (no `/proc`), the
/// agent runs with the caches.
pub fn without_thread_caches() {
    if let Some(callers) = std::env::var_os(CALLERS_TUNABLES) {
        std::env::remove_var(CALLERS_TUNABLES);
        if callers.is_empty() {
            std::env::remove_var("GLIBC_TUNABLES");
        } else {
            std::env::set_var("GLIBC_TUNABLES", callers);
        }
        return;
    }
    let callers = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
    if callers
        .to_string_lossy()
        .contains("glibc.malloc.tcache_count")
    {
        return;
    }
    let mut tunables = callers.clone();
    if !tunables.is_empty() {
        tunables.push(":");
    }
    tunables.push(NO_THREAD_CACHE);
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("kat-agent"));
    let error = std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .env("GLIBC_TUNABLES", tunables)
        .env(CALLERS_TUNABLES, callers)
        .exec();
    eprintln!(
        "kat-agent: running with glibc's thread caches (re-executing without them failed: {error})"
    );
}

/// One arena instead of up to 16 on a 2-core node. This was unsafe while containers were
/// cloned from this multi-threaded process (more contention on arena locks at fork); since
/// creation moved to a single-threaded helper process, it is not. Two arenas (the setting
/// until 2026-11-28) kept 1.5 MiB in the main one and 1.2 MiB in the second at idle; one
/// keeps 2.4 MiB, and the apply benchmark's p50 did not move (64 ms): two worker threads
/// rarely allocate at the same instant. Call before any thread.
pub fn limit_arenas() {
    // SAFETY: mallopt only sets allocator parameters; no other thread exists yet.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
    }
}

/// Returns free pages of every arena to the kernel every [`TRIM_EVERY`]; never ends. An
/// idle agent's trim finds little and takes microseconds.
pub async fn trim_periodically() {
    let mut tick = tokio::time::interval(TRIM_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // SAFETY: malloc_trim is thread-safe and only releases memory malloc holds free.
        let _ = tokio::task::spawn_blocking(|| unsafe { nix::libc::malloc_trim(0) }).await;
    }
}
