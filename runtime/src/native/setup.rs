//! Opening the runtime: its configuration, its directories and their modes, the id range,
//! the image store and its unpack sandbox, and the capabilities this node reports.

use super::*;

/// How to set up a `NativeRuntime`.
#[derive(Clone, Debug)]
pub struct NativeConfig {
    /// Where images, container state and logs live.
    pub root: PathBuf,
    /// The static kat-init binary to place in every container.
    pub init_binary: PathBuf,
    /// Plain-HTTP registries and the auth files pulls read.
    pub registries: RegistryConfig,
    /// Where pulls and builds may connect on a workload's behalf (registries, git).
    pub outbound: kat_outbound::OutboundPolicy,
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
    /// How long a create helper started ahead of the next create waits for it before it is
    /// ended (default [`crate::create_helper::SPARE_KEEP`]).
    pub spare_helper_keep: std::time::Duration,
    /// The node network; containers with an address join namespaces it makes.
    pub network: Option<Arc<dyn crate::network::NetworkNamespaces>>,
}

impl NativeConfig {
    /// The defaults, with the runtime root `root` and kat-init at `init_binary`.
    pub fn new(root: impl Into<PathBuf>, init_binary: impl Into<PathBuf>) -> NativeConfig {
        NativeConfig {
            root: root.into(),
            init_binary: init_binary.into(),
            registries: RegistryConfig::default(),
            outbound: Default::default(),
            id_range: None,
            cgroup_parent: None,
            cgroup_manager: CgroupManager::Auto,
            force_copy_rootfs: false,
            seccomp: true,
            image_limits: image::UnpackLimits::default(),
            pull_timeouts: image::PullTimeouts::default(),
            create_helper: PathBuf::from("/proc/self/exe"),
            spare_helper_keep: crate::create_helper::SPARE_KEEP,
            network: None,
        }
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
    /// Opens the runtime: checks kat-init, makes its directories, opens the image store and
    /// finds what this node can enforce.
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
            ("helpers", 0o700),
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
        let helpers = crate::create_helper::Spares::new(
            config.create_helper.clone(),
            config.root.join("helpers"),
            config.spare_helper_keep,
        );
        let runtime = NativeRuntime {
            overlay: AtomicBool::new(overlay),
            reaping: Arc::default(),
            _orphans: crate::orphans::OrphanReaper::start(),
            config,
            images,
            cgroups,
            range,
            slices: Mutex::new(None),
            creating: Mutex::new(Vec::new()),
            spare_under_way: Arc::default(),
            helpers,
            caps,
            log_watch: Default::default(),
            removals: Default::default(),
        };
        if let Ok(copier) = runtime.slice_copier() {
            copier.remove_partials();
        }
        Ok(runtime)
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
