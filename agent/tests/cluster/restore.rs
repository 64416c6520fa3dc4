//! The disaster drill: a backup, every node's etcd data destroyed, restore and rejoin.

use super::*;

/// Instance ids of `workload` that run, as the workload's status (through node `via`) says.
fn running_ids(h: &Hosts, via: usize, workload: &str) -> std::collections::BTreeSet<String> {
    instances(h, via, workload)
        .iter()
        .filter(|i| i.state == InstanceState::Running)
        .map(|i| i.instance_id.to_string())
        .collect()
}

/// The disaster drill (`bench/restore-drill.sh` runs it and prints its figures): a 3-node
/// cluster with a Service, a Job and a DaemonService; a backup; a workload applied after it;
/// every agent killed and every node's etcd data destroyed; `kat-agent restore` on n1 and
/// `kat-agent rejoin` on the others. Every workload of the backup comes back with the same
/// instances (the containers that kept running are adopted: none is started twice), and the
/// workload applied after the backup is wholly gone, its containers too.
#[test]
fn restore_drill() {
    let mut h = Hosts::up();
    let backups = h.path("backups");
    std::fs::create_dir_all(&backups).unwrap();
    // Shared by the nodes' users on this one machine (each writes files of its own name).
    std::fs::set_permissions(
        &backups,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let cluster = format!(
        "{}  nodeLossTimeoutSeconds: 45\n  backupPath: {}\n",
        cluster_kat().replace("  nodeLossTimeoutSeconds: 8\n", ""),
        backups.display()
    );
    let (_, pin) = init_with(&mut h, &cluster);
    join_others(&mut h, &pin);
    let image = format!("{}/kat/busybox:latest", h.registry_addr);
    apply_spread(&h, 1, "web");
    apply_text(
        &h,
        "daemon",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: daemon, namespace: default}}\nspec:\n  type: DaemonService\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do sleep 1; done']\n"),
    );
    apply_text(
        &h,
        "batch",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: batch, namespace: default}}\nspec:\n  type: Job\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Never}}\n  container:\n    command: [/bin/sh, -c, 'echo working; sleep 900']\n"),
    );
    let expected = [("web", 6), ("daemon", NODES), ("batch", 1)];
    wait(
        "web, daemon and batch running",
        Duration::from_secs(120),
        || {
            expected
                .iter()
                .all(|(w, n)| running_ids(&h, 1, w).len() == *n)
        },
    );
    let before: BTreeMap<&str, _> = expected
        .iter()
        .map(|(w, _)| (*w, running_ids(&h, 1, w)))
        .collect();

    let made: BackupRecord = h
        .k(1)
        .json(&["backup", "create", "-o", "json"])
        .expect("a backup record");
    let snapshot = PathBuf::from(&made.path);
    assert!(snapshot.is_file(), "{made:?}");
    let listed: Vec<BackupRecord> = h
        .k(2)
        .json(&["get", "backups", "-o", "json"])
        .unwrap_or_default();
    assert!(listed.iter().any(|b| b.name == made.name), "{listed:?}");
    // Written after the snapshot: must not come back, not even in part.
    apply_text(
        &h,
        "late",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: late, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {image}}}\n  replicas: 3\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do sleep 1; done']\n"),
    );
    wait("late running", Duration::from_secs(60), || {
        running_ids(&h, 1, "late").len() == 3
    });

    // The disaster: every agent (and its etcd) gone, every node's etcd data destroyed. The
    // containers keep running.
    for i in 1..=NODES {
        h.kill(i);
    }
    std::thread::sleep(Duration::from_millis(500));
    for i in 1..=NODES {
        std::fs::remove_dir_all(h.data(i).join("etcd")).expect("n's etcd data");
    }

    // A damaged snapshot is refused before anything changes.
    let damaged = h.path("damaged.db");
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0xff;
    std::fs::write(&damaged, bytes).unwrap();
    std::fs::copy(
        format!("{}.sha256", snapshot.display()),
        format!("{}.sha256", damaged.display()),
    )
    .unwrap();
    let out = h
        .tool_command(
            1,
            &["restore", "--snapshot", &damaged.display().to_string()],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");
    assert!(
        !h.data(1).join("etcd").exists(),
        "a refused restore wrote etcd data"
    );

    let started = Instant::now();
    let out = h
        .tool_command(
            1,
            &["restore", "--snapshot", &snapshot.display().to_string()],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("kat-agent rejoin --leader-api"),
        "{printed}"
    );
    h.spawn(1, &["run"]);
    let leader_api = format!("{}:{API_PORT}", ip(1));
    // (The restored state holds the old leader's endpoint until its lease runs out: wait
    // for the API itself.)
    let other = format!("https://{leader_api}/v1alpha1/nodes/n3/etcd-member");
    let mut refused = String::new();
    wait("n1's API answers", Duration::from_secs(60), || {
        refused = h.request_as(2, "POST", &other, None);
        refused != "000"
    });
    // A node's certificate cannot make another node an etcd member.
    assert_eq!(refused, "403");
    for i in 2..=NODES {
        let out = h
            .tool_command(i, &["rejoin", "--leader-api", &leader_api])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rejoin n{i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        h.spawn(i, &["run"]);
    }
    // Ready from heartbeats sent after the restore (the snapshot holds older ones).
    let restored_at = Timestamp::now();
    wait(
        "3 nodes heartbeating again",
        Duration::from_secs(120),
        || {
            let nodes = h.k(1).nodes();
            nodes.len() == NODES
                && nodes.iter().all(|n| {
                    n.state == NodeState::Ready && n.last_heartbeat.is_some_and(|t| t > restored_at)
                })
        },
    );
    let mut back = 0;
    wait("every workload back", Duration::from_secs(120), || {
        back = expected
            .iter()
            .filter(|(w, n)| running_ids(&h, 1, w).len() == *n)
            .count();
        back == expected.len()
    });
    let restore_s = started.elapsed().as_secs_f64();
    wait("3 voting etcd members", Duration::from_secs(60), || {
        let out = h.etcdctl(1, &["member", "list", "-w", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let members = v["members"].as_array().cloned().unwrap_or_default();
        members.len() == NODES && members.iter().all(|m| m["isLearner"] != true)
    });
    // Adopted, not started again: the same instances, and no more containers than them.
    // Watched for a while, not looked at once: a duplicate that comes and goes counts.
    let mut duplicates = 0;
    holds_for(
        "the instances from before the restore",
        Duration::from_secs(3),
        || {
            // A look the API did not answer (a timeout under load) shows nothing either way.
            let Some(workloads) =
                h.k(1)
                    .json::<Vec<WorkloadObject>>(&["get", "workloads", "-o", "json"])
            else {
                return true;
            };
            let mut now = 0;
            for (w, n) in expected {
                let running: std::collections::BTreeSet<String> = workloads
                    .iter()
                    .filter(|x| x.metadata.name == w)
                    .flat_map(|x| &x.status.instances)
                    .filter(|i| i.state == InstanceState::Running)
                    .map(|i| i.instance_id.to_string())
                    .collect();
                assert_eq!(running, before[w], "{w}: other instances than before");
                now += reported_running(&h, 1, w).saturating_sub(n);
            }
            duplicates = duplicates.max(now);
            true
        },
    );
    // Nothing of `late`: no workload, no instance, no container on any node.
    assert!(
        instances(&h, 1, "late").is_empty() && h.k(1).workload("late").is_none(),
        "late came back in part"
    );
    wait("late's containers stopped", Duration::from_secs(60), || {
        reported_running(&h, 1, "late") == 0
    });
    assert_eq!(duplicates, 0, "instances running twice");
    println!(
        "restore_drill workloads_back={back}/{} duplicates={duplicates} restore_s={restore_s:.1}",
        expected.len()
    );
}
