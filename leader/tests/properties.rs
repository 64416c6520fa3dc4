//! Properties of the control plane over random clusters, specs and failures.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::{GpuInfo, ResourceList, Taint};
use kat_api::workload::{GpuDriver, GpuRequest, TaintEffect, Toleration, TolerationOperator};
use kat_leader::scheduler::{self, NodeLoad, Request, SchedNode};
use kat_leader::sim::Behaviour;
use proptest::prelude::*;
use rand::SeedableRng;
use support::*;

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn arb_taint() -> impl Strategy<Value = Taint> {
    (
        prop::sample::select(vec!["gpu", "zone", "maint"]),
        prop::option::of(prop::sample::select(vec!["a", "b"])),
        prop::bool::ANY,
    )
        .prop_map(|(k, v, hard)| Taint {
            key: k.into(),
            value: v.map(Into::into),
            effect: if hard {
                TaintEffect::NoSchedule
            } else {
                TaintEffect::PreferNoSchedule
            },
        })
}

fn arb_node(i: usize) -> impl Strategy<Value = (SchedNode, NodeLoad)> {
    (
        prop::bool::weighted(0.9),
        prop::collection::btree_map(
            prop::sample::select(vec!["disk", "zone"]),
            prop::sample::select(vec!["ssd", "a", "b"]).prop_map(String::from),
            0..2,
        ),
        prop::collection::vec(arb_taint(), 0..2),
        (0u64..4000, 0u64..8),
        (0u64..4000, 0u64..8),
        prop::option::of(0u32..16_000),
    )
        .prop_map(
            move |(ready, labels, taints, (cpu, gi), (used_cpu, used_gi), vram)| {
                let labels = labels
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                let node = SchedNode {
                    free_ips: u64::MAX,
                    name: format!("n{i}").parse().unwrap(),
                    schedulable: ready,
                    labels,
                    taints,
                    allocatable: ResourceList {
                        cpu_millis: cpu,
                        memory_bytes: gi * GI,
                        pids: 0,
                    },
                    gpus: vram
                        .map(|v| {
                            vec![GpuInfo {
                                driver: GpuDriver::Nvidia,
                                vram_mb: v,
                                model: String::new(),
                                device: "nvidia.com/gpu=0".into(),
                            }]
                        })
                        .unwrap_or_default(),
                };
                let load = NodeLoad {
                    requested: ResourceList {
                        cpu_millis: used_cpu.min(cpu),
                        memory_bytes: (used_gi * GI).min(gi * GI),
                        pids: 0,
                    },
                    per_workload: Default::default(),
                    host_ports: Default::default(),
                    gpus: Default::default(),
                };
                (node, load)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the scheduler picks passes every filter; when it refuses, no node would have
    /// passed them all, and the reason accounts for every node.
    #[test]
    fn scheduler_never_places_against_a_filter(
        nodes in (1usize..12).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>()),
        cpu in 0u64..2000,
        mem_gi in 0u64..4,
        selector in prop::collection::btree_map(prop::sample::select(vec!["disk", "zone"]).prop_map(String::from), prop::sample::select(vec!["ssd", "a"]).prop_map(String::from), 0..2),
        tolerate in prop::option::of(prop::sample::select(vec!["gpu", "zone", ""])),
        gpu in prop::option::of(0u32..16_000),
        seed in any::<u64>(),
    ) {
        let (nodes, loads): (Vec<SchedNode>, Vec<NodeLoad>) = nodes.into_iter().unzip();
        let tolerations: Vec<Toleration> = tolerate.iter().map(|k| Toleration { key: k.to_string(), operator: TolerationOperator::Exists, value: None, effect: None }).collect();
        let gpu_req = gpu.map(|v| GpuRequest { driver: Some(GpuDriver::Nvidia), min_vram_mb: Some(v), count: None });
        let workload = kat_api::WorkloadKey::new("ns", "w");
        let req = Request { workload: &workload, requests: ResourceList { cpu_millis: cpu, memory_bytes: mem_gi * GI, pids: 0 }, node_selector: &selector, tolerations: &tolerations, gpu: gpu_req.as_ref(), host_ports: &[], template_hash: "" };
        let passes = |i: usize| scheduler::static_exclusion(&nodes[i], &req).is_none() && scheduler::resource_exclusion(&nodes[i], &loads[i], &req).is_none();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        match scheduler::place(&nodes, &loads, &req, &mut rng) {
            Ok(i) => {
                let n = &nodes[i];
                prop_assert!(n.schedulable);
                prop_assert!(selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)));
                prop_assert!(n.taints.iter().all(|t| t.effect != TaintEffect::NoSchedule || scheduler::tolerated(t, &tolerations)));
                prop_assert!(loads[i].requested.cpu_millis + cpu <= n.allocatable.cpu_millis);
                prop_assert!(loads[i].requested.memory_bytes + mem_gi * GI <= n.allocatable.memory_bytes);
                if let Some(v) = gpu { prop_assert!(n.gpus.iter().any(|g| g.vram_mb >= v)); }
                // PreferNoSchedule: a penalised node only when every passing node is penalised.
                let penalised = |j: usize| nodes[j].taints.iter().any(|t| t.effect == TaintEffect::PreferNoSchedule && !scheduler::tolerated(t, &tolerations));
                if penalised(i) { prop_assert!((0..nodes.len()).filter(|&j| passes(j)).all(penalised)); }
            }
            Err(why) => {
                prop_assert!((0..nodes.len()).all(|i| !passes(i)));
                prop_assert_eq!(why.excluded.values().sum::<usize>(), nodes.len());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Rolling updates stay within replicas + maxSurge live instances and, once healthy, never
    /// drop below replicas - maxSurge healthy ones, whatever the new version does.
    #[test]
    fn rolling_updates_respect_the_surge_budget(
        replicas in 1u32..7,
        surge in prop_oneof![(1u32..4).prop_map(|n| n.to_string()), (1u32..101).prop_map(|p| format!("'{p}%'"))],
        new_healthy in prop::bool::weighted(0.7),
        start_delay in 1u64..4,
        second_replicas in prop::option::of(1u32..7),
        seed in any::<u64>(),
    ) {
        paused_runtime().block_on(async {
            let mut cfg_nodes = nodes(4);
            for n in &mut cfg_nodes { n.start_delay = Duration::from_secs(start_delay); }
            let mut c = cluster_with(cfg_nodes).await;
            c.behaviour = Arc::new(move |r| Behaviour { healthy: r.generation < 2 || new_healthy, exit: None });
            let _ = seed;
            let strategy = format!("  updateStrategy: {{type: Rolling, rolling: {{maxSurge: {surge}}}}}\n");
            c.apply(&[("workload.kat", &service("web", replicas, "web:1", &strategy)), ("lb.kat", HEALTH_CHECK)]).await;
            c.run_until(20, |c| c.healthy_of("web") == replicas as usize).await.unwrap();
            prop_assert_eq!(c.healthy_of("web"), replicas as usize);
            let new_replicas = second_replicas.unwrap_or(replicas);
            c.apply(&[("workload.kat", &service("web", new_replicas, "web:2", &strategy)), ("lb.kat", HEALTH_CHECK)]).await;
            let max_surge = kat_api::workload::MaxSurge::parse(&yaml_serde::from_str(&surge).unwrap()).unwrap();
            let budget = |r: u32| max_surge.absolute(r) as usize;
            // During the change both the old and the new count bound the total.
            let ceiling = replicas.max(new_replicas) as usize + budget(replicas).max(budget(new_replicas));
            let floor = (new_replicas.min(replicas) as usize).saturating_sub(budget(new_replicas));
            for _ in 0..60 {
                c.tick().await.unwrap();
                let live = c.live_of("web").len();
                prop_assert!(live <= ceiling, "{} live > {}", live, ceiling);
                let healthy = c.healthy_of("web");
                prop_assert!(healthy >= floor, "{} healthy < {}", healthy, floor);
            }
            if new_healthy {
                prop_assert_eq!(c.live_of("web").len(), new_replicas as usize);
                prop_assert!(c.live_of("web").iter().all(|r| r.generation == 2));
            }
            Ok(())
        })?;
    }

    /// Nodes cut off and reconnected at random: no instance is ever live twice, and once all
    /// nodes are back the Service has exactly its replicas.
    #[test]
    fn node_loss_and_return_never_duplicate_an_instance(
        replicas in 1u32..6,
        outages in prop::collection::vec((0usize..4, 0u64..60, 5u64..90), 1..4),
    ) {
        paused_runtime().block_on(async {
            let mut c = cluster(4).await;
            c.apply(&[("workload.kat", &service("web", replicas, "web:1", ""))]).await;
            c.run_until(10, |c| c.healthy_of("web") == replicas as usize).await.unwrap();
            for step in 0u64..200 {
                for (node, start, len) in &outages {
                    let name = format!("node-{}", node + 1);
                    if step == *start { c.node(&name).partitioned = true; }
                    if step == start + len { c.node(&name).partitioned = false; }
                }
                c.tick().await.unwrap();
                let mut seen = HashSet::new();
                for r in c.live() {
                    prop_assert!(seen.insert(r.instance_id.clone()), "{} live twice", r.instance_id);
                }
            }
            for n in &mut c.nodes { n.partitioned = false; }
            c.run_until(60, |_| false).await.unwrap();
            prop_assert_eq!(c.live_of("web").len(), replicas as usize);
            let on_ready: BTreeMap<String, usize> = c.live_of("web").iter().fold(BTreeMap::new(), |mut m, r| { *m.entry(r.node.to_string()).or_default() += 1; m });
            prop_assert!(on_ready.values().sum::<usize>() == replicas as usize);
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Instances that end, under any restart policy, Service or DaemonService: each is
    /// replaced by a new instance with one `InstanceReplaced` event naming it and its exit
    /// code; the rounds that replace are spaced by the backoff (the n-th gap at least
    /// min(base × 2^(n-1), cap)); at no time do more than `replicas` records run; and once the
    /// crashes stop, the workload runs its replicas again.
    #[test]
    fn ended_instances_are_replaced_with_backoff(
        daemon in any::<bool>(),
        condition in prop::sample::select(vec!["Never", "MaxCount", "Always"]),
        replicas in 1u32..4,
        crashes in 0usize..8,
        code in 0i32..3,
        runs_for in 1u64..20,
    ) {
        paused_runtime().block_on(async {
            let node_count = 3;
            let mut c = cluster(node_count).await;
            c.step = Duration::from_secs(2);
            let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = created.clone();
            c.behaviour = Arc::new(move |_| Behaviour {
                healthy: true,
                exit: (counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < crashes)
                    .then_some((Duration::from_secs(runs_for), code)),
            });
            let (kind, replicas_line, want) = if daemon {
                ("DaemonService", String::new(), node_count)
            } else {
                ("Service", format!("  replicas: {replicas}\n"), replicas as usize)
            };
            let workload = format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: crashy\nspec:\n  type: {kind}\n{replicas_line}  source:\n    image: web:1\n  restartPolicy:\n    condition: {condition}\n  container:\n    resources:\n      requests: {{cpu: 100m, memory: 64Mi}}\n");
            c.apply(&[("workload.kat", &workload)]).await;
            let cfg = config();
            for _ in 0..900 {
                c.tick().await.unwrap();
                let records = c.store.list("/kat/instances/").await.unwrap().kvs.len();
                // Ended records wait for their replacement; never one more than wanted.
                prop_assert!(records <= want, "{} records for {} wanted", records, want);
                // Each crashing instance replaced: `crashes + want` instances in all.
                if created.load(std::sync::atomic::Ordering::Relaxed) == crashes + want && c.healthy_of("crashy") == want {
                    break;
                }
            }
            prop_assert_eq!(c.healthy_of("crashy"), want);
            prop_assert_eq!(created.load(std::sync::atomic::Ordering::Relaxed), crashes + want);
            let events = events(&c).await;
            let replaced: Vec<&kat_api::wire::Event> = events.iter().filter(|e| e.reason == "InstanceReplaced").collect();
            prop_assert_eq!(replaced.len(), crashes, "{:#?}", events.iter().map(|e| (e.timestamp.unix_millis(), &e.reason, &e.message)).collect::<Vec<_>>());
            for e in &replaced {
                prop_assert!(e.message.contains(&format!("exited with code {code}")), "{}", e.message);
                prop_assert!(e.message.contains(condition), "{}", e.message);
            }
            let mut ids: Vec<&str> = replaced.iter().filter_map(|e| e.message.split(' ').next()).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), replaced.len(), "an instance replaced twice");
            let mut rounds: Vec<u64> = replaced.iter().map(|e| e.timestamp.unix_millis()).collect();
            rounds.dedup();
            for (n, pair) in rounds.windows(2).enumerate() {
                let gap = Duration::from_millis(pair[1] - pair[0]);
                let min = cfg.replacement_backoff_base.saturating_mul(1 << n).min(cfg.replacement_backoff_cap);
                prop_assert!(gap >= min, "replacement {} came {:?} after the previous one (backoff {:?})", n + 2, gap, min);
            }
            Ok(())
        })?;
    }
}

/// `kat.dws.rip/nodeName` (what a detached node pins its workloads with) matches the node of
/// that name, though no node stores the label.
#[test]
fn a_node_name_selector_matches_that_node_only() {
    let node = |name: &str| SchedNode {
        name: name.parse().unwrap(),
        schedulable: true,
        labels: BTreeMap::new(),
        taints: vec![],
        allocatable: ResourceList {
            cpu_millis: 4000,
            memory_bytes: 8 * GI,
            pids: 0,
        },
        gpus: vec![],
        free_ips: 100,
    };
    let nodes = vec![node("n1"), node("laptop"), node("n3")];
    let loads = vec![NodeLoad::default(); 3];
    let workload = kat_api::WorkloadKey::new("default", "notes");
    let selector = BTreeMap::from([(
        kat_api::wire::NODE_NAME_LABEL.to_string(),
        "laptop".to_string(),
    )]);
    let req = Request {
        workload: &workload,
        requests: ResourceList::default(),
        node_selector: &selector,
        tolerations: &[],
        gpu: None,
        host_ports: &[],
        template_hash: "",
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..20 {
        assert_eq!(
            scheduler::place(&nodes, &loads, &req, &mut rng).ok(),
            Some(1)
        );
    }
    // A label of that name stored on another node does not make it that node.
    let mut impostor = node("n1");
    impostor
        .labels
        .insert(kat_api::wire::NODE_NAME_LABEL.into(), "laptop".into());
    let nodes = vec![impostor, node("laptop")];
    for _ in 0..20 {
        assert_eq!(
            scheduler::place(&nodes, &loads[..2], &req, &mut rng).ok(),
            Some(1)
        );
    }
    let gone = vec![node("n1"), node("n3")];
    assert!(scheduler::place(&gone, &loads[..2], &req, &mut rng).is_err());
}
