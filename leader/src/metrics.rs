//! Prometheus metrics of the leader: API requests by route and code, reconcile rounds.
//!
//! A handful of histograms behind a mutex: the API records one observation per request and
//! the reconcile loop one per round, far below the rate where a lock would matter. Instance
//! counts are not kept here; `/metrics` computes them from the store when scraped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, n) in BUCKETS.iter().zip(self.buckets.iter_mut()) {
            if secs <= *bound {
                *n += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, n) in BUCKETS.iter().zip(self.buckets.iter()) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    api: Mutex<BTreeMap<(String, String, u16), Histogram>>,
    reconcile: Mutex<Histogram>,
}

impl Metrics {
    pub fn observe_request(&self, method: &str, route: &str, code: u16, took: Duration) {
        let mut api = self.api.lock().unwrap_or_else(|p| p.into_inner());
        api.entry((method.to_string(), route.to_string(), code))
            .or_default()
            .observe(took);
    }

    pub fn observe_reconcile(&self, took: Duration) {
        self.reconcile
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(took);
    }

    /// The text exposition format, with `instances` (state → count) as a gauge.
    pub fn render(&self, instances: &BTreeMap<String, u64>) -> String {
        let mut out = String::new();
        out.push_str("# HELP kat_api_request_duration_seconds API request latency by route and status code.\n");
        out.push_str("# TYPE kat_api_request_duration_seconds histogram\n");
        for ((method, route, code), h) in self.api.lock().unwrap_or_else(|p| p.into_inner()).iter()
        {
            let labels = format!("method=\"{method}\",route=\"{route}\",code=\"{code}\"");
            h.render(&mut out, "kat_api_request_duration_seconds", &labels);
        }
        out.push_str(
            "# HELP kat_reconcile_duration_seconds Duration of the leader's reconcile rounds.\n",
        );
        out.push_str("# TYPE kat_reconcile_duration_seconds histogram\n");
        self.reconcile
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(&mut out, "kat_reconcile_duration_seconds", "");
        out.push_str("# HELP kat_instances Instances by state, as their nodes report them.\n");
        out.push_str("# TYPE kat_instances gauge\n");
        for (state, n) in instances {
            let _ = writeln!(out, "kat_instances{{state=\"{state}\"}} {n}");
        }
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
            "kat_api_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",code=\"200\",le=\"0.005\"} 1"
        ));
        assert!(text.contains(
            "kat_api_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",code=\"200\",le=\"+Inf\"} 2"
        ));
        assert!(text.contains("kat_reconcile_duration_seconds_count 1"));
        assert!(text.contains("kat_instances{state=\"Running\"} 2"));
    }
}
