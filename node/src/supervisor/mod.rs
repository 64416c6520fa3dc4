//! The node supervisor: converges this node's containers on its assignments.
//!
//! One loop owns every decision about local containers, so there is no locking between
//! them. It wakes on a new assignment snapshot, on a health-probe result, at the next due
//! restart or probe, and at an exit the runtime tells (else once a second to notice exits;
//! every 10 s when it tells every exit). For each assigned instance it makes
//! the image and volumes ready, creates and starts the container, follows it, applies the
//! restart policy and runs health probes; for each container no longer assigned it stops it
//! with the grace period (SIGTERM, then SIGKILL) and removes it. Statuses go to the heartbeat.
//!
//! Containers carry their instance id and attempt number as labels. After an agent restart
//! the supervisor waits for the first snapshot, adopts the containers of assigned instances
//! (the newest attempt, with its restart count) and removes the rest: a restarted agent
//! neither duplicates nor loses a running container.
//!
//! Long because it is the one `Supervisor` loop and its steps (assign, start, follow, probe,
//! publish), which all read and change the private `Tracked` entries and their `Phase`; what
//! needs none of that state is in the submodules (restart, health, volumes, builds, ...).

pub mod assignments;
pub mod builds;
pub mod container_spec;
pub mod health;
mod pulls;
pub mod restart;
#[cfg(test)]
mod tests;
pub mod volumes;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kat_api::wire::{Health, InstanceId, InstanceState, InstanceStatus, PullStatus, Timestamp};
use kat_api::workload::WorkloadType;
use kat_api::Template;
use kat_runtime::{ContainerRuntime, ContainerState, ContainerStatus, ExecOptions, RuntimeError};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use assignments::{Assignment, Snapshot, Source};
use container_spec::{
    apply_gpu_edits, connect_options, container_id, create_options, published_ports,
};

use crate::network::{NetworkSettings, PublishedPort};
use health::HealthTracker;
use kat_api::load_balancer::HealthFailureAction;
use pulls::{PullState, Pulls};
use restart::{Decision, Exit, RestartTracker};

/// At most this many containers are created at once: creating one is mostly waiting for
/// its helper processes, and a burst (a Service of 10 replicas) should not take every core.
const PARALLEL_CREATES: usize = 4;
/// How often running containers are checked for exits the runtime does not tell (a
/// container adopted from an earlier agent), and while stops are under way.
const POLL: Duration = Duration::from_secs(1);
/// How often they are checked when the runtime tells every exit
/// ([`ContainerRuntime::exits`]): an idle node does not read every container's state each
/// second, and a lost notice still shows within this.
const RECHECK: Duration = Duration::from_secs(10);
/// Wait between attempts to get an image or volume ready.
const PREPARE_RETRY: Duration = Duration::from_secs(2);
/// How often an instance waiting for its image looks at the pull again (its status shows
/// the progress, `katcall apply --wait` draws it).
const PULL_PROGRESS: Duration = Duration::from_millis(500);

/// What the supervisor says runs here: `None` until it has had its first snapshot and
/// looked at this node's containers (the heartbeat waits for it).
pub type Statuses = Option<Vec<InstanceStatus>>;

/// How the supervisor runs this node's instances.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// This node's name.
    pub node: kat_api::wire::NodeName,
    /// Where `simpleClusterStorage` volumes are kept (`volumeBasePath`).
    pub volume_base: PathBuf,
    /// Which host paths `hostMount` volumes may use on this node.
    pub host_mounts: kat_api::host_paths::HostMountPolicy,
    /// SIGTERM, then SIGKILL after this long, when an instance goes.
    pub stop_grace: Duration,
    /// Most processes one container may have (`pids.max`): a fork bomb stops there.
    pub pids_limit: u64,
    /// The node network's gateway and domain once it is up; instances with an address wait
    /// for it.
    pub network: watch::Receiver<Option<NetworkSettings>>,
    /// Where the ports running instances publish (`hostPort`) are announced.
    pub published: watch::Sender<Vec<PublishedPort>>,
    /// Builds of `source.git` images (shared with heartbeats and `logs --build`).
    pub builds: builds::Builds,
    /// The node's GPUs and their CDI specifications.
    pub gpus: kat_runtime::gpus::Gpus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Create the next attempt's container at this time.
    Start(Instant),
    Running,
    Finished,
}

/// How long past the stop grace a stop for health may take before it is sent again.
const UNHEALTHY_STOP_SLACK: Duration = Duration::from_secs(5);

struct Tracked {
    assignment: Assignment,
    template: Result<Arc<Template>, String>,
    attempt: u32,
    phase: Phase,
    restart: RestartTracker,
    health: Option<HealthTracker>,
    /// The running container is being stopped (since then) for failing its health check
    /// (`healthCheck.onFailure: restart`): its exit is a restart, whatever the policy.
    unhealthy_stop: Option<Instant>,
    started: Option<Instant>,
    status: InstanceStatus,
}

impl Tracked {
    fn new(assignment: Assignment, node: &kat_api::wire::NodeName) -> Self {
        let template = assignment.template.clone();
        let record = &assignment.record;
        let restart = match &template {
            Ok(b) => RestartTracker::new(
                &b.workload.spec.restart_policy,
                record.workload_type == WorkloadType::Job,
            ),
            Err(_) => RestartTracker::new(
                &kat_api::workload::RestartPolicy {
                    condition: kat_api::workload::RestartCondition::Never,
                    max_restarts: None,
                    reset_seconds: None,
                },
                true,
            ),
        };
        let status = InstanceStatus {
            node: Some(node.clone()),
            gpus: record.gpus.clone(),
            ..InstanceStatus::of(record, InstanceState::Pending)
        };
        Tracked {
            assignment,
            template,
            attempt: 0,
            phase: Phase::Start(Instant::now()),
            restart,
            health: None,
            unhealthy_stop: None,
            started: None,
            status,
        }
    }

    fn container(&self) -> String {
        container_id(&self.assignment.record.instance_id, self.attempt)
    }

    fn health_check(&self) -> Option<&kat_api::load_balancer::HealthCheck> {
        let b = self.template.as_ref().ok()?;
        b.load_balancer.as_ref()?.spec.health_check.as_ref()
    }
}

/// Why a container could not be made.
pub(super) enum StartError {
    /// Try again later without counting a restart (image or volume not ready).
    NotReady(String),
    /// Try again later: its image is being pulled, this far.
    Pulling(PullStatus),
    /// Counts as a failed run (bad spec, missing executable, impossible limits…).
    Failed(String),
}

/// Converges this node's containers on its assignments; [`Supervisor::run`] is its loop.
pub struct Supervisor {
    config: SupervisorConfig,
    runtime: Arc<dyn ContainerRuntime>,
    tracked: BTreeMap<InstanceId, Tracked>,
    /// Containers found at start-up, by instance id: (attempt, container id) newest first.
    adoptable: Option<HashMap<InstanceId, Vec<(u32, String)>>>,
    stopping: HashMap<String, (InstanceStatus, JoinHandle<()>)>,
    images: HashSet<String>,
    /// Pulls under way, by normalized reference.
    pulls: Pulls,
    probes_tx: mpsc::Sender<(String, u32, bool)>,
    probes_rx: mpsc::Receiver<(String, u32, bool)>,
    statuses: watch::Sender<Statuses>,
    source: Option<Source>,
    stop_seq: u64,
    /// The runtime's exit notices, if it gives them.
    exits: Option<watch::Receiver<u64>>,
}

/// Resolves at the runtime's next exit notice: true, or false once it gives none any more.
async fn next_exit(exits: &mut Option<watch::Receiver<u64>>) -> bool {
    match exits {
        Some(exits) => exits.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// Stops (`grace` before SIGKILL) and removes each of `containers`; one already gone is no
/// error, others are logged.
async fn stop_and_remove(runtime: &dyn ContainerRuntime, containers: Vec<String>, grace: Duration) {
    for c in containers {
        match runtime.stop(&c, grace).await {
            Ok(_) | Err(RuntimeError::ContainerNotFound(_)) => {}
            Err(e) => tracing::warn!(container = %c, error = %e, "stop failed"),
        }
        match runtime.remove(&c, true).await {
            Ok(()) | Err(RuntimeError::ContainerNotFound(_)) => {}
            Err(e) => tracing::warn!(container = %c, error = %e, "remove failed"),
        }
    }
}

impl Supervisor {
    /// A supervisor of `runtime`'s containers, publishing what runs here on `statuses`.
    pub fn new(
        config: SupervisorConfig,
        runtime: Arc<dyn ContainerRuntime>,
        statuses: watch::Sender<Statuses>,
    ) -> Self {
        let (probes_tx, probes_rx) = mpsc::channel(64);
        let exits = runtime.exits();
        Supervisor {
            exits,
            config,
            runtime,
            tracked: BTreeMap::new(),
            adoptable: None,
            stopping: HashMap::new(),
            images: HashSet::new(),
            pulls: Pulls::default(),
            probes_tx,
            probes_rx,
            statuses,
            source: None,
            stop_seq: 0,
        }
    }

    /// Run until the assignment feed ends.
    pub async fn run(mut self, mut feed: watch::Receiver<Option<(Source, Snapshot)>>) {
        self.adoptable = Some(self.scan().await);
        loop {
            let update = feed.borrow_and_update().clone();
            if let Some((source, snapshot)) = update {
                self.assign(source, snapshot);
            }
            if self.source.is_some() {
                self.converge().await;
            }
            self.publish();
            let wake = self.next_wake();
            tokio::select! {
                changed = feed.changed() => if changed.is_err() { return },
                Some((id, attempt, ok)) = self.probes_rx.recv() => self.on_probe(&id, attempt, ok),
                told = next_exit(&mut self.exits) => if !told { self.exits = None },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Containers on this node by instance, newest attempt first.
    async fn scan(&self) -> HashMap<InstanceId, Vec<(u32, String)>> {
        let mut found: HashMap<InstanceId, Vec<(u32, String)>> = HashMap::new();
        let mut strays = Vec::new();
        match self.runtime.list().await {
            Ok(containers) => {
                for c in containers {
                    let Some(label) = c.labels.get(kat_runtime::labels::INSTANCE) else {
                        continue;
                    };
                    let Ok(instance) = InstanceId::parse(label.as_str()) else {
                        // No assignment can ever name it: it goes, as unassigned ones do.
                        tracing::warn!(container = %c.id, label, "removing a container whose instance label is not an instance id");
                        strays.push(c.id);
                        continue;
                    };
                    let attempt = kat_runtime::labels::attempt(&c.labels);
                    found.entry(instance).or_default().push((attempt, c.id));
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list existing containers"),
        }
        if !strays.is_empty() {
            let (runtime, grace) = (self.runtime.clone(), self.config.stop_grace);
            tokio::spawn(async move { stop_and_remove(&*runtime, strays, grace).await });
        }
        for list in found.values_mut() {
            list.sort_by_key(|a| std::cmp::Reverse(a.0));
        }
        found
    }

    fn assign(&mut self, source: Source, snapshot: Snapshot) {
        self.source = Some(source);
        let gone: Vec<InstanceId> = self
            .tracked
            .keys()
            .filter(|id| !snapshot.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(t) = self.tracked.remove(&id) {
                let mut ids = vec![t.container()];
                if t.attempt > 0 {
                    ids.push(container_id(&id, t.attempt - 1));
                }
                // A running instance drains: it has left the published ports (it is no
                // longer tracked) and DNS (its record is gone), and keeps serving
                // `drainSeconds` before SIGTERM.
                let drain = match (&t.template, t.phase) {
                    (Ok(template), Phase::Running) => template.workload.spec.drain(),
                    _ => Duration::ZERO,
                };
                self.stop_later(t.status, ids, drain);
            }
        }
        for (id, assignment) in snapshot {
            if let Some(t) = self.tracked.get_mut(&id) {
                // Records are immutable per instance; only a re-created one would differ.
                if t.assignment.record == assignment.record {
                    continue;
                }
            }
            let mut t = Tracked::new(assignment, &self.config.node);
            if let Some(found) = self.adoptable.as_mut().and_then(|a| a.remove(&id)) {
                if let Some((attempt, _)) = found.first() {
                    t.attempt = *attempt;
                    t.restart = t.restart.resume(*attempt);
                    t.status.restarts = *attempt;
                    t.phase = Phase::Running;
                    t.started = Some(Instant::now());
                    if let Some(check) = t.health_check() {
                        t.health = Some(HealthTracker::new(check, Instant::now()));
                    }
                    tracing::info!(instance = %id, attempt, "adopted a running container");
                }
                let stale: Vec<String> = found.iter().skip(2).map(|(_, c)| c.clone()).collect();
                if !stale.is_empty() {
                    self.stop_later(t.status.clone(), stale, Duration::ZERO);
                }
            }
            self.tracked.insert(id, t);
        }
        // Containers of instances no longer assigned to this node go.
        if source == Source::Store {
            if let Some(adoptable) = self.adoptable.take() {
                for (id, found) in adoptable {
                    tracing::info!(instance = %id, "removing a container whose instance is no longer assigned here");
                    let status = InstanceStatus {
                        node: Some(self.config.node.clone()),
                        reason: Some("no longer assigned to this node".into()),
                        ..InstanceStatus::new(
                            id.clone(),
                            String::new(),
                            String::new(),
                            0,
                            InstanceState::Stopping,
                        )
                    };
                    self.stop_later(
                        status,
                        found.into_iter().map(|(_, c)| c).collect(),
                        Duration::ZERO,
                    );
                }
            }
        }
    }

    /// After `drain`, stop (with the grace period) and remove `containers` in the
    /// background.
    fn stop_later(&mut self, mut status: InstanceStatus, containers: Vec<String>, drain: Duration) {
        let runtime = self.runtime.clone();
        let grace = self.config.stop_grace;
        let id = status.instance_id.clone();
        status.state = InstanceState::Stopping;
        if !drain.is_zero() {
            tracing::info!(instance = %id, drain_ms = drain.as_millis() as u64, "draining before stop");
            status.reason = Some(format!(
                "draining for {} s before it is stopped",
                drain.as_secs()
            ));
        }
        let task = tokio::spawn(async move {
            tokio::time::sleep(drain).await;
            stop_and_remove(&*runtime, containers, grace).await;
        });
        self.stop_seq += 1;
        self.stopping
            .insert(format!("{id}#{}", self.stop_seq), (status, task));
    }

    async fn converge(&mut self) {
        self.stopping.retain(|_, (_, task)| !task.is_finished());
        let now = Instant::now();
        let due: Vec<InstanceId> = self
            .tracked
            .iter()
            .filter(|(_, t)| matches!(t.phase, Phase::Start(at) if now >= at))
            .map(|(id, _)| id.clone())
            .collect();
        // The instances due to start are created side by side (a Service's replicas start
        // together, not one after the other), a few at a time.
        let started: Vec<(InstanceId, Result<ContainerStatus, StartError>)> = {
            let this = &*self;
            let mut creates = Vec::new();
            for id in &due {
                if let Some(t) = this.tracked.get(id) {
                    creates.push(async move { (id.clone(), this.create_container(t).await) });
                }
            }
            futures_util::stream::iter(creates)
                .buffer_unordered(PARALLEL_CREATES)
                .collect()
                .await
        };
        for (id, result) in started {
            self.started(&id, result);
        }
        let ids: Vec<InstanceId> = self.tracked.keys().cloned().collect();
        for id in ids {
            // One just started is followed from the next round on.
            if !due.contains(&id) && self.tracked.get(&id).map(|t| t.phase) == Some(Phase::Running)
            {
                self.follow(&id).await;
            }
            self.maybe_probe(&id);
        }
    }

    /// Records how an instance's start went.
    fn started(&mut self, id: &str, result: Result<ContainerStatus, StartError>) {
        let now = Instant::now();
        let Some(t) = self.tracked.get_mut(id) else {
            return;
        };
        match result {
            Ok(status) => {
                t.phase = Phase::Running;
                t.status.pull = None;
                t.started = Some(now);
                t.status.state = InstanceState::Running;
                t.status.reason = None;
                t.status.exit_code = None;
                t.status.finished_at = None;
                t.status.started_at = Some(Timestamp::now());
                t.status.warnings = status.warnings;
                t.status.health = Health::Unknown;
                t.health = t.health_check().map(|c| HealthTracker::new(c, now));
                tracing::info!(instance = %id, attempt = t.attempt, "container started");
            }
            Err(StartError::NotReady(reason)) => {
                t.status.state = InstanceState::Pending;
                t.status.reason = Some(reason);
                t.status.pull = None;
                t.phase = Phase::Start(now + PREPARE_RETRY);
            }
            Err(StartError::Pulling(pull)) => {
                t.status.state = InstanceState::Pending;
                t.status.reason = Some(pull.summary());
                t.status.pull = Some(pull);
                t.phase = Phase::Start(now + PULL_PROGRESS);
            }
            Err(StartError::Failed(reason)) => {
                tracing::warn!(instance = %id, %reason, "container could not start");
                t.status.pull = None;
                let exit = Exit {
                    code: None,
                    oom_killed: false,
                    ran_for: Duration::ZERO,
                };
                let decision = t.restart.on_exit(now, exit);
                Self::apply(t, decision, now, reason.clone());
                // Finished without a run: the only account of why is this reason.
                if t.phase == Phase::Finished {
                    let what = t.status.reason.take().unwrap_or_default();
                    t.status.reason = Some(format!("{what}: {reason}"));
                }
            }
        }
    }

    async fn create_container(&self, t: &Tracked) -> Result<ContainerStatus, StartError> {
        let template = t
            .template
            .as_ref()
            .map_err(|e| StartError::Failed(e.clone()))?;
        let spec = &template.workload.spec;
        // A record stored before validation refused it stays Pending, with what to change:
        // never created, never dropped.
        if let Some(m) = spec
            .container
            .volume_mounts
            .iter()
            .find(|m| kat_api::names::is_reserved_container_path(&m.mount_path))
        {
            return Err(StartError::NotReady(format!(
                "volumeMounts {}: mountPath {} is at or under {}, which KAT reserves for kat-init; apply the workload again with another mountPath",
                m.name,
                m.mount_path,
                kat_api::names::RESERVED_CONTAINER_DIR
            )));
        }
        let image = match (&spec.source.image, &spec.source.git) {
            (Some(image), _) => {
                self.ensure_image(image).await?;
                image.clone()
            }
            (None, Some(git)) => {
                self.config
                    .builds
                    .ensure(&self.runtime, template, git)
                    .await?
            }
            (None, None) => {
                return Err(StartError::Failed(
                    "source has neither image nor git".into(),
                ))
            }
        };
        let image = image.as_str();
        let record = &t.assignment.record;
        // Directories made, paths resolved and checked: file-system work, off the async
        // threads (a slow disk delays this instance, nothing else).
        let (base, policy) = (
            self.config.volume_base.clone(),
            self.config.host_mounts.clone(),
        );
        let (ns, workload, wanted) = (
            record.namespace.clone(),
            record.workload.clone(),
            spec.volumes.clone(),
        );
        let paths = tokio::task::spawn_blocking(move || {
            let mut paths = BTreeMap::new();
            for v in &wanted {
                let path = volumes::prepare(&base, &ns, &workload, v, &policy)
                    .map_err(|e| e.to_string())?;
                paths.insert(v.name.clone(), path);
            }
            Ok::<_, String>(paths)
        })
        .await
        .map_err(|e| StartError::Failed(format!("preparing volumes: {e}")))?
        .map_err(StartError::NotReady)?;
        let mut options = create_options(record, template, image, t.attempt, &paths);
        options.resources.pids_limit = self.config.pids_limit;
        if !record.gpus.is_empty() {
            // The CDI edits of the GPUs the scheduler gave it; device nodes are checked on
            // the file system: off the async threads.
            let (gpus, names) = (self.config.gpus.clone(), record.gpus.clone());
            let edits = tokio::task::spawn_blocking(move || gpus.edits(&names))
                .await
                .map_err(|e| StartError::Failed(format!("reading the GPUs' CDI edits: {e}")))?
                .map_err(|e| StartError::Failed(format!("GPUs {:?}: {e}", record.gpus)))?;
            if !edits.hooks.is_empty() {
                tracing::info!(instance = %record.instance_id, hooks = edits.hooks.len(), "running the GPUs' CDI hooks as the agent's user");
            }
            apply_gpu_edits(&mut options, edits);
        }
        if let Some(ip) = record.ip {
            let settings = self.config.network.borrow().clone().ok_or_else(|| {
                StartError::NotReady("waiting for the node network to come up".into())
            })?;
            let std::net::IpAddr::V4(address) = ip else {
                return Err(StartError::Failed(format!(
                    "the instance's address {ip} is not an IPv4 address"
                )));
            };
            connect_options(&mut options, address, &settings);
        }
        // A leftover container of this attempt (e.g. created just before an agent crash).
        if self.runtime.status(&options.id).await.is_ok() {
            let _ = self.runtime.remove(&options.id, true).await;
        }
        // Keep the previous attempt (its logs say why it ended); older ones go.
        if t.attempt >= 2 {
            let _ = self
                .runtime
                .remove(&container_id(&record.instance_id, t.attempt - 2), true)
                .await;
        }
        let status = self
            .runtime
            .create(&options)
            .await
            .map_err(|e| StartError::Failed(e.to_string()))?;
        if let Err(e) = self.runtime.start(&options.id).await {
            let _ = self.runtime.remove(&options.id, true).await;
            return Err(StartError::Failed(e.to_string()));
        }
        Ok(status)
    }

    async fn ensure_image(&self, image: &str) -> Result<(), StartError> {
        let normalized = kat_runtime::image::normalize_reference(image)
            .map_err(|e| StartError::Failed(format!("source.image: {e}")))?;
        // A build's image is its own workload's (a record stored before validation refused
        // these names gets this reason, and nothing of another namespace's build).
        if kat_api::build_definition::is_local_image(&normalized) {
            return Err(StartError::Failed(format!(
                "source.image: {image} is an image a node built for another workload's git source; name an image in a registry (katcall apply again with it)"
            )));
        }
        if self.images.contains(&normalized) {
            return Ok(());
        }
        // A pull under way first: the image store is read only when none is.
        match self.pulls.state(&normalized) {
            PullState::Running(status) => return Err(StartError::Pulling(status)),
            PullState::Failed(error) => return Err(StartError::NotReady(error)),
            PullState::Absent => {}
        }
        if let Ok(list) = self.runtime.list_images().await {
            if list.iter().any(|i| i.references.contains(&normalized)) {
                return Ok(());
            }
        }
        tracing::info!(%image, "pulling image");
        let status = self.pulls.start(self.runtime.clone(), image, normalized);
        Err(StartError::Pulling(status))
    }

    /// The host (uid, gid) of the container's root.
    async fn follow(&mut self, id: &str) {
        let Some(t) = self.tracked.get(id) else {
            return;
        };
        let container = t.container();
        let observed = self.runtime.status(&container).await;
        let now = Instant::now();
        let Some(t) = self.tracked.get_mut(id) else {
            return;
        };
        let exit = match observed {
            Ok(s) if matches!(s.state, ContainerState::Running | ContainerState::Created) => {
                // A stop for its health that did not end it (the runtime failed): again.
                let retry = t.unhealthy_stop.is_some_and(|at| {
                    now.saturating_duration_since(at)
                        > self.config.stop_grace + UNHEALTHY_STOP_SLACK
                });
                let t = if retry {
                    self.stop_unhealthy(id);
                    let Some(t) = self.tracked.get_mut(id) else {
                        return;
                    };
                    t
                } else {
                    t
                };
                t.status.state = InstanceState::Running;
                t.status.warnings = s.warnings;
                t.status.container_id = Some(s.id);
                t.status.image_digest = Some(s.image_id).filter(|d| !d.is_empty());
                if let Some(h) = &t.health {
                    t.status.health = h.health;
                }
                return;
            }
            Ok(s) => {
                t.status.exit_code = s.exit_code;
                let reason = match (s.oom_killed, s.exit_code, s.signal) {
                    (true, _, _) => "OOM-killed: the container exceeded limits.memory".to_string(),
                    (_, _, Some(sig)) => format!("killed by signal {sig}"),
                    (_, Some(code), _) => format!("exited with code {code}"),
                    _ => "exited".to_string(),
                };
                (
                    Exit {
                        code: s.exit_code,
                        oom_killed: s.oom_killed,
                        ran_for: t.started.map_or(Duration::ZERO, |s| now.duration_since(s)),
                    },
                    reason,
                )
            }
            Err(RuntimeError::ContainerNotFound(_)) => (
                Exit {
                    code: None,
                    oom_killed: false,
                    ran_for: Duration::ZERO,
                },
                "the container disappeared".to_string(),
            ),
            Err(e) => {
                tracing::warn!(instance = %id, error = %e, "cannot read container status");
                return;
            }
        };
        let (exit, reason) = exit;
        tracing::info!(instance = %id, %reason, "container ended");
        t.status.finished_at = Some(Timestamp::now());
        t.health = None;
        if t.unhealthy_stop.take().is_some() {
            let decision = t.restart.on_unhealthy(exit.ran_for);
            let why = "stopped for failing its health check (healthCheck.onFailure: restart)";
            Self::apply(t, decision, now, why.to_string());
            return;
        }
        let decision = t.restart.on_exit(now, exit);
        Self::apply(t, decision, now, reason);
    }

    fn apply(t: &mut Tracked, decision: Decision, now: Instant, why: String) {
        match decision {
            Decision::Restart { after } => {
                t.attempt += 1;
                t.status.restarts = t.restart.restarts;
                t.status.state = InstanceState::Pending;
                t.status.health = Health::Unknown;
                t.status.reason = Some(format!(
                    "{why}; restarting in {} ms (restart {})",
                    after.as_millis(),
                    t.restart.restarts
                ));
                t.phase = Phase::Start(now + after);
            }
            Decision::Finish { state, reason } => {
                t.status.state = state;
                t.status.health = Health::Unknown;
                t.status.reason = Some(reason);
                t.phase = Phase::Finished;
            }
        }
    }

    fn maybe_probe(&mut self, id: &str) {
        let Some(t) = self.tracked.get_mut(id) else {
            return;
        };
        if t.phase != Phase::Running {
            return;
        }
        let container = t.container();
        let Some(h) = t.health.as_mut() else {
            return;
        };
        if !h.start_probe(Instant::now()) {
            return;
        }
        let runtime = self.runtime.clone();
        let command = h.command.clone();
        let timeout = h.timeout;
        let tx = self.probes_tx.clone();
        let attempt = t.attempt;
        let id = id.to_string();
        tokio::spawn(async move {
            let ok = probe(runtime, &container, command, timeout).await;
            let _ = tx.send((id, attempt, ok)).await;
        });
    }

    fn on_probe(&mut self, id: &str, attempt: u32, ok: bool) {
        let Some(t) = self.tracked.get_mut(id) else {
            return;
        };
        if t.attempt != attempt {
            return;
        }
        let Some(new) = t.health.as_mut().and_then(|h| h.record(Instant::now(), ok)) else {
            return;
        };
        tracing::info!(instance = %id, health = ?new, "health changed");
        t.status.health = new;
        if new == Health::Unhealthy {
            t.status.unhealthy_transitions += 1;
        }
        let restart = t
            .health_check()
            .is_some_and(|c| c.on_failure == HealthFailureAction::Restart);
        if new == Health::Unhealthy
            && restart
            && t.phase == Phase::Running
            && t.unhealthy_stop.is_none()
        {
            tracing::warn!(instance = %id, "unhealthy: stopping it to restart (healthCheck.onFailure: restart)");
            self.stop_unhealthy(id);
        }
    }

    /// Stop `id`'s container beside the loop for its restart; `follow` sees the exit (and
    /// tries again if the container still runs after the grace period).
    fn stop_unhealthy(&mut self, id: &str) {
        let Some(t) = self.tracked.get_mut(id) else {
            return;
        };
        t.unhealthy_stop = Some(Instant::now());
        let (runtime, grace, container) =
            (self.runtime.clone(), self.config.stop_grace, t.container());
        tokio::spawn(async move {
            if let Err(e) = runtime.stop(&container, grace).await {
                tracing::warn!(%container, error = %e, "cannot stop an unhealthy container; trying again");
            }
        });
    }

    fn next_wake(&self) -> Instant {
        // A container whose end the runtime would not tell, one being stopped for its
        // health (the stop may need sending again) and stops under way are looked at often.
        let polled = self.exits.is_none()
            || !self.stopping.is_empty()
            || self.tracked.values().any(|t| {
                t.phase == Phase::Running
                    && (t.unhealthy_stop.is_some() || !self.runtime.sees_exit(&t.container()))
            });
        let mut wake = Instant::now() + if polled { POLL } else { RECHECK };
        for t in self.tracked.values() {
            if let Phase::Start(at) = t.phase {
                wake = wake.min(at);
            }
            if let Some(at) = t.health.as_ref().and_then(|h| h.next_probe()) {
                wake = wake.min(at);
            }
        }
        wake.max(Instant::now() + Duration::from_millis(10))
    }

    fn publish(&self) {
        let mut statuses: Vec<InstanceStatus> =
            self.tracked.values().map(|t| t.status.clone()).collect();
        statuses.extend(
            self.stopping
                .values()
                .filter(|(s, _)| !s.workload.is_empty())
                .map(|(s, _)| s.clone()),
        );
        // Nothing is said before the first snapshot: an empty list would tell the leader
        // that a restarted agent's running containers are gone.
        if self.source.is_some() {
            self.statuses.send_if_modified(|current| {
                if current.as_ref() == Some(&statuses) {
                    false
                } else {
                    *current = Some(statuses);
                    true
                }
            });
        }
        // Only ready instances take connections: healthy, or running where the workload has
        // no health check (a container that runs but does not listen yet gets none).
        let mut published: Vec<PublishedPort> = self
            .tracked
            .values()
            .filter(|t| {
                t.phase == Phase::Running
                    && t.status.state == InstanceState::Running
                    && (t.health_check().is_none() || t.status.health == Health::Healthy)
            })
            .flat_map(|t| published_ports(&t.assignment.record, t.template.as_ref().ok()))
            .collect();
        published.sort();
        self.config.published.send_if_modified(|current| {
            if *current == published {
                false
            } else {
                *current = published;
                true
            }
        });
    }
}

/// Run a health probe: exit 0 within the timeout is a success.
async fn probe(
    runtime: Arc<dyn ContainerRuntime>,
    container: &str,
    command: Vec<String>,
    timeout: Duration,
) -> bool {
    let options = ExecOptions {
        command,
        ..Default::default()
    };
    let mut handle = match runtime.exec(container, options).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(%container, error = %e, "health probe could not run");
            return false;
        }
    };
    drop(handle.stdin.take());
    for out in [handle.stdout.take(), handle.stderr.take()]
        .into_iter()
        .flatten()
    {
        // Drained and dropped, by a task on the reactor (not a thread per probe).
        let Ok(out) = kat_runtime::async_pipe::AsyncPipe::new(out) else {
            // Nobody would read it: the probe would stall on a full pipe. It fails instead.
            tracing::debug!(%container, "cannot drain a probe's output; the probe fails");
            handle.kill_tree();
            return false;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while matches!(out.read(&mut buf).await, Ok(n) if n > 0) {}
        });
    }
    match tokio::time::timeout(timeout, handle.wait()).await {
        Ok(Ok(code)) => code == 0,
        Ok(Err(_)) => false,
        Err(_) => {
            handle.kill_tree();
            false
        }
    }
}
