//! Builds from Git: `git2` checks out one commit into a workspace, a `buildah` subprocess
//! builds its Dockerfile into an OCI layout, and the image store imports it.
//!
//! Each build has a workspace `{root}/builds/{random}` (0700, the agent's; an ACL lets the
//! build slice's root in): `src/` the checkout, `conf/` buildah's registry configuration
//! and, only while buildah pulls the base images (before any of the Dockerfile's RUN steps
//! runs, as the same user), a copy of the auth file; `push-*/` what the cache push reads
//! (made after the build, see `push_to_cache`); `state/` buildah's storage and the layout it writes (owned
//! by the build slice). Everything goes when the build ends, whatever the outcome: the
//! storage is removed from inside the build's namespace (its files are not the agent's),
//! then the workspace. Images are therefore not cached between builds; the image store
//! keeps the result under `kat-local/{namespace}_{workload}:{sha7}`, which the agent reuses
//! while the commit is the same.
//!
//! Containment: the base images are pulled first, with the node's network, and `buildah
//! bud` runs with pulls off in its own pid, mount and network namespaces (a fresh `/proc`,
//! only its own workspace, egress through a slirp4netns of its own or no network): see
//! [`buildah`] and [`egress`].
//!
//! Limits: a timeout over the whole build, a cap on what is fetched and checked out, and a
//! cgroup with memory, CPU and pids limits for buildah and everything it starts (see
//! [`crate::cgroups::Cgroups::build_group`]).
//!
//! Long because it holds one build's whole course in [`Builder`] (workspace, checkout,
//! buildah's configuration, base pulls, `buildah bud` under its limits, cache push, layout):
//! every step works in the private `Workspace`, which `build` removes when any step fails.

pub mod buildah;
pub mod dockerfile;
pub mod egress;

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kat_outbound::PinnedProxy;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

pub use buildah::Step;
pub use kat_api::build_definition::BuildNetwork;

/// One build: which commit of which repository, and how to build it.
#[derive(Clone, Debug, Default)]
pub struct BuildRequest {
    /// The Git repository's URL.
    pub repository: String,
    /// The full commit id (the leader resolves branches and tags at apply time).
    pub commit: String,
    /// `build.kat` `buildContext`: relative to the repository's root.
    pub context: String,
    /// `build.kat` `dockerfilePath`: relative to the context.
    pub dockerfile: String,
    /// Build arguments, passed to buildah as `--build-arg`.
    pub build_args: BTreeMap<String, String>,
    /// The Dockerfile stage to build (buildah's `--target`).
    pub target: Option<String>,
    /// The platform to build for (`os/arch`); `None`: this node's.
    pub platform: Option<String>,
    /// The reference the image store keeps the result under.
    pub reference: String,
    /// Where buildah's whole output goes (`katcall logs --build`); replaced per build.
    pub log_file: Option<PathBuf>,
    /// The cache repository (`source.cacheImage`, `build.kat` `cache.registryPath`): the
    /// build is looked up there first and pushed there after ([`cache_reference`]).
    pub cache: Option<String>,
    /// `build.kat` `network`: what `RUN` steps may reach (egress, never the host's
    /// loopback; or nothing).
    pub network: BuildNetwork,
}

/// Where a build is kept in its cache repository: `{cache}:{commit}-{options}`, where
/// `options` is a short hash of everything besides the commit that shapes the image (build
/// context, Dockerfile, arguments, target stage, and the platform or, without one, this
/// node's architecture), so that two workloads sharing a cache, or one workload after a
/// change of `build.kat`, never take each other's image.
pub fn cache_reference(cache: &str, request: &BuildRequest) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let platform = request
        .platform
        .clone()
        .unwrap_or_else(|| format!("linux/{}", std::env::consts::ARCH));
    for part in [
        request.context.as_str(),
        request.dockerfile.as_str(),
        request.target.as_deref().unwrap_or(""),
        platform.as_str(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for (k, v) in &request.build_args {
        h.update(k.as_bytes());
        h.update([1]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    let options = hex::encode(&h.finalize()[..6]);
    format!("{cache}:{}-{options}", request.commit)
}

/// How long pushing a build to its cache may take.
const CACHE_PUSH_TIMEOUT: Duration = Duration::from_secs(300);

/// What happened with the cache repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// No cache repository is configured.
    Unused,
    /// The image was pulled from this reference; nothing was built.
    Hit(String),
    /// Built and pushed to this reference.
    Pushed(String),
    /// Built, but the push failed (the build is kept on this node all the same).
    PushFailed {
        /// The reference the push was for.
        reference: String,
        /// Why it failed.
        error: String,
    },
}

/// A build's result: the image in the store and how the cache was used.
#[derive(Clone, Debug)]
pub struct BuildOutcome {
    /// The image, as the store keeps it under the request's reference.
    pub image: crate::ImageSummary,
    /// How the cache repository was used.
    pub cache: CacheOutcome,
}

/// What one build may use.
#[derive(Clone, Copy, Debug)]
pub struct BuildLimits {
    /// How long the whole build may take.
    pub timeout: Duration,
    /// Memory limit of buildah and everything it starts, in bytes.
    pub memory_bytes: u64,
    /// CPU limit of the build, in millicores.
    pub cpu_millis: u64,
    /// Most processes (and threads) the build may have at once.
    pub pids: u64,
    /// What the checkout may fetch and occupy.
    pub workspace_bytes: u64,
}

impl Default for BuildLimits {
    fn default() -> Self {
        BuildLimits {
            timeout: Duration::from_secs(20 * 60),
            memory_bytes: 2 << 30,
            cpu_millis: 1000,
            pids: 1024,
            workspace_bytes: 1 << 30,
        }
    }
}

/// Where a build stands, for the instance's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildPhase {
    /// Pulling `{cache}:{commit}` from the cache repository.
    CheckingCache,
    /// Checking out the commit.
    Cloning,
    /// buildah runs; the step it is at, once its output names one.
    Building(Option<Step>),
    /// After buildah: the cache push, the OCI layout and the import into the store.
    Importing,
}

impl std::fmt::Display for BuildPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildPhase::CheckingCache => write!(f, "looking in the build cache"),
            BuildPhase::Cloning => write!(f, "cloning"),
            BuildPhase::Building(None) => write!(f, "building"),
            BuildPhase::Building(Some(step)) => write!(f, "building, {step}"),
            BuildPhase::Importing => write!(f, "importing the image"),
        }
    }
}

/// Why a build failed, with what a user needs to fix it.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The repository could not be checked out, or its URL is refused.
    #[error(transparent)]
    Git(#[from] kat_git::GitError),
    /// `buildContext` or `dockerfilePath` names nothing usable inside the repository.
    #[error("build.kat {field}: {reason}")]
    BadPath {
        /// The `build.kat` field (`buildContext` or `dockerfilePath`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// buildah failed.
    #[error("buildah failed at {step}: {tail}")]
    Failed {
        /// The step it failed at, or what the build was doing.
        step: String,
        /// The last lines of its output.
        tail: String,
    },
    /// The build outlasted its timeout and was killed.
    #[error("the build took longer than its timeout of {0:?} and was stopped")]
    TimedOut(Duration),
    /// Builds cannot run on this node, or buildah could not be started.
    #[error("builds cannot run on this node: {0}")]
    Unavailable(String),
    /// Work on the build's workspace failed.
    #[error("build workspace: {0}")]
    Io(String),
    /// The Dockerfile, or one of its base images, is refused.
    #[error("{0}")]
    Dockerfile(String),
}

/// What builds need from the node.
#[derive(Clone, Debug)]
pub struct Builder {
    /// `{runtime root}/builds`.
    pub root: PathBuf,
    /// The build id slice: (host uid, host gid, count).
    pub slice: (u32, u32, u32),
    /// Plain-HTTP registries (as for pulls).
    pub insecure: Vec<String>,
    /// The auth file buildah may read (a copy goes into the workspace), if any.
    pub auth_file: Option<PathBuf>,
    /// Where a build's git fetch may connect.
    pub outbound: kat_outbound::OutboundPolicy,
    /// The node's cgroups, where each build's limits are set.
    pub cgroups: crate::cgroups::Cgroups,
    /// The sandbox program (the runtime's create helper, i.e. the agent).
    pub helper: PathBuf,
}

/// A finished build's OCI layout; the workspace goes when this is dropped.
pub struct Built {
    /// The OCI layout directory of the built image.
    pub layout: PathBuf,
    /// How the cache repository was used.
    pub cache: CacheOutcome,
    workspace: Workspace,
}

impl Built {
    /// Removes the workspace now (also done on drop, without waiting).
    pub async fn remove(mut self) {
        self.workspace.remove().await;
    }
}

struct Workspace {
    dir: PathBuf,
    sandbox: buildah::Sandbox,
    removed: bool,
}

impl Workspace {
    async fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        // The build slice's files first, from inside its namespace.
        let state = self.sandbox.state.clone();
        if state.exists() {
            let _ = self
                .sandbox
                .output("rm", &["-rf".into(), state.display().to_string()])
                .await;
        }
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if !self.removed {
            let (dir, sandbox) = (self.dir.clone(), self.sandbox.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let mut w = Workspace {
                        dir,
                        sandbox,
                        removed: false,
                    };
                    w.remove().await;
                });
            }
        }
    }
}

impl Builder {
    /// Checks out and builds `request`; the result is an OCI layout in the workspace.
    pub async fn build(
        &self,
        request: &BuildRequest,
        limits: BuildLimits,
        progress: &watch::Sender<BuildPhase>,
    ) -> Result<Built, BuildError> {
        let started = Instant::now();
        let deadline = started + limits.timeout;
        kat_git::check_url(&request.repository)?;
        let mut workspace = self.workspace().await?;
        let result = self
            .build_in(&mut workspace, request, limits, deadline, progress)
            .await;
        match result {
            Ok((layout, cache)) => Ok(Built {
                layout,
                cache,
                workspace,
            }),
            Err(e) => {
                workspace.remove().await;
                Err(e)
            }
        }
    }

    async fn workspace(&self) -> Result<Workspace, BuildError> {
        let io = |what: &str, e: std::io::Error| BuildError::Io(format!("{what}: {e}"));
        let root = self.root.clone();
        let (uid, gid, count) = self.slice;
        let dir = tokio::task::spawn_blocking(move || -> Result<PathBuf, BuildError> {
            std::fs::create_dir_all(&root).map_err(|e| io(&root.display().to_string(), e))?;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| io(&root.display().to_string(), e))?;
            let dir = root.join(format!("b{:016x}", rand_u64()));
            std::fs::create_dir(&dir).map_err(|e| io(&dir.display().to_string(), e))?;
            // The sandbox hides every other directory of its parent by this path.
            let dir = dir
                .canonicalize()
                .map_err(|e| io(&dir.display().to_string(), e))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| io(&dir.display().to_string(), e))?;
            crate::acl::open_dir_to(&dir, uid)
                .map_err(|e| io(&format!("ACL on {}", dir.display()), e))?;
            for sub in ["src", "conf", "conf/registries.d"] {
                let d = dir.join(sub);
                std::fs::create_dir_all(&d).map_err(|e| io(&d.display().to_string(), e))?;
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| io(&d.display().to_string(), e))?;
            }
            Ok(dir)
        })
        .await
        .map_err(|e| BuildError::Io(e.to_string()))??;
        Ok(Workspace {
            sandbox: buildah::Sandbox {
                host_uid: uid,
                host_gid: gid,
                count,
                workspace: dir.clone(),
                state: dir.join("state"),
                private: None,
                conf: dir.join("conf"),
                prefix: Vec::new(),
                helper: self.helper.clone(),
                env: Vec::new(),
            },
            dir,
            removed: false,
        })
    }

    async fn build_in(
        &self,
        ws: &mut Workspace,
        request: &BuildRequest,
        limits: BuildLimits,
        deadline: Instant,
        progress: &watch::Sender<BuildPhase>,
    ) -> Result<(PathBuf, CacheOutcome), BuildError> {
        progress.send_replace(BuildPhase::Cloning);
        let src = ws.dir.join("src");
        let (url, commit, dir) = (
            request.repository.clone(),
            request.commit.clone(),
            src.clone(),
        );
        let cap = limits.workspace_bytes;
        let outbound = self.outbound.clone();
        tokio::task::spawn_blocking(move || {
            kat_git::checkout(
                &url,
                &commit,
                &dir,
                kat_git::CheckoutLimits {
                    max_bytes: cap,
                    deadline,
                },
                &outbound,
            )?;
            open_tree(&dir);
            Ok::<(), BuildError>(())
        })
        .await
        .map_err(|e| BuildError::Io(e.to_string()))??;
        let (context, dockerfile) = paths_in(&src, &request.context, &request.dockerfile)?;
        self.write_conf(ws).await?;
        progress.send_replace(BuildPhase::Building(None));
        let platform = request
            .platform
            .clone()
            .unwrap_or_else(|| format!("linux/{}", go_arch()));
        let text = tokio::fs::read_to_string(&dockerfile)
            .await
            .map_err(|e| BuildError::Io(format!("reading the Dockerfile: {e}")))?;
        let bases = dockerfile::base_images(&text, &request.build_args, &platform)
            .map_err(BuildError::Dockerfile)?;
        for base in &bases {
            self.check_registry(&base.reference)
                .await
                .map_err(|e| BuildError::Dockerfile(format!("base image {e}")))?;
        }
        let auth = self
            .auth_file
            .as_ref()
            .map(|_| ws.sandbox.conf.join("auth.json"));
        let mut log = match &request.log_file {
            Some(path) => tokio::fs::File::create(path).await.ok(),
            None => None,
        };
        let group = format!(
            "build-{}",
            ws.dir
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default()
        );
        // The base images first, with the node's network and no code from the repository
        // running: then `buildah bud` never needs the host's network.
        let (pulling, proxy) = self.proxied(&ws.sandbox)?;
        for base in &bases {
            let mut args = pulling.global_args();
            args.extend(buildah::pull_args(
                base,
                request.platform.as_deref(),
                auth.as_deref(),
            ));
            let run = self
                .run_limited(
                    &pulling,
                    &group,
                    args,
                    buildah::Contain::UserOnly,
                    limits,
                    deadline,
                    log.as_mut(),
                    progress,
                )
                .await;
            if let Err(e) = run {
                self.cgroups.remove(&group);
                return Err(match (e, proxy.refusal()) {
                    (BuildError::Failed { .. }, Some(refused)) => {
                        BuildError::Dockerfile(format!("base image {}: {refused}", base.reference))
                    }
                    (BuildError::Failed { tail, .. }, None) => BuildError::Failed {
                        step: format!("pulling the base image {}", base.reference),
                        tail,
                    },
                    (e, _) => e,
                });
            }
        }
        drop(proxy);
        // The credentials were for those pulls: `bud` pulls nothing (`--pull=never`), and its
        // RUN steps run as the same user, so the copy goes before any of them runs.
        self.remove_auth(ws).await?;
        let iid = ws.sandbox.state.join("iid");
        let mut args = ws.sandbox.global_args();
        args.extend(buildah::bud_args(&buildah::BudOptions {
            context,
            dockerfile,
            build_args: request.build_args.clone(),
            target: request.target.clone(),
            platform: request.platform.clone(),
            iid_file: iid.clone(),
            auth_file: None,
        }));
        let run = self
            .run_limited(
                &ws.sandbox,
                &group,
                args,
                buildah::Contain::Build(request.network),
                limits,
                deadline,
                log.as_mut(),
                progress,
            )
            .await;
        self.cgroups.remove(&group);
        run?;
        progress.send_replace(BuildPhase::Importing);
        let id = tokio::fs::read_to_string(&iid)
            .await
            .map_err(|e| BuildError::Io(format!("buildah wrote no image id ({e})")))?;
        let id = id.trim().to_string();
        let cache = match &request.cache {
            Some(cache) => {
                self.push_to_cache(ws, &id, &cache_reference(cache, request))
                    .await
            }
            None => CacheOutcome::Unused,
        };
        let layout = ws.sandbox.state.join("out");
        let mut push = ws.sandbox.global_args();
        push.extend([
            "push".to_string(),
            id,
            format!("oci:{}:{}", layout.display(), request.reference),
        ]);
        let (ok, out) = ws
            .sandbox
            .output("buildah", &push)
            .await
            .map_err(|e| BuildError::Unavailable(format!("running buildah: {e}")))?;
        if !ok {
            return Err(BuildError::Failed {
                step: "writing the OCI layout".into(),
                tail: out.trim().to_string(),
            });
        }
        Ok((layout, cache))
    }

    /// Pushes the built image to the cache repository; a failure is reported, not fatal.
    ///
    /// The push needs the node's credentials, after `bud` let RUN steps write the workspace
    /// (its root is open to the build's user, so `conf/` may have been swapped for a tree
    /// of links, and `state/home` may hold a `containers.conf`). Every process of the build
    /// is gone by now (its pid namespace ended with `bud`), so a directory made now, by the
    /// agent, under a fresh name, holds only what the agent writes: the push takes its
    /// registry configuration, its copy of the auth file and its home from there.
    async fn push_to_cache(&self, ws: &Workspace, id: &str, reference: &str) -> CacheOutcome {
        let failed = |error: String| CacheOutcome::PushFailed {
            reference: reference.to_string(),
            error,
        };
        if let Err(e) = self.check_registry(reference).await {
            return failed(format!("cache repository {e}"));
        }
        let fresh = match self.push_dir(ws).await {
            Ok(dir) => dir,
            Err(e) => return failed(e.to_string()),
        };
        let (mut sandbox, proxy) = match self.proxied(&ws.sandbox) {
            Ok(proxied) => proxied,
            Err(e) => return failed(e.to_string()),
        };
        sandbox.conf = fresh.clone();
        sandbox.private = Some(fresh.clone());
        let mut push = sandbox.global_args();
        push.push("push".into());
        if self.auth_file.is_some() {
            push.extend([
                "--authfile".into(),
                fresh.join("auth.json").display().to_string(),
            ]);
        }
        push.extend([id.to_string(), format!("docker://{reference}")]);
        let pushed = tokio::time::timeout(CACHE_PUSH_TIMEOUT, sandbox.output("buildah", &push));
        match pushed.await.unwrap_or_else(|_| {
            Err(std::io::Error::other(format!(
                "no answer within {CACHE_PUSH_TIMEOUT:?}"
            )))
        }) {
            Ok((true, _)) => CacheOutcome::Pushed(reference.to_string()),
            Ok((false, _)) if proxy.refusal().is_some() => {
                failed(proxy.refusal().map(|e| e.to_string()).unwrap_or_default())
            }
            Ok((false, out)) => CacheOutcome::PushFailed {
                reference: reference.to_string(),
                error: out
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("buildah push failed")
                    .to_string(),
            },
            Err(e) => CacheOutcome::PushFailed {
                reference: reference.to_string(),
                error: e.to_string(),
            },
        }
    }

    async fn write_conf(&self, ws: &Workspace) -> Result<(), BuildError> {
        let conf = ws.sandbox.conf.clone();
        let state = ws.sandbox.state.clone();
        let insecure = self.insecure.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::write(
                conf.join("registries.conf"),
                buildah::registries_conf(&insecure),
            )?;
            std::fs::write(
                conf.join("registries.d/default.yaml"),
                buildah::registries_d(&state),
            )?;
            std::fs::write(conf.join("resolv.conf"), egress::RESOLV_CONF)?;
            for f in [
                "registries.conf",
                "registries.d/default.yaml",
                "resolv.conf",
            ] {
                std::fs::set_permissions(conf.join(f), std::fs::Permissions::from_mode(0o644))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| BuildError::Io(e.to_string()))?
        .map_err(|e| BuildError::Io(format!("writing buildah's configuration: {e}")))?;
        self.write_auth(ws).await
    }

    /// The cache push's configuration, in `{workspace}/push-{random}`, made by the agent
    /// after `bud` (see [`Self::push_to_cache`]): registries, the auth file's copy (created
    /// exclusively, never through a link) and an empty home, open to the build's root only.
    async fn push_dir(&self, ws: &Workspace) -> Result<PathBuf, BuildError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = ws.dir.join(format!("push-{:016x}", rand_u64()));
        let (insecure, auth, uid) = (self.insecure.clone(), self.auth_file.clone(), self.slice.0);
        let state = ws.sandbox.state.clone();
        let made = dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            // `create_dir` fails on anything already there, a link included.
            std::fs::create_dir(&made)?;
            std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o700))?;
            crate::acl::open_dir_to(&made, uid)?;
            std::fs::create_dir(made.join("registries.d"))?;
            let write = |name: &str, bytes: &[u8], mode: u32| -> std::io::Result<()> {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .mode(mode)
                    .open(made.join(name))?;
                f.write_all(bytes)
            };
            write(
                "registries.conf",
                buildah::registries_conf(&insecure).as_bytes(),
                0o644,
            )?;
            write(
                "registries.d/default.yaml",
                buildah::registries_d(&state).as_bytes(),
                0o644,
            )?;
            if let Some(auth) = auth {
                write("auth.json", &std::fs::read(&auth)?, 0o600)?;
                crate::acl::open_file_to(&made.join("auth.json"), uid)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| BuildError::Io(e.to_string()))?
        .map_err(|e| {
            BuildError::Io(format!(
                "preparing the cache push in {}: {e}",
                dir.display()
            ))
        })?;
        Ok(dir)
    }

    /// A copy of the node's auth file in the workspace, for buildah's pulls of the base
    /// images: readable by the build's root only (and the agent), and there only before any
    /// code from the repository runs (see [`Self::remove_auth`]).
    async fn write_auth(&self, ws: &Workspace) -> Result<(), BuildError> {
        let Some(auth) = self.auth_file.clone() else {
            return Ok(());
        };
        let copy = ws.sandbox.conf.join("auth.json");
        let uid = self.slice.0;
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::copy(&auth, &copy)?;
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600))?;
            crate::acl::open_file_to(&copy, uid)
        })
        .await
        .map_err(|e| BuildError::Io(e.to_string()))?
        .map_err(|e| BuildError::Io(format!("copying the auth file for buildah: {e}")))
    }

    /// Removes the workspace's copy of the auth file before `bud`: its RUN steps run as the
    /// build's root, which may read the copy, by a chroot escape into the workspace if
    /// nothing else.
    async fn remove_auth(&self, ws: &Workspace) -> Result<(), BuildError> {
        let copy = ws.sandbox.conf.join("auth.json");
        match tokio::fs::remove_file(&copy).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BuildError::Io(format!(
                "removing {} before the build runs: {e}",
                copy.display()
            ))),
        }
    }

    /// Runs buildah in the build's cgroup until it ends or the deadline passes; progress
    /// from its output.
    #[allow(clippy::too_many_arguments)]
    async fn run_limited(
        &self,
        sandbox: &buildah::Sandbox,
        group: &str,
        args: Vec<String>,
        contain: buildah::Contain,
        limits: BuildLimits,
        deadline: Instant,
        mut log: Option<&mut tokio::fs::File>,
        progress: &watch::Sender<BuildPhase>,
    ) -> Result<(), BuildError> {
        let mut sandbox = sandbox.clone();
        if let Some(prefix) =
            self.cgroups
                .systemd_run(limits.memory_bytes, limits.cpu_millis, limits.pids)
        {
            sandbox.prefix = prefix;
        }
        let procs = self
            .cgroups
            .build_group(group, limits.memory_bytes, limits.cpu_millis, limits.pids)
            .map_err(|e| BuildError::Unavailable(format!("the build's cgroup: {e}")))?;
        let buildah::Spawned {
            mut child,
            stdout,
            egress,
        } = sandbox
            .spawn("buildah", &args, procs, contain)
            .await
            .map_err(|e| BuildError::Unavailable(format!("starting buildah: {e}")))?;
        let pgid = child.id().map(|p| p as i32);
        let mut out = stdout.lines();
        let mut err = BufReader::new(
            child
                .stderr
                .take()
                .ok_or_else(|| BuildError::Io("no stderr".into()))?,
        )
        .lines();
        let mut tail: VecDeque<String> = VecDeque::new();
        let mut step = String::from("the start");
        let (mut out_done, mut err_done) = (false, false);
        let sleep = tokio::time::sleep_until(deadline.into());
        tokio::pin!(sleep);
        while !(out_done && err_done) {
            let line = tokio::select! {
                l = out.next_line(), if !out_done => match l { Ok(Some(l)) => l, _ => { out_done = true; continue } },
                l = err.next_line(), if !err_done => match l { Ok(Some(l)) => l, _ => { err_done = true; continue } },
                _ = &mut sleep => {
                    if let Some(p) = pgid {
                        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
                    }
                    let _ = child.wait().await;
                    return Err(BuildError::TimedOut(limits.timeout));
                }
            };
            if let Some(s) = buildah::parse_step(&line) {
                step = s.to_string();
                progress.send_replace(BuildPhase::Building(Some(s)));
            }
            if let Some(f) = log.as_mut() {
                let _ = f.write_all(format!("{line}\n").as_bytes()).await;
            }
            tail.push_back(line);
            if tail.len() > 15 {
                tail.pop_front();
            }
        }
        let status = child
            .wait()
            .await
            .map_err(|e| BuildError::Io(format!("waiting for buildah: {e}")))?;
        // The build's egress ends with it.
        drop(egress);
        if let Some(f) = log.as_mut() {
            let _ = f.flush().await;
        }
        if status.success() {
            Ok(())
        } else {
            let oom = self.cgroups.oom_killed(group);
            let mut text: Vec<String> = tail.into_iter().collect();
            if oom {
                text.push(format!(
                    "(the build ran out of memory: its limit is {} bytes)",
                    limits.memory_bytes
                ));
            }
            Err(BuildError::Failed {
                step,
                tail: text.join("\n"),
            })
        }
    }
}

/// The context and Dockerfile as paths inside the checkout; neither may leave it (through
/// `..` or a symbolic link).
fn paths_in(src: &Path, context: &str, dockerfile: &str) -> Result<(PathBuf, PathBuf), BuildError> {
    let root = src
        .canonicalize()
        .map_err(|e| BuildError::Io(format!("{}: {e}", src.display())))?;
    let context_path = src
        .join(context)
        .canonicalize()
        .map_err(|_| BuildError::BadPath {
            field: "buildContext",
            reason: format!("{context:?} does not exist in the repository at this commit"),
        })?;
    if !context_path.starts_with(&root) || !context_path.is_dir() {
        return Err(BuildError::BadPath {
            field: "buildContext",
            reason: format!("{context:?} is not a directory inside the repository"),
        });
    }
    let file = context_path
        .join(dockerfile)
        .canonicalize()
        .map_err(|_| BuildError::BadPath {
            field: "dockerfilePath",
            reason: format!("{dockerfile:?} does not exist in {context:?} at this commit"),
        })?;
    if !file.starts_with(&root) || !file.is_file() {
        return Err(BuildError::BadPath {
            field: "dockerfilePath",
            reason: format!("{dockerfile:?} is not a file inside the repository"),
        });
    }
    Ok((context_path, file))
}

/// Lets the build's root (another host id) read the checkout: directories 0755, files
/// 0644 or 0755; symbolic links are left as they are. The checkout came from a repository
/// someone else controls, so it is walked by descriptor (`crate::tree_dir`): a symlink is
/// never followed out of it. Best effort, subtree by subtree: what cannot be opened (or lies
/// deeper than `tree_dir::MAX_DEPTH`) keeps its mode, is logged, and the walk goes on; the
/// build then fails to read it with its own message.
fn open_tree(dir: &Path) {
    use crate::tree_dir::{Kind, TreeDir, MAX_DEPTH};
    let root = match TreeDir::open(dir) {
        Ok(root) => root,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot open the checkout to the build's user");
            return;
        }
    };
    let _ = root.set_mode(0o755);
    let mut skipped = 0usize;
    // One descriptor per level, and the names still to visit at each.
    let names = root.names().unwrap_or_default();
    let mut stack = vec![(root, names)];
    while let Some(top) = stack.len().checked_sub(1) {
        let Some(name) = stack[top].1.pop() else {
            stack.pop();
            continue;
        };
        let parent = &stack[top].0;
        let Ok(Some(entry)) = parent.stat(&name) else {
            continue;
        };
        let mode = match entry.kind {
            Kind::Dir => 0o755,
            Kind::File if entry.mode & 0o100 != 0 => 0o755,
            Kind::File => 0o644,
            _ => continue,
        };
        let _ = parent.set_mode_of(&name, mode);
        if entry.kind != Kind::Dir {
            continue;
        }
        match (stack.len() < MAX_DEPTH).then(|| parent.dir(&name).and_then(|d| Ok((d.names()?, d))))
        {
            Some(Ok((names, sub))) => stack.push((sub, names)),
            _ => skipped += 1,
        }
    }
    if skipped > 0 {
        tracing::warn!(dir = %dir.display(), skipped, "directories of the checkout could not be opened to the build's user (unreadable, or nested deeper than {MAX_DEPTH} levels)");
    }
}

/// This machine's architecture as OCI platforms name it.
impl Builder {
    /// Refuses an image (a base image, the cache repository) whose registry the outbound
    /// policy refuses (`kat_outbound`), with a message that names it, before buildah
    /// connects there with the node's network and credentials. buildah resolves the name
    /// again; its connections go through [`Self::proxied`]'s proxy, which checks the
    /// address it connects to, so a DNS answer that changes in between is refused there.
    async fn check_registry(&self, image: &str) -> Result<(), String> {
        let reference =
            crate::image::reference::parse_reference(image).map_err(|e| format!("{image}: {e}"))?;
        let registry = reference.resolve_registry();
        let named = self
            .insecure
            .iter()
            .any(|i| i.eq_ignore_ascii_case(registry))
            || self.outbound.trusts_endpoint(registry);
        if named {
            return Ok(());
        }
        let refused = |message: String| format!("{image}: registry {registry}: {message}");
        let url =
            url::Url::parse(&format!("https://{registry}/")).map_err(|e| refused(e.to_string()))?;
        match url.host() {
            Some(url::Host::Domain(name)) => {
                let port = url.port_or_known_default().unwrap_or(443);
                self.outbound
                    .resolve_async(name, port)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
            }
            _ => self
                .outbound
                .check_url(&url)
                .map_err(|e| refused(e.to_string()))?,
        }
        Ok(())
    }

    /// `sandbox` with buildah's HTTPS connections through a [`PinnedProxy`] of the outbound
    /// policy (Go's `HTTPS_PROXY`), which lives as long as the returned handle; the
    /// insecure registries (plain HTTP, named by the admin) are reached directly.
    fn proxied(
        &self,
        sandbox: &buildah::Sandbox,
    ) -> Result<(buildah::Sandbox, PinnedProxy), BuildError> {
        let proxy = PinnedProxy::start(self.outbound.clone())
            .map_err(|e| BuildError::Unavailable(format!("the outbound proxy: {e}")))?;
        let mut proxied = sandbox.clone();
        let no_proxy = self.insecure.join(",");
        for (var, value) in [
            ("HTTPS_PROXY", proxy.url()),
            ("https_proxy", proxy.url()),
            ("NO_PROXY", no_proxy.clone()),
            ("no_proxy", no_proxy),
        ] {
            proxied.env.push((var.to_string(), value));
        }
        Ok((proxied, proxy))
    }
}

pub(crate) fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        "arm" => "arm",
        other => other,
    }
}

fn rand_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    u64::from_le_bytes(bytes) ^ (std::process::id() as u64).rotate_left(32)
}

pub use kat_api::build_definition::local_reference;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_tag_changes_with_what_shapes_the_image() {
        let base = BuildRequest {
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            context: ".".into(),
            dockerfile: "Dockerfile".into(),
            ..Default::default()
        };
        let tag = cache_reference("reg.example/cache", &base);
        assert!(
            tag.starts_with("reg.example/cache:0123456789abcdef"),
            "{tag}"
        );
        let tag_part = tag.rsplit_once(':').unwrap().1;
        assert!(
            tag_part.len() <= 128
                && tag_part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        );
        assert_eq!(tag, cache_reference("reg.example/cache", &base.clone()));
        let mut args = base.clone();
        args.build_args = [("V".to_string(), "2".to_string())].into();
        let mut target = base.clone();
        target.target = Some("final".into());
        let mut platform = base.clone();
        platform.platform = Some("linux/arm64".into());
        let mut context = base.clone();
        context.context = "app".into();
        let tags: std::collections::BTreeSet<String> = [&base, &args, &target, &platform, &context]
            .iter()
            .map(|r| cache_reference("reg.example/cache", r))
            .collect();
        assert_eq!(tags.len(), 5, "{tags:?}");
    }
}
