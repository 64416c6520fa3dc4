//! Prometheus metrics of the leader: API requests by route and code, reconcile rounds, and
//! instances by state, through `prometheus-client`.
//!
//! The histograms live in a registry for the life of the process. Instance counts are not kept
//! here; `/metrics` computes them from the store when scraped and sets the gauge family then.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    api: Family<RequestLabels, Histogram, fn() -> Histogram>,
    reconcile: Histogram,
    instances: Family<StateLabels, Gauge>,
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
        Metrics {
            registry,
            api,
            reconcile,
            instances,
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
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
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
