//! KAT's container runtime: the `ContainerRuntime` trait and its one shipped
//! implementation, [`NativeRuntime`], on youki's `libcontainer`.
//!
//! - [`image`]: pull (`oci-client`), import from an OCI layout, unpack layers safely,
//!   snapshots, list/remove/prune;
//! - [`spec`]: the OCI spec of a KAT container;
//! - [`cgroups`]: what the host offers and each container's cgroup;
//! - [`logs`]: the log format kat-init writes, and streaming it;
//! - [`exec`]: commands inside running containers, with a TTY;
//! - [`create_helper`]: libcontainer's create in a single-threaded process of its own;
//! - [`network`]: the seam to the node network, whose namespaces a container joins;
//! - `fake` (feature `fake`): a runtime without a kernel, for tests of what drives one.
//!
//! `docs/runtime.md` describes what every container gets and what is enforced.

#![warn(missing_docs)]

pub mod acl;
pub mod async_pipe;
pub mod build;
pub mod cgroups;
pub mod create_helper;
pub mod error;
pub mod exec;
#[cfg(feature = "fake")]
pub mod fake;
pub mod gpus;
pub mod id_slices;
pub mod id_tool;
pub mod idmap;
pub mod image;
pub mod labels;
pub mod log_watch;
pub mod logs;
pub mod native;
pub mod network;
mod orphans;
pub mod phases;
pub mod reaping;
pub mod rootfs;
pub mod spec;
pub mod state_file;
pub mod tree_dir;
pub mod types;
pub mod userns_helper;
pub mod volume_paths;

use std::path::Path;
use std::time::Duration;

pub use error::{Result, RuntimeError};

/// Held around libcontainer's `start`.
///
/// libcontainer changes the *process-wide* working directory for a moment (to reach its
/// notify socket by a short name) and restores what it read before. Two such calls at once
/// on different threads can leave the process inside a container directory that is later
/// deleted, after which every create fails with "failed to get cwd" (seen in the one-node
/// end-to-end test while a rolling update ran health probes). Create runs in a helper
/// process and exec does not use libcontainer, so `start` is the one call left in-process.
pub(crate) static LIBCONTAINER_CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());
pub use exec::ExecHandle;
pub use native::{NativeConfig, NativeRuntime};
pub use types::*;

/// Told before a runtime removes a container, while its status and log are still there
/// ([`ContainerRuntime::observe_removals`]): the node keeps a finished instance's log this way.
#[async_trait::async_trait]
pub trait RemovalObserver: Send + Sync {
    /// Container `id` of `runtime` is about to be removed.
    async fn removing(&self, runtime: &dyn ContainerRuntime, id: &str);
}

/// What the node agent needs from a container runtime (RFC 001 §6.1, in Rust).
#[async_trait::async_trait]
pub trait ContainerRuntime: Send + Sync {
    /// What this node can enforce; reported in heartbeats.
    fn capabilities(&self) -> &NodeCapabilities;

    /// Pulls `reference` from its registry into the image store; `progress` follows the pull.
    async fn pull_image(
        &self,
        reference: &str,
        progress: Option<image::ProgressSender>,
    ) -> Result<ImageSummary>;
    /// Imports the image tagged `reference` from an OCI layout directory.
    async fn import_image(&self, layout: &Path, reference: &str) -> Result<ImageSummary>;
    /// Every image in the store.
    async fn list_images(&self) -> Result<Vec<ImageSummary>>;
    /// Removes a reference (or an image by id); returns the bytes reclaimed.
    async fn remove_image(&self, reference: &str) -> Result<u64>;
    /// Removes every image no container uses; returns the bytes reclaimed.
    async fn prune_images(&self) -> Result<u64>;
    /// Builds a commit of a Git repository ([`build`]) and keeps the image under
    /// `request.reference`; `progress` follows the build.
    async fn build_image(
        &self,
        request: &build::BuildRequest,
        limits: build::BuildLimits,
        progress: &tokio::sync::watch::Sender<build::BuildPhase>,
    ) -> Result<build::BuildOutcome>;

    /// Creates a container, not yet started, from `options`; returns its status.
    async fn create(&self, options: &CreateOptions) -> Result<ContainerStatus>;
    /// Starts a created container.
    async fn start(&self, id: &str) -> Result<()>;
    /// SIGTERM, then SIGKILL to the whole container after `grace`.
    async fn stop(&self, id: &str, grace: Duration) -> Result<ContainerStatus>;
    /// Removes the container, its cgroup, rootfs and logs. `force` stops it first. The
    /// removal observer, if one is set, is told first.
    async fn remove(&self, id: &str, force: bool) -> Result<()>;
    /// From now on `observer` is told before each container is removed. Set once; a second
    /// observer is refused (returned).
    fn observe_removals(
        &self,
        observer: std::sync::Arc<dyn RemovalObserver>,
    ) -> std::result::Result<(), std::sync::Arc<dyn RemovalObserver>>;
    /// The container's status now.
    async fn status(&self, id: &str) -> Result<ContainerStatus>;
    /// Changes each time the runtime sees one of its containers' processes end (those for
    /// which [`ContainerRuntime::sees_exit`] holds); `None`: it does not tell, so whoever
    /// follows containers reads their status on a clock.
    fn exits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// Whether an end of `id`'s process shows in [`ContainerRuntime::exits`]. A container
    /// an earlier agent started, adopted after a restart, is not this runtime's child: no.
    fn sees_exit(&self, _id: &str) -> bool {
        false
    }
    /// What the container uses now (its cgroup); zeros where the node has no cgroups.
    async fn usage(&self, id: &str) -> Result<ContainerUsage>;
    /// Every container on this node, found from on-disk state.
    async fn list(&self) -> Result<Vec<ContainerStatus>>;
    /// Streams the container's log records that `options` selects.
    async fn logs(&self, id: &str, options: LogOptions) -> Result<logs::LogReceiver>;
    /// Runs a command inside the running container `id`.
    async fn exec(&self, id: &str, options: ExecOptions) -> Result<ExecHandle>;
}
