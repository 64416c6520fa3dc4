//! What this node and its instances use, measured at each heartbeat.
//!
//! Instances: each running container's cgroup, through the runtime (CPU time, memory, pids).
//! The node: the kernel's totals in `/proc` (busy CPU time, memory in use, tasks) and the
//! file system of the agent's data directory. CPU is a rate: the CPU time between two
//! readings over the time between them, in millicores. A container's first reading is
//! averaged over its life so far; a reading less than a second after the last one (a
//! heartbeat sent early for a state change) keeps the last rate rather than a noisy one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kat_api::wire::{InstanceState, InstanceStatus, Usage};
use kat_runtime::{ContainerRuntime, ContainerState, ContainerStatus};
use tokio::time::Instant;

use kat_runtime::labels;

/// Readings closer together than this do not give a new CPU rate.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// One CPU counter: its last reading, when, and the rate computed from the one before.
#[derive(Debug, Clone, Copy)]
struct CpuCounter {
    micros: u64,
    at: Instant,
    millis: u64,
}

impl CpuCounter {
    /// Take a new cumulative reading (`micros` of CPU time) at `now`; returns millicores.
    fn update(previous: Option<CpuCounter>, micros: u64, now: Instant) -> CpuCounter {
        match previous {
            Some(p) if micros >= p.micros => {
                let elapsed = now.saturating_duration_since(p.at);
                if elapsed < MIN_INTERVAL {
                    return p;
                }
                CpuCounter {
                    micros,
                    at: now,
                    millis: rate(micros - p.micros, elapsed),
                }
            }
            // First reading, or a counter that went back (a new container with the same id).
            _ => CpuCounter {
                micros,
                at: now,
                millis: 0,
            },
        }
    }
}

/// Millicores from `micros` of CPU time over `elapsed`.
fn rate(micros: u64, elapsed: Duration) -> u64 {
    let wall = elapsed.as_micros().max(1);
    (u128::from(micros) * 1000 / wall) as u64
}

/// Measures what this node and its instances use, keeping the CPU counters between readings.
pub struct UsageMeter {
    runtime: Arc<dyn ContainerRuntime>,
    data_dir: PathBuf,
    containers: HashMap<String, CpuCounter>,
    node_cpu: Option<CpuCounter>,
}

impl UsageMeter {
    /// A meter of `runtime`'s containers and of the file system that holds `data_dir`.
    pub fn new(runtime: Arc<dyn ContainerRuntime>, data_dir: PathBuf) -> Self {
        UsageMeter {
            runtime,
            data_dir,
            containers: HashMap::new(),
            node_cpu: None,
        }
    }

    /// Fill in `usage` of every running instance in `instances`; returns the node's usage.
    pub async fn measure(&mut self, instances: &mut [InstanceStatus]) -> Usage {
        self.measure_instances(instances).await;
        self.measure_node().await
    }

    async fn measure_instances(&mut self, instances: &mut [InstanceStatus]) {
        let containers = match self.runtime.list().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "listing containers for their usage");
                return;
            }
        };
        // The running container of each instance (after a restart, the newest attempt).
        let mut running: HashMap<&str, &ContainerStatus> = HashMap::new();
        for c in containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            if let Some(instance) = c.labels.get(labels::INSTANCE) {
                let newer = running
                    .get(instance.as_str())
                    .is_none_or(|o| o.created_at < c.created_at);
                if newer {
                    running.insert(instance, c);
                }
            }
        }
        let now = Instant::now();
        let mut seen = HashMap::new();
        for status in instances.iter_mut() {
            status.usage = None;
            if status.state != InstanceState::Running {
                continue;
            }
            let Some(c) = running.get(status.instance_id.as_str()) else {
                continue;
            };
            let Ok(u) = self.runtime.usage(&c.id).await else {
                continue;
            };
            let counter = match self.containers.get(&c.id) {
                Some(previous) => CpuCounter::update(Some(*previous), u.cpu_usec, now),
                None => CpuCounter {
                    micros: u.cpu_usec,
                    at: now,
                    millis: lifetime_rate(u.cpu_usec, c.started_at),
                },
            };
            seen.insert(c.id.clone(), counter);
            status.usage = Some(Usage {
                cpu_millis: counter.millis,
                memory_bytes: u.memory_bytes,
                pids: u.pids,
                disk_bytes: None,
                disk_total_bytes: None,
            });
        }
        // Forget containers that are gone.
        self.containers = seen;
    }

    async fn measure_node(&mut self) -> Usage {
        let dir = self.data_dir.clone();
        let host = tokio::task::spawn_blocking(move || HostReading::take(&dir))
            .await
            .unwrap_or_default();
        let now = Instant::now();
        let cpu = host
            .cpu_busy_micros
            .map(|micros| CpuCounter::update(self.node_cpu, micros, now));
        self.node_cpu = cpu;
        Usage {
            cpu_millis: cpu.map_or(0, |c| c.millis),
            memory_bytes: host.memory_used_bytes,
            pids: host.tasks,
            disk_bytes: host.disk.map(|d| d.0),
            disk_total_bytes: host.disk.map(|d| d.1),
        }
    }
}

/// Millicores averaged over a container's life so far.
fn lifetime_rate(cpu_usec: u64, started: Option<SystemTime>) -> u64 {
    started
        .and_then(|s| SystemTime::now().duration_since(s).ok())
        .filter(|d| *d >= MIN_INTERVAL)
        .map_or(0, |d| rate(cpu_usec, d))
}

/// The host's totals at one moment.
#[derive(Debug, Default)]
struct HostReading {
    cpu_busy_micros: Option<u64>,
    memory_used_bytes: u64,
    tasks: u64,
    /// (used, total) bytes of the data directory's file system.
    disk: Option<(u64, u64)>,
}

impl HostReading {
    fn take(data_dir: &std::path::Path) -> HostReading {
        let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .unwrap_or(100) as u64;
        let cpu_busy_micros = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| busy_ticks(&t))
            .map(|ticks| ticks.saturating_mul(1_000_000) / ticks_per_sec);
        let memory_used_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .map_or(0, |t| memory_used(&t));
        let tasks = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| total_tasks(&t))
            .unwrap_or(0);
        let disk = nix::sys::statvfs::statvfs(data_dir).ok().map(|s| {
            let block = s.fragment_size();
            let total = s.blocks().saturating_mul(block);
            let free = s.blocks_free().saturating_mul(block);
            (total.saturating_sub(free), total)
        });
        HostReading {
            cpu_busy_micros,
            memory_used_bytes,
            tasks,
            disk,
        }
    }
}

/// Busy CPU ticks of all CPUs from `/proc/stat`: everything but idle and iowait.
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some(total.saturating_sub(idle))
}

/// MemTotal − MemAvailable from `/proc/meminfo`, in bytes.
fn memory_used(meminfo: &str) -> u64 {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("MemTotal:").saturating_sub(field("MemAvailable:")) * 1024
}

/// Tasks (processes and threads) on the host: the total in `/proc/loadavg`'s `R/T` field.
fn total_tasks(loadavg: &str) -> Option<u64> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(busy_ticks(stat), Some(160));
        assert_eq!(busy_ticks("intr 1 2\n"), None);
        let meminfo = "MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:   4096 kB\n";
        assert_eq!(memory_used(meminfo), 12288 * 1024);
        assert_eq!(total_tasks("0.10 0.20 0.30 2/345 6789\n"), Some(345));
        assert_eq!(total_tasks("garbage"), None);
    }

    #[test]
    fn cpu_rate_is_time_over_time_and_ignores_close_readings() {
        let t0 = Instant::now();
        let first = CpuCounter::update(None, 1_000_000, t0);
        assert_eq!(first.millis, 0);
        // 0.5 s of CPU in 2 s: 250 millicores.
        let second = CpuCounter::update(Some(first), 1_500_000, t0 + Duration::from_secs(2));
        assert_eq!(second.millis, 250);
        // 100 ms later: too close, the rate stays.
        let third = CpuCounter::update(Some(second), 1_600_000, t0 + Duration::from_millis(2100));
        assert_eq!((third.millis, third.micros), (250, 1_500_000));
        // Two busy cores for 4 s.
        let fourth = CpuCounter::update(Some(second), 9_500_000, t0 + Duration::from_secs(6));
        assert_eq!(fourth.millis, 2000);
        // A counter that went back starts over.
        assert_eq!(CpuCounter::update(Some(fourth), 10, t0).millis, 0);
    }

    #[test]
    fn the_host_reading_is_real() {
        let r = HostReading::take(std::path::Path::new("/"));
        assert!(r.cpu_busy_micros.is_some_and(|b| b > 0), "{r:?}");
        assert!(r.memory_used_bytes > 0 && r.tasks > 0, "{r:?}");
        let (used, total) = r.disk.expect("statvfs of /");
        assert!(used > 0 && used <= total, "{r:?}");
    }
}
