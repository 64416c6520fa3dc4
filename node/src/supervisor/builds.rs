//! Images of `source.git` workloads, built on this node: one build per image reference at a
//! time, whichever replicas wait for it, beside convergence (a long build never delays
//! another instance's restart, stop or probe). The image is kept as
//! `kat-local/{namespace}_{workload}:{sha7}` and reused while the commit is the same, so a
//! rollback to an earlier commit that was built here does not build again.
//!
//! Every build is reported ([`BuildReport`], in the heartbeat: the leader turns them into
//! events and the workload's status) while it runs and for [`REPORT_FINISHED_FOR`] after it
//! ended, and its whole output goes to `{log dir}/{namespace}_{workload}_{sha7}.log` for
//! `katcall logs --build` (the newest two per workload are kept).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kat_api::wire::{BuildReport, BuildState, Timestamp};
use kat_api::workload::GitSource;
use kat_api::Template;
use kat_runtime::build::{local_reference, BuildLimits, BuildPhase, BuildRequest, CacheOutcome};
use kat_runtime::ContainerRuntime;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StartError;

/// A failed build is not tried again for this long: every instance waiting for it fails
/// with its reason meanwhile (a broken Dockerfile does not rebuild in a loop).
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);
/// How long a finished build stays in the reports.
const REPORT_FINISHED_FOR: Duration = Duration::from_secs(600);
/// Build logs kept per workload.
const LOGS_KEPT: usize = 2;

struct Entry {
    report: BuildReport,
    log: PathBuf,
    /// Set while the build runs.
    phase: Option<watch::Receiver<BuildPhase>>,
    /// When it ended.
    ended: Option<Instant>,
}

struct Table {
    entries: HashMap<String, Entry>,
    reports: watch::Sender<Vec<BuildReport>>,
}

impl Table {
    fn publish(&mut self) {
        self.entries
            .retain(|_, e| e.ended.is_none_or(|at| at.elapsed() < REPORT_FINISHED_FOR));
        let mut reports: Vec<BuildReport> =
            self.entries.values().map(|e| e.report.clone()).collect();
        reports.sort_by_key(|r| r.started_at);
        self.reports.send_if_modified(|old| {
            let changed = *old != reports;
            *old = reports;
            changed
        });
    }
}

/// The node's builds; clones share them.
#[derive(Clone)]
pub struct Builds {
    table: Arc<Mutex<Table>>,
    log_dir: PathBuf,
}

/// Where `katcall logs --build` reads a workload's newest build on this node.
pub struct BuildLog {
    /// The build's log file.
    pub path: PathBuf,
    /// Changes to `None` when the build ends; `None` already if it has.
    pub phase: Option<watch::Receiver<BuildPhase>>,
}

impl std::fmt::Debug for Builds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builds")
            .field("log_dir", &self.log_dir)
            .finish_non_exhaustive()
    }
}

impl Builds {
    /// Builds logging under `log_dir` (created on the first build).
    pub fn new(log_dir: PathBuf) -> Self {
        Builds {
            table: Arc::new(Mutex::new(Table {
                entries: HashMap::new(),
                reports: watch::channel(Vec::new()).0,
            })),
            log_dir,
        }
    }

    /// The reports, for heartbeats: changes whenever a build starts, moves on or ends.
    pub fn reports(&self) -> watch::Receiver<Vec<BuildReport>> {
        self.lock().reports.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The log of the workload's newest build on this node: a running one first, else the
    /// newest file.
    pub fn log_of(&self, namespace: &str, workload: &str) -> Option<BuildLog> {
        {
            let table = self.lock();
            let newest = table
                .entries
                .values()
                .filter(|e| e.report.namespace == namespace && e.report.workload == workload)
                .max_by(|a, b| a.report.started_at.cmp(&b.report.started_at));
            if let Some(e) = newest {
                return Some(BuildLog {
                    path: e.log.clone(),
                    phase: e.phase.clone(),
                });
            }
        }
        logs_of(&self.log_dir, namespace, workload)
            .pop()
            .map(|path| BuildLog { path, phase: None })
    }

    /// The reference of the instance's image once it is in the store; until then, why not
    /// (building, with progress) or why it failed.
    pub(super) async fn ensure(
        &self,
        runtime: &Arc<dyn ContainerRuntime>,
        template: &Template,
        git: &GitSource,
    ) -> Result<String, StartError> {
        let meta = &template.workload.metadata;
        let commit = git.commit.clone().ok_or_else(|| {
            StartError::Failed(
                "source.git has no commit recorded for this generation; apply the workload again"
                    .into(),
            )
        })?;
        let reference = local_reference(&meta.namespace, &meta.name, &commit);
        let short: String = commit.chars().take(7).collect();
        let normalized = kat_runtime::image::normalize_reference(&reference)
            .map_err(|e| StartError::Failed(format!("the build's image name: {e}")))?;
        let building = |phase: &BuildPhase| {
            StartError::NotReady(format!("building {short} from {}: {phase}", git.repository))
        };
        if let Some(wait) = waiting(&self.lock(), &normalized, &building, &short, None) {
            return Err(wait);
        }
        let looked = Instant::now();
        if let Ok(list) = runtime.list_images().await {
            if list.iter().any(|i| i.references.contains(&normalized)) {
                return Ok(reference);
            }
        }
        let build = template.build.as_ref().map(|b| &b.spec);
        let cache = template
            .workload
            .spec
            .source
            .cache_image
            .clone()
            .or_else(|| {
                build
                    .and_then(|b| b.cache.as_ref())
                    .and_then(|c| c.registry_path.clone())
            });
        let log = self
            .log_dir
            .join(format!("{}_{}_{short}.log", meta.namespace, meta.name));
        let request = BuildRequest {
            repository: git.repository.clone(),
            commit: commit.clone(),
            context: build.map_or(".".into(), |b| b.build_context.clone()),
            dockerfile: build.map_or("Dockerfile".into(), |b| b.dockerfile_path.clone()),
            build_args: build.map(|b| b.build_args.clone()).unwrap_or_default(),
            target: build.and_then(|b| b.target_stage.clone()),
            platform: build.and_then(|b| b.platform.clone()),
            reference: reference.clone(),
            log_file: Some(log.clone()),
            cache,
            network: build.map(|b| b.network).unwrap_or_default(),
        };
        let (tx, rx) = watch::channel(if request.cache.is_some() {
            BuildPhase::CheckingCache
        } else {
            BuildPhase::Cloning
        });
        let first = building(&rx.borrow());
        {
            let mut table = self.lock();
            // Another replica may have started it, or it may have ended, while the store
            // was read.
            if let Some(wait) = waiting(&table, &normalized, &building, &short, Some(looked)) {
                return Err(wait);
            }
            table.entries.insert(
                normalized.clone(),
                Entry {
                    report: BuildReport {
                        namespace: meta.namespace.clone(),
                        workload: meta.name.clone(),
                        commit: commit.clone(),
                        image: reference.clone(),
                        node: None,
                        state: BuildState::Building,
                        message: rx.borrow().to_string(),
                        from_cache: false,
                        started_at: Timestamp::now(),
                        finished_at: None,
                    },
                    log: log.clone(),
                    phase: Some(rx.clone()),
                    ended: None,
                },
            );
            table.publish();
        }
        tracing::info!(image = %reference, repository = %git.repository, "building");
        let (dir, namespace, workload) = (
            self.log_dir.clone(),
            meta.namespace.clone(),
            meta.name.clone(),
        );
        let prepared =
            tokio::task::spawn_blocking(move || prepare_log_dir(&dir, &namespace, &workload));
        if let Ok(Err(e)) = prepared.await {
            tracing::warn!(error = %e, "build logs cannot be kept");
        }
        tokio::spawn(
            self.clone()
                .run(runtime.clone(), request, normalized, tx, rx),
        );
        Err(first)
    }

    /// Runs one build, following its phases into the reports.
    async fn run(
        self,
        runtime: Arc<dyn ContainerRuntime>,
        request: BuildRequest,
        key: String,
        tx: watch::Sender<BuildPhase>,
        mut rx: watch::Receiver<BuildPhase>,
    ) {
        let started = Instant::now();
        let build = runtime.build_image(&request, BuildLimits::default(), &tx);
        tokio::pin!(build);
        let result = loop {
            tokio::select! {
                result = &mut build => break result,
                Ok(()) = rx.changed() => {
                    let phase = rx.borrow_and_update().to_string();
                    let mut table = self.lock();
                    if let Some(e) = table.entries.get_mut(&key) {
                        e.report.message = phase;
                    }
                    table.publish();
                }
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        let (state, message, from_cache) = match result {
            Ok(outcome) => {
                tracing::info!(image = %request.reference, seconds, cache = ?outcome.cache, "built");
                let (message, hit) = match outcome.cache {
                    CacheOutcome::Hit(from) => (
                        format!("pulled {from} from the build cache in {seconds:.1} s"),
                        true,
                    ),
                    CacheOutcome::Unused => (format!("built in {seconds:.1} s"), false),
                    CacheOutcome::Pushed(to) => {
                        (format!("built in {seconds:.1} s, pushed to {to}"), false)
                    }
                    CacheOutcome::PushFailed { reference, error } => (
                        format!("built in {seconds:.1} s; pushing to {reference} failed: {error}"),
                        false,
                    ),
                };
                (BuildState::Succeeded, message, hit)
            }
            Err(e) => {
                tracing::warn!(image = %request.reference, error = %e, "build failed");
                (BuildState::Failed, e.to_string(), false)
            }
        };
        {
            let mut table = self.lock();
            if let Some(e) = table.entries.get_mut(&key) {
                e.report.state = state;
                e.report.message = message;
                e.report.from_cache = from_cache;
                e.report.finished_at = Some(Timestamp::now());
                e.phase = None;
                e.ended = Some(Instant::now());
            }
            table.publish();
        }
        // The report leaves the heartbeats when its time is up, whether or not another
        // build changes the table before.
        tokio::time::sleep(REPORT_FINISHED_FOR + Duration::from_secs(1)).await;
        self.lock().publish();
    }
}

/// Why an instance must wait for the build under `key` (running, failed a moment ago, or —
/// with `since` — ended after the image store was looked at), or `None` to build.
fn waiting(
    table: &Table,
    key: &str,
    building: &dyn Fn(&BuildPhase) -> StartError,
    short: &str,
    since: Option<Instant>,
) -> Option<StartError> {
    let entry = table.entries.get(key)?;
    if let Some(phase) = &entry.phase {
        return Some(building(&phase.borrow()));
    }
    let ended = entry.ended?;
    if entry.report.state == BuildState::Failed && ended.elapsed() < RETRY_FAILED_AFTER {
        return Some(StartError::Failed(format!(
            "building {short}: {}",
            entry.report.message
        )));
    }
    if since.is_some_and(|looked| ended >= looked) && entry.report.state == BuildState::Succeeded {
        return Some(StartError::NotReady(format!("{short} built; starting")));
    }
    None
}

/// The workload's build logs in `dir`, oldest first.
fn logs_of(dir: &Path, namespace: &str, workload: &str) -> Vec<PathBuf> {
    let prefix = format!("{namespace}_{workload}_");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut logs: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    logs.sort();
    logs.into_iter().map(|(_, p)| p).collect()
}

/// Creates the log directory (the agent's only) and drops the workload's older logs so
/// that, with the one about to be written, [`LOGS_KEPT`] remain.
fn prepare_log_dir(dir: &Path, namespace: &str, workload: &str) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let logs = logs_of(dir, namespace, workload);
    let drop = logs.len().saturating_sub(LOGS_KEPT - 1);
    for old in &logs[..drop] {
        std::fs::remove_file(old)?;
    }
    Ok(())
}
