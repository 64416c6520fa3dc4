//! Whether the kernel OOM killer struck in this container.
//!
//! On cgroup v2 hosts the agent mounts the container's own cgroup read-only at
//! `/sys/fs/cgroup` (the cgroup namespace makes it the root). kat-init reads the counter when
//! the workload ends, because under systemd the scope, and its counters with it, are removed
//! as soon as the last process leaves: the agent cannot ask afterwards.

/// `memory.events` of the container's cgroup, as mounted by the agent.
const MEMORY_EVENTS: &str = "/sys/fs/cgroup/memory.events";

/// Whether `memory.events` of this container counts at least one OOM kill. False where the
/// file is not there (cgroup v1, no memory controller): the agent reads those itself.
pub fn oom_killed() -> bool {
    std::fs::read_to_string(MEMORY_EVENTS)
        .map(|text| oom_kills(&text) > 0)
        .unwrap_or(false)
}

/// The `oom_kill` count of a `memory.events` (v2) or `memory.oom_control` (v1) text.
fn oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::oom_kills;

    #[test]
    fn reads_the_oom_kill_counter() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(v2), 1);
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(oom_kills(v1), 3);
        assert_eq!(oom_kills("oom 0\n"), 0);
        assert_eq!(oom_kills("oom_kill x\n"), 0);
        assert_eq!(oom_kills(""), 0);
    }
}
