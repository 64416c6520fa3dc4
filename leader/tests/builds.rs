//! Builds the nodes report: events once per change, the workload's status, and a node's
//! reports about workloads it does not run are ignored.

mod support;

use kat_api::wire::{BuildReport, BuildState, EventType};
use support::*;

fn report(workload: &str, state: BuildState, message: &str) -> BuildReport {
    BuildReport {
        namespace: "default".into(),
        workload: workload.into(),
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        image: format!("kat-local/default_{workload}:0123456"),
        node: None,
        state,
        message: message.into(),
        from_cache: false,
        started_at: "2026-11-24T10:00:00Z".parse().unwrap(),
        finished_at: None,
    }
}

async fn build_events(c: &kat_leader::sim::SimCluster) -> Vec<(EventType, String, String)> {
    events(c)
        .await
        .into_iter()
        .filter(|e| e.reason.starts_with("Build"))
        .map(|e| (e.event_type, e.reason, e.message))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn build_reports_become_events_and_status_once_per_change() {
    let mut c = cluster(2).await;
    c.apply(&[("workload.kat", &service("web", 1, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 1).await.unwrap();
    let on = c.live_of("web")[0].node.clone();
    let other = if on == "node-1" { "node-2" } else { "node-1" };

    c.node(&on).builds = vec![report("web", BuildState::Building, "step 1 of 3: FROM x")];
    for _ in 0..3 {
        c.tick().await.unwrap();
    }
    let first = status(&c, "web").await;
    assert_eq!(first.builds.len(), 1);
    assert_eq!(first.builds[0].node.as_deref(), Some(on.as_str()));
    assert_eq!(first.builds[0].message, "step 1 of 3: FROM x");

    // Progress changes the status, not the events.
    c.node(&on).builds = vec![report("web", BuildState::Building, "step 2 of 3: RUN make")];
    c.tick().await.unwrap();
    c.tick().await.unwrap();
    assert_eq!(
        status(&c, "web").await.builds[0].message,
        "step 2 of 3: RUN make"
    );

    let failure = format!(
        "buildah failed at step 2 of 3: RUN make: {}",
        "x".repeat(10_000)
    );
    c.node(&on).builds = vec![report("web", BuildState::Failed, &failure)];
    for _ in 0..3 {
        c.tick().await.unwrap();
    }
    let events = build_events(&c).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, EventType::Normal);
    assert_eq!(events[0].1, "BuildStarted");
    assert!(events[0].2.contains(on.as_str()));
    assert_eq!(events[1].0, EventType::Warning);
    assert_eq!(events[1].1, "BuildFailed");
    assert!(events[1].2.len() < 4200, "a failure's message is bounded");

    // A build that started and ended between two rounds: both told.
    c.node(&on).builds = vec![];
    c.tick().await.unwrap();
    let mut done = report("web", BuildState::Succeeded, "built in 3.0 s");
    done.commit = "fedcba9876543210fedcba9876543210fedcba98".into();
    done.image = "kat-local/default_web:fedcba9".into();
    // With it, made-up images and the same build twice: not counted.
    let mut made_up = report("web", BuildState::Failed, "made up");
    made_up.image = "kat-local/default_web:nothing".into();
    c.node(&on).builds = vec![done.clone(), made_up, done];
    c.tick().await.unwrap();
    c.tick().await.unwrap();
    let reasons: Vec<String> = build_events(&c).await.into_iter().map(|e| e.1).collect();
    assert_eq!(
        reasons,
        [
            "BuildStarted",
            "BuildFailed",
            "BuildStarted",
            "BuildSucceeded"
        ]
    );

    // Another node claims builds of a workload it runs no instance of: ignored.
    c.node(other).builds = vec![report("web", BuildState::Failed, "forged")];
    for _ in 0..3 {
        c.tick().await.unwrap();
    }
    assert_eq!(build_events(&c).await.len(), 4);
    assert!(status(&c, "web")
        .await
        .builds
        .iter()
        .all(|b| b.node.as_deref() == Some(on.as_str())));
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_does_not_repeat_build_events() {
    let mut c = cluster(1).await;
    c.apply(&[("workload.kat", &service("web", 1, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 1).await.unwrap();
    c.node("node-1").builds = vec![report("web", BuildState::Succeeded, "built in 1.0 s")];
    for _ in 0..3 {
        c.tick().await.unwrap();
    }
    assert_eq!(build_events(&c).await.len(), 2);
    c.leader = kat_leader::Leader::start(c.store.clone(), config(), c.clock, None)
        .await
        .unwrap();
    for _ in 0..3 {
        c.tick().await.unwrap();
    }
    assert_eq!(
        build_events(&c).await.len(),
        2,
        "a failover repeats nothing"
    );
    assert_eq!(status(&c, "web").await.builds.len(), 1);
}
