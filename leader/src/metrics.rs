//! Prometheus metrics of a node's control plane, through `prometheus-client`: API requests by
//! route and code, reconcile rounds, scheduling attempts by result and reason, leadership
//! changes, etcd's health, instances by state, and what every node and instance uses (CPU,
//! memory, disk, pids, restarts).
//!
//! The histograms and counters live in a registry for the life of the process. What the
//! heartbeats say (instance states, usage) is not kept here: `/metrics` reads the nodes' last
//! heartbeats when scraped and sets those gauge families then, so a node or instance that is
//! gone is gone from the next scrape.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use kat_api::wire::NodeHeartbeat;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The content type of [`Metrics::render`]'s output: Prometheus' text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    namespace: String,
    workload: String,
    instance: String,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SchedulingLabels {
    /// `scheduled` or `unschedulable`.
    result: String,
    /// Why not (the filter that excluded the most nodes); empty when scheduled.
    reason: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    api: Family<RequestLabels, Histogram, fn() -> Histogram>,
    reconcile: Histogram,
    instances: Family<StateLabels, Gauge>,
    scheduling: Family<SchedulingLabels, Counter>,
    leader_changes: Counter,
    is_leader: Gauge,
    etcd_up: Gauge,
    etcd_restarts: Gauge,
    backup_last_success: Gauge,
    backup_failures: Counter,
    rejoin_requests: Family<OutcomeLabels, Counter>,
    node_cpu: Family<NodeLabels, Gauge>,
    node_memory: Family<NodeLabels, Gauge>,
    node_disk_used: Family<NodeLabels, Gauge>,
    node_disk_size: Family<NodeLabels, Gauge>,
    node_tasks: Family<NodeLabels, Gauge>,
    instance_cpu: Family<InstanceLabels, Gauge>,
    instance_memory: Family<InstanceLabels, Gauge>,
    instance_pids: Family<InstanceLabels, Gauge>,
    instance_restarts: Family<InstanceLabels, Gauge>,
    /// Rendering sets the heartbeat gauges, then encodes: one scrape at a time.
    render: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let api = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "kat_api_request_duration_seconds",
            "API request latency by route and status code",
            api.clone(),
        );
        let reconcile = latency_histogram();
        registry.register(
            "kat_reconcile_duration_seconds",
            "Duration of the leader's reconcile rounds",
            reconcile.clone(),
        );
        let instances = Family::<StateLabels, Gauge>::default();
        registry.register(
            "kat_instances",
            "Instances by state, as their nodes report them",
            instances.clone(),
        );
        let scheduling = Family::<SchedulingLabels, Counter>::default();
        registry.register(
            "kat_scheduling_attempts",
            "Instances the scheduler tried to place, by result and, when it could not, the filter that excluded the most nodes",
            scheduling.clone(),
        );
        let leader_changes = Counter::default();
        registry.register(
            "kat_leader_changes",
            "Times this node became or stopped being the leader",
            leader_changes.clone(),
        );
        let is_leader = Gauge::default();
        registry.register(
            "kat_is_leader",
            "1 while this node leads the cluster",
            is_leader.clone(),
        );
        let etcd_up = Gauge::default();
        registry.register(
            "kat_etcd_up",
            "1 while the store answers this node",
            etcd_up.clone(),
        );
        let backup_last_success = Gauge::default();
        registry.register(
            "kat_backup_last_success_timestamp_seconds",
            "When this node last wrote a backup (Unix time; 0: none since it started)",
            backup_last_success.clone(),
        );
        let backup_failures = Counter::default();
        registry.register(
            "kat_backup_failures",
            "Backups this node failed to take",
            backup_failures.clone(),
        );
        let rejoin_requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "kat_rejoin_requests",
            "REJOIN_REQUESTs from detached nodes this node heard, by outcome: answered (the offer reached the node), unanswered (it did not), ignored (no valid proof, another cluster, stale or repeated)",
            rejoin_requests.clone(),
        );
        let etcd_restarts = Gauge::default();
        registry.register(
            "kat_etcd_restarts",
            "Times the agent restarted the etcd it supervises",
            etcd_restarts.clone(),
        );
        let mut gauge = |name: &str, help: &str| {
            let family = Family::<NodeLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let node_cpu = gauge(
            "kat_node_cpu_usage_millicores",
            "CPU a node used over its last heartbeat interval (1000 = one core)",
        );
        let node_memory = gauge(
            "kat_node_memory_used_bytes",
            "Memory in use on a node (MemTotal - MemAvailable)",
        );
        let node_disk_used = gauge(
            "kat_node_disk_used_bytes",
            "Bytes used on the file system of a node's data directory",
        );
        let node_disk_size = gauge(
            "kat_node_disk_size_bytes",
            "Size of the file system of a node's data directory",
        );
        let node_tasks = gauge("kat_node_tasks", "Processes and threads on a node");
        let mut gauge = |name: &str, help: &str| {
            let family = Family::<InstanceLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let instance_cpu = gauge(
            "kat_instance_cpu_usage_millicores",
            "CPU a running instance used over its node's last heartbeat interval, from its cgroup",
        );
        let instance_memory = gauge(
            "kat_instance_memory_bytes",
            "Memory charged to a running instance's cgroup",
        );
        let instance_pids = gauge(
            "kat_instance_pids",
            "Processes and threads in a running instance's cgroup",
        );
        let instance_restarts = gauge(
            "kat_instance_restarts",
            "Times an instance's container was restarted on its node",
        );
        Metrics {
            registry,
            api,
            reconcile,
            instances,
            scheduling,
            leader_changes,
            is_leader,
            etcd_up,
            etcd_restarts,
            backup_last_success,
            backup_failures,
            rejoin_requests,
            node_cpu,
            node_memory,
            node_disk_used,
            node_disk_size,
            node_tasks,
            instance_cpu,
            instance_memory,
            instance_pids,
            instance_restarts,
            render: Mutex::new(()),
        }
    }
}

impl Metrics {
    pub fn observe_request(&self, method: &str, route: &str, code: u16, took: Duration) {
        self.api
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.to_string(),
                code: code.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn observe_reconcile(&self, took: Duration) {
        self.reconcile.observe(took.as_secs_f64());
    }

    /// One round's placements and failures to place (by reason label).
    pub fn observe_scheduling(&self, scheduled: usize, unschedulable: &BTreeMap<&str, usize>) {
        if scheduled > 0 {
            self.scheduling
                .get_or_create(&SchedulingLabels {
                    result: "scheduled".into(),
                    reason: String::new(),
                })
                .inc_by(scheduled as u64);
        }
        for (reason, n) in unschedulable {
            self.scheduling
                .get_or_create(&SchedulingLabels {
                    result: "unschedulable".into(),
                    reason: reason.to_string(),
                })
                .inc_by(*n as u64);
        }
    }

    /// This node became (`true`) or stopped being the leader.
    pub fn set_leader(&self, leading: bool) {
        let was = self.is_leader.set(i64::from(leading)) == 1;
        if was != leading {
            self.leader_changes.inc();
        }
    }

    /// Whether the store answers, and how often the supervised etcd was restarted.
    pub fn set_etcd(&self, up: bool, restarts: u64) {
        self.etcd_up.set(i64::from(up));
        self.etcd_restarts
            .set(i64::try_from(restarts).unwrap_or(i64::MAX));
    }

    /// A backup written at `unix_seconds`, or (`None`) one that failed.
    pub fn record_backup(&self, unix_seconds: Option<u64>) {
        match unix_seconds {
            Some(t) => {
                self.backup_last_success
                    .set(i64::try_from(t).unwrap_or(i64::MAX));
            }
            None => {
                self.backup_failures.inc();
            }
        }
    }

    /// A detached node's `REJOIN_REQUEST`: `answered`, `unanswered` or `ignored`.
    pub fn record_rejoin_request(&self, outcome: &str) {
        self.rejoin_requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The exposition, with the gauges the nodes' last heartbeats give: instances by state,
    /// and what each node and running instance uses.
    pub fn render(&self, heartbeats: &[NodeHeartbeat]) -> String {
        let _one_at_a_time = self.render.lock().unwrap_or_else(|p| p.into_inner());
        for family in [
            &self.node_cpu,
            &self.node_memory,
            &self.node_disk_used,
            &self.node_disk_size,
            &self.node_tasks,
        ] {
            family.clear();
        }
        for family in [
            &self.instance_cpu,
            &self.instance_memory,
            &self.instance_pids,
            &self.instance_restarts,
        ] {
            family.clear();
        }
        self.instances.clear();
        let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
        for hb in heartbeats {
            if let Some(u) = hb.usage {
                let node = NodeLabels {
                    node: hb.node.to_string(),
                };
                set(&self.node_cpu, &node, u.cpu_millis);
                set(&self.node_memory, &node, u.memory_bytes);
                set(&self.node_tasks, &node, u.pids);
                if let (Some(used), Some(size)) = (u.disk_bytes, u.disk_total_bytes) {
                    set(&self.node_disk_used, &node, used);
                    set(&self.node_disk_size, &node, size);
                }
            }
            for i in &hb.instances {
                *by_state.entry(format!("{:?}", i.state)).or_default() += 1;
                if i.namespace.is_empty() {
                    continue; // a leftover container being removed: nothing to label it with
                }
                let labels = InstanceLabels {
                    namespace: i.namespace.clone(),
                    workload: i.workload.clone(),
                    instance: i.instance_id.to_string(),
                    node: hb.node.to_string(),
                };
                set(&self.instance_restarts, &labels, u64::from(i.restarts));
                if let Some(u) = i.usage {
                    set(&self.instance_cpu, &labels, u.cpu_millis);
                    set(&self.instance_memory, &labels, u.memory_bytes);
                    set(&self.instance_pids, &labels, u.pids);
                }
            }
        }
        for (state, n) in by_state {
            set(&self.instances, &StateLabels { state }, n);
        }
        let mut open_metrics = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry);
        prometheus_text(&open_metrics)
    }
}

fn set<L>(family: &Family<L, Gauge>, labels: &L, value: u64)
where
    L: Clone + std::hash::Hash + Eq,
{
    family
        .get_or_create(labels)
        .set(i64::try_from(value).unwrap_or(i64::MAX));
}

/// OpenMetrics (what `prometheus-client` writes) to Prometheus' text format 0.0.4, which
/// every scraper and `promtool check metrics` read: a counter family is named like its
/// samples (`x_total`, where OpenMetrics says `x`), and there is no `# EOF`.
fn prometheus_text(open_metrics: &str) -> String {
    let counters: Vec<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
