//! A [`ContainerRuntime`] without a kernel, for unit tests of what drives a runtime (the
//! node supervisor) under tokio's paused clock. Enabled by the `fake` feature.
//!
//! Containers are records that run, by the clock, for as long as their [`Run`] says, then
//! exit with its code. Pulls take the time set per reference. A health probe (`exec`) exits
//! with the code the probe function gives for the container. Everything the runtime is asked
//! to do is kept in a journal the test can read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::{
    logs, CgroupMode, ContainerRuntime, ContainerState, ContainerStatus, ContainerUsage,
    CreateOptions, ExecHandle, ExecOptions, ImageSummary, LogOptions, NodeCapabilities,
    PullProgress, Result, RootfsMode, RuntimeError,
};

/// How a created container behaves once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Exit after this long; `None` runs until stopped.
    pub exits_after: Option<Duration>,
    /// The exit code it ends with when it exits on its own.
    pub exit_code: i32,
    /// Its status says the OOM killer ended it, once it has ended.
    pub oom_killed: bool,
    /// Whether SIGTERM ends it; if not, stop waits the whole grace period.
    pub stops_on_term: bool,
    /// While it runs: CPU busy (millicores, so usage grows with the clock), memory, pids.
    pub cpu_millis: u64,
    /// Memory it uses while it runs, in bytes.
    pub memory_bytes: u64,
    /// Processes it has while it runs.
    pub pids: u64,
}

impl Run {
    /// Runs until stopped, using nothing.
    pub fn forever() -> Run {
        Run {
            exits_after: None,
            exit_code: 0,
            oom_killed: false,
            stops_on_term: true,
            cpu_millis: 0,
            memory_bytes: 0,
            pids: 0,
        }
    }

    /// Exits with `code` after `after`.
    pub fn exits(after: Duration, code: i32) -> Run {
        Run {
            exits_after: Some(after),
            exit_code: code,
            ..Run::forever()
        }
    }
}

/// What the runtime was asked to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `pull_image` of this reference.
    Pull(String),
    /// `build_image` of this reference.
    Build(String),
    /// `create` of this container.
    Create(String),
    /// `start` of this container.
    Start(String),
    /// `stop` of a container.
    Stop {
        /// The container.
        id: String,
        /// The grace period it was given.
        grace: Duration,
    },
    /// `remove` of this container.
    Remove(String),
    /// `exec` in this container.
    Exec(String),
}

type RunFn = dyn Fn(&CreateOptions) -> Run + Send + Sync;
type ProbeFn = dyn Fn(&str) -> i32 + Send + Sync;

struct Container {
    options: CreateOptions,
    run: Run,
    started: Option<Instant>,
    /// (when, exit code, signal) once it ended.
    ended: Option<(Instant, i32, Option<i32>)>,
    /// Started by this runtime (not adopted): its end is told when exits are.
    child: bool,
}

struct State {
    containers: BTreeMap<String, Container>,
    images: BTreeSet<String>,
    pull_time: HashMap<String, Duration>,
    create_time: Duration,
    /// Workloads whose containers never finish stopping (a stuck kernel, a hung disk).
    stuck_stops: BTreeSet<String>,
    journal: Vec<(Instant, Call)>,
}

/// A runtime whose containers are records run by tokio's clock (see the module).
pub struct FakeRuntime {
    state: Mutex<State>,
    run: Box<RunFn>,
    probe: Box<ProbeFn>,
    capabilities: NodeCapabilities,
    /// Set by [`FakeRuntime::tell_exits`]: bumped when a container it started exits.
    exit_notices: std::sync::OnceLock<tokio::sync::watch::Sender<u64>>,
    /// Told before a container is removed.
    removals: std::sync::OnceLock<std::sync::Arc<dyn crate::RemovalObserver>>,
}

impl FakeRuntime {
    /// Containers behave as `run` says; probes exit as `probe` says for a container id.
    pub fn new(
        run: impl Fn(&CreateOptions) -> Run + Send + Sync + 'static,
        probe: impl Fn(&str) -> i32 + Send + Sync + 'static,
    ) -> Arc<FakeRuntime> {
        Arc::new(FakeRuntime {
            state: Mutex::new(State {
                containers: BTreeMap::new(),
                images: BTreeSet::new(),
                pull_time: HashMap::new(),
                create_time: Duration::ZERO,
                stuck_stops: BTreeSet::new(),
                journal: Vec::new(),
            }),
            run: Box::new(run),
            probe: Box::new(probe),
            capabilities: NodeCapabilities {
                rootless: true,
                cgroup_mode: CgroupMode::None,
                memory_limit: false,
                cpu_limit: false,
                pids_limit: false,
                rootfs: RootfsMode::Copy,
                uid_map: vec![],
                seccomp: false,
                notes: vec!["fake runtime".into()],
            },
            exit_notices: std::sync::OnceLock::new(),
            removals: std::sync::OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An image already in the store.
    pub fn add_image(&self, reference: &str) {
        self.lock().images.insert(normalized(reference));
    }

    /// Pulling `reference` takes this long (default: no time).
    pub fn set_pull_time(&self, reference: &str, took: Duration) {
        self.lock().pull_time.insert(normalized(reference), took);
    }

    /// Creating a container takes this long (default: no time).
    pub fn set_create_time(&self, took: Duration) {
        self.lock().create_time = took;
    }

    /// Stopping a container of `workload` never returns.
    pub fn stick_stops_of(&self, workload: &str) {
        self.lock().stuck_stops.insert(workload.to_string());
    }

    /// From now on, tell the exits of the containers it starts ([`ContainerRuntime::exits`]),
    /// as the native runtime's reapers do.
    pub fn tell_exits(&self) {
        let _ = self.exit_notices.set(tokio::sync::watch::Sender::new(0));
    }

    /// A container left running by an earlier agent (for adoption).
    pub fn add_running(&self, options: CreateOptions) {
        let run = (self.run)(&options);
        let id = options.id.clone();
        self.lock().containers.insert(
            id,
            Container {
                options,
                run,
                started: Some(Instant::now()),
                ended: None,
                child: false,
            },
        );
    }

    /// Everything asked so far, with the (paused) clock's time.
    pub fn journal(&self) -> Vec<(Instant, Call)> {
        self.lock().journal.clone()
    }

    /// Ids of the containers that exist, running or not.
    pub fn containers(&self) -> Vec<String> {
        self.lock().containers.keys().cloned().collect()
    }

    fn record(&self, call: Call) {
        self.lock().journal.push((Instant::now(), call));
    }
}

fn normalized(reference: &str) -> String {
    crate::image::normalize_reference(reference).unwrap_or_else(|_| reference.to_string())
}

fn not_found(id: &str) -> RuntimeError {
    RuntimeError::ContainerNotFound(id.to_string())
}

impl Container {
    /// Settle an exit that the clock has reached.
    fn settle(&mut self, now: Instant) {
        if self.ended.is_some() {
            return;
        }
        if let (Some(started), Some(after)) = (self.started, self.run.exits_after) {
            if now >= started + after {
                self.ended = Some((started + after, self.run.exit_code, None));
            }
        }
    }

    fn status(&self) -> ContainerStatus {
        let (state, exit_code, signal) = match (self.started, self.ended) {
            (_, Some((_, code, signal))) => (ContainerState::Exited, Some(code), signal),
            (Some(_), None) => (ContainerState::Running, None, None),
            (None, None) => (ContainerState::Created, None, None),
        };
        ContainerStatus {
            id: self.options.id.clone(),
            namespace: self.options.namespace.clone(),
            workload: self.options.workload.clone(),
            image: self.options.image.clone(),
            image_id: String::new(),
            state,
            pid: None,
            exit_code,
            signal,
            oom_killed: self.ended.is_some() && self.run.oom_killed,
            created_at: Some(SystemTime::now()),
            started_at: None,
            finished_at: None,
            labels: self.options.labels.clone(),
            warnings: vec![],
        }
    }
}

#[async_trait::async_trait]
impl ContainerRuntime for FakeRuntime {
    fn capabilities(&self) -> &NodeCapabilities {
        &self.capabilities
    }

    async fn pull_image(
        &self,
        reference: &str,
        progress: Option<crate::image::ProgressSender>,
    ) -> Result<ImageSummary> {
        self.record(Call::Pull(reference.to_string()));
        let key = normalized(reference);
        let took = self.lock().pull_time.get(&key).copied().unwrap_or_default();
        // Two layers of 1 MiB: one already here, half of the other at once, the rest when
        // the pull's time is up.
        let send = |event: PullProgress| {
            if let Some(tx) = &progress {
                let _ = tx.send(event);
            }
        };
        send(PullProgress::Resolved {
            reference: key.clone(),
            layers: 2,
            total_bytes: 2 << 20,
        });
        send(PullProgress::LayerCached {
            digest: "sha256:1".into(),
            size: 1 << 20,
        });
        send(PullProgress::LayerBytes {
            digest: "sha256:2".into(),
            downloaded: 1 << 19,
            total: 1 << 20,
        });
        tokio::time::sleep(took).await;
        send(PullProgress::LayerBytes {
            digest: "sha256:2".into(),
            downloaded: 1 << 20,
            total: 1 << 20,
        });
        send(PullProgress::LayerDone {
            digest: "sha256:2".into(),
        });
        self.lock().images.insert(key.clone());
        Ok(summary(&key))
    }

    async fn import_image(&self, _layout: &Path, reference: &str) -> Result<ImageSummary> {
        self.add_image(reference);
        Ok(summary(&normalized(reference)))
    }

    async fn list_images(&self) -> Result<Vec<ImageSummary>> {
        Ok(self.lock().images.iter().map(|r| summary(r)).collect())
    }

    async fn remove_image(&self, reference: &str) -> Result<u64> {
        self.lock().images.remove(&normalized(reference));
        Ok(0)
    }

    async fn prune_images(&self) -> Result<u64> {
        Ok(0)
    }

    /// A build that takes `pull_time` of its reference and fails when the repository's URL
    /// ends in `/broken` (as a broken Dockerfile would).
    async fn build_image(
        &self,
        request: &crate::build::BuildRequest,
        _limits: crate::build::BuildLimits,
        progress: &tokio::sync::watch::Sender<crate::build::BuildPhase>,
    ) -> Result<crate::build::BuildOutcome> {
        self.record(Call::Build(request.reference.clone()));
        let key = normalized(&request.reference);
        progress.send_replace(crate::build::BuildPhase::Building(None));
        let took = self.lock().pull_time.get(&key).copied().unwrap_or_default();
        tokio::time::sleep(took).await;
        if request.repository.ends_with("/broken") {
            return Err(crate::build::BuildError::Failed {
                step: "step 2 of 2: RUN false".into(),
                tail: "error building at STEP \"RUN false\": exit status 1".into(),
            }
            .into());
        }
        self.lock().images.insert(key.clone());
        Ok(crate::build::BuildOutcome {
            image: summary(&key),
            cache: crate::build::CacheOutcome::Unused,
        })
    }

    async fn create(&self, options: &CreateOptions) -> Result<ContainerStatus> {
        self.record(Call::Create(options.id.clone()));
        let took = self.lock().create_time;
        tokio::time::sleep(took).await;
        let run = (self.run)(options);
        let container = Container {
            options: options.clone(),
            run,
            started: None,
            ended: None,
            child: true,
        };
        let status = container.status();
        let mut state = self.lock();
        if state.containers.contains_key(&options.id) {
            return Err(RuntimeError::InvalidOption {
                field: "id".into(),
                reason: format!("container {} exists", options.id),
            });
        }
        state.containers.insert(options.id.clone(), container);
        Ok(status)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.record(Call::Start(id.to_string()));
        let mut state = self.lock();
        let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        c.started = Some(Instant::now());
        if let (Some(notices), Some(after)) = (self.exit_notices.get(), c.run.exits_after) {
            let notices = notices.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                notices.send_modify(|n| *n += 1);
            });
        }
        Ok(())
    }

    fn exits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.exit_notices.get().map(|n| n.subscribe())
    }

    fn sees_exit(&self, id: &str) -> bool {
        self.exit_notices.get().is_some() && self.lock().containers.get(id).is_some_and(|c| c.child)
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<ContainerStatus> {
        self.record(Call::Stop {
            id: id.to_string(),
            grace,
        });
        let (stops_on_term, stuck) = {
            let mut state = self.lock();
            let c = state.containers.get(id).ok_or_else(|| not_found(id))?;
            let stuck = state.stuck_stops.contains(&c.options.workload);
            let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
            c.settle(Instant::now());
            (c.ended.is_some() || c.run.stops_on_term, stuck)
        };
        if stuck {
            std::future::pending::<()>().await;
        }
        if !stops_on_term {
            tokio::time::sleep(grace).await;
        }
        let mut state = self.lock();
        let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        c.settle(Instant::now());
        if c.ended.is_none() {
            let signal = if stops_on_term { 15 } else { 9 };
            c.ended = Some((Instant::now(), 128 + signal, Some(signal)));
        }
        Ok(c.status())
    }

    fn observe_removals(
        &self,
        observer: std::sync::Arc<dyn crate::RemovalObserver>,
    ) -> std::result::Result<(), std::sync::Arc<dyn crate::RemovalObserver>> {
        self.removals.set(observer)
    }

    async fn remove(&self, id: &str, _force: bool) -> Result<()> {
        if let Some(observer) = self.removals.get() {
            observer.removing(self, id).await;
        }
        self.record(Call::Remove(id.to_string()));
        self.lock()
            .containers
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| not_found(id))
    }

    async fn status(&self, id: &str) -> Result<ContainerStatus> {
        let mut state = self.lock();
        let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        c.settle(Instant::now());
        Ok(c.status())
    }

    async fn usage(&self, id: &str) -> Result<ContainerUsage> {
        let now = Instant::now();
        let mut state = self.lock();
        let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
        c.settle(now);
        let Some(started) = c.started else {
            return Ok(ContainerUsage::default());
        };
        let until = c.ended.map_or(now, |(when, ..)| when);
        let running = c.ended.is_none();
        let micros = until.duration_since(started).as_micros() as u64;
        Ok(ContainerUsage {
            cpu_usec: micros.saturating_mul(c.run.cpu_millis) / 1000,
            memory_bytes: if running { c.run.memory_bytes } else { 0 },
            pids: if running { c.run.pids } else { 0 },
        })
    }

    async fn list(&self) -> Result<Vec<ContainerStatus>> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(state
            .containers
            .values_mut()
            .map(|c| {
                c.settle(now);
                c.status()
            })
            .collect())
    }

    async fn logs(&self, id: &str, _options: LogOptions) -> Result<logs::LogReceiver> {
        if !self.lock().containers.contains_key(id) {
            return Err(not_found(id));
        }
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        Ok(rx)
    }

    async fn exec(&self, id: &str, _options: ExecOptions) -> Result<ExecHandle> {
        self.record(Call::Exec(id.to_string()));
        let running = {
            let mut state = self.lock();
            let c = state.containers.get_mut(id).ok_or_else(|| not_found(id))?;
            c.settle(Instant::now());
            c.started.is_some() && c.ended.is_none()
        };
        if !running {
            return Err(RuntimeError::Container {
                context: format!("exec in {id}"),
                message: "the container is not running".into(),
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send((self.probe)(id));
        Ok(ExecHandle::finished(rx))
    }
}

fn summary(reference: &str) -> ImageSummary {
    ImageSummary {
        id: format!("sha256:{}", hex::encode(reference.as_bytes())),
        references: vec![reference.to_string()],
        manifest_digest: String::new(),
        layers: vec![],
        size: 0,
    }
}
