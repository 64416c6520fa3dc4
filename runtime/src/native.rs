//! The native `ContainerRuntime`: youki's `libcontainer`, kat-init and the image store.
//!
//! On disk, under the runtime root:
//!
//! ```text
//! images/                       the image store
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
use crate::id_slices::IdSlices;
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

/// How to set up a `NativeRuntime`.
#[derive(Clone, Debug)]
pub struct NativeConfig {
    /// Where images, container state and logs live.
    pub root: PathBuf,
    /// The static kat-init binary to place in every container.
    pub init_binary: PathBuf,
    pub registries: RegistryConfig,
    /// The node's subordinate id range; defaults to the current user's from `/etc/subuid`
    /// and `/etc/subgid`. Without one, containers are refused.
    pub id_range: Option<NodeIdRange>,
    /// Parent cgroup of containers (default `/kat`; ignored for a delegated v2 subtree and
    /// under systemd, where containers go in `kat.slice`).
    pub cgroup_parent: Option<String>,
    /// systemd scopes or the cgroup filesystem (default: detected).
    pub cgroup_manager: CgroupManager,
    /// Never try overlay; always copy the image (for hosts where overlay misbehaves).
    pub force_copy_rootfs: bool,
    /// kat-init installs KAT's default seccomp filter in every container (default on).
    pub seccomp: bool,
    /// What one image may unpack to (a layer bomb stops there).
    pub image_limits: image::UnpackLimits,
    /// Registry connect, read and per-blob timeouts.
    pub pull_timeouts: image::PullTimeouts,
    /// The program that runs libcontainer's create in a process of its own
    /// ([`crate::create_helper`]). Default: this very binary (`/proc/self/exe`), which must
    /// then call [`crate::create_helper::run_if_requested`] first in `main`.
    pub create_helper: PathBuf,
    /// The node network; containers with an address join namespaces it makes.
    pub network: Option<Arc<dyn crate::network::NetworkNamespaces>>,
}

impl NativeConfig {
    pub fn new(root: impl Into<PathBuf>, init_binary: impl Into<PathBuf>) -> NativeConfig {
        NativeConfig {
            root: root.into(),
            init_binary: init_binary.into(),
            registries: RegistryConfig::default(),
            id_range: None,
            cgroup_parent: None,
            cgroup_manager: CgroupManager::Auto,
            force_copy_rootfs: false,
            seccomp: true,
            image_limits: image::UnpackLimits::default(),
            pull_timeouts: image::PullTimeouts::default(),
            create_helper: PathBuf::from("/proc/self/exe"),
            network: None,
        }
    }
}

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

pub struct NativeRuntime {
    config: NativeConfig,
    images: ImageStore,
    cgroups: Cgroups,
    /// The node's id range, or why there is none (then every create says so).
    range: std::result::Result<NodeIdRange, String>,
    /// Which workload owns which slice of the range.
    slices: Mutex<Option<IdSlices>>,
    caps: NodeCapabilities,
    overlay: AtomicBool,
    /// Containers whose kat-init our reaper thread waits for; it writes `exit.json` if
    /// kat-init could not, a moment after the process is gone.
    reaping: Arc<crate::reaping::Reaping>,
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

fn kernel_allows_userns_overlay() -> bool {
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems
        .lines()
        .any(|l| l.trim_end().ends_with("overlay"))
    {
        return false;
    }
    // Unprivileged overlay (with `userxattr`) arrived in Linux 5.11.
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (5, 11)
}

impl NativeRuntime {
    pub fn new(config: NativeConfig) -> Result<NativeRuntime> {
        if !config.init_binary.is_file() {
            return Err(RuntimeError::InvalidOption {
                field: "init_binary".into(),
                reason: format!(
                    "{} does not exist; build the static kat-init (scripts/test-fixtures.sh does: RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build -p kat-init --release --target x86_64-unknown-linux-gnu) or pass its path",
                    config.init_binary.display()
                ),
            });
        }
        if is_dynamic_elf(&config.init_binary) {
            return Err(RuntimeError::InvalidOption {
                field: "init_binary".into(),
                reason: format!(
                    "{} is dynamically linked and cannot run inside images without a libc; build the static kat-init (RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build -p kat-init --release --target x86_64-unknown-linux-gnu) and pass its path",
                    config.init_binary.display()
                ),
            });
        }
        // Searchable (each container's own directory then lets only its slice in), except
        // the image store, which only we read: workloads get shifted copies (`slots/`).
        for (sub, mode) in [
            ("containers", 0o711),
            ("libcontainer", 0o711),
            ("images", 0o700),
        ] {
            let dir = config.root.join(sub);
            fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .context(|| format!("chmod {}", dir.display()))?;
        }
        fs::set_permissions(&config.root, fs::Permissions::from_mode(0o711))
            .context(|| format!("chmod {}", config.root.display()))?;
        crate::create_helper::become_subreaper()?;
        let range = match config.id_range {
            Some(r) if r.slots() > 0 => Ok(r),
            Some(r) => Err(format!(
                "the configured id range has {} ids, fewer than the {SLICE_SIZE} one workload needs",
                r.uid_count.min(r.gid_count)
            )),
            None => NodeIdRange::for_current_user(),
        };
        // Layers keep the image's own ids (a root agent) or belong to us (unprivileged);
        // each workload's copy is shifted into its slice (`slot_rootfs`).
        let mut images = ImageStore::open(&config.root.join("images"), IdMap::identity())?
            .with_limits(config.image_limits)
            .with_timeouts(config.pull_timeouts);
        let sandbox = range
            .as_ref()
            .ok()
            .and_then(|r| UnpackSandbox::new(config.create_helper.clone(), *r));
        // Searchable, not listable: each slice's directory below lets only its own root
        // through to the image copies that are the lower layers of its overlays.
        let slots = config.root.join("slots");
        fs::create_dir_all(&slots).context(|| format!("creating {}", slots.display()))?;
        fs::set_permissions(&slots, fs::Permissions::from_mode(0o711))
            .context(|| format!("chmod {}", slots.display()))?;
        let cgroups = Cgroups::detect(config.cgroup_parent.as_deref(), config.cgroup_manager);
        let rootless = !nix::unistd::geteuid().is_root();
        let overlay = !config.force_copy_rootfs && kernel_allows_userns_overlay();
        let mut notes = cgroups.notes.clone();
        if !config.seccomp {
            notes.push("seccomp: off (--seccomp unconfined); containers rely on the user namespace, dropped capabilities and no_new_privs".into());
        }
        match &range {
            Ok(r) => notes.push(format!(
                "user namespaces: {} workload slices of {SLICE_SIZE} ids from host uid {} (gid {})",
                r.slots(),
                r.uid_start,
                r.gid_start
            )),
            Err(e) => notes.push(format!("containers refused: {e}")),
        }
        match sandbox {
            Some(sandbox) => {
                notes.push(format!(
                    "image layers unpacked as uid {} (an id slice of their own), which owns nothing on the host",
                    sandbox.unpacks_as().0
                ));
                images = images.with_sandbox(sandbox);
            }
            None => notes.push("image layers unpacked with the agent's own credentials: the id range has no slice to spare (give the agent's user at least three slices of 65536 ids)".into()),
        }
        if rootless {
            notes.push("image files owned by non-root ids are owned by container root (unpacked without privilege)".into());
        }
        let caps = NodeCapabilities {
            rootless,
            cgroup_mode: cgroups.mode,
            memory_limit: cgroups.memory,
            cpu_limit: cgroups.cpu,
            pids_limit: cgroups.pids,
            rootfs: if overlay {
                RootfsMode::Overlay
            } else {
                RootfsMode::Copy
            },
            uid_map: range
                .as_ref()
                .map(|r| vec![(0, r.uid_start, r.uid_count)])
                .unwrap_or_default(),
            seccomp: config.seccomp,
            notes,
        };
        Ok(NativeRuntime {
            overlay: AtomicBool::new(overlay),
            reaping: Arc::default(),
            config,
            images,
            cgroups,
            range,
            slices: Mutex::new(None),
            caps,
        })
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
            cgroups: self.cgroups.clone(),
            helper: self.config.create_helper.clone(),
        })
    }

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
        let mut c = Container::load(self.lib_root().join(id)).ok()?;
        let _ = c.refresh_status();
        Some(c)
    }

    /// Checks limits against what is possible; returns warnings for what cannot be enforced.
    fn check_limits(&self, r: &Resources) -> Result<Vec<String>> {
        if r.memory_limit_bytes > 0 && r.memory_limit_bytes < 4 * 1024 * 1024 {
            return Err(RuntimeError::BadLimits(format!(
                "memory limit {} bytes is below the 4 MiB a container needs to start",
                r.memory_limit_bytes
            )));
        }
        if r.cpu_limit_millis > 0 && r.cpu_limit_millis < 10 {
            return Err(RuntimeError::BadLimits(format!(
                "cpu limit {}m is below the kernel's minimum of 10m (1 ms per 100 ms)",
                r.cpu_limit_millis
            )));
        }
        if r.cpu_limit_millis > 0 && r.cpu_request_millis > r.cpu_limit_millis {
            return Err(RuntimeError::BadLimits(format!(
                "cpu request {}m is above the cpu limit {}m",
                r.cpu_request_millis, r.cpu_limit_millis
            )));
        }
        if r.pids_limit > 0 && r.pids_limit < 2 {
            return Err(RuntimeError::BadLimits(
                "pids limit must be at least 2 (kat-init and the workload)".into(),
            ));
        }
        let mut warnings = Vec::new();
        let mode = format!("{:?}", self.caps.cgroup_mode);
        if r.memory_limit_bytes > 0 && !self.caps.memory_limit {
            warnings.push(format!(
                "memory limit not enforced on this node (cgroups: {mode})"
            ));
        }
        if (r.cpu_limit_millis > 0 || r.cpu_request_millis > 0) && !self.caps.cpu_limit {
            warnings.push(format!(
                "cpu limit not enforced on this node (cgroups: {mode})"
            ));
        }
        if r.pids_limit > 0 && !self.caps.pids_limit {
            warnings.push(format!(
                "pids limit not enforced on this node (cgroups: {mode})"
            ));
        }
        Ok(warnings)
    }

    /// Opens every volume's source (its `subPath` walked without following symlinks, see
    /// [`crate::volume_paths`]); the opened sources are checked again once mounted.
    fn volume_sources(&self, options: &CreateOptions) -> Result<Vec<OpenedSource>> {
        let mut out = Vec::new();
        for v in &options.volumes {
            let bad = |reason: &str| RuntimeError::BadMount {
                name: v.name.clone(),
                source_path: v.source.clone(),
                reason: reason.to_string(),
            };
            if !v.source.is_absolute() {
                return Err(bad("is not an absolute path"));
            }
            if !v.destination.starts_with('/') || v.destination.split('/').any(|c| c == "..") {
                return Err(bad(&format!(
                    "has destination {:?}, which must be an absolute path without '..'",
                    v.destination
                )));
            }
            if let Some(sub) = &v.sub_path {
                if sub.starts_with('/') || sub.split('/').any(|c| c == "..") {
                    return Err(bad(&format!(
                        "subPath {sub:?} must be relative and without '..'"
                    )));
                }
            }
            // The source was resolved by the agent: it is opened refusing any symlink, and
            // so is everything below it, which a container may have planted.
            let opened = crate::volume_paths::open_beneath(&v.source, v.sub_path.as_deref(), true)
                .map_err(|e| match &v.sub_path {
                    Some(sub) => bad(&format!("subPath {sub:?}: {e}")),
                    None => bad(&e),
                })?;
            out.push(opened);
        }
        Ok(out)
    }

    /// After create, before start: every volume mount is the object opened for it.
    fn verify_volumes(
        &self,
        options: &CreateOptions,
        pid: i32,
        sources: &[OpenedSource],
    ) -> Result<()> {
        for (v, source) in options.volumes.iter().zip(sources) {
            crate::volume_paths::verify_mounted(pid, &v.destination, source).map_err(|reason| {
                RuntimeError::BadMount {
                    name: v.name.clone(),
                    source_path: v.source.clone(),
                    reason,
                }
            })?;
        }
        Ok(())
    }

    /// Everything of `create` after the container directory exists; on error the caller
    /// removes that directory.
    async fn create_in(&self, options: &CreateOptions, dir: &Path) -> Result<Meta> {
        let warnings = self.check_limits(&options.resources)?;
        let record = self.images.resolve(&options.image)?;
        let volume_sources = self.volume_sources(options)?;
        let snapshot = self.images.snapshot(&record).await?;
        let user = if options.user.is_empty() {
            record.config.user.clone()
        } else {
            options.user.clone()
        };
        let (uid, gid) = crate::rootfs::resolve_user(&snapshot, &user)?;
        let argv = spec::workload_argv(&record.config, &options.command, &options.args);
        if argv.is_empty() {
            return Err(RuntimeError::InvalidOption {
                field: "command".into(),
                reason: format!(
                    "image {} has no Entrypoint or Cmd; give the workload a command",
                    options.image
                ),
            });
        }
        let hostname = if options.hostname.is_empty() {
            options.id.clone()
        } else {
            options.hostname.clone()
        };
        let env = spec::merged_env(&record.config, &options.env, &hostname);
        let image_root = crate::tree_dir::TreeDir::open(&snapshot)
            .context(|| format!("opening {}", snapshot.display()))?;
        crate::rootfs::find_executable(&image_root, &argv[0], &env)?;
        let cwd = if record.config.working_dir.is_empty() {
            "/".to_string()
        } else {
            record.config.working_dir.clone()
        };

        let range = *self
            .range
            .as_ref()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })?;
        let slot = self.acquire_slot(options)?;
        let ids = range.slot_map(slot, !nix::unistd::geteuid().is_root());
        let host_root = range.slot_root(slot);
        let host_user = (ids.host_uid(uid), ids.host_gid(gid));
        // Its root only: the workload reaches its files through the mounts root made.
        crate::acl::searchable_by(dir, &[host_root.0]).context(|| {
            format!(
                "setting an ACL on {} (the file system must support POSIX ACLs)",
                dir.display()
            )
        })?;
        let logs = dir.join("logs");
        let etc = dir.join("etc");
        let rootfs = dir.join("rootfs");
        for d in [&logs, &etc, &dir.join("bundle")] {
            fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
        }
        // config.json holds the workload's environment (secrets, often): ours alone.
        fs::set_permissions(dir.join("bundle"), fs::Permissions::from_mode(0o700))
            .context(|| "chmod bundle".to_string())?;
        // kat-init writes here as the workload's user, and only it and we may: ours, with
        // an ACL for it (see `acl`); no other host user gets in.
        fs::set_permissions(&logs, fs::Permissions::from_mode(0o700))
            .context(|| format!("chmod {}", logs.display()))?;
        crate::acl::share_log_dir(&logs, host_user.0, nix::unistd::geteuid().as_raw()).context(
            || {
                format!(
                    "setting an ACL on {} (the file system must support POSIX ACLs)",
                    logs.display()
                )
            },
        )?;
        fs::write(
            etc.join("hosts"),
            spec::hosts_file(&hostname, options.address, &options.hosts),
        )
        .context(|| "writing /etc/hosts".to_string())?;
        fs::write(etc.join("hostname"), format!("{hostname}\n"))
            .context(|| "writing /etc/hostname".to_string())?;
        fs::write(
            etc.join("resolv.conf"),
            spec::resolv_conf(&options.dns_servers, &options.dns_search),
        )
        .context(|| "writing /etc/resolv.conf".to_string())?;

        let use_overlay = self.overlay.load(Ordering::Relaxed);
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        let lower = if use_overlay {
            for d in [&rootfs, &upper, &work] {
                fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
            }
            fs::set_permissions(&upper, fs::Permissions::from_mode(0o755))
                .context(|| format!("chmod {}", upper.display()))?;
            // The overlay's directories and the workload's own volumes belong to its
            // root: one task, so an unprivileged agent starts one helper per create.
            let mut paths = vec![rootfs.clone(), upper.clone(), work.clone()];
            paths.extend(
                options
                    .volumes
                    .iter()
                    .filter(|v| v.owned_by_container)
                    .map(|v| v.source.clone()),
            );
            self.id_task(IdTask::Own {
                paths,
                owner: host_root,
            })
            .await?;
            self.slot_rootfs(&record.id, &snapshot, slot).await?
        } else {
            self.shifted_copy(&snapshot, &rootfs, host_root).await?;
            let volumes: Vec<PathBuf> = options
                .volumes
                .iter()
                .filter(|v| v.owned_by_container)
                .map(|v| v.source.clone())
                .collect();
            if !volumes.is_empty() {
                self.id_task(IdTask::Own {
                    paths: volumes,
                    owner: host_root,
                })
                .await?;
            }
            rootfs.clone()
        };
        let joined = match options.address {
            Some(address) => Some(self.join_network(address, &ids).await?),
            None => None,
        };
        let cgroups_path = self.cgroups.container_path(&options.id);
        let kat_limits = self.cgroups.kat_applies_limits();
        let input = SpecInput {
            options,
            hostname: &hostname,
            argv,
            env,
            cwd,
            uid,
            gid,
            ids: &ids,
            rootfs: if use_overlay {
                Rootfs::Overlay {
                    mountpoint: &rootfs,
                    lower: &lower,
                    upper: &upper,
                    work: &work,
                }
            } else {
                Rootfs::Copy(&rootfs)
            },
            init_binary: &self.config.init_binary,
            etc_dir: &etc,
            log_dir: &logs,
            volume_sources: volume_sources.iter().map(|o| o.path.clone()).collect(),
            cgroups_path,
            memory_limit: self.caps.memory_limit && !kat_limits,
            cpu_limit: self.caps.cpu_limit && !kat_limits,
            pids_limit: self.caps.pids_limit && !kat_limits,
            omit_resources: kat_limits,
            seccomp: self.config.seccomp,
            cgroup_mount: matches!(
                self.cgroups.mode,
                CgroupMode::Systemd | CgroupMode::V2Delegated | CgroupMode::V2Root
            ),
            joined: joined.as_ref().map(|j| (j.user(), j.network())),
        };
        let config = spec::build(&input);
        let bundle = dir.join("bundle");
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).map_err(|e| lc_error("encoding config.json", e))?,
        )
        .context(|| "writing config.json".to_string())?;

        let request = crate::create_helper::Request {
            id: options.id.clone(),
            lib_root: self.lib_root(),
            bundle,
            systemd: self.cgroups.mode == CgroupMode::Systemd,
            enter_user_namespace: joined
                .as_ref()
                .filter(|_| !nix::unistd::geteuid().is_root())
                .map(|j| j.parent_user()),
        };
        crate::create_helper::create(
            &self.config.create_helper,
            &request,
            &dir.join("create.err"),
        )
        .await?;
        // The container's processes hold its namespaces now.
        drop(joined);
        // kat-init is our child now (its helper is gone and we are a subreaper): wait for it.
        let init_pid = self.load_container(&options.id).and_then(|c| c.pid());
        if let Some(pid) = init_pid {
            let (cgroups, id) = (self.cgroups.clone(), options.id.clone());
            let reaping = self.reaping.clone();
            reaping.started(&options.id);
            let done_id = options.id.clone();
            spawn_reaper(
                pid.as_raw(),
                logs,
                move || cgroups.oom_killed(&id),
                move || reaping.done(&done_id),
            );
        }
        if let Some(pid) = init_pid {
            self.verify_volumes(options, pid.as_raw(), &volume_sources)?;
        }
        if kat_limits {
            self.cgroups
                .apply_v1_limits(&options.id, &options.resources)?;
        }

        Ok(Meta {
            options: options.clone(),
            image_id: record.id,
            created_at: SystemTime::now(),
            started_at: None,
            rootfs: if use_overlay {
                RootfsMode::Overlay
            } else {
                RootfsMode::Copy
            },
            warnings,
        })
    }

    /// The namespaces a container with `address` joins, from the node network.
    async fn join_network(
        &self,
        address: std::net::Ipv4Addr,
        ids: &IdMap,
    ) -> Result<Box<dyn crate::network::JoinedNamespaces>> {
        let network = self
            .config
            .network
            .clone()
            .ok_or_else(|| RuntimeError::InvalidOption {
                field: "address".into(),
                reason: format!("this node has no container network to give {address} on"),
            })?;
        let ids = ids.clone();
        blocking("connecting the container to the node network", move || {
            network
                .prepare(address, &ids)
                .map_err(|message| RuntimeError::Container {
                    context: format!("connecting the container to the node network as {address}"),
                    message,
                })
        })
        .await
    }

    /// Runs an ownership task off the async threads (see [`crate::id_tool`]).
    async fn id_task(&self, task: IdTask) -> Result<()> {
        let range = *self
            .range
            .as_ref()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })?;
        let program = self.config.create_helper.clone();
        blocking("changing file ownership", move || {
            crate::id_tool::run(&program, &range, &task)
        })
        .await
    }

    /// The slice of this container's workload, allocated on first use and kept.
    fn acquire_slot(&self, options: &CreateOptions) -> Result<u32> {
        let range = self
            .range
            .as_ref()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })?;
        let key = WorkloadKey::new(&options.namespace, &options.workload);
        let mut guard = self
            .slices
            .lock()
            .map_err(|_| lc_error("the id-slice table", "a thread panicked while holding it"))?;
        if guard.is_none() {
            *guard = Some(IdSlices::load(
                &self.config.root.join("id-slices.json"),
                // The last slice is the builds' (`builder`), the one before it the layer
                // unpacker's when the range has room for it.
                range
                    .slots()
                    .saturating_sub(if UnpackSandbox::slot(range).is_some() {
                        2
                    } else {
                        1
                    })
                    .max(1),
            )?);
        }
        let table = guard
            .as_mut()
            .ok_or_else(|| lc_error("the id-slice table", "not loaded"))?;
        let in_use = std::cell::OnceCell::new();
        table.acquire(&key, |k| {
            in_use
                .get_or_init(|| self.workloads_with_containers())
                .contains(k)
        })
    }

    /// The workload of every container on the node.
    fn workloads_with_containers(&self) -> HashSet<WorkloadKey> {
        let dir = self.config.root.join("containers");
        fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| self.read_meta(&e.file_name().to_string_lossy()).ok())
            .map(|m| WorkloadKey::new(&m.options.namespace, &m.options.workload))
            .collect()
    }

    /// Ids as the image store keeps them: a root agent keeps the image's own ids (0…), an
    /// unprivileged one owns every file itself.
    fn stored_ids(&self) -> ((u32, u32), u32) {
        if nix::unistd::geteuid().is_root() {
            ((0, 0), SLICE_SIZE)
        } else {
            (
                (
                    nix::unistd::geteuid().as_raw(),
                    nix::unistd::getegid().as_raw(),
                ),
                1,
            )
        }
    }

    /// Copies `from` to `to` (which must not exist) and shifts the copy into the slice whose
    /// root is `root`. Setuid and setgid bits do not survive the change of owner.
    async fn shifted_copy(&self, from: &Path, to: &Path, root: (u32, u32)) -> Result<()> {
        let (f, t) = (from.to_path_buf(), to.to_path_buf());
        let privileged = nix::unistd::geteuid().is_root();
        blocking("copying the image", move || {
            crate::image::snapshot::copy_tree(&f, &t, privileged)
        })
        .await?;
        let (stored, count) = self.stored_ids();
        self.id_task(IdTask::Shift {
            path: to.to_path_buf(),
            from: stored,
            count,
            to: root,
        })
        .await
    }

    /// The image's tree owned by slice `slot`: the lower directory of its containers'
    /// overlays, made once per image and slice and kept under `slots/`.
    async fn slot_rootfs(&self, image_id: &str, snapshot: &Path, slot: u32) -> Result<PathBuf> {
        let hex = image_id.trim_start_matches("sha256:");
        // One directory per slice, which only that slice's root may pass through: other
        // local users (and other slices) cannot read the image copies below.
        let slice_dir = self.config.root.join("slots").join(slot.to_string());
        let dest = slice_dir.join(hex);
        if dest.is_dir() {
            return Ok(dest);
        }
        let slice_root = self
            .range
            .as_ref()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })?
            .slot_root(slot);
        fs::create_dir_all(&slice_dir).context(|| format!("creating {}", slice_dir.display()))?;
        fs::set_permissions(&slice_dir, fs::Permissions::from_mode(0o700))
            .context(|| format!("chmod {}", slice_dir.display()))?;
        crate::acl::searchable_by(&slice_dir, &[slice_root.0])
            .context(|| format!("setting an ACL on {}", slice_dir.display()))?;
        let range = *self
            .range
            .as_ref()
            .map_err(|e| RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: e.clone(),
            })?;
        let tmp = dest.with_extension(format!(
            "partial-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let made = self
            .shifted_copy(snapshot, &tmp, range.slot_root(slot))
            .await;
        let renamed = made.and_then(|()| {
            fs::rename(&tmp, &dest).or_else(|e| {
                // Another create of the same workload got there first.
                if dest.is_dir() {
                    Ok(())
                } else {
                    Err(e).context(|| format!("moving {} into place", dest.display()))
                }
            })
        });
        if tmp.exists() {
            let _ = self.id_task(IdTask::Remove { path: tmp }).await;
        }
        renamed.map(|()| dest)
    }

    /// Forgets a half-made container: libcontainer state, cgroups, files.
    fn discard(&self, id: &str) {
        if let Some(mut c) = self.load_container(id) {
            let _ = c.kill(LcSignal::try_from(9).expect("SIGKILL is a signal"), true);
            let _ = c.delete(true);
        }
        let _ = remove_tree(&self.lib_root().join(id));
        // The upper layer and logs belong to the workload's ids: an unprivileged agent
        // removes them from inside a user namespace.
        if remove_tree(&self.dir(id)).is_err() {
            if let Ok(range) = &self.range {
                let task = IdTask::Remove { path: self.dir(id) };
                if let Err(e) = crate::id_tool::run(&self.config.create_helper, range, &task) {
                    tracing::warn!(container = %id, error = %e, "cannot remove the container's files");
                }
            }
        }
        self.cgroups.remove(id);
    }

    fn status_of(&self, id: &str, meta: Meta) -> ContainerStatus {
        let container = self.load_container(id);
        let lc_status = container.as_ref().map(|c| c.status());
        let pid = container.as_ref().and_then(|c| c.pid()).map(|p| p.as_raw());
        let read_exit = || read_exit_record(&self.dir(id).join("logs"));
        let mut exit = read_exit();
        if exit.is_none() && lc_status == Some(LcStatus::Stopped) {
            // kat-init died without a record; if our reaper has it, its record is a moment
            // away: the reaper says when it is written.
            self.reaping.wait_until_reaped(id, Duration::from_secs(2));
            exit = read_exit();
        }
        let state = match lc_status {
            Some(LcStatus::Created) | Some(LcStatus::Creating) => ContainerState::Created,
            Some(LcStatus::Running) | Some(LcStatus::Paused) => ContainerState::Running,
            Some(LcStatus::Stopped) => ContainerState::Exited,
            None => ContainerState::Unknown,
        };
        let mut warnings = meta.warnings.clone();
        let (exit_code, signal, finished_at) = match (&exit, state) {
            (Some(e), _) => (
                Some(e.exit_code),
                e.signal,
                crate::logs::parse_time(&e.finished_at),
            ),
            (None, ContainerState::Exited) => {
                warnings.push("kat-init was killed before it could record the exit status".into());
                (Some(137), Some(9), None)
            }
            _ => (None, None, None),
        };
        // An OOM kill counts when the workload failed: kat-init read the counter before the
        // cgroup could go away (systemd removes an empty scope), or the cgroup still has it.
        let oom_killed = state == ContainerState::Exited
            && exit_code != Some(0)
            && (exit.as_ref().is_some_and(|e| e.oom_killed) || self.cgroups.oom_killed(id));
        ContainerStatus {
            id: id.to_string(),
            namespace: meta.options.namespace.clone(),
            workload: meta.options.workload.clone(),
            image: meta.options.image.clone(),
            image_id: meta.image_id.clone(),
            state,
            pid: if state == ContainerState::Running {
                pid
            } else {
                None
            },
            exit_code,
            signal,
            oom_killed,
            created_at: Some(meta.created_at),
            started_at: meta.started_at,
            finished_at,
            labels: meta.options.labels.clone(),
            warnings,
        }
    }

    async fn wait_until_exited(&self, id: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match read_in_place(|| self.load_container(id).map(|c| c.status())) {
                Some(LcStatus::Stopped) | None => return true,
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Sends `signal` to the container's PID 1 (kat-init forwards it to the workload), through
/// libcontainer or, where that fails, directly.
fn signal_init(c: &mut Container, signal: i32) {
    let Ok(lc_signal) = LcSignal::try_from(signal) else {
        return;
    };
    if c.kill(lc_signal, false).is_err() {
        if let (Some(pid), Ok(sig)) = (c.pid(), nix::sys::signal::Signal::try_from(signal)) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }
}

/// Reaps kat-init when it is our child, and records its end if kat-init could not
/// (SIGKILL, OOM kill of PID 1).
/// `oom_killed` is asked at once, while the cgroup most likely still exists; `done` runs
/// when the record is written, or when there is none to write.
fn spawn_reaper(
    pid: i32,
    logs: PathBuf,
    oom_killed: impl FnOnce() -> bool + Send + 'static,
    done: impl FnOnce() + Send + 'static,
) {
    let spawned = std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || {
            record_end(pid, &logs, oom_killed);
            done();
        });
    if spawned.is_err() {
        tracing::warn!(
            pid,
            "cannot start a reaper thread; exit codes of a killed kat-init will be approximate"
        );
    }
}

fn record_end(pid: i32, logs: &Path, oom_killed: impl FnOnce() -> bool) {
    use nix::sys::wait::{waitpid, WaitStatus};
    let status = waitpid(nix::unistd::Pid::from_raw(pid), None);
    let exit = logs.join("exit.json");
    if fs::symlink_metadata(&exit).is_ok() {
        return;
    }
    let (code, signal) = match status {
        Ok(WaitStatus::Exited(_, code)) => (code, None),
        Ok(WaitStatus::Signaled(_, sig, _)) => (128 + sig as i32, Some(sig as i32)),
        _ => return,
    };
    let record = ExitRecord {
        exit_code: code,
        signal,
        finished_at: crate::logs::format_time(SystemTime::now()),
        oom_killed: oom_killed(),
    };
    if let Ok(bytes) = serde_json::to_vec(&record) {
        // The directory is the container's: never follow what a workload planted in it.
        let _ = crate::state_file::write_atomic(&exit, &bytes, 0o640);
    }
}

/// `exit.json` of a container's log directory, which its workload can write: read without
/// following links or blocking, bounded, and ignored when it is not a valid record.
fn read_exit_record(logs: &Path) -> Option<ExitRecord> {
    let bytes = crate::state_file::read_untrusted(&logs.join("exit.json"), 4096).ok()??;
    serde_json::from_slice(&bytes).ok()
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
            match image::pull::pull(&self.images, &self.config.registries, &cached, None).await {
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
        self.images.remove(reference, &in_use)
    }

    async fn prune_images(&self) -> Result<u64> {
        let in_use = self.images_in_use().await?;
        self.images.prune(&in_use)
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
        let mut meta = read_in_place(|| self.read_meta(id))?;
        let lib_root = self.lib_root();
        let owned = id.to_string();
        blocking("starting the container", move || {
            let mut c = Container::load(lib_root.join(&owned))
                .map_err(|e| lc_error(format!("loading container {owned}"), e))?;
            c.refresh_status()
                .map_err(|e| lc_error(format!("container {owned}"), e))?;
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
            Ok(())
        })
        .await?;
        meta.started_at = Some(SystemTime::now());
        read_in_place(|| self.write_meta(id, &meta))
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

    async fn remove(&self, id: &str, force: bool) -> Result<()> {
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
                if let Err(e) = c.delete(true) {
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
        logs::stream(dir, options, running)
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

    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.dir(id)
    }
}

/// Whether `path` is an ELF executable that needs a program interpreter (a dynamic loader).
/// Anything that is not ELF is left to fail at exec with its own error.
fn is_dynamic_elf(path: &Path) -> bool {
    let Ok(bytes) = fs::read(path) else {
        return false;
    };
    goblin::elf::Elf::parse(&bytes).is_ok_and(|elf| elf.interpreter.is_some())
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

#[cfg(test)]
mod elf_tests {
    #[test]
    fn tells_dynamic_from_static_executables() {
        // The test binary itself is dynamically linked; /bin/busybox from busybox-static is not.
        let me = std::env::current_exe().unwrap();
        assert!(super::is_dynamic_elf(&me));
        let busybox = std::path::Path::new("/bin/busybox");
        if busybox.exists() {
            assert!(!super::is_dynamic_elf(busybox));
        }
        assert!(!super::is_dynamic_elf(std::path::Path::new(
            "/etc/hostname"
        )));
    }
}
