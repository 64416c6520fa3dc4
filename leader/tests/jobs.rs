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
        .map(|kv| serde_json::from_slice(&kv.value).unwrap())
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
