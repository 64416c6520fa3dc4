//! A stored record KAT cannot read is an error where it is read, never a default: applying a
//! workload over an unreadable record of it does not restart its generation at 1 under a new
//! uid, and leaves the record as it was.

mod support;

use kat_api::WorkloadBundle;
use kat_leader::desired::workloads::{self, WorkloadError};
use kat_store::StoreError;
use support::*;

#[tokio::test(start_paused = true)]
async fn an_apply_over_an_unreadable_workload_record_changes_nothing() {
    let c = cluster(1).await;
    let events = c.leader.events().clone();
    let key = kat_api::keys::workload_meta("default", "web");
    let garbage = b"{\"metadata\": not json".to_vec();
    c.store.put(&key, garbage.clone(), None).await.unwrap();
    let bundle = WorkloadBundle::parse(
        [(
            "workload.kat".to_string(),
            service("web", 1, "web:1", "").into_bytes(),
        )]
        .into(),
    )
    .expect("a valid bundle");

    for outcome in [
        workloads::plan(&*c.store, &bundle).await.map(|_| ()),
        workloads::apply(&*c.store, &events, &c.clock, &bundle)
            .await
            .map(|_| ()),
    ] {
        match outcome {
            Err(WorkloadError::Store(StoreError::Value { key: named, detail })) => {
                assert_eq!(named, key);
                assert!(detail.contains("cannot read"), "{detail}");
            }
            other => panic!("an unreadable record is an error naming it: {other:?}"),
        }
    }
    let kept = c.store.get(&key).await.unwrap().expect("the record kept");
    assert_eq!(
        kept.value, garbage,
        "the unreadable record is left as it was"
    );
}
