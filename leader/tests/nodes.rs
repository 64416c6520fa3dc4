//! Node loss and return, drain, taints and labels, DaemonService: simulated on MemStore.

mod support;

use std::collections::{BTreeMap, HashSet};

use kat_api::wire::InstanceId;
use kat_api::wire::{Taint, DRAIN_TAINT_KEY};
use kat_api::workload::TaintEffect;
use kat_leader::desired::node_admin;
use support::*;

fn daemon(name: &str, extra: &str) -> String {
    format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  type: DaemonService\n  source:\n    image: agent:1\n  restartPolicy:\n    condition: Always\n  container: {{}}\n{extra}")
}

fn no_duplicate_ids(c: &kat_leader::sim::SimCluster) {
    let mut seen = HashSet::new();
    for r in c.live() {
        assert!(
            seen.insert(r.instance_id.clone()),
            "instance {} is live twice",
            r.instance_id
        );
    }
}

/// A Service pinned to a node (what a detached node hands back when it rejoins) stays with
/// its node through a loss: no replacement that the node would start beside, or instead of,
/// the container it kept running, however long the loss and whichever side notices first.
#[tokio::test(start_paused = true)]
async fn a_pinned_service_is_not_replaced_while_its_node_is_lost() {
    let mut c = cluster(3).await;
    let pinned = service(
        "notes",
        1,
        "notes:1",
        "  nodeSelector:\n    kat.dws.rip/nodeName: node-2\n",
    );
    c.apply(&[("workload.kat", &pinned)]).await;
    c.run_until(5, |c| c.healthy_of("notes") == 1)
        .await
        .unwrap();
    let before: Vec<InstanceId> = c
        .live_of("notes")
        .iter()
        .map(|r| r.instance_id.clone())
        .collect();
    assert_eq!(c.live_of("notes")[0].node, "node-2");
    c.node("node-2").partitioned = true;
    // Well past the 30 s loss timeout: node-2 is NotReady.
    c.run_until(90, |_| false).await.unwrap();
    let records = c.store.list("/kat/instances/").await.unwrap().kvs;
    assert_eq!(
        records.len(),
        1,
        "no replacement record while node-2 is lost"
    );
    c.node("node-2").partitioned = false;
    c.run_until(10, |_| false).await.unwrap();
    let after: Vec<InstanceId> = c
        .live_of("notes")
        .iter()
        .map(|r| r.instance_id.clone())
        .collect();
    assert_eq!(before, after, "the same instance runs on, never restarted");
    let reasons: Vec<String> = events(&c).await.into_iter().map(|e| e.reason).collect();
    assert!(reasons.contains(&"NodeNotReady".to_string()), "{reasons:?}");
    assert!(
        !reasons.contains(&"InstanceLost".to_string()),
        "{reasons:?}"
    );
    no_duplicate_ids(&c);
}

#[tokio::test(start_paused = true)]
async fn lost_node_services_move_and_return_without_duplicates() {
    let mut c = cluster(3).await;
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(5, |c| c.healthy_of("web") == 3).await.unwrap();
    let victim = c.live_of("web")[0].node.clone();
    let lost_id = c
        .live_of("web")
        .iter()
        .find(|r| r.node == victim)
        .unwrap()
        .instance_id
        .clone();
    c.node(&victim).partitioned = true;

    // 30s timeout: the node is declared NotReady and its instance replaced elsewhere.
    let steps = c
        .run_until(60, |c| {
            c.live_of("web").iter().filter(|r| r.node != victim).count() == 3
        })
        .await
        .unwrap();
    assert!(
        (30..=40).contains(&steps),
        "rescheduled after {steps}s, expected just after the 30s timeout"
    );
    assert!(
        c.live_of("web").iter().any(|r| r.instance_id == lost_id),
        "the cut-off node still runs its container"
    );
    let reasons: Vec<String> = events(&c).await.into_iter().map(|e| e.reason).collect();
    assert!(
        reasons.contains(&"NodeNotReady".to_string())
            && reasons.contains(&"InstanceLost".to_string()),
        "{reasons:?}"
    );
    no_duplicate_ids(&c);

    // The node comes back: it stops the replaced instance by id.
    c.node(&victim).partitioned = false;
    c.run_until(10, |c| c.live_of("web").len() == 3)
        .await
        .unwrap();
    assert_eq!(c.live_of("web").len(), 3);
    assert!(!c.live_of("web").iter().any(|r| r.instance_id == lost_id));
    no_duplicate_ids(&c);
    assert!(events(&c)
        .await
        .iter()
        .any(|e| e.reason == "NodeReady" && e.message.contains("again")));
}

#[tokio::test(start_paused = true)]
async fn daemon_service_follows_nodes() {
    let mut ns = nodes(3);
    ns[2].labels.insert("role".into(), "edge".into());
    let mut c = cluster_with(ns).await;
    c.apply(&[("workload.kat", &daemon("agent", ""))]).await;
    c.run_until(5, |c| c.healthy_of("agent") == 3)
        .await
        .unwrap();
    assert_eq!(c.live_of("agent").len(), 3);

    // A node joins: it gets an instance.
    let mut n4 = kat_leader::sim::SimNode::new("node-4", 4000, 8 * GI);
    n4.labels.insert("role".into(), "edge".into());
    node_admin::register(&*c.store, "node-4", vec![], n4.labels.clone())
        .await
        .unwrap();
    c.nodes.push(n4);
    c.run_until(5, |c| c.live_of("agent").len() == 4)
        .await
        .unwrap();
    assert!(c.live_of("agent").iter().any(|r| r.node == "node-4"));

    // A NoSchedule taint makes a node ineligible: its instance goes.
    let log = c.leader.events().clone();
    node_admin::set_taints(
        &*c.store,
        &log,
        &c.clock,
        "node-1",
        vec![Taint {
            key: "maintenance".into(),
            value: None,
            effect: TaintEffect::NoSchedule,
        }],
    )
    .await
    .unwrap();
    c.run_until(5, |c| {
        !c.live_of("agent").iter().any(|r| r.node == "node-1")
    })
    .await
    .unwrap();
    assert_eq!(c.live_of("agent").len(), 3);

    // A lost node keeps its daemon instance (it has nowhere else to go).
    c.node("node-2").partitioned = true;
    c.run_until(45, |_| false).await.unwrap();
    assert!(
        c.store
            .list("/kat/instances/node-2/")
            .await
            .unwrap()
            .kvs
            .len()
            == 1,
        "record kept on the lost node"
    );
    c.node("node-2").partitioned = false;
    c.run_until(3, |_| false).await.unwrap();
    assert_eq!(c.live_of("agent").len(), 3);

    // A selector narrows it to the edge nodes.
    c.apply(&[(
        "workload.kat",
        &daemon("agent", "  nodeSelector: {role: edge}\n"),
    )])
    .await;
    c.run_until(10, |c| {
        c.live_of("agent")
            .iter()
            .all(|r| r.node == "node-3" || r.node == "node-4")
            && c.live_of("agent").len() == 2
    })
    .await
    .unwrap();
    let on: HashSet<String> = c
        .live_of("agent")
        .iter()
        .map(|r| r.node.to_string())
        .collect();
    assert_eq!(
        on,
        HashSet::from(["node-3".to_string(), "node-4".to_string()])
    );
}

#[tokio::test(start_paused = true)]
async fn daemon_rolling_update_replaces_node_by_node() {
    let mut c = cluster(4).await;
    c.apply(&[
        (
            "workload.kat",
            &daemon("agent", "  updateStrategy: {rolling: {maxSurge: 1}}\n"),
        ),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    c.run_until(5, |c| c.healthy_of("agent") == 4)
        .await
        .unwrap();
    c.apply(&[
        (
            "workload.kat",
            &daemon("agent", "  updateStrategy: {rolling: {maxSurge: 1}}\n")
                .replace("agent:1", "agent:2"),
        ),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    for _ in 0..30 {
        c.tick().await.unwrap();
        assert!(
            c.live_of("agent").len() <= 5,
            "at most one node at a time runs two instances"
        );
        assert!(c.healthy_of("agent") >= 3);
    }
    assert_eq!(c.live_of("agent").len(), 4);
    assert!(c.live_of("agent").iter().all(|r| r.generation == 2));
}

#[tokio::test(start_paused = true)]
async fn drain_moves_services_with_availability_and_uncordon_reopens() {
    let mut c = cluster(3).await;
    c.apply(&[
        ("workload.kat", &service("web", 3, "web:1", "")),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    c.apply(&[("workload.kat", &daemon("agent", ""))]).await;
    c.run_until(6, |c| {
        c.healthy_of("web") == 3 && c.healthy_of("agent") == 3
    })
    .await
    .unwrap();
    let log = c.leader.events().clone();
    let reg = node_admin::drain(&*c.store, &log, &c.clock, "node-1")
        .await
        .unwrap();
    assert!(
        reg.draining
            && reg
                .taints
                .iter()
                .any(|t| t.key == DRAIN_TAINT_KEY && t.effect == TaintEffect::NoSchedule)
    );
    for _ in 0..20 {
        c.tick().await.unwrap();
        assert!(
            c.healthy_of("web") >= 3,
            "availability kept during the drain"
        );
    }
    assert!(
        !c.live_of("web").iter().any(|r| r.node == "node-1"),
        "services moved off node-1"
    );
    assert_eq!(c.live_of("web").len(), 3);
    assert!(
        c.live_of("agent").iter().any(|r| r.node == "node-1"),
        "daemon instances stay"
    );

    node_admin::uncordon(&*c.store, &log, &c.clock, "node-1")
        .await
        .unwrap();
    c.apply(&[
        ("workload.kat", &service("web", 6, "web:1", "")),
        ("lb.kat", HEALTH_CHECK),
    ])
    .await;
    c.run_until(10, |c| c.live_of("web").iter().any(|r| r.node == "node-1"))
        .await
        .unwrap();
    assert!(
        c.live_of("web").iter().any(|r| r.node == "node-1"),
        "node-1 takes instances again"
    );
    let reasons: Vec<String> = events(&c).await.into_iter().map(|e| e.reason).collect();
    assert!(
        reasons.contains(&"NodeDraining".to_string())
            && reasons.contains(&"NodeUncordoned".to_string())
    );
}

#[tokio::test(start_paused = true)]
async fn labels_steer_scheduling() {
    let mut c = cluster(2).await;
    c.apply(&[(
        "workload.kat",
        &service("db", 1, "db:1", "  nodeSelector: {disk: nvme}\n"),
    )])
    .await;
    c.run_until(3, |_| false).await.unwrap();
    assert!(c.live_of("db").is_empty());
    assert!(status(&c, "db")
        .await
        .message
        .unwrap()
        .contains("2 node selector mismatch"));
    let log = c.leader.events().clone();
    node_admin::set_labels(
        &*c.store,
        &log,
        &c.clock,
        "node-2",
        BTreeMap::from([("disk".into(), Some("nvme".into()))]),
    )
    .await
    .unwrap();
    c.run_until(5, |c| c.healthy_of("db") == 1).await.unwrap();
    assert_eq!(c.live_of("db")[0].node, "node-2");
    let err = node_admin::drain(&*c.store, &log, &c.clock, "node-9")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("node node-9 is not registered"));
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_continues_without_duplicates() {
    let mut c = cluster(3).await;
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(5, |c| c.healthy_of("web") == 3).await.unwrap();
    let ids: HashSet<InstanceId> = c
        .live_of("web")
        .iter()
        .map(|r| r.instance_id.clone())
        .collect();
    // The old leader is gone; a new one starts from the store alone.
    c.leader = kat_leader::Leader::start(c.store.clone(), config(), c.clock, None)
        .await
        .unwrap();
    c.run_until(40, |_| false).await.unwrap();
    let after: HashSet<InstanceId> = c
        .live_of("web")
        .iter()
        .map(|r| r.instance_id.clone())
        .collect();
    assert_eq!(ids, after, "the new leader keeps the same instances");
}

/// A pinned Service whose node was removed for good (its registration gone) is not kept
/// waiting for it: the record goes, with an event saying so.
#[tokio::test(start_paused = true)]
async fn a_pinned_service_on_a_removed_node_is_not_kept() {
    let mut c = cluster(3).await;
    let pinned = service(
        "notes",
        1,
        "notes:1",
        "  nodeSelector:\n    kat.dws.rip/nodeName: node-2\n",
    );
    c.apply(&[("workload.kat", &pinned)]).await;
    c.run_until(5, |c| c.healthy_of("notes") == 1)
        .await
        .unwrap();
    let id = c.live_of("notes")[0].instance_id.clone();
    c.node("node-2").partitioned = true;
    c.run_until(45, |_| false).await.unwrap();
    c.store
        .delete(&kat_api::keys::node_registration("node-2"))
        .await
        .unwrap();
    c.run_until(5, |_| false).await.unwrap();
    let records = c.store.list("/kat/instances/").await.unwrap().kvs;
    assert!(
        !records.iter().any(|kv| kv.key.contains(id.as_str())),
        "the record of {id} is kept for a node that is gone"
    );
    let reasons: Vec<String> = events(&c).await.into_iter().map(|e| e.reason).collect();
    assert!(reasons.contains(&"InstanceLost".to_string()), "{reasons:?}");
}

/// `nodeRemoveAfterSeconds`: a node silent that long is removed as `katcall delete node`
/// would (registration gone, certificate revoked, `NodeRemoved` event); a node that keeps
/// heartbeating stays, and so does the leader's own node however silent; a node first seen
/// by a new sweep gets the whole period from then.
#[tokio::test(start_paused = true)]
async fn departed_nodes_are_removed_after_the_setting() {
    let mut c = cluster(3).await;
    c.apply(&[("workload.kat", &service("web", 3, "web:1", ""))])
        .await;
    c.run_until(10, |c| c.healthy_of("web") == 3).await.unwrap();
    let sweep = kat_leader::departed::Sweep {
        store: c.store.clone(),
        etcd: None,
        events: c.leader.events().clone(),
        clock: c.clock,
        after: std::time::Duration::from_secs(120),
        own: "node-1".into(),
    };
    let mut silence = kat_leader::departed::Silence::default();
    // node-2 and node-1 (the leader's own) go silent; node-3 keeps heartbeating.
    c.node("node-2").partitioned = true;
    c.node("node-1").partitioned = true;
    let mut removed = Vec::new();
    for step in 0..200 {
        c.tick().await.unwrap();
        removed.extend(sweep.once(&mut silence).await.unwrap());
        if step == 100 {
            assert!(removed.is_empty(), "removed before 120 s: {removed:?}");
        }
    }
    assert_eq!(removed, vec!["node-2".to_string()]);
    let store = c.store.clone();
    let registered = |name: &str| {
        let store = store.clone();
        let key = kat_api::keys::node_registration(name);
        async move { store.get(&key).await.unwrap().is_some() }
    };
    assert!(!registered("node-2").await);
    assert!(registered("node-1").await && registered("node-3").await);
    assert!(c
        .store
        .get(&kat_api::keys::revoked_node("node-2"))
        .await
        .unwrap()
        .is_some());
    let list = events(&c).await;
    assert!(
        list.iter().any(|e| e.reason == "NodeRemoved"
            && e.message.contains("node-2")
            && e.message.contains("nodeRemoveAfterSeconds")),
        "{list:?}"
    );
    // A fresh sweep (a new leader) does not remove a node silent for longer than the
    // setting the moment it looks: it counts from its own first look.
    c.node("node-3").partitioned = true;
    for _ in 0..150 {
        c.tick().await.unwrap();
    }
    let mut fresh = kat_leader::departed::Silence::default();
    assert!(sweep.once(&mut fresh).await.unwrap().is_empty());
    for _ in 0..119 {
        c.tick().await.unwrap();
        assert!(sweep.once(&mut fresh).await.unwrap().is_empty());
    }
    for _ in 0..5 {
        c.tick().await.unwrap();
        removed.extend(sweep.once(&mut fresh).await.unwrap());
    }
    assert_eq!(removed, vec!["node-2".to_string(), "node-3".to_string()]);
    // A node that spoke since the sweep looked (its status at another revision) stays.
    let spoke = node_admin::remove(
        &*c.store,
        c.leader.events(),
        &c.clock,
        None,
        "node-1",
        "",
        Some(1),
    )
    .await
    .unwrap();
    assert!(!spoke);
    assert!(registered("node-1").await);
}

/// The cluster role has its own label, set by the agent at every start; `kat.dws.rip/role`
/// is the administrator's (e.g. `ingress`) and survives restarts; a registration from before
/// the split loses the old role value there; `katcall label` cannot change system labels.
#[tokio::test]
async fn the_cluster_role_and_the_admins_role_are_separate_labels() {
    use kat_api::wire::{CLUSTER_ROLE_LABEL, HOSTNAME_LABEL, ROLE_LABEL};
    let store = kat_store::MemStore::new();
    let events = kat_leader::events::EventLog::new(100);
    let clock = kat_leader::Clock::system();
    let old = BTreeMap::from([
        (HOSTNAME_LABEL.to_string(), "n1".to_string()),
        (ROLE_LABEL.to_string(), "worker".to_string()),
    ]);
    node_admin::register(&store, "n1", vec![], old)
        .await
        .unwrap();
    let now = BTreeMap::from([
        (HOSTNAME_LABEL.to_string(), "n1".to_string()),
        (CLUSTER_ROLE_LABEL.to_string(), "worker".to_string()),
    ]);
    node_admin::register(&store, "n1", vec![], now.clone())
        .await
        .unwrap();
    async fn labels(store: &kat_store::MemStore) -> BTreeMap<String, String> {
        let key = kat_api::keys::node_registration("n1");
        let kv = kat_store::StateStore::get(store, &key)
            .await
            .unwrap()
            .unwrap();
        kat_store::decode::<kat_api::wire::NodeRegistration>(&kv)
            .unwrap()
            .labels
    }
    let l = labels(&store).await;
    assert_eq!(
        l.get(CLUSTER_ROLE_LABEL).map(String::as_str),
        Some("worker")
    );
    assert!(!l.contains_key(ROLE_LABEL), "{l:?}");
    node_admin::set_labels(
        &store,
        &events,
        &clock,
        "n1",
        BTreeMap::from([(ROLE_LABEL.to_string(), Some("ingress".to_string()))]),
    )
    .await
    .unwrap();
    node_admin::register(&store, "n1", vec![], now)
        .await
        .unwrap();
    let l = labels(&store).await;
    assert_eq!(l.get(ROLE_LABEL).map(String::as_str), Some("ingress"));
    assert_eq!(
        l.get(CLUSTER_ROLE_LABEL).map(String::as_str),
        Some("worker")
    );
    for system in [CLUSTER_ROLE_LABEL, HOSTNAME_LABEL] {
        let err = node_admin::set_labels(
            &store,
            &events,
            &clock,
            "n1",
            BTreeMap::from([(system.to_string(), Some("control-plane".to_string()))]),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("set by the node's agent"), "{err}");
    }
}

/// A node whose heartbeat claims 100 cores, approved for 1: the scheduler places on it only
/// what the approved core holds (500m requests: two instances), the rest stays unplaced.
#[tokio::test(start_paused = true)]
async fn the_scheduler_uses_the_approved_capacity_not_the_claim() {
    let mut liar = kat_leader::sim::SimNode::new("liar", 100_000, 64 * GI);
    liar.labels.insert("pool".into(), "x".into());
    let mut c = cluster_with(vec![liar]).await;
    let key = kat_api::keys::node_registration("liar");
    let kv = c.store.get(&key).await.unwrap().unwrap();
    let mut reg: kat_api::wire::NodeRegistration = kat_store::decode(&kv).unwrap();
    reg.capacity = Some(kat_api::wire::ApprovedCapacity {
        allocatable: kat_api::wire::ResourceList {
            cpu_millis: 1000,
            memory_bytes: 8 * GI,
            pids: 4096,
        },
        gpus: vec![],
    });
    c.store
        .put(&key, serde_json::to_vec(&reg).unwrap(), None)
        .await
        .unwrap();
    c.apply(&[("workload.kat", &service("web", 5, "web:1", ""))])
        .await;
    c.run_until(10, |_| false).await.unwrap();
    assert_eq!(c.live_of("web").len(), 2, "{:?}", c.live_of("web"));
}
