//! The agent's own heap: how glibc's allocator is told to keep kat-agent small.
//!
//! kat-agent is a long-lived, mostly idle process with bursts of work (a rollout, a pull, a
//! burst of API calls). glibc keeps the pages such a burst touched, in one arena per thread
//! that allocated, up to 8 per core. Two settings keep the idle resident set near what is in
//! use; `bench/apply-to-running.sh` measures the effect.

use std::time::Duration;

/// How often free heap pages go back to the kernel.
const TRIM_EVERY: Duration = Duration::from_secs(20);

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
