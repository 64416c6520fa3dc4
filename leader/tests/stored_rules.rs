//! A workload stored before a rule that refuses it now (a mount at `/.kat`, a `kat-local/`
//! image in `source.image`, both refused at apply since) is kept as stored, and the leader says so once per generation with a
//! Warning event naming what to change; applying it again without the mount ends it.

mod support;

use kat_api::WorkloadBundle;
use kat_leader::desired::workloads;
use support::*;

fn bundle(text: &str) -> WorkloadBundle {
    WorkloadBundle::parse([("workload.kat".to_string(), text.as_bytes().to_vec())].into())
        .expect("a valid bundle")
}

#[tokio::test(start_paused = true)]
async fn a_stored_workload_a_new_rule_refuses_is_kept_with_one_warning() {
    let mut c = cluster(1).await;
    let events_log = c.leader.events().clone();
    let mut old = bundle(&service("old", 1, "web:1", ""));
    // As a version without the rule stored it (apply refuses it today).
    old.workload.spec.container.volume_mounts.push(
        serde_json::from_value(serde_json::json!({"name": "hide", "mountPath": "/.kat"})).unwrap(),
    );
    workloads::apply(&*c.store, &events_log, &c.clock, &old)
        .await
        .expect("stored as it was");
    c.run_until(5, |_| false).await.unwrap();
    let refused = |events: &[kat_api::wire::Event]| {
        events
            .iter()
            .filter(|e| e.reason == "StoredWorkloadRefused")
            .cloned()
            .collect::<Vec<_>>()
    };
    let warnings = refused(&events(&c).await);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let message = &warnings[0].message;
    assert!(
        message.contains("mountPath /.kat") && message.contains("another mountPath"),
        "{message}"
    );
    assert_eq!(warnings[0].involved_object.name, "old");
    // Kept: the record is still there, as stored.
    let stored = c
        .store
        .get(&kat_api::keys::workload_meta("default", "old"))
        .await
        .unwrap();
    assert!(stored.is_some());

    // An image of a node's local build named in source.image (refused at apply since).
    let mut local = bundle(&service("local", 1, "web:1", ""));
    local.workload.spec.source.image = Some("kat-local/default_other:0123abc".into());
    workloads::apply(&*c.store, &events_log, &c.clock, &local)
        .await
        .expect("stored as it was");
    c.run_until(5, |_| false).await.unwrap();
    let warned = refused(&events(&c).await);
    let about_local: Vec<_> = warned
        .iter()
        .filter(|e| e.involved_object.name == "local")
        .collect();
    assert_eq!(about_local.len(), 1, "{warned:?}");
    assert!(about_local[0]
        .message
        .contains("source.image kat-local/default_other:0123abc"));

    // Applied again without the mount: a new generation, no new warning.
    workloads::apply(
        &*c.store,
        &events_log,
        &c.clock,
        &bundle(&service("old", 1, "web:1", "")),
    )
    .await
    .expect("the fixed workload");
    c.run_until(5, |_| false).await.unwrap();
    assert_eq!(refused(&events(&c).await).len(), 2);
}
