//! The supervisor on the fake runtime under tokio's paused clock: restart backoff, MaxCount,
//! health probes, adoption after an agent restart, deletion with its grace period, and a slow
//! pull or a stop that never returns that delays nobody else.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::{Health, InstanceRecord, InstanceState, InstanceStatus};
use kat_api::WorkloadBundle;
use kat_runtime::fake::{Call, FakeRuntime, Run};
use kat_runtime::ContainerRuntime;
use tokio::sync::watch;
use tokio::time::Instant;

use super::assignments::{Assignment, Snapshot, Source};
use super::container_spec::container_id;
use super::{Supervisor, SupervisorConfig};
use kat_runtime::labels::{ATTEMPT as LABEL_ATTEMPT, INSTANCE as LABEL_INSTANCE};

const GRACE: Duration = Duration::from_secs(10);

/// A workload's instance template, parsed from YAML as apply would.
fn assignment(
    workload: &str,
    instance: &str,
    image: &str,
    restart: &str,
    lb: Option<&str>,
) -> Assignment {
    let yaml = format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {workload}}}\nspec:\n  type: Service\n  replicas: 1\n  source: {{image: {image}}}\n  restartPolicy: {restart}\n  container: {{command: [/bin/app]}}\n"
    );
    let mut files = BTreeMap::from([("workload.kat".to_string(), yaml.into_bytes())]);
    if let Some(lb) = lb {
        files.insert(
            "VirtualLoadBalancer.kat".to_string(),
            lb.as_bytes().to_vec(),
        );
    }
    let bundle = WorkloadBundle::parse(files).unwrap_or_else(|e| panic!("{e}"));
    let template = bundle.template().for_instances();
    Assignment {
        record: InstanceRecord {
            instance_id: instance.parse().unwrap(),
            namespace: "default".into(),
            workload: workload.to_string(),
            node: "n1".parse().unwrap(),
            generation: 1,
            spec_hash: template.hash(),
            workload_type: bundle.workload.spec.workload_type,
            requests: Default::default(),
            job_run: None,
            created_at: "2026-11-23T00:00:00Z".parse().unwrap(),
            ip: None,
            host_ports: vec![],
            gpus: vec![],
        },
        template: Ok(Arc::new(template)),
    }
}

const HEALTH: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 8080}]\n  healthCheck:\n    exec: {command: [/bin/check]}\n    initialDelaySeconds: 2\n    periodSeconds: 5\n    failureThreshold: 2\n";

struct Node {
    runtime: Arc<FakeRuntime>,
    published: watch::Receiver<Vec<crate::network::PublishedPort>>,
    feed: watch::Sender<Option<(Source, Snapshot)>>,
    statuses: watch::Receiver<super::Statuses>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(runtime: Arc<FakeRuntime>, snapshot: &[Assignment]) -> Node {
    let (published_tx, published) = watch::channel(Vec::new());
    let config = SupervisorConfig {
        node: "n1".parse().unwrap(),
        volume_base: std::env::temp_dir().join("kat-fake-volumes"),
        host_mounts: Default::default(),
        stop_grace: GRACE,
        pids_limit: 1024,
        network: watch::channel(Some(crate::network::NetworkSettings {
            gateway: "10.100.0.1".parse().unwrap(),
            domain: "cluster.local".into(),
        }))
        .1,
        published: published_tx,
        builds: super::builds::Builds::new(std::env::temp_dir().join("kat-fake-build-logs")),
        gpus: Default::default(),
    };
    let (status_tx, statuses) = watch::channel(None);
    let (feed, feed_rx) = watch::channel(Some((Source::Store, snap(snapshot))));
    let rt: Arc<dyn ContainerRuntime> = runtime.clone();
    let task = tokio::spawn(Supervisor::new(config, rt, status_tx).run(feed_rx));
    Node {
        runtime,
        published,
        feed,
        statuses,
        task,
    }
}

fn snap(list: &[Assignment]) -> Snapshot {
    list.iter()
        .map(|a| (a.record.instance_id.clone(), a.clone()))
        .collect()
}

impl Node {
    fn status(&self, instance: &str) -> Option<InstanceStatus> {
        self.statuses
            .borrow()
            .iter()
            .flatten()
            .find(|s| s.instance_id == instance)
            .cloned()
    }

    /// Advance the paused clock until `cond` holds (checked every 100 ms), at most `limit`.
    async fn until(&self, limit: Duration, mut cond: impl FnMut(&Node) -> bool) -> Duration {
        let started = Instant::now();
        while !cond(self) {
            assert!(
                started.elapsed() < limit,
                "not within {limit:?}: {:#?}",
                self.statuses.borrow()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        started.elapsed()
    }

    fn creates(&self, instance: &str) -> Vec<Instant> {
        self.runtime
            .journal()
            .into_iter()
            .filter_map(|(at, c)| match c {
                Call::Create(id) if id.starts_with(instance) => Some(at),
                _ => None,
            })
            .collect()
    }
}

/// A node running one instance, `web-1` (restart Always), on `rt`.
async fn web_1_running(rt: &Arc<FakeRuntime>) -> Node {
    let a = assignment("web", "web-1", "app:1", "{condition: Always}", None);
    let node = start(rt.clone(), &[a]);
    node.until(
        Duration::from_secs(10),
        state_is("web-1", InstanceState::Running),
    )
    .await;
    node
}

fn state_is(instance: &'static str, state: InstanceState) -> impl FnMut(&Node) -> bool {
    move |n| n.status(instance).is_some_and(|s| s.state == state)
}

fn runtime_with(
    run: impl Fn(&kat_runtime::CreateOptions) -> Run + Send + Sync + 'static,
) -> Arc<FakeRuntime> {
    let rt = FakeRuntime::new(run, |_| 0);
    rt.add_image("app:1");
    rt
}

/// The waits between an exit (each run lasts `run` seconds) and the next create double from
/// 0.5 s; each may be `early` seconds shorter and `late` seconds longer.
fn check_restart_waits(creates: &[Instant], run: f64, early: f64, late: f64) {
    let waits: Vec<f64> = creates
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() - run)
        .collect();
    for (i, wait) in waits.iter().enumerate() {
        let backoff = 0.5 * f64::from(1u32 << i);
        assert!(
            *wait >= backoff - early && *wait <= backoff + late,
            "wait {i} was {wait:.2} s, expected {backoff} s (-{early}/+{late}): {waits:?}"
        );
    }
}

/// `crash-1` of workload `crash` on `app:1`, restarted always.
fn crash_1() -> Assignment {
    assignment("crash", "crash-1", "app:1", "{condition: Always}", None)
}

#[tokio::test(start_paused = true)]
async fn a_crashing_instance_restarts_with_a_doubling_backoff() {
    let rt = runtime_with(|_| Run::exits(Duration::from_secs(1), 1));
    let node = start(rt, &[crash_1()]);
    node.until(Duration::from_secs(120), |n| {
        n.creates("crash-1").len() >= 6
    })
    .await;
    // Each run lasts 1 s; the waits between an exit and the next create double from 0.5 s
    // (the supervisor notices an exit within its 1 s poll).
    check_restart_waits(&node.creates("crash-1"), 1.0, 0.01, 1.2);
    let status = node.status("crash-1").unwrap();
    assert!(status.restarts >= 5, "{status:?}");
}

#[tokio::test(start_paused = true)]
async fn exits_the_runtime_tells_are_seen_at_once_and_adopted_ones_within_the_poll() {
    // Runs of 1.3 s: a 1 s poll would see each exit 0.7 s late.
    let rt = runtime_with(|_| Run::exits(Duration::from_millis(1300), 1));
    rt.tell_exits();
    let node = start(rt, &[crash_1()]);
    node.until(Duration::from_secs(60), |n| n.creates("crash-1").len() >= 4)
        .await;
    check_restart_waits(&node.creates("crash-1"), 1.3, 0.05, 0.05);

    // A container an earlier agent started is no child of this runtime: no notice comes
    // for it, so it is still looked at every second.
    let rt = runtime_with(|_| Run::exits(Duration::from_millis(4300), 1));
    rt.tell_exits();
    rt.add_running(kat_runtime::CreateOptions {
        id: container_id("old-1", 0),
        namespace: "default".into(),
        workload: "old".into(),
        image: "app:1".into(),
        labels: BTreeMap::from([
            (LABEL_INSTANCE.to_string(), "old-1".to_string()),
            (LABEL_ATTEMPT.to_string(), "0".to_string()),
        ]),
        ..Default::default()
    });
    let begin = Instant::now();
    let node = start(
        rt,
        &[assignment(
            "old",
            "old-1",
            "app:1",
            "{condition: Always}",
            None,
        )],
    );
    node.until(Duration::from_secs(30), |n| !n.creates("old-1").is_empty())
        .await;
    let restarted = node.creates("old-1")[0] - begin;
    // Exit at 4.3 s, seen by a poll within a second, then the 0.5 s backoff.
    assert!(
        restarted >= Duration::from_millis(4800) && restarted <= Duration::from_millis(5900),
        "{restarted:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn max_count_ends_failed_after_its_restarts() {
    let rt = runtime_with(|_| Run::exits(Duration::from_secs(1), 3));
    let node = start(
        rt,
        &[assignment(
            "few",
            "few-1",
            "app:1",
            "{condition: MaxCount, maxRestarts: 2}",
            None,
        )],
    );
    node.until(
        Duration::from_secs(60),
        state_is("few-1", InstanceState::Failed),
    )
    .await;
    // A first run and two restarts, then no more.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(node.creates("few-1").len(), 3);
    let status = node.status("few-1").unwrap();
    assert_eq!(status.restarts, 2);
    assert_eq!(status.exit_code, Some(3));
}

#[tokio::test(start_paused = true)]
async fn probes_make_an_instance_healthy_then_unhealthy() {
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe_result = healthy.clone();
    let rt = FakeRuntime::new(
        |_| Run::forever(),
        move |_| {
            if probe_result.load(std::sync::atomic::Ordering::SeqCst) {
                0
            } else {
                1
            }
        },
    );
    rt.add_image("app:1");
    let node = start(
        rt,
        &[assignment(
            "web",
            "web-1",
            "app:1",
            "{condition: Always}",
            Some(HEALTH),
        )],
    );
    let took = node
        .until(Duration::from_secs(30), |n| {
            n.status("web-1")
                .is_some_and(|s| s.health == Health::Healthy)
        })
        .await;
    assert!(
        took >= Duration::from_secs(2),
        "healthy before the initial delay: {took:?}"
    );
    healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    let took = node
        .until(Duration::from_secs(30), |n| {
            n.status("web-1")
                .is_some_and(|s| s.health == Health::Unhealthy)
        })
        .await;
    // Two failures, five seconds apart.
    assert!(
        took >= Duration::from_secs(5) && took <= Duration::from_secs(11),
        "{took:?}"
    );
    // Health does not restart the container.
    assert_eq!(node.creates("web-1").len(), 1);
}

/// `healthCheck.onFailure: restart`: an instance that turns Unhealthy is stopped and started
/// again with the restart backoff, even under `restartPolicy: Never`, and is never reported
/// ended for it.
#[tokio::test(start_paused = true)]
async fn on_failure_restart_restarts_an_unhealthy_instance_with_backoff() {
    let rt = FakeRuntime::new(|_| Run::forever(), |_| 1);
    rt.add_image("app:1");
    let lb = format!("{HEALTH}    onFailure: restart\n");
    let node = start(
        rt,
        &[assignment(
            "hung",
            "hung-1",
            "app:1",
            "{condition: Never}",
            Some(&lb),
        )],
    );
    let mut seen_reason = false;
    node.until(Duration::from_secs(120), |n| {
        seen_reason |= n.status("hung-1").is_some_and(|s| {
            s.reason
                .as_deref()
                .is_some_and(|r| r.contains("onFailure: restart"))
        });
        n.creates("hung-1").len() >= 4
    })
    .await;
    assert!(seen_reason, "the status says why it restarted");
    let creates = node.creates("hung-1");
    let gaps: Vec<Duration> = creates.windows(2).map(|w| w[1] - w[0]).collect();
    // Unhealthy 7 s after a start (2 s delay, two failures 5 s apart), then the backoff.
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_secs(7)),
        "{gaps:?}"
    );
    assert!(gaps[2] > gaps[0], "the backoff grows: {gaps:?}");
    let status = node.status("hung-1").unwrap();
    assert!(status.restarts >= 3, "{status:?}");
    assert!(
        !matches!(
            status.state,
            InstanceState::Failed | InstanceState::Succeeded
        ),
        "{status:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_running_containers_instead_of_duplicating_them() {
    let rt = runtime_with(|_| Run::forever());
    let a = assignment("web", "web-1", "app:1", "{condition: Always}", None);
    // What an earlier agent left: attempt 3 running, attempts 2 (kept for its logs) and 0.
    for attempt in [0u32, 2, 3] {
        rt.add_running(kat_runtime::CreateOptions {
            id: container_id("web-1", attempt),
            namespace: "default".into(),
            workload: "web".into(),
            image: "app:1".into(),
            labels: BTreeMap::from([
                (LABEL_INSTANCE.to_string(), "web-1".to_string()),
                (LABEL_ATTEMPT.to_string(), attempt.to_string()),
            ]),
            ..Default::default()
        });
    }
    let node = start(rt.clone(), &[a]);
    node.until(
        Duration::from_secs(10),
        state_is("web-1", InstanceState::Running),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        node.creates("web-1").is_empty(),
        "adopted, not created: {:?}",
        rt.journal()
    );
    assert_eq!(node.status("web-1").unwrap().restarts, 3);
    // Only the stale attempt 0 went; 3 runs, 2 keeps its logs.
    assert_eq!(
        rt.containers(),
        vec![container_id("web-1", 2), container_id("web-1", 3)]
    );
    // A container of an instance no longer assigned here is removed once the store answers.
    let rt2 = runtime_with(|_| Run::forever());
    rt2.add_running(kat_runtime::CreateOptions {
        id: container_id("gone-1", 0),
        labels: BTreeMap::from([(LABEL_INSTANCE.to_string(), "gone-1".to_string())]),
        ..Default::default()
    });
    let node2 = start(rt2.clone(), &[]);
    node2
        .until(Duration::from_secs(10), |_| rt2.containers().is_empty())
        .await;
    // A container whose instance label is no instance id (made by hand, or tampered with):
    // no assignment can ever name it, so it goes too, and nothing else is touched.
    let rt3 = runtime_with(|_| Run::forever());
    for (id, label) in [("stray-0", "../../etc"), ("kept-1-0", "kept-1")] {
        rt3.add_running(kat_runtime::CreateOptions {
            id: id.into(),
            labels: BTreeMap::from([(LABEL_INSTANCE.to_string(), label.to_string())]),
            ..Default::default()
        });
    }
    let kept = assignment("kept", "kept-1", "app:1", "{condition: Always}", None);
    let node3 = start(rt3.clone(), &[kept]);
    node3
        .until(Duration::from_secs(10), |_| {
            rt3.containers() == vec!["kept-1-0".to_string()]
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_instance_gets_its_grace_period_then_goes() {
    let rt = runtime_with(|_| Run {
        stops_on_term: false,
        ..Run::forever()
    });
    let node = web_1_running(&rt).await;
    let deleted = Instant::now();
    node.feed
        .send(Some((Source::Store, Snapshot::new())))
        .unwrap();
    node.until(
        Duration::from_secs(5),
        state_is("web-1", InstanceState::Stopping),
    )
    .await;
    node.until(Duration::from_secs(30), |n| n.status("web-1").is_none())
        .await;
    let gone = Instant::now() - deleted;
    // It drains (drainSeconds, 5 by default), then gets SIGTERM and the grace period.
    let drain = Duration::from_secs(u64::from(kat_api::workload::DEFAULT_DRAIN_SECONDS));
    assert!(
        gone >= drain + GRACE && gone < drain + GRACE + Duration::from_secs(2),
        "a container that ignores SIGTERM is killed after the grace period: {gone:?}"
    );
    assert!(rt.journal().iter().any(|(_, c)| *c
        == Call::Stop {
            id: container_id("web-1", 0),
            grace: GRACE
        }));
    assert!(rt.containers().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_slow_pull_delays_no_other_instance() {
    let rt = runtime_with(|o| {
        if o.workload == "crash" {
            Run::exits(Duration::from_secs(1), 1)
        } else {
            Run::forever()
        }
    });
    rt.set_pull_time("slow:1", Duration::from_secs(3600));
    let node = start(
        rt.clone(),
        &[
            assignment("big", "big-1", "slow:1", "{condition: Always}", None),
            assignment("web", "web-1", "app:1", "{condition: Always}", None),
            crash_1(),
        ],
    );
    node.until(
        Duration::from_secs(5),
        state_is("web-1", InstanceState::Running),
    )
    .await;
    node.until(Duration::from_secs(20), |n| n.creates("crash-1").len() >= 4)
        .await;
    let big = node.status("big-1").unwrap();
    assert_eq!(big.state, InstanceState::Pending);
    // The pull's progress, as the runtime reported it, in the status and its reason.
    let pull = big.pull.expect("the pull's progress");
    // 1.5 MiB arrived; the status moves in steps of 1 MiB (a twentieth, at least 1 MiB).
    assert_eq!(
        (
            pull.layers,
            pull.layers_done,
            pull.bytes_total,
            pull.bytes_done
        ),
        (2, 1, 2 << 20, 1 << 20)
    );
    assert!(
        big.reason
            .unwrap_or_default()
            .ends_with("slow:1: 1 of 2 layers, 1.0 of 2.0 MiB"),
        "{:?}",
        pull.summary()
    );
    // The pull ends an hour later and the instance starts then.
    node.until(
        Duration::from_secs(3700),
        state_is("big-1", InstanceState::Running),
    )
    .await;
    assert_eq!(
        node.status("big-1").unwrap().pull,
        None,
        "no pull once it runs"
    );
    let pulls = rt
        .journal()
        .iter()
        .filter(|(_, c)| matches!(c, Call::Pull(r) if r == "slow:1"))
        .count();
    assert_eq!(pulls, 1, "one pull, not one per retry");
}

#[tokio::test(start_paused = true)]
async fn running_instances_report_what_their_cgroups_use() {
    let rt = runtime_with(|_| Run {
        cpu_millis: 250,
        memory_bytes: 64 << 20,
        pids: 3,
        ..Run::forever()
    });
    let node = web_1_running(&rt).await;
    let mut meter = crate::usage::UsageMeter::new(rt.clone(), std::env::temp_dir());
    let mut first = node.statuses.borrow().clone().unwrap_or_default();
    meter.measure(&mut first).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut statuses = node.statuses.borrow().clone().unwrap_or_default();
    let host = meter.measure(&mut statuses).await;
    let usage = statuses[0].usage.expect("a running instance has a usage");
    // A quarter of a core over the 5 s between the readings.
    assert_eq!(usage.cpu_millis, 250);
    assert_eq!((usage.memory_bytes, usage.pids), (64 << 20, 3));
    assert!(host.memory_bytes > 0 && host.pids > 0, "{host:?}");
    assert!(host.disk_bytes.is_some() && host.disk_total_bytes.is_some());
    // An instance that is not running reports none.
    let mut stopped = statuses.clone();
    stopped[0].state = InstanceState::Failed;
    meter.measure(&mut stopped).await;
    assert_eq!(stopped[0].usage, None);
}

/// A published port takes connections only once its instance is healthy, and an instance
/// that is deleted leaves the published ports at once but gets SIGTERM only after its
/// `drainSeconds`.
#[tokio::test(start_paused = true)]
async fn only_ready_instances_are_published_and_a_leaving_one_drains_first() {
    let rt = FakeRuntime::new(|_| Run::forever(), |_| 0);
    rt.add_image("app:1");
    let lb = "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 8080, hostPort: 18080}]\n  healthCheck:\n    exec: {command: [/bin/check]}\n    initialDelaySeconds: 2\n    periodSeconds: 5\n";
    let mut a = assignment("web", "web-1", "app:1", "{condition: Always}", Some(lb));
    a.record.ip = Some([10, 100, 0, 5].into());
    let mut template = (**a.template.as_ref().unwrap()).clone();
    template.workload.spec.drain_seconds = Some(3);
    a.template = Ok(Arc::new(template));
    let node = start(rt.clone(), &[a]);
    node.until(
        Duration::from_secs(10),
        state_is("web-1", InstanceState::Running),
    )
    .await;
    assert!(
        node.published.borrow().is_empty(),
        "published while running but not yet healthy"
    );
    node.until(Duration::from_secs(10), |n| {
        n.status("web-1")
            .is_some_and(|s| s.health == Health::Healthy)
    })
    .await;
    node.until(Duration::from_secs(1), |n| !n.published.borrow().is_empty())
        .await;
    assert_eq!(
        node.published.borrow()[0].address,
        "10.100.0.5".parse::<std::net::Ipv4Addr>().unwrap()
    );

    let deleted = Instant::now();
    node.feed
        .send(Some((Source::Store, Snapshot::new())))
        .unwrap();
    node.until(Duration::from_secs(1), |n| n.published.borrow().is_empty())
        .await;
    assert!(Instant::now() - deleted < Duration::from_millis(500));
    node.until(Duration::from_secs(10), |_| {
        rt.journal()
            .iter()
            .any(|(_, c)| matches!(c, Call::Stop { .. }))
    })
    .await;
    let stopped = rt
        .journal()
        .into_iter()
        .find_map(|(at, c)| matches!(c, Call::Stop { .. }).then_some(at))
        .unwrap();
    let after = stopped - deleted;
    assert!(
        after >= Duration::from_secs(3) && after < Duration::from_secs(4),
        "SIGTERM {after:?} after the deletion, not after the 3 s drain"
    );
}

/// A stop that never returns (a hung kernel call, a stuck disk) holds only its own
/// instance: the node's statuses (what its heartbeats carry) keep being published, the
/// other instance keeps running, and a new one is created and started meanwhile.
#[tokio::test(start_paused = true)]
async fn a_stop_that_never_returns_delays_no_other_instance() {
    let rt = runtime_with(|_| Run::forever());
    rt.stick_stops_of("stuck");
    let stuck = assignment("stuck", "stuck-1", "app:1", "{condition: Always}", None);
    let web = assignment("web", "web-1", "app:1", "{condition: Always}", None);
    let node = start(rt.clone(), &[stuck.clone(), web.clone()]);
    for id in ["stuck-1", "web-1"] {
        node.until(
            Duration::from_secs(10),
            state_is(id, InstanceState::Running),
        )
        .await;
    }
    // stuck-1 is deleted: its stop hangs for good.
    node.feed
        .send(Some((Source::Store, snap(std::slice::from_ref(&web)))))
        .unwrap();
    let drain = Duration::from_secs(u64::from(kat_api::workload::DEFAULT_DRAIN_SECONDS));
    node.until(drain + Duration::from_secs(5), |_| {
        rt.journal()
            .iter()
            .any(|(_, c)| matches!(c, Call::Stop { id, .. } if id.starts_with("stuck-1")))
    })
    .await;
    // Meanwhile a new instance comes and starts, and statuses keep flowing.
    let mut statuses = node.statuses.clone();
    statuses.borrow_and_update();
    let api = assignment("api", "api-1", "app:1", "{condition: Always}", None);
    node.feed
        .send(Some((Source::Store, snap(&[web, api]))))
        .unwrap();
    node.until(
        Duration::from_secs(10),
        state_is("api-1", InstanceState::Running),
    )
    .await;
    assert!(
        statuses.has_changed().unwrap_or(false),
        "statuses were published while a stop hung"
    );
    assert_eq!(
        node.status("web-1").map(|s| s.state),
        Some(InstanceState::Running)
    );
    // Ten minutes on, the stop still hangs and nothing else is held up.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        node.status("api-1").map(|s| s.state),
        Some(InstanceState::Running)
    );
    assert!(
        rt.containers().iter().any(|c| c.starts_with("stuck-1")),
        "the stuck container is still there"
    );
}

#[tokio::test(start_paused = true)]
async fn replicas_are_created_side_by_side() {
    let rt = runtime_with(|_| Run::forever());
    rt.set_create_time(Duration::from_secs(1));
    let node = start(
        rt.clone(),
        &[
            assignment("web", "web-1", "app:1", "{condition: Always}", None),
            assignment("web", "web-2", "app:1", "{condition: Always}", None),
            assignment("web", "web-3", "app:1", "{condition: Always}", None),
        ],
    );
    // One after another, three creates of a second each would take three seconds.
    let took = node
        .until(Duration::from_millis(1500), |n| {
            ["web-1", "web-2", "web-3"].iter().all(|i| {
                n.status(i)
                    .is_some_and(|s| s.state == InstanceState::Running)
            })
        })
        .await;
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let begun: Vec<Instant> = ["web-1", "web-2", "web-3"]
        .iter()
        .flat_map(|i| node.creates(i))
        .collect();
    assert_eq!(begun.len(), 3, "one create each");
    assert!(
        begun.iter().all(|at| *at == begun[0]),
        "all three begun at once: {begun:?}"
    );
}

/// A workload stored before validation refused the name (or written around it) that names
/// another workload's git build, `kat-local/team_app:…`, present in the node's store: it is
/// never created, and its reason says what to change.
#[tokio::test(start_paused = true)]
async fn another_workloads_local_build_is_never_run() {
    let rt = runtime_with(|_| Run::forever());
    let stolen = "kat-local/team_app:abc1234";
    rt.add_image(stolen);
    let mut a = assignment("thief", "thief-1", "app:1", "{condition: Never}", None);
    let mut template = (**a.template.as_ref().unwrap()).clone();
    template.workload.spec.source.image = Some(stolen.into());
    a.template = Ok(Arc::new(template));
    let node = start(rt.clone(), &[a]);
    node.until(Duration::from_secs(10), |n| {
        n.status("thief-1")
            .and_then(|s| s.reason)
            .is_some_and(|r| r.contains("built for another workload"))
    })
    .await;
    assert!(node.creates("thief-1").is_empty(), "nothing was created");
}

/// A workload stored before `mountPath: /.kat` was refused at apply is kept Pending with a
/// reason that says what to change, and never created.
#[tokio::test(start_paused = true)]
async fn a_stored_mount_at_the_kat_directory_stays_pending() {
    let rt = runtime_with(|_| Run::forever());
    let mut a = assignment("old", "old-1", "app:1", "{condition: Always}", None);
    let mut template = (**a.template.as_ref().unwrap()).clone();
    let spec = &mut template.workload.spec;
    spec.volumes.push(
        serde_json::from_value(serde_json::json!({"name": "hide", "simpleClusterStorage": {}}))
            .unwrap(),
    );
    spec.container.volume_mounts.push(
        serde_json::from_value(serde_json::json!({"name": "hide", "mountPath": "/.kat"})).unwrap(),
    );
    a.template = Ok(Arc::new(template));
    let node = start(rt.clone(), &[a]);
    node.until(Duration::from_secs(10), |n| {
        n.status("old-1").is_some_and(|s| {
            s.state == InstanceState::Pending
                && s.reason.as_deref().is_some_and(|r| {
                    r.contains("mountPath /.kat") && r.contains("another mountPath")
                })
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(node.creates("old-1").is_empty(), "never created");
    assert_eq!(node.status("old-1").unwrap().state, InstanceState::Pending);
}
