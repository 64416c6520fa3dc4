use super::*;
use kat_api::wire::{InstanceState, InstanceStatus, Usage};

fn instance(id: &str, state: InstanceState, usage: Option<Usage>) -> InstanceStatus {
    InstanceStatus {
        node: Some("n1".parse().unwrap()),
        restarts: 2,
        usage,
        ..InstanceStatus::new(
            id.parse().unwrap(),
            "default".into(),
            "web".into(),
            1,
            state,
        )
    }
}

/// One node's heartbeat with instances in `states` (state, how many).
fn heartbeat(node: &str, states: &[(InstanceState, usize)]) -> NodeHeartbeat {
    let mut instances = Vec::new();
    for (state, n) in states {
        for k in 0..*n {
            instances.push(instance(
                &format!("web-{state:?}-{k}").to_lowercase(),
                *state,
                None,
            ));
        }
    }
    NodeHeartbeat {
        node: node.parse().unwrap(),
        timestamp: "2026-11-23T00:00:00Z".parse().unwrap(),
        capacity: Default::default(),
        allocatable: Default::default(),
        gpus: vec![],
        instances,
        usage: None,
        builds: vec![],
        detached: None,
        overlay: vec![],
    }
}

#[test]
fn histogram_buckets_are_cumulative_and_rendered() {
    let m = Metrics::default();
    m.observe_request("GET", "/healthz", 200, Duration::from_millis(3));
    m.observe_request("GET", "/healthz", 200, Duration::from_millis(300));
    m.observe_reconcile(Duration::from_millis(1));
    let text = m.render(&[heartbeat("n1", &[(InstanceState::Running, 2)])]);
    assert!(text.contains(
        "kat_api_request_duration_seconds_bucket{le=\"0.005\",method=\"GET\",route=\"/healthz\",code=\"200\"} 1"
    ));
    assert!(text.contains(
        "kat_api_request_duration_seconds_bucket{le=\"+Inf\",method=\"GET\",route=\"/healthz\",code=\"200\"} 2"
    ));
    assert!(text.contains("kat_reconcile_duration_seconds_count 1"));
    assert!(text.contains("kat_instances{state=\"Running\"} 2"));
    // A state gone since the last scrape is gone from the output.
    let text = m.render(&[heartbeat("n1", &[(InstanceState::Failed, 1)])]);
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
    let text = m.render(&[]);
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

#[test]
fn node_and_instance_usage_come_from_the_heartbeats() {
    let m = Metrics::default();
    let mut hb = heartbeat("n1", &[]);
    hb.usage = Some(Usage {
        cpu_millis: 1500,
        memory_bytes: 2 << 30,
        pids: 412,
        disk_bytes: Some(7),
        disk_total_bytes: Some(10),
    });
    hb.instances.push(instance(
        "web-a",
        InstanceState::Running,
        Some(Usage {
            cpu_millis: 250,
            memory_bytes: 64 << 20,
            pids: 3,
            disk_bytes: None,
            disk_total_bytes: None,
        }),
    ));
    hb.instances
        .push(instance("web-b", InstanceState::Failed, None));
    let text = m.render(&[hb]);
    let labels = "namespace=\"default\",workload=\"web\",instance=\"web-a\",node=\"n1\"";
    for line in [
        "kat_node_cpu_usage_millicores{node=\"n1\"} 1500".to_string(),
        format!("kat_node_memory_used_bytes{{node=\"n1\"}} {}", 2u64 << 30),
        "kat_node_tasks{node=\"n1\"} 412".to_string(),
        "kat_node_disk_used_bytes{node=\"n1\"} 7".to_string(),
        "kat_node_disk_size_bytes{node=\"n1\"} 10".to_string(),
        format!("kat_instance_cpu_usage_millicores{{{labels}}} 250"),
        format!("kat_instance_memory_bytes{{{labels}}} {}", 64u64 << 20),
        format!("kat_instance_pids{{{labels}}} 3"),
        format!("kat_instance_restarts{{{labels}}} 2"),
        "kat_instance_restarts{namespace=\"default\",workload=\"web\",instance=\"web-b\",node=\"n1\"} 2".to_string(),
    ] {
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
    // A failed instance has no usage; a node gone since is gone from the next scrape.
    assert!(!text.contains("kat_instance_cpu_usage_millicores{namespace=\"default\",workload=\"web\",instance=\"web-b\""));
    let text = m.render(&[]);
    assert!(!text.contains("node=\"n1\""), "{text}");
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
    let mut hb = heartbeat(
        "n1",
        &[(InstanceState::Running, 3), (InstanceState::Pending, 1)],
    );
    hb.usage = Some(Usage {
        cpu_millis: 1200,
        memory_bytes: 1 << 30,
        pids: 300,
        disk_bytes: Some(5 << 30),
        disk_total_bytes: Some(20 << 30),
    });
    hb.instances[0].usage = Some(Usage {
        cpu_millis: 250,
        memory_bytes: 64 << 20,
        pids: 3,
        disk_bytes: None,
        disk_total_bytes: None,
    });
    let text = m.render(&[hb]);
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
