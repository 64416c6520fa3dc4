//! The native `ContainerRuntime`: youki's `libcontainer`, kat-init and the image store.
//!
//! On disk, under the runtime root:
//!
//! ```text
//! images/                       the image store
//! id-slices.json                which workload owns which id slice
//! slots/<slot>/<image>/         a slice's copy of an image: its overlays' lower layer
//! libcontainer/<id>/            libcontainer's state (pid, status, bundle)
//! containers/<id>/meta.json     what KAT asked for, the image, times, warnings
//! containers/<id>/bundle/       config.json
//! containers/<id>/rootfs/       the overlay mount point, or the private copy
//! containers/<id>/upper, work/  the overlay's writable layer
//! containers/<id>/etc/          generated hosts, hostname, resolv.conf
//! containers/<id>/logs/         stdio.log[.N] and exit.json, written by kat-init
//! ```
//!
//! Nothing about a running container lives only in the agent's memory: a new agent (after a
//! crash, an upgrade, a reboot of the agent alone) finds every container, its state and exit
//! code from these files. The log directory is bind-mounted into the container at
//! `/.kat/log`, where kat-init writes logs and the exit record itself: no helper process
//! runs outside the container, and kat-init holds no descriptor of a host directory.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kat_api::WorkloadKey;
use libcontainer::container::{Container, ContainerStatus as LcStatus};
use libcontainer::signal::Signal as LcSignal;
use serde::{Deserialize, Serialize};

use crate::cgroups::Cgroups;
use crate::error::{IoContext, Result, RuntimeError};
use crate::exec::ExecHandle;
use crate::id_slices::{Acquired, IdSlices};
use crate::id_tool::IdTask;
use crate::idmap::{IdMap, NodeIdRange, SLICE_SIZE};
use crate::image::unpack_sandbox::UnpackSandbox;
use crate::image::{self, ImageStore, RegistryConfig};
use crate::logs::{self, LogReceiver};
use crate::spec::{self, Rootfs, SpecInput};
use crate::tree_dir::remove_tree;
use crate::types::*;
use crate::volume_paths::OpenedSource;
use crate::ContainerRuntime;

mod create;
mod exits;
mod setup;
mod slice_copies;

pub use setup::NativeConfig;

use exits::{signal_init, spawn_reaper};

/// What KAT keeps about a container beside libcontainer's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    options: CreateOptions,
    image_id: String,
    created_at: SystemTime,
    started_at: Option<SystemTime>,
    rootfs: RootfsMode,
    warnings: Vec<String>,
}

/// `exit.json` as kat-init (or the reaper) writes it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExitRecord {
    exit_code: i32,
    signal: Option<i32>,
    finished_at: String,
    /// kat-init saw an OOM kill in the container's cgroup (`memory.events`) before it exited.
    #[serde(default)]
    oom_killed: bool,
}

/// The container runtime on youki's `libcontainer` (see the module).
pub struct NativeRuntime {
    config: NativeConfig,
    images: ImageStore,
    cgroups: Cgroups,
    /// The node's id range, or why there is none (then every create says so).
    range: std::result::Result<NodeIdRange, String>,
    /// Which workload owns which slice of the range.
    slices: Mutex<Option<IdSlices>>,
    /// Workloads with a create under way, once per create: their containers have no
    /// `meta.json` yet, and their slices must not look free to a concurrent create that
    /// reclaims one (see `acquire_slot`).
    creating: Mutex<Vec<WorkloadKey>>,
    /// A spare image copy is being made (one at a time; see `slice_copies`).
    spare_under_way: Arc<AtomicBool>,
    /// The create helper started ahead of the next create.
    helpers: Arc<crate::create_helper::Spares>,
    caps: NodeCapabilities,
    overlay: AtomicBool,
    /// Containers whose kat-init our reaper thread waits for; it writes `exit.json` if
    /// kat-init could not, a moment after the process is gone.
    reaping: Arc<crate::reaping::Reaping>,
    /// Reaps the containers' processes we adopt as a subreaper (orphans.rs).
    _orphans: crate::orphans::OrphanReaper,
    /// Change notices for followed logs, made at the first `logs -f` (on the agent's
    /// runtime); `None` if inotify is unavailable (followers then read every 50 ms).
    log_watch: std::sync::OnceLock<Option<crate::log_watch::LogWatcher>>,
    /// Told before a container is removed (`ContainerRuntime::observe_removals`).
    removals: std::sync::OnceLock<Arc<dyn crate::RemovalObserver>>,
}

/// A create under way for a workload: counted in `NativeRuntime::creating` until dropped.
struct Creating<'a> {
    set: &'a Mutex<Vec<WorkloadKey>>,
    key: WorkloadKey,
}

impl<'a> Creating<'a> {
    fn new(set: &'a Mutex<Vec<WorkloadKey>>, key: WorkloadKey) -> Self {
        set.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key.clone());
        Creating { set, key }
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = set.iter().position(|k| *k == self.key) {
            set.swap_remove(i);
        }
    }
}

fn lc_error(context: impl Into<String>, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Container {
        context: context.into(),
        message: e.to_string(),
    }
}

/// Blocking work that needs `&self` (a container's state files, libcontainer's state, its
/// directory made or removed, a wait for the reaper's word): the async worker hands its
/// other tasks to another worker while this one blocks, so a slow disk or a stuck removal
/// never stalls heartbeats or the API. On a single-threaded runtime (tests) it just runs.
fn read_in_place<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Runs blocking work (libcontainer forks, file trees) off the async threads.
async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| lc_error(what.to_string(), e))?
}

/// Waits (at most `limit`) until process `pid` has exited: gone, or a zombie its parent has
/// not collected yet (a zombie belongs to no cgroup any more).
fn wait_until_exited(pid: nix::unistd::Pid, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        let running = fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            // The state follows the command, which is in parentheses and may hold any byte.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        });
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Container IDs are KAT instance IDs: DNS labels, which are also safe file names.
fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidOption {
            field: "id".into(),
            reason: format!(
                "{id:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
            ),
        })
    }
}

impl NativeRuntime {
    /// How many creates used a create helper started ahead of them (see
    /// [`crate::create_helper`]).
    pub fn spare_helpers_used(&self) -> u64 {
        self.helpers.used()
    }

    /// Builds run as root of the last id slice, which no workload is given (layers are
    /// unpacked as the one before it: [`UnpackSandbox`]).
    pub fn builder(&self) -> Result<crate::build::Builder> {
        let range = self.range.as_ref().map_err(|e| {
            crate::build::BuildError::Unavailable(format!("no subordinate id range: {e}"))
        })?;
        if range.slots() < 2 {
            return Err(crate::build::BuildError::Unavailable(format!(
                "the node's id range has one slice of {SLICE_SIZE} ids, for workloads; builds need a second"
            ))
            .into());
        }
        let (uid, gid) = range.slot_root(range.slots() - 1);
        Ok(crate::build::Builder {
            root: self.config.root.join("builds"),
            slice: (uid, gid, SLICE_SIZE),
            insecure: self.config.registries.insecure.clone(),
            auth_file: self.config.registries.auth_file(),
            outbound: self.config.outbound.clone(),
            cgroups: self.cgroups.clone(),
            helper: self.config.create_helper.clone(),
        })
    }

    /// The node's image store.
    pub fn images(&self) -> &ImageStore {
        &self.images
    }

    fn lib_root(&self) -> PathBuf {
        self.config.root.join("libcontainer")
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.config.root.join("containers").join(id)
    }

    fn read_meta(&self, id: &str) -> Result<Meta> {
        check_id(id)?;
        let path = self.dir(id).join("meta.json");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RuntimeError::ContainerNotFound(id.to_string()))
            }
            Err(e) => return Err(e).context(|| format!("reading {}", path.display())),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| lc_error(format!("reading {}", path.display()), e))
    }

    fn write_meta(&self, id: &str, meta: &Meta) -> Result<()> {
        let path = self.dir(id).join("meta.json");
        let bytes =
            serde_json::to_vec_pretty(meta).map_err(|e| lc_error("encoding meta.json", e))?;
        crate::state_file::write_atomic(&path, &bytes, 0o600)
            .context(|| format!("writing {}", path.display()))
    }

    fn load_container(&self, id: &str) -> Option<Container> {
        let root = self.lib_root().join(id);
        // libcontainer logs a missing state as an error; none is the usual case here (a
        // removed container, a create that failed before libcontainer's).
        if !root.join("state.json").exists() {
            return None;
        }
        let mut c = Container::load(root).ok()?;
        let _ = c.refresh_status();
        Some(c)
    }
}

#[async_trait::async_trait]
impl ContainerRuntime for NativeRuntime {
    fn capabilities(&self) -> &NodeCapabilities {
        &self.caps
    }

    async fn pull_image(
        &self,
        reference: &str,
        progress: Option<image::ProgressSender>,
    ) -> Result<ImageSummary> {
        image::pull::pull(
            &self.images,
            &self.config.registries,
            &self.config.outbound,
            reference,
            progress.as_ref(),
        )
        .await
    }

    async fn import_image(&self, layout: &Path, reference: &str) -> Result<ImageSummary> {
        image::layout::import(&self.images, layout, reference).await
    }

    async fn build_image(
        &self,
        request: &crate::build::BuildRequest,
        limits: crate::build::BuildLimits,
        progress: &tokio::sync::watch::Sender<crate::build::BuildPhase>,
    ) -> Result<crate::build::BuildOutcome> {
        use crate::build::{BuildOutcome, BuildPhase, CacheOutcome};
        if let Some(cache) = &request.cache {
            let cached = crate::build::cache_reference(cache, request);
            progress.send_replace(BuildPhase::CheckingCache);
            match image::pull::pull(
                &self.images,
                &self.config.registries,
                &self.config.outbound,
                &cached,
                None,
            )
            .await
            {
                Ok(pulled) => {
                    // A small index update, as `list_images` reads it.
                    let image = self
                        .images
                        .rename(&pulled.id, &cached, &request.reference)?;
                    return Ok(BuildOutcome {
                        image,
                        cache: CacheOutcome::Hit(cached),
                    });
                }
                Err(e) => {
                    tracing::info!(image = %cached, error = %e, "not in the build cache; building")
                }
            }
        }
        let built = self.builder()?.build(request, limits, progress).await?;
        let imported = image::layout::import(&self.images, &built.layout, &request.reference).await;
        let cache = built.cache.clone();
        built.remove().await;
        Ok(BuildOutcome {
            image: imported?,
            cache,
        })
    }

    async fn list_images(&self) -> Result<Vec<ImageSummary>> {
        self.images.list()
    }

    async fn remove_image(&self, reference: &str) -> Result<u64> {
        let in_use = self.images_in_use().await?;
        let freed = self.images.remove(reference, &in_use)?;
        self.sweep_after_removal().await;
        Ok(freed)
    }

    async fn prune_images(&self) -> Result<u64> {
        let in_use = self.images_in_use().await?;
        let freed = self.images.prune(&in_use)?;
        self.sweep_after_removal().await;
        Ok(freed)
    }

    async fn create(&self, options: &CreateOptions) -> Result<ContainerStatus> {
        check_id(&options.id)?;
        let dir = self.dir(&options.id);
        read_in_place(|| {
            if dir.exists() || self.lib_root().join(&options.id).exists() {
                return Err(RuntimeError::ContainerExists(options.id.clone()));
            }
            fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
            // Ours alone until `create_in` knows the slice: then its root (a different host
            // uid) may pass through to mount its overlay and bind sources, and no other user may.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                .context(|| format!("chmod {}", dir.display()))
        })?;
        let _creating = Creating::new(
            &self.creating,
            WorkloadKey::new(&options.namespace, &options.workload),
        );
        match self.create_in(options, &dir).await {
            Ok(meta) => read_in_place(|| {
                if let Err(e) = self.write_meta(&options.id, &meta) {
                    self.discard(&options.id);
                    return Err(e);
                }
                Ok(self.status_of(&options.id, meta))
            }),
            Err(e) => {
                read_in_place(|| self.discard(&options.id));
                Err(e)
            }
        }
    }

    async fn start(&self, id: &str) -> Result<()> {
        let mut phases = crate::phases::Phases::begin("start");
        let mut meta = read_in_place(|| self.read_meta(id))?;
        phases.mark("meta");
        let lib_root = self.lib_root();
        let owned = id.to_string();
        phases = blocking("starting the container", move || {
            let mut c = Container::load(lib_root.join(&owned))
                .map_err(|e| lc_error(format!("loading container {owned}"), e))?;
            c.refresh_status()
                .map_err(|e| lc_error(format!("container {owned}"), e))?;
            phases.mark("load");
            if !c.can_start() {
                return Err(RuntimeError::WrongState {
                    id: owned.clone(),
                    state: format!("{:?}", c.status()).to_lowercase(),
                    what: "and only a created container can be started".into(),
                });
            }
            let _cwd = crate::LIBCONTAINER_CWD
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            c.start()
                .map_err(|e| lc_error(format!("starting container {owned}"), e))?;
            phases.mark("start");
            Ok(phases)
        })
        .await?;
        meta.started_at = Some(SystemTime::now());
        read_in_place(|| self.write_meta(id, &meta))?;
        phases.mark("record");
        phases.report(id);
        Ok(())
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<ContainerStatus> {
        let (meta, container) = read_in_place(|| {
            Ok::<_, RuntimeError>((self.read_meta(id)?, self.load_container(id)))
        })?;
        if let Some(mut c) = container {
            if matches!(
                c.status(),
                LcStatus::Running | LcStatus::Created | LcStatus::Paused
            ) {
                read_in_place(|| signal_init(&mut c, 15));
                if !self.wait_until_exited(id, grace).await {
                    read_in_place(|| {
                        if let Some(mut c) = self.load_container(id) {
                            // Every process of the container (a walk of its cgroup); without
                            // a cgroup to walk (no usable cgroups on this node), PID 1, which
                            // takes its PID namespace with it.
                            if c.kill(LcSignal::try_from(9).expect("SIGKILL is a signal"), true)
                                .is_err()
                            {
                                signal_init(&mut c, 9);
                            }
                        }
                    });
                    self.wait_until_exited(id, Duration::from_secs(10)).await;
                }
            }
        }
        Ok(read_in_place(|| self.status_of(id, meta)))
    }

    fn observe_removals(
        &self,
        observer: Arc<dyn crate::RemovalObserver>,
    ) -> std::result::Result<(), Arc<dyn crate::RemovalObserver>> {
        self.removals.set(observer)
    }

    async fn remove(&self, id: &str, force: bool) -> Result<()> {
        if let Some(observer) = self.removals.get() {
            observer.removing(self, id).await;
        }
        let status =
            read_in_place(|| Ok::<_, RuntimeError>(self.status_of(id, self.read_meta(id)?)))?;
        if status.state == ContainerState::Running {
            if !force {
                return Err(RuntimeError::WrongState {
                    id: id.to_string(),
                    state: "running".into(),
                    what: "stop it first or remove with force".into(),
                });
            }
            self.stop(id, Duration::ZERO).await?;
        }
        let lib_root = self.lib_root();
        let owned = id.to_string();
        blocking("removing the container", move || {
            if let Ok(mut c) = Container::load(lib_root.join(&owned)) {
                let _ = c.refresh_status();
                let created = c.status() == LcStatus::Created;
                let deleted = c.delete(true).or_else(|e| {
                    // The delete of a created container kills its init and removes its cgroup
                    // at once; the kernel refuses while the killed init has not exited yet.
                    match c.pid() {
                        Some(pid) if created => {
                            wait_until_exited(pid, Duration::from_secs(5));
                            c.delete(true)
                        }
                        _ => Err(e),
                    }
                });
                if let Err(e) = deleted {
                    // With no process left, what libcontainer could not clean up (a cgroup
                    // it never had, on a node without usable cgroups) goes with the state
                    // directory below.
                    let _ = c.refresh_status();
                    if c.status() != LcStatus::Stopped {
                        return Err(lc_error(format!("deleting container {owned}"), e));
                    }
                    tracing::warn!(container = %owned, error = %e, "libcontainer could not delete a stopped container; removing its state");
                }
            }
            Ok(())
        })
        .await?;
        read_in_place(|| self.discard(id));
        Ok(())
    }

    async fn status(&self, id: &str) -> Result<ContainerStatus> {
        read_in_place(|| {
            let meta = self.read_meta(id)?;
            Ok(self.status_of(id, meta))
        })
    }
    fn exits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.reaping.exits())
    }
    fn sees_exit(&self, id: &str) -> bool {
        self.reaping.is_reaping(id)
    }

    async fn usage(&self, id: &str) -> Result<ContainerUsage> {
        check_id(id)?;
        if !self.dir(id).exists() {
            return Err(RuntimeError::ContainerNotFound(id.to_string()));
        }
        let cgroups = self.cgroups.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || cgroups.usage(&id).unwrap_or_default())
            .await
            .map_err(|e| lc_error("reading the container's cgroup", e.to_string()))
    }

    async fn list(&self) -> Result<Vec<ContainerStatus>> {
        read_in_place(|| {
            let dir = self.config.root.join("containers");
            let mut out = Vec::new();
            for entry in fs::read_dir(&dir).context(|| format!("reading {}", dir.display()))? {
                let entry = entry.context(|| format!("reading {}", dir.display()))?;
                let id = entry.file_name().to_string_lossy().into_owned();
                if let Ok(meta) = self.read_meta(&id) {
                    out.push(self.status_of(&id, meta));
                }
            }
            out.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(out)
        })
    }

    async fn logs(&self, id: &str, options: LogOptions) -> Result<LogReceiver> {
        self.read_meta(id)?;
        let dir = self.dir(id).join("logs");
        let lib_dir = self.lib_root().join(id);
        let running = move || -> bool {
            Container::load(lib_dir.clone())
                .map(|mut c| {
                    let _ = c.refresh_status();
                    !matches!(c.status(), LcStatus::Stopped)
                })
                .unwrap_or(false)
        };
        let watcher = self.log_watch.get_or_init(|| {
            crate::log_watch::LogWatcher::new()
                .inspect_err(|e| tracing::warn!(error = %e, "no inotify: followed logs are read every 50 ms"))
                .ok()
        });
        logs::stream(dir, options, running, watcher.as_ref())
    }

    async fn exec(&self, id: &str, options: ExecOptions) -> Result<ExecHandle> {
        let status = self.status(id).await?;
        if status.state != ContainerState::Running {
            return Err(RuntimeError::WrongState {
                id: id.to_string(),
                state: status.state.to_string(),
                what: "and exec needs a running container".into(),
            });
        }
        crate::exec::exec(
            self.lib_root(),
            &self.config.init_binary,
            id.to_string(),
            self.cgroups.procs_files(id),
            options,
        )
        .await
    }
}

impl NativeRuntime {
    async fn images_in_use(&self) -> Result<Vec<String>> {
        Ok(self.list().await?.into_iter().map(|c| c.image_id).collect())
    }

    /// Cgroup directories of a container (for tests and diagnostics).
    pub fn cgroup_exists(&self, id: &str) -> bool {
        self.cgroups.exists(id)
    }

    /// The container's cgroup directories: one on cgroup v2, one per controller on v1 (for
    /// tests and diagnostics).
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        self.cgroups.dirs(id)
    }

    /// The container's directory under the runtime root (`containers/<id>`).
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.dir(id)
    }
}

#[cfg(test)]
mod blocking_tests {
    use std::time::{Duration, Instant};

    /// Work that blocks its thread (a slow disk, a stuck kernel call) on both async workers
    /// at once leaves the runtime free for other tasks: a timer still fires on time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_work_on_every_worker_leaves_timers_running() {
        let blockers: Vec<_> = (0..2)
            .map(|_| {
                tokio::spawn(async {
                    super::read_in_place(|| std::thread::sleep(Duration::from_millis(800)))
                })
            })
            .collect();
        // Both workers are inside the blocking call now.
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let late = t0.elapsed();
        for b in blockers {
            b.await.unwrap();
        }
        assert!(
            late < Duration::from_millis(500),
            "a 20 ms timer took {late:?} while the workers blocked"
        );
    }
}
