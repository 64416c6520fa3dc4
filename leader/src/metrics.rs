//! Prometheus metrics of a node's control plane, through `prometheus-client`: API requests by
//! route and code, reconcile rounds, scheduling attempts by result and reason, leadership
//! changes, etcd's health, and instances by state.
//!
//! The histograms live in a registry for the life of the process. Instance counts are not kept
//! here; `/metrics` computes them from the store when scraped and sets the gauge family then.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
    /// Rendering sets the instance gauges, then encodes: one scrape at a time.
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
        let etcd_restarts = Gauge::default();
        registry.register(
            "kat_etcd_restarts",
            "Times the agent restarted the etcd it supervises",
            etcd_restarts.clone(),
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

    /// The OpenMetrics text exposition, with `instances` (state → count) as a gauge.
    pub fn render(&self, instances: &BTreeMap<String, u64>) -> String {
        let _one_at_a_time = self.render.lock().unwrap_or_else(|p| p.into_inner());
        self.instances.clear();
        for (state, n) in instances {
            self.instances
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        let mut open_metrics = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry);
        prometheus_text(&open_metrics)
    }
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
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_rendered() {
        let m = Metrics::default();
        m.observe_request("GET", "/healthz", 200, Duration::from_millis(3));
        m.observe_request("GET", "/healthz", 200, Duration::from_millis(300));
        m.observe_reconcile(Duration::from_millis(1));
        let text = m.render(&BTreeMap::from([("Running".to_string(), 2)]));
        assert!(text.contains(
            "kat_api_request_duration_seconds_bucket{le=\"0.005\",method=\"GET\",route=\"/healthz\",code=\"200\"} 1"
        ));
        assert!(text.contains(
            "kat_api_request_duration_seconds_bucket{le=\"+Inf\",method=\"GET\",route=\"/healthz\",code=\"200\"} 2"
        ));
        assert!(text.contains("kat_reconcile_duration_seconds_count 1"));
        assert!(text.contains("kat_instances{state=\"Running\"} 2"));
        // A state gone since the last scrape is gone from the output.
        let text = m.render(&BTreeMap::from([("Failed".to_string(), 1)]));
        assert!(!text.contains("state=\"Running\""), "{text}");
        assert!(text.contains("kat_instances{state=\"Failed\"} 1"));
    }

    #[test]
    fn scheduling_leadership_and_etcd_are_counted() {
        let m = Metrics::default();
        m.observe_scheduling(3, &BTreeMap::from([("insufficient_memory", 1)]));
        m.observe_scheduling(
            0,
            &BTreeMap::from([("insufficient_memory", 1), ("taint", 2)]),
        );
        m.set_leader(true);
        m.set_leader(true);
        m.set_leader(false);
        m.set_etcd(true, 2);
        let text = m.render(&BTreeMap::new());
        for line in [
            "kat_scheduling_attempts_total{result=\"scheduled\",reason=\"\"} 3",
            "kat_scheduling_attempts_total{result=\"unschedulable\",reason=\"insufficient_memory\"} 2",
            "kat_scheduling_attempts_total{result=\"unschedulable\",reason=\"taint\"} 2",
            "kat_leader_changes_total 2",
            "kat_is_leader 0",
            "kat_etcd_up 1",
            "kat_etcd_restarts 2",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }

    /// The exposition passes `promtool check metrics` (Debian's prometheus package, installed
    /// by scripts/install-deps.sh).
    #[test]
    fn promtool_accepts_the_exposition() {
        use std::io::Write;
        let m = Metrics::default();
        m.observe_request(
            "PUT",
            "/v1alpha1/n/:ns/workloads/:name",
            400,
            Duration::from_millis(7),
        );
        m.observe_reconcile(Duration::from_millis(2));
        let text = m.render(&BTreeMap::from([
            ("Running".to_string(), 3),
            ("Pending".to_string(), 1),
        ]));
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (apt-get install prometheus, or run scripts/install-deps.sh)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed:\n{}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
