//! Unsticks container creation when a libcontainer `clone` child deadlocks.
//!
//! libcontainer makes containers and exec'd processes by `clone`-ing this multi-threaded
//! process. A lock that another thread held at that instant (malloc's arena lock, a std lock
//! taken while a thread starts or ends) stays held in the child forever: it hangs in
//! `futex_wait` before it reaches `exec`, and the create or exec call that waits for it
//! hangs too. A single-threaded child of ours that still runs our binary and sleeps on a futex
//! can only be in that state (nothing else exists to wake it), so this watchdog kills such a
//! child once it has been seen stuck twice in a row. The caller then gets an error and the
//! supervisor retries. The real fix is a single-threaded helper that does every clone
//! (docs/runtime.md); until then this keeps a node from hanging.

use std::collections::HashSet;
use std::time::Duration;

fn stuck_clones(me: u32, my_cmdline: &[u8]) -> HashSet<i32> {
    let mut stuck = HashSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let path = entry.path();
        let Ok(status) = std::fs::read_to_string(path.join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        if field("PPid:").and_then(|p| p.parse::<u32>().ok()) != Some(me)
            || field("Threads:").as_deref() != Some("1")
        {
            continue;
        }
        let same_binary = std::fs::read(path.join("cmdline")).is_ok_and(|c| c == my_cmdline);
        let on_futex = std::fs::read_to_string(path.join("wchan"))
            .is_ok_and(|w| w.trim().starts_with("futex"));
        if same_binary && on_futex {
            stuck.insert(pid);
        }
    }
    stuck
}

pub async fn run() {
    let me = std::process::id();
    let Ok(my_cmdline) = std::fs::read("/proc/self/cmdline") else {
        return;
    };
    let mut seen: HashSet<i32> = HashSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = stuck_clones(me, &my_cmdline);
        for pid in now.intersection(&seen) {
            tracing::warn!(pid, "killing a container clone deadlocked on a lock inherited from a threaded parent; the operation is retried");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        seen = now;
    }
}
