//! DNS records (RFC 001 §7.3), simulated on MemStore: one per running instance, ready while
//! it is healthy, following health in the round that sees it change, gone with the workload.

mod support;

use std::collections::BTreeMap;

use kat_api::keys;
use kat_api::wire::{DnsRecord, InstanceId};
use kat_leader::sim::SimCluster;
use support::*;

async fn records(c: &SimCluster) -> BTreeMap<InstanceId, DnsRecord> {
    c.store
        .list(keys::dns_records())
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| {
            let r: DnsRecord = kat_store::decode(kv).unwrap();
            (r.instance_id.clone(), r)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn records_follow_instances_and_their_health() {
    let mut c = cluster(2).await;
    c.apply(&[
        ("workload.kat", &service("web", 2, "web:1", "")),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    c.run_until(10, |c| c.healthy_of("web") == 2).await.unwrap();
    c.tick().await.unwrap();
    let all = records(&c).await;
    assert_eq!(all.len(), 2, "{all:?}");
    for r in c.live_of("web") {
        let rec = &all[&r.instance_id];
        assert_eq!(Some(rec.ip), r.ip);
        assert!(rec.ready, "{rec:?}");
        assert_eq!(
            (rec.namespace.as_str(), rec.workload.as_str()),
            ("default", "web")
        );
    }
    // One turns unhealthy: its record says so in the next round, and back again.
    let sick = c.live_of("web")[0].clone();
    c.node(&sick.node).set_healthy(&sick.instance_id, false);
    c.tick().await.unwrap();
    c.tick().await.unwrap();
    assert!(!records(&c).await[&sick.instance_id].ready);
    c.node(&sick.node).set_healthy(&sick.instance_id, true);
    c.tick().await.unwrap();
    c.tick().await.unwrap();
    assert!(records(&c).await[&sick.instance_id].ready);

    // The workload is deleted: its records go.
    let log = kat_leader::events::EventLog::new(100);
    kat_leader::desired::workloads::delete(&*c.store, &log, &c.clock, "default", "web")
        .await
        .unwrap();
    c.run_until(30, |c| c.live_of("web").is_empty())
        .await
        .unwrap();
    c.tick().await.unwrap();
    assert!(records(&c).await.is_empty());
}
