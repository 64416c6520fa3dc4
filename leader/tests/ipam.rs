//! Addresses (RFC 001 §7.2), simulated on MemStore: each node a subnet as soon as it is
//! registered, each instance an address of its node's subnet, never two live containers on
//! one address, addresses and subnets released, and a full subnet an honest Pending reason.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kat_api::keys;
use kat_api::wire::NodeName;
use kat_leader::sim::SimNode;
use kat_store::StateStore;
use support::*;

async fn subnets(c: &kat_leader::sim::SimCluster) -> BTreeMap<String, IpNet> {
    c.store
        .list(keys::node_subnets())
        .await
        .unwrap()
        .kvs
        .iter()
        .filter_map(|kv| match keys::parse(&kv.key)? {
            keys::Key::NodeSubnet { node } => Some((
                node.to_string(),
                String::from_utf8_lossy(&kv.value).parse().ok()?,
            )),
            _ => None,
        })
        .collect()
}

async fn allocations(c: &kat_leader::sim::SimCluster) -> BTreeMap<String, String> {
    let prefix = "/kat/network/allocations/";
    c.store
        .list(prefix)
        .await
        .unwrap()
        .kvs
        .iter()
        .map(|kv| {
            let id = kv.key[prefix.len()..].trim_end_matches("/ip").to_string();
            (id, String::from_utf8_lossy(&kv.value).into_owned())
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn nodes_get_subnets_and_instances_addresses_of_their_node() {
    let mut c = cluster(3).await;
    c.apply(&[("workload.kat", &service("web", 6, "web:1", ""))])
        .await;
    // Placed in the round the nodes got their subnets.
    let report = c.tick().await.unwrap();
    assert_eq!(report.scheduled, 6);
    let subnets = subnets(&c).await;
    assert_eq!(
        subnets.values().copied().collect::<BTreeSet<_>>(),
        ["10.100.0.0/23", "10.100.2.0/23", "10.100.4.0/23"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect(),
        "three distinct subnets, lowest first"
    );
    c.run_until(10, |c| c.healthy_of("web") == 6).await.unwrap();

    let live = c.live_of("web");
    let mut seen = BTreeSet::new();
    for r in &live {
        let ip: IpAddr = r.ip.expect("an address");
        let subnet = subnets[r.node.as_str()];
        assert!(subnet.contains(&ip), "{ip} in {} of {}", subnet, r.node);
        assert_ne!(
            Some(ip),
            kat_leader::ipam::node_address(&subnet),
            "not the node's own"
        );
        assert!(seen.insert(ip), "{ip} given twice");
    }
    // The RFC's allocation keys say the same.
    let alloc = allocations(&c).await;
    assert_eq!(alloc.len(), 6);
    for r in &live {
        assert_eq!(
            alloc.get(r.instance_id.as_str()),
            r.ip.map(|ip| ip.to_string()).as_ref()
        );
    }
    // The workload's status carries the addresses.
    let status = status(&c, "web").await;
    assert!(status.instances.iter().all(|i| i.ip.is_some()));

    // Scaled down: the addresses go with the records.
    c.apply(&[("workload.kat", &service("web", 2, "web:1", ""))])
        .await;
    c.run_until(20, |c| c.live_of("web").len() == 2)
        .await
        .unwrap();
    c.tick().await.unwrap();
    assert_eq!(allocations(&c).await.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_address_is_not_reused_while_its_container_still_stops() {
    // One node with a /28: 13 instance addresses.
    let mut config = config();
    config.addresses = kat_leader::ipam::AddressPlan::new("10.9.0.0/24".parse().unwrap(), 4);
    let store: std::sync::Arc<dyn StateStore> = std::sync::Arc::new(kat_store::MemStore::new());
    // Containers take long to stop: a replaced instance keeps its address for a while.
    let mut node = SimNode::new("node-1", 64_000, 64 * GI);
    node.stop_delay = std::time::Duration::from_secs(20);
    let mut c = kat_leader::sim::SimCluster::start(store, vec![node], config, true)
        .await
        .unwrap();
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    let first: BTreeSet<IpAddr> = c.live_of("web").iter().filter_map(|r| r.ip).collect();
    // A new generation replaces them one by one while the old ones stop.
    c.apply(&[("workload.kat", &service("web", 3, "web:2", ""))])
        .await;
    let mut at_once: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for _ in 0..300 {
        if c.live_of("web").len() == 3 && c.live_of("web").iter().all(|r| r.generation == 2) {
            break;
        }
        c.tick().await.unwrap();
        let mut by_ip: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for r in c.live_of("web") {
            *by_ip.entry(r.ip.unwrap()).or_default() += 1;
        }
        for (ip, n) in by_ip {
            let max = at_once.entry(ip).or_default();
            *max = (*max).max(n);
        }
    }
    assert!(
        at_once.values().all(|n| *n == 1),
        "two live containers shared an address: {at_once:?}"
    );
    // The first replacement could not take an old address (all three were in use or still
    // stopping); later ones may reuse an address whose container has gone.
    let now: BTreeSet<IpAddr> = c.live_of("web").iter().filter_map(|r| r.ip).collect();
    assert_eq!(now.len(), 3);
    assert!(!now.is_subset(&first), "{first:?} {now:?}");

    // Scaled down and straight back up: the new instances are placed while the removed ones
    // still stop, and must not take their addresses.
    // (A surge of 3 lets the controller place new instances beside those still stopping.)
    let surge = "  updateStrategy: {rolling: {maxSurge: 3}}\n";
    c.apply(&[("workload.kat", &service("web", 1, "web:2", surge))])
        .await;
    c.tick().await.unwrap();
    c.tick().await.unwrap();
    c.apply(&[("workload.kat", &service("web", 3, "web:2", surge))])
        .await;
    let mut shared = BTreeMap::new();
    for _ in 0..40 {
        c.tick().await.unwrap();
        let mut by_ip: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for r in c.live_of("web") {
            *by_ip.entry(r.ip.unwrap()).or_default() += 1;
        }
        shared.extend(by_ip.into_iter().filter(|(_, n)| *n > 1));
    }
    assert!(
        shared.is_empty(),
        "two live containers shared an address: {shared:?}"
    );
    assert_eq!(c.live_of("web").len(), 3);

    // 13 addresses: a 14th instance stays Pending and says why.
    c.apply(&[("workload.kat", &service("web", 14, "web:2", ""))])
        .await;
    c.run_until(60, |c| c.live_of("web").len() == 13)
        .await
        .unwrap();
    c.run_until(5, |_| false).await.unwrap();
    assert_eq!(c.live_of("web").len(), 13);
    let s = status(&c, "web").await;
    assert_eq!(
        s.message.as_deref(),
        Some("1 instance(s) Pending: 0/1 nodes available: 1 no free address in the node's subnet")
    );
}

#[tokio::test(start_paused = true)]
async fn a_removed_node_gives_its_subnet_back_once_its_instances_are_gone() {
    let mut c = cluster(2).await;
    c.apply(&[("workload.kat", &service("web", 2, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 2).await.unwrap();
    let before = subnets(&c).await;
    let gone = before["node-2"];
    // node-2 is removed (katcall delete node): its registration and status go.
    c.store
        .delete(&keys::node_registration("node-2"))
        .await
        .unwrap();
    c.store.delete(&keys::node_status("node-2")).await.unwrap();
    c.node("node-2").partitioned = true;
    c.run_until(30, |c| {
        c.live_of("web")
            .iter()
            .filter(|r| r.node == "node-1")
            .count()
            == 2
    })
    .await
    .unwrap();
    c.run_until(5, |_| false).await.unwrap();
    let after = subnets(&c).await;
    assert!(!after.contains_key("node-2"), "{after:?}");
    // A new node gets the freed subnet.
    c.add_node(SimNode::new("node-3", 4000, 8 * GI))
        .await
        .unwrap();
    c.run_until(3, |_| false).await.unwrap();
    assert_eq!(subnets(&c).await.get("node-3"), Some(&gone));
}

/// A Service whose instances publish host port 8080.
fn published(replicas: u32) -> [(&'static str, String); 2] {
    [
        ("workload.kat", service("web", replicas, "web:1", "")),
        (
            "lb.kat",
            "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 80, hostPort: 8080}]\n".to_string(),
        ),
    ]
}

#[tokio::test(start_paused = true)]
async fn two_instances_publishing_one_host_port_never_share_a_node() {
    let mut c = cluster(2).await;
    let files = published(3);
    let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    c.apply(&files).await;
    c.run_until(10, |c| c.healthy_of("web") == 2).await.unwrap();
    c.run_until(5, |_| false).await.unwrap();
    let live = c.live_of("web");
    assert_eq!(live.len(), 2, "the third has no node with 8080 free");
    assert_ne!(live[0].node, live[1].node);
    assert!(live.iter().all(|r| r.host_ports.len() == 1));
    let s = status(&c, "web").await;
    assert_eq!(
        s.message.as_deref(),
        Some("1 instance(s) Pending: 0/2 nodes available: 2 host port already in use")
    );
    // A third node: the pending instance goes there.
    c.add_node(SimNode::new("node-3", 4000, 8 * GI))
        .await
        .unwrap();
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    let nodes: BTreeSet<NodeName> = c.live_of("web").iter().map(|r| r.node.clone()).collect();
    assert_eq!(nodes.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_node_cannot_hold_back_a_workload_with_made_up_instances() {
    let mut c = cluster(2).await;
    // A rogue node (a compromised worker) reports 50 "running" instances of web that were
    // never its own, which would count as still terminating and block new ones.
    let fake: Vec<kat_api::wire::InstanceStatus> = (0..50)
        .map(|i| kat_api::wire::InstanceStatus {
            node: Some("rogue".parse().unwrap()),
            health: kat_api::wire::Health::Healthy,
            ..kat_api::wire::InstanceStatus::new(
                format!("web-fake{i}").parse().unwrap(),
                "default".into(),
                "web".into(),
                1,
                kat_api::wire::InstanceState::Running,
            )
        })
        .collect();
    let rogue = SimNode::new("rogue", 0, 0);
    c.store
        .put(
            &keys::node_registration("rogue"),
            serde_json::to_vec(&rogue.registration()).unwrap(),
            None,
        )
        .await
        .unwrap();
    let hb = kat_api::wire::NodeHeartbeat {
        node: "rogue".parse().unwrap(),
        timestamp: c.clock.timestamp(),
        capacity: Default::default(),
        allocatable: Default::default(),
        gpus: vec![],
        instances: fake,
        usage: None,
        builds: vec![],
        detached: None,
        overlay: vec![],
    };
    c.store
        .put(
            &keys::node_status("rogue"),
            serde_json::to_vec(&hb).unwrap(),
            None,
        )
        .await
        .unwrap();
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    assert_eq!(
        c.healthy_of("web"),
        3,
        "the made-up instances held the workload back"
    );
}

/// Addresses of live containers per step; fails when an instance appears on an address whose
/// previous container went away less than `ipam::QUARANTINE` ago.
struct ReuseWatch {
    live: BTreeSet<IpAddr>,
    freed: BTreeMap<IpAddr, tokio::time::Instant>,
    reused_early: Vec<String>,
}

impl ReuseWatch {
    fn new() -> Self {
        ReuseWatch {
            live: BTreeSet::new(),
            freed: BTreeMap::new(),
            reused_early: vec![],
        }
    }

    fn step(&mut self, c: &kat_leader::sim::SimCluster) {
        let now = tokio::time::Instant::now();
        let live: BTreeSet<IpAddr> = c.live().iter().filter_map(|r| r.ip).collect();
        for gone in self.live.difference(&live) {
            self.freed.insert(*gone, now);
        }
        for new in live.difference(&self.live) {
            if let Some(at) = self.freed.get(new) {
                let after = now.duration_since(*at);
                if after < kat_leader::ipam::QUARANTINE {
                    self.reused_early.push(format!(
                        "{new} given again {}s after it was freed",
                        after.as_secs()
                    ));
                }
            }
        }
        self.live = live;
    }
}

#[tokio::test(start_paused = true)]
async fn a_rolling_update_and_rollback_never_reuse_an_address_just_freed() {
    // One node: every replacement is placed where its predecessor's address was just freed.
    let mut c = cluster(1).await;
    let mut watch = ReuseWatch::new();
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    for image in ["web:2", "web:1", "web:2"] {
        c.apply(&[("workload.kat", &service("web", 3, image, ""))])
            .await;
        for _ in 0..60 {
            c.tick().await.unwrap();
            watch.step(&c);
        }
        assert_eq!(c.healthy_of("web"), 3);
        assert!(c
            .live_of("web")
            .iter()
            .all(|r| r.spec_hash == c.live_of("web")[0].spec_hash));
    }
    assert!(watch.reused_early.is_empty(), "{:?}", watch.reused_early);
    // Nine replacements, no address given twice within a minute: more than the three
    // lowest were used.
    assert!(watch.freed.len() >= 6, "{:?}", watch.freed);
}

#[tokio::test(start_paused = true)]
async fn a_full_subnet_gives_a_quarantined_address_rather_than_none() {
    // A /29: five instance addresses, all taken.
    let mut config = config();
    config.addresses = kat_leader::ipam::AddressPlan::new("10.9.0.0/24".parse().unwrap(), 5);
    let store: std::sync::Arc<dyn StateStore> = std::sync::Arc::new(kat_store::MemStore::new());
    let node = SimNode::new("node-1", 64_000, 64 * GI);
    let mut c = kat_leader::sim::SimCluster::start(store, vec![node], config, true)
        .await
        .unwrap();
    c.apply(&[("workload.kat", &service("web", 5, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 5).await.unwrap();
    c.run_until(70, |_| false).await.unwrap();
    // One goes; straight back to five: the only free address is the one just freed.
    c.apply(&[("workload.kat", &service("web", 4, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.live_of("web").len() == 4)
        .await
        .unwrap();
    c.apply(&[("workload.kat", &service("web", 5, "web:1", ""))])
        .await;
    let steps = c.run_until(10, |c| c.healthy_of("web") == 5).await.unwrap();
    assert!(steps < 10, "the fifth instance waited for the quarantine");
}

/// Three nodes, three replicas publishing one host port: a rolling update and a rollback
/// complete (a new instance may join an old one of the same workload on its node; two of one
/// template never share one), and every node has a healthy instance at every step, so its
/// published port always has somewhere to go.
#[tokio::test(start_paused = true)]
async fn a_workload_publishing_a_host_port_on_every_node_rolls_node_by_node() {
    let mut c = cluster(3).await;
    let with = |image: &str| {
        [
            ("workload.kat", service("web", 3, image, "")),
            (
                "lb.kat",
                "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 80, hostPort: 8080}]\n".to_string(),
            ),
        ]
    };
    let apply = |files: &[(&'static str, String); 2]| {
        files
            .iter()
            .map(|(n, t)| (*n, t.clone()))
            .collect::<Vec<(&str, String)>>()
    };
    let v1 = apply(&with("web:1"));
    c.apply(&v1.iter().map(|(n, t)| (*n, t.as_str())).collect::<Vec<_>>())
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    for image in ["web:2", "web:1"] {
        let files = apply(&with(image));
        c.apply(
            &files
                .iter()
                .map(|(n, t)| (*n, t.as_str()))
                .collect::<Vec<_>>(),
        )
        .await;
        let target = c.live_of("web")[0].spec_hash.clone();
        let mut done = false;
        for _ in 0..120 {
            c.tick().await.unwrap();
            for node in ["node-1", "node-2", "node-3"] {
                let serving = c
                    .nodes
                    .iter()
                    .find(|n| n.name == node)
                    .map_or(0, |n| n.live().filter(|r| r.workload == "web").count());
                assert!(serving >= 1, "{node} had no instance of web");
            }
            let live = c.live_of("web");
            if live.len() == 3
                && live.iter().all(|r| r.spec_hash != target)
                && c.healthy_of("web") == 3
            {
                done = true;
                break;
            }
        }
        assert!(
            done,
            "the update to {image} did not complete: {:?}",
            c.live_of("web")
        );
        let nodes: BTreeSet<NodeName> = c.live_of("web").iter().map(|r| r.node.clone()).collect();
        assert_eq!(nodes.len(), 3, "one instance per node again");
    }
}
