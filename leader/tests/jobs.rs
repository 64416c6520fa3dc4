//! Jobs: completions, parallelism, backoff, deadlines, cron and missed ticks.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::{JobRun, JobRunState};
use kat_leader::sim::Behaviour;
use support::*;

fn job(name: &str, job_spec: &str) -> [(String, String); 2] {
    [
        (
            "workload.kat".into(),
            format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  type: Job\n  source:\n    image: batch:1\n  restartPolicy:\n    condition: Never\n  container: {{}}\n"),
        ),
        ("job.kat".into(), format!("apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec:\n{job_spec}")),
    ]
}

async fn apply_job(c: &mut kat_leader::sim::SimCluster, files: &[(String, String)]) {
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    c.apply(&refs).await;
}

async fn runs(c: &kat_leader::sim::SimCluster, name: &str) -> Vec<JobRun> {
    c.store
        .list(&kat_api::keys::job_runs("default", name))
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kat_store::decode(kv).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn completions_with_bounded_parallelism() {
    let mut c = cluster(3).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(3), 0)),
    });
    apply_job(
        &mut c,
        &job("batch", "  completions: 5\n  parallelism: 2\n"),
    )
    .await;
    let mut peak = 0;
    for _ in 0..40 {
        c.tick().await.unwrap();
        peak = peak.max(c.live_of("batch").len());
    }
    assert_eq!(peak, 2, "never more than parallelism at once");
    let r = runs(&c, "batch").await;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].state, r[0].succeeded, r[0].failed),
        (JobRunState::Succeeded, 5, 0)
    );
    assert!(c.live_of("batch").is_empty());
    assert!(events(&c)
        .await
        .iter()
        .any(|e| e.reason == "JobRunSucceeded"));
}

#[tokio::test(start_paused = true)]
async fn backoff_limit_fails_the_run() {
    let mut c = cluster(2).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(1), 3)),
    });
    apply_job(&mut c, &job("flaky", "  backoffLimit: 2\n")).await;
    c.run_until(40, |_| false).await.unwrap();
    let r = runs(&c, "flaky").await;
    assert_eq!(r[0].state, JobRunState::Failed);
    assert_eq!(
        r[0].failed, 3,
        "backoffLimit 2 allows 2 failures; the 3rd fails the run"
    );
    assert!(r[0]
        .reason
        .as_ref()
        .unwrap()
        .starts_with("BackoffLimitExceeded"));
    assert!(status(&c, "flaky")
        .await
        .message
        .unwrap()
        .contains("BackoffLimitExceeded"));
}

#[tokio::test(start_paused = true)]
async fn deadline_stops_a_slow_run() {
    let mut c = cluster(1).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(3600), 0)),
    });
    apply_job(&mut c, &job("slow", "  activeDeadlineSeconds: 30\n")).await;
    c.run_until(45, |_| false).await.unwrap();
    let r = runs(&c, "slow").await;
    assert_eq!(r[0].state, JobRunState::Failed);
    assert!(
        r[0].reason
            .as_ref()
            .unwrap()
            .starts_with("DeadlineExceeded"),
        "{:?}",
        r[0].reason
    );
    assert!(c.live_of("slow").is_empty(), "the instance was stopped");
}

#[tokio::test(start_paused = true)]
async fn jobs_on_a_lost_node_count_as_failures_and_retry_elsewhere() {
    let mut c = cluster(2).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(100), 0)),
    });
    apply_job(&mut c, &job("report", "  backoffLimit: 3\n")).await;
    c.run_until(3, |_| false).await.unwrap();
    let first = c.live_of("report")[0].node.clone();
    c.node(&first).partitioned = true;
    c.run_until(200, |_| false).await.unwrap();
    let r = runs(&c, "report").await;
    assert_eq!(
        (r[0].state, r[0].failed, r[0].succeeded),
        (JobRunState::Succeeded, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_generation_supersedes_the_active_run() {
    let mut c = cluster(1).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(600), 0)),
    });
    apply_job(&mut c, &job("etl", "  completions: 1\n")).await;
    c.run_until(3, |_| false).await.unwrap();
    apply_job(&mut c, &job("etl", "  completions: 2\n")).await;
    c.run_until(3, |_| false).await.unwrap();
    let r = runs(&c, "etl").await;
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].state, JobRunState::Failed);
    assert!(r[0]
        .reason
        .as_ref()
        .unwrap()
        .contains("superseded by generation 2"));
    assert_eq!(r[1].state, JobRunState::Active);
}

#[tokio::test(start_paused = true)]
async fn cron_runs_at_each_tick_and_keeps_the_last_runs() {
    let mut c = cluster(2).await;
    c.step = Duration::from_secs(30);
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(10), 0)),
    });
    apply_job(&mut c, &job("tick", "  schedule: '*/5 * * * *'\n")).await;
    c.run_until(2 * 26, |_| false).await.unwrap(); // 26 minutes
    let r = runs(&c, "tick").await;
    assert_eq!(r.len(), 3, "job_history keeps the last 3 finished runs");
    let started = events(&c)
        .await
        .iter()
        .filter(|e| e.reason == "JobRunStarted")
        .count();
    assert_eq!(started, 5, "a run every 5 minutes for 26 minutes");
    let minutes: Vec<u64> = r.iter().map(|x| x.scheduled_minute.unwrap()).collect();
    assert!(
        minutes.windows(2).all(|w| w[1] - w[0] == 5) && minutes.iter().all(|m| m % 5 == 0),
        "{minutes:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_start_one_catch_up_run() {
    let mut c = cluster(1).await;
    c.step = Duration::from_secs(30);
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(10), 0)),
    });
    apply_job(&mut c, &job("tick", "  schedule: '*/5 * * * *'\n")).await;
    c.run_until(12, |_| false).await.unwrap(); // 6 minutes: one or two runs
    let before = events(&c)
        .await
        .iter()
        .filter(|e| e.reason == "JobRunStarted")
        .count();
    // No leader for 31 minutes: time passes, nobody reconciles.
    tokio::time::advance(Duration::from_secs(31 * 60)).await;
    c.leader = kat_leader::Leader::start(c.store.clone(), config(), c.clock, None)
        .await
        .unwrap();
    c.tick().await.unwrap();
    let ev = events(&c).await;
    let after = ev.iter().filter(|e| e.reason == "JobRunStarted").count();
    assert_eq!(
        after,
        before + 1,
        "one catch-up run, not one per missed tick"
    );
    let missed = ev
        .iter()
        .find(|e| e.reason == "MissedSchedule")
        .expect("missed ticks are reported");
    assert!(
        missed.message.starts_with("5 scheduled run(s) were missed"),
        "{}",
        missed.message
    );
}

async fn finished(
    c: &kat_leader::sim::SimCluster,
    name: &str,
) -> Vec<kat_api::finished::FinishedInstance> {
    c.store
        .list(&kat_api::keys::finished_instances("default", name))
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| kat_store::decode(kv).unwrap())
        .collect()
}

async fn cluster_keeping(
    nodes: Vec<kat_leader::sim::SimNode>,
    history: usize,
    max_age: Duration,
) -> kat_leader::sim::SimCluster {
    let mut config = config();
    config.finished = kat_api::finished::Retention {
        history,
        max_age_ms: max_age.as_millis() as u64,
    };
    let store: Arc<dyn kat_store::StateStore> = Arc::new(kat_store::MemStore::new());
    kat_leader::sim::SimCluster::start(store, nodes, config, true)
        .await
        .expect("start")
}

/// A finished run's instances keep their record, node and exit code after their records
/// (and so their containers) are gone: the newest `history` runs, whole, none past the age
/// limit; a lost one says which node it was lost with.
#[tokio::test(start_paused = true)]
async fn finished_runs_keep_their_instances_for_the_retention() {
    let mut c = cluster_keeping(nodes(2), 2, Duration::from_secs(12 * 60)).await;
    c.step = Duration::from_secs(30);
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(10), 0)),
    });
    apply_job(
        &mut c,
        &job("tick", "  schedule: '*/5 * * * *'\n  completions: 2\n"),
    )
    .await;
    c.run_until(2 * 17, |_| false).await.unwrap(); // 17 minutes: runs at 5, 10 and 15
    assert!(c.live_of("tick").is_empty(), "the records are gone");
    let r = runs(&c, "tick").await;
    let done: Vec<&str> = r
        .iter()
        .filter(|x| x.state == JobRunState::Succeeded)
        .map(|x| x.run_id.as_str())
        .collect();
    assert_eq!(done.len(), 3, "{r:?}");
    let kept = finished(&c, "tick").await;
    // The newest two runs, both instances of each.
    let mut kept_runs: Vec<&str> = kept.iter().map(|f| f.run()).collect();
    kept_runs.sort();
    assert_eq!(
        kept_runs,
        vec![done[1], done[1], done[2], done[2]],
        "{kept:?}"
    );
    for f in &kept {
        assert_eq!(f.state, kat_api::wire::InstanceState::Succeeded);
        assert_eq!(f.exit_code, Some(0));
        assert!(f.record.node.starts_with("node-"), "{f:?}");
        assert!(
            f.reason.as_deref().unwrap().contains("exited with 0"),
            "{f:?}"
        );
    }
    // The schedule goes (a new generation that never runs again): after the age limit,
    // nothing is kept.
    apply_job(
        &mut c,
        &job("tick", "  schedule: '0 0 1 1 *'\n  completions: 2\n"),
    )
    .await;
    c.run_until(2 * 14, |_| false).await.unwrap();
    assert!(finished(&c, "tick").await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_instance_is_kept_with_its_node_and_a_deleted_job_leaves_nothing() {
    let mut c = cluster_keeping(nodes(2), 3, Duration::from_secs(24 * 3600)).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(100), 0)),
    });
    apply_job(&mut c, &job("report", "  backoffLimit: 3\n")).await;
    c.run_until(3, |_| false).await.unwrap();
    let first = (*c.live_of("report")[0]).clone();
    c.node(&first.node).partitioned = true;
    c.run_until(200, |_| false).await.unwrap();
    let kept = finished(&c, "report").await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    let lost = kept
        .iter()
        .find(|f| f.record.instance_id == first.instance_id)
        .expect("the lost instance is kept");
    assert_eq!(lost.state, kat_api::wire::InstanceState::Unknown);
    assert_eq!(lost.record.node, first.node);
    assert!(
        lost.reason
            .as_deref()
            .unwrap()
            .contains(&format!("lost with node {}", first.node)),
        "{lost:?}"
    );
    let ok = kept
        .iter()
        .find(|f| f.record.instance_id != first.instance_id)
        .unwrap();
    assert_eq!(
        (ok.state, ok.exit_code),
        (kat_api::wire::InstanceState::Succeeded, Some(0))
    );

    let log = c.leader.events().clone();
    kat_leader::desired::workloads::delete(&*c.store, &log, &c.clock, "default", "report")
        .await
        .unwrap();
    c.run_until(3, |_| false).await.unwrap();
    assert!(finished(&c, "report").await.is_empty());
}

/// A Service instance that ended under `restartPolicy: Never` is kept with its exit code,
/// and replaced by a new instance with an `InstanceReplaced` event naming the code; the kept
/// record is written once, not every round.
#[tokio::test(start_paused = true)]
async fn a_service_that_ended_under_never_is_kept_and_replaced() {
    let mut c = cluster_keeping(nodes(1), 3, Duration::from_secs(24 * 3600)).await;
    c.behaviour = Arc::new(|_| Behaviour {
        healthy: true,
        exit: Some((Duration::from_secs(5), 3)),
    });
    let service = "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: once\nspec:\n  type: Service\n  replicas: 1\n  source:\n    image: web:1\n  restartPolicy:\n    condition: Never\n  container: {}\n";
    c.apply(&[("workload.kat", service)]).await;
    c.run_until(10, |_| false).await.unwrap();
    let kept = finished(&c, "once").await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].state, kept[0].exit_code),
        (kat_api::wire::InstanceState::Failed, Some(3))
    );
    let first = kept[0].record.instance_id.clone();
    let record = kat_api::keys::instance(&kept[0].record.node, &first);
    assert!(
        c.store.get(&record).await.unwrap().is_none(),
        "the ended instance's record is replaced"
    );
    let live = c.live_of("once");
    assert_eq!(live.len(), 1, "{live:?}");
    assert_ne!(live[0].instance_id, first);
    let events = events(&c).await;
    assert!(
        events.iter().any(|e| e.reason == "InstanceReplaced"
            && e.message.contains(first.as_str())
            && e.message.contains("exited with code 3")),
        "{events:?}"
    );
    // Kept once, not rewritten each round.
    let key = kat_api::keys::finished_instance("default", "once", &first);
    let rev = c.store.get(&key).await.unwrap().unwrap().mod_revision;
    c.run_until(5, |_| false).await.unwrap();
    let again = c.store.get(&key).await.unwrap().unwrap().mod_revision;
    assert_eq!(rev, again);
}

/// More ended instances than the history keeps (and a history of none): the retention's
/// choice is written once and stays; nothing is saved and pruned again round after round.
#[tokio::test(start_paused = true)]
async fn ended_services_beyond_the_history_are_not_saved_again_every_round() {
    for history in [2, 0] {
        let mut c = cluster_keeping(nodes(2), history, Duration::from_secs(24 * 3600)).await;
        // The first five instances crash; their replacements run.
        let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        c.behaviour = Arc::new(move |_| Behaviour {
            healthy: true,
            exit: (created.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 5)
                .then_some((Duration::from_secs(5), 3)),
        });
        let service = "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: many\nspec:\n  type: Service\n  replicas: 5\n  source:\n    image: web:1\n  restartPolicy:\n    condition: Never\n  container:\n    resources:\n      requests: {cpu: 100m, memory: 64Mi}\n";
        c.apply(&[("workload.kat", service)]).await;
        c.run_until(15, |_| false).await.unwrap();
        let revisions = |c: &kat_leader::sim::SimCluster| {
            let store = c.store.clone();
            async move {
                store
                    .list(&kat_api::keys::finished_instances("default", "many"))
                    .await
                    .unwrap()
                    .kvs
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.mod_revision))
                    .collect::<Vec<_>>()
            }
        };
        let settled = revisions(&c).await;
        assert_eq!(settled.len(), history, "history {history}: {settled:?}");
        c.run_until(20, |_| false).await.unwrap();
        assert_eq!(
            revisions(&c).await,
            settled,
            "history {history}: the kept instances were written again"
        );
    }
}
