//! The node's GPUs: found through their CDI specifications ([`cdi`]), described from the
//! kernel ([`describe`]: NVIDIA's `/proc/driver/nvidia`, the DRM sysfs of AMD and others),
//! reported in heartbeats, and given to the instances the scheduler assigned them to.
//!
//! Everything is read under a root directory: `/`, or `KAT_GPU_ROOT` (tests: a fake
//! `/sys`, `/proc`, `/dev` and `/etc/cdi`; no GPU is on the machines this project is tested
//! on).

pub mod cdi;
pub mod describe;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kat_api::wire::GpuInfo;

/// The environment variable that moves the root GPUs are read under (tests only).
pub const ROOT_ENV: &str = "KAT_GPU_ROOT";

/// What the node knows of its GPUs, read once at start.
#[derive(Debug, Clone, Default)]
pub struct Gpus {
    /// The directory everything was read under (`/` but in tests); the host paths of the
    /// edits are taken under it too.
    pub root: PathBuf,
    /// The CDI specifications read, one per kind.
    pub specs: Arc<Vec<cdi::Spec>>,
    /// The GPUs described, each named by its CDI device name (`kind=name`).
    pub found: Vec<GpuInfo>,
}

impl Gpus {
    /// Read the CDI specifications and describe each GPU device in them (blocking: files).
    pub fn discover() -> Gpus {
        let root = std::env::var_os(ROOT_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        Gpus::discover_under(&root)
    }

    /// [`Gpus::discover`] with everything read under `root` rather than `/`.
    pub fn discover_under(root: &Path) -> Gpus {
        let dirs = [root.join("etc/cdi"), root.join("var/run/cdi")];
        let (specs, problems) = cdi::load(&dirs);
        for p in &problems {
            tracing::warn!("CDI specification ignored: {p}");
        }
        let mut found = Vec::new();
        for spec in &specs {
            for device in &spec.devices {
                let name = cdi::qualified(&spec.kind, &device.name);
                match describe::gpu(root, &spec.kind, device) {
                    Some(mut gpu) => {
                        gpu.device = name;
                        found.push(gpu);
                    }
                    None => {
                        tracing::info!(device = %name, "a CDI device that is not a GPU KAT knows (NVIDIA or AMD); not offered")
                    }
                }
            }
        }
        for orphan in describe::without_spec(root, &found) {
            tracing::warn!("{orphan}: no CDI specification names it, so no container can have it (generate one: nvidia-ctk cdi generate, or amd-ctk cdi generate)");
        }
        if !found.is_empty() {
            tracing::info!(gpus = found.len(), "GPUs found through CDI");
        }
        Gpus {
            root: root.to_path_buf(),
            specs: Arc::new(specs),
            found,
        }
    }

    /// What `names` (the instance's GPUs) put in its container; every device node must be a
    /// device (not a symlink, not a file).
    pub fn edits(&self, names: &[String]) -> Result<cdi::Edits, String> {
        let mut edits = cdi::edits(&self.specs, names, &self.root)?;
        for (host, _) in &edits.devices {
            let meta =
                std::fs::symlink_metadata(host).map_err(|e| format!("{}: {e}", host.display()))?;
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            if !(t.is_char_device() || t.is_block_device()) {
                return Err(format!(
                    "{} is not a device node (a CDI deviceNode must name one)",
                    host.display()
                ));
            }
        }
        // A hook runs with the agent's ids: its program must be one only root or the agent
        // can change (a `startContainer` hook runs in the container, from its files).
        let euid = nix::unistd::geteuid().as_raw();
        for hook in edits
            .hooks
            .iter_mut()
            .filter(|h| h.stage != crate::HookStage::StartContainer)
        {
            let not_run = |why: String| format!("CDI hook {}: {why}; not run", hook.path.display());
            // Every directory above it too: no one else may put another program in its place
            // between this check and the runtime's exec.
            let real = cdi::trusted_path(&hook.path, euid).map_err(not_run)?;
            let meta = std::fs::metadata(&real).map_err(|e| not_run(e.to_string()))?;
            if !meta.is_file() {
                return Err(not_run("not a file".into()));
            }
            if let Some(why) = cdi::writable_by_others(&meta, euid) {
                return Err(not_run(format!("it {why}")));
            }
            // The runtime runs what was checked, not a symlink that could be changed.
            hook.path = real;
        }
        Ok(edits)
    }
}
