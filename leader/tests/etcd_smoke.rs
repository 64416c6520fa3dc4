//! The control plane on a real etcd (started by the test), in real time with short timeouts:
//! scheduling, a rolling update, node loss and return, a job, events.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::JobRunState;
use kat_leader::sim::{Behaviour, SimCluster};
use kat_leader::LeaderConfig;
use kat_store::{EtcdServer, EtcdServerConfig, EtcdStore, StateStore};
use support::*;

async fn etcd(dir: &std::path::Path) -> (EtcdServer, Arc<dyn StateStore>) {
    let server = EtcdServer::start(EtcdServerConfig::loopback("smoke", dir).unwrap())
        .await
        .expect("start etcd");
    let store = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    (server, Arc::new(store))
}

async fn run_until(
    c: &mut SimCluster,
    limit: Duration,
    mut done: impl FnMut(&SimCluster) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        c.tick().await.unwrap();
        if done(c) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_on_real_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (server, store) = etcd(dir.path()).await;
    let mut sim_nodes = nodes(3);
    for n in &mut sim_nodes {
        n.start_delay = Duration::from_millis(100);
        n.stop_delay = Duration::from_millis(100);
    }
    let config = LeaderConfig {
        node_loss_timeout: Duration::from_secs(2),
        ..support::config()
    };
    let mut c = SimCluster::start(store.clone(), sim_nodes, config, false)
        .await
        .unwrap();

    // Scheduling and a rolling update.
    c.apply(&[
        ("workload.kat", &service("web", 3, "web:1", "")),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    assert!(
        run_until(&mut c, Duration::from_secs(20), |c| c.healthy_of("web")
            == 3)
        .await,
        "3 replicas healthy"
    );
    c.apply(&[
        ("workload.kat", &service("web", 3, "web:2", "")),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    let mut max_live = 0;
    let rolled = run_until(&mut c, Duration::from_secs(30), |c| {
        max_live = max_live.max(c.live_of("web").len());
        c.live_of("web").iter().all(|r| r.generation == 2) && c.healthy_of("web") == 3
    })
    .await;
    assert!(rolled, "rolled to generation 2");
    assert!(max_live <= 4, "surge respected on etcd: {max_live}");

    // Node loss and return.
    let victim = c.live_of("web")[0].node.clone();
    c.node(&victim).partitioned = true;
    assert!(
        run_until(&mut c, Duration::from_secs(30), |c| c
            .live_of("web")
            .iter()
            .filter(|r| r.node != victim)
            .count()
            == 3)
        .await,
        "rescheduled"
    );
    c.node(&victim).partitioned = false;
    assert!(
        run_until(&mut c, Duration::from_secs(20), |c| c.live_of("web").len()
            == 3)
        .await,
        "no duplicates after return"
    );

    // A job runs to completion.
    c.behaviour = Arc::new(|r| {
        if r.workload == "batch" {
            Behaviour {
                healthy: true,
                exit: Some((Duration::from_millis(200), 0)),
            }
        } else {
            Behaviour::default()
        }
    });
    c.apply(&[
        ("workload.kat", "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {name: batch}\nspec:\n  type: Job\n  source: {image: batch:1}\n  restartPolicy: {condition: Never}\n  container: {}\n"),
        ("job.kat", "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec: {completions: 2, parallelism: 2}\n"),
    ])
    .await;
    let mut state = None;
    run_until(&mut c, Duration::from_secs(20), |_| false).await;
    for kv in store
        .list(&kat_api::keys::job_runs("default", "batch"))
        .await
        .unwrap()
        .kvs
    {
        state = Some(
            kat_store::decode::<kat_api::wire::JobRun>(&kv)
                .unwrap()
                .state,
        );
    }
    assert_eq!(state, Some(JobRunState::Succeeded));

    let reasons: Vec<String> = events(&c).await.into_iter().map(|e| e.reason).collect();
    for r in [
        "WorkloadCreated",
        "Scheduled",
        "RolloutComplete",
        "NodeNotReady",
        "InstanceLost",
        "JobRunSucceeded",
    ] {
        assert!(reasons.iter().any(|x| x == r), "missing {r} in {reasons:?}");
    }
    server.stop().await;
}
