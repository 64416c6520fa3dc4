//! The OCI runtime spec (`config.json`) of a KAT container, built with `oci-spec`'s types.
//!
//! What every container gets, and why:
//! - `kat-init` as PID 1, bind-mounted read-only at `/.kat/init`, with the workload's argv
//!   after `--` (the image's Entrypoint and Cmd merged with the workload's command and
//!   args, Docker semantics);
//! - user, pid, mount, ipc, uts, cgroup and (empty, for now) network namespaces;
//! - the node's id mapping; `noNewPrivileges`; a minimal capability set; KAT's seccomp
//!   filter, which kat-init installs in itself (`--seccomp default`, see `init/`);
//! - `proc`, a tmpfs `/dev` with the default devices, `/dev/pts`, `/dev/shm`, read-only
//!   `sys` (with the container's own cgroup v2 read-only at `/sys/fs/cgroup` on v2 hosts),
//!   and runc's masked and read-only paths;
//! - the container's log directory at `/.kat/log` (kat-init opens it there: no host fd);
//! - generated `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf`;
//! - volumes as bind mounts (`subPath`, `readOnly`);
//! - device nodes given to it (a GPU's CDI `deviceNodes`) bound in, allowed in its device
//!   cgroup, and the CDI `mounts` (files or directories) bound in as they are;
//! - the rootfs as an overlay made inside the user namespace, or a private copy;
//! - a `cgroupsPath` always, with the limits the node can enforce.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::collections::HashSet;

use oci_spec::runtime::{
    Capability, Linux, LinuxCapabilities, LinuxCpu, LinuxDeviceCgroup, LinuxDeviceType,
    LinuxIdMapping, LinuxIdMappingBuilder, LinuxMemory, LinuxNamespace, LinuxNamespaceType,
    LinuxPids, LinuxResources, Mount, Process, Root, Spec, User,
};
use oci_spec::OciSpecError;

use crate::idmap::IdMap;
use crate::image::config::RunConfig;
use crate::types::{CreateOptions, Resources};

/// The container's reserved directory: a read-only bind mount of a directory of the agent's
/// that holds only the mount points of kat-init and the log directory. Being a mount point,
/// it cannot be renamed or removed from inside the container (`EBUSY`), and a workload
/// holds no `CAP_SYS_ADMIN` to unmount it; it is mounted after every volume, device and
/// host path, so nothing declared (or an image's symbolic link that leads a volume there)
/// can hide it.
pub const KAT_DIR_PATH: &str = kat_api::names::RESERVED_CONTAINER_DIR;

/// Where kat-init lives inside every container: libcontainer starts PID 1 from this path
/// (nothing of the workload runs yet). An exec never does: it starts kat-init from a
/// descriptor of the host's binary (see `exec`).
pub const INIT_PATH: &str = "/.kat/init";

/// Where the container's log directory is bind-mounted for kat-init. kat-init opens it by
/// this path, inside the container, so it never holds a descriptor of a host directory.
pub const LOG_DIR_PATH: &str = "/.kat/log";

/// Capabilities a workload keeps: enough to run ordinary services as root, nothing that
/// reaches outside the container.
pub const CAPABILITIES: [Capability; 9] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::NetBindService,
];

/// Held by kat-init alone, dropped before the workload starts: the container's network
/// namespace (its loopback) is set up with it.
pub const INIT_ONLY_CAPABILITY: Capability = Capability::NetAdmin;

const MASKED: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READ_ONLY: [&str; 6] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/sys/fs/cgroup",
];

/// The workload's argv: Docker's rules for Entrypoint/Cmd against command/args.
pub fn workload_argv(image: &RunConfig, command: &[String], args: &[String]) -> Vec<String> {
    let (entry, cmd): (&[String], &[String]) = match (command.is_empty(), args.is_empty()) {
        (false, false) => (command, args),
        (false, true) => (command, &[]),
        (true, false) => (&image.entrypoint, args),
        (true, true) => (&image.entrypoint, &image.cmd),
    };
    entry.iter().chain(cmd.iter()).cloned().collect()
}

/// The image's Env overridden by the workload's, with a default PATH and HOSTNAME.
pub fn merged_env(
    image: &RunConfig,
    env: &BTreeMap<String, String>,
    hostname: &str,
) -> Vec<String> {
    let mut merged: BTreeMap<String, String> = BTreeMap::new();
    merged.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    for entry in &image.env {
        if let Some((k, v)) = entry.split_once('=') {
            merged.insert(k.to_string(), v.to_string());
        }
    }
    merged.insert("HOSTNAME".into(), hostname.to_string());
    for (k, v) in env {
        merged.insert(k.clone(), v.clone());
    }
    merged
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// The container's rootfs as the spec sees it.
pub enum Rootfs<'a> {
    /// Mount an overlay of `lower` inside the user namespace onto `mountpoint`.
    Overlay {
        /// Where the overlay is mounted: the container's root.
        mountpoint: &'a Path,
        /// The read-only lower layer (the slice's copy of the image).
        lower: &'a Path,
        /// The container's writable layer.
        upper: &'a Path,
        /// The overlay's work directory.
        work: &'a Path,
    },
    /// A private copy already at this path.
    Copy(&'a Path),
}

/// Everything [`build`] needs to write a container's `config.json`.
pub struct SpecInput<'a> {
    /// What KAT asked for.
    pub options: &'a CreateOptions,
    /// The container's hostname.
    pub hostname: &'a str,
    /// The workload's argv, which kat-init runs.
    pub argv: Vec<String>,
    /// The workload's environment (`NAME=VALUE`).
    pub env: Vec<String>,
    /// The workload's working directory.
    pub cwd: String,
    /// The workload's uid inside the container.
    pub uid: u32,
    /// The workload's gid inside the container.
    pub gid: u32,
    /// The container's uid and gid mappings (unused when it joins namespaces already mapped).
    pub ids: &'a IdMap,
    /// The container's root filesystem.
    pub rootfs: Rootfs<'a>,
    /// The host's kat-init binary, bound in read-only.
    pub init_binary: &'a Path,
    /// The container's reserved directory on the host, mounted read-only at
    /// [`KAT_DIR_PATH`]: it holds only the empty mount points `init` and `log`
    /// ([`make_kat_dir`]).
    pub kat_dir: &'a Path,
    /// Generated files: `/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`.
    pub etc_dir: &'a Path,
    /// The container's log directory (`stdio.log`, `exit.json`), mounted at [`LOG_DIR_PATH`].
    pub log_dir: &'a Path,
    /// Volume sources resolved (subPath applied), in `options.volumes` order.
    pub volume_sources: Vec<PathBuf>,
    /// libcontainer's `cgroupsPath`; `None` where the node has no usable cgroups.
    pub cgroups_path: Option<String>,
    /// Which limits the node enforces through libcontainer.
    pub memory_limit: bool,
    /// CPU limits and requests are enforced through libcontainer.
    pub cpu_limit: bool,
    /// The pids limit is enforced through libcontainer.
    pub pids_limit: bool,
    /// Leave `linux.resources` out: the agent writes the limits itself (rootless on v1).
    pub omit_resources: bool,
    /// kat-init installs KAT's default seccomp filter (`--seccomp default`).
    pub seccomp: bool,
    /// Mount the container's own cgroup (v2, through the cgroup namespace) read-only at
    /// `/sys/fs/cgroup`, so kat-init can read `memory.events` before it exits: under systemd
    /// the scope and its counters are gone as soon as the last process leaves.
    pub cgroup_mount: bool,
    /// User and network namespaces made for the container, joined by path (they carry its id
    /// mappings, so `config.json` has none): see [`crate::network`].
    pub joined: Option<(PathBuf, PathBuf)>,
}

fn mount(destination: &str, typ: &str, source: impl Into<PathBuf>, options: &[&str]) -> Mount {
    let mut m = Mount::default();
    m.set_destination(destination.into());
    m.set_typ(Some(typ.into()));
    m.set_source(Some(source.into()));
    m.set_options(Some(options.iter().map(|o| o.to_string()).collect()));
    m
}

/// A host device node bound in: `nosuid`, `noexec`, but not `nodev`.
fn device_mount(d: &crate::types::DeviceNode) -> Mount {
    mount(
        &d.container_path,
        "bind",
        &d.host_path,
        &["bind", "nosuid", "noexec"],
    )
}

/// The OCI hooks of `hooks`, in their order within each stage; `None` without any.
fn hooks(hooks: &[crate::types::Hook]) -> Option<oci_spec::runtime::Hooks> {
    use crate::types::HookStage;
    if hooks.is_empty() {
        return None;
    }
    let at = |stage: HookStage| -> Option<Vec<oci_spec::runtime::Hook>> {
        let list: Vec<_> = hooks
            .iter()
            .filter(|h| h.stage == stage)
            .map(|h| {
                let mut hook = oci_spec::runtime::Hook::default();
                hook.set_path(h.path.clone());
                hook.set_args((!h.args.is_empty()).then(|| h.args.clone()));
                hook.set_env((!h.env.is_empty()).then(|| h.env.clone()));
                hook.set_timeout(h.timeout);
                hook
            })
            .collect();
        (!list.is_empty()).then_some(list)
    };
    let mut out = oci_spec::runtime::Hooks::default();
    #[allow(deprecated)]
    out.set_prestart(at(HookStage::Prestart));
    out.set_create_runtime(at(HookStage::CreateRuntime));
    out.set_create_container(at(HookStage::CreateContainer));
    out.set_start_container(at(HookStage::StartContainer));
    out.set_poststart(at(HookStage::Poststart));
    out.set_poststop(at(HookStage::Poststop));
    Some(out)
}

/// The device cgroup's rules: deny everything, then allow `devices` (their type and numbers
/// read from the host's nodes); libcgroups adds the default devices (`/dev/null`, `/dev/tty`,
/// ptys, …) after them. Without the first rule a v1 device cgroup inherits its parent's
/// `a *:* rwm` (libcgroups writes allow rules only) and a container could open any device
/// node that reached it. The same start runc and youki's default spec have. Where they
/// apply: a root agent on cgroup v1. An unprivileged agent on v1 writes no device rules
/// (that takes CAP_SYS_ADMIN in the host), and on v2 (and under systemd) libcontainer is
/// built without `cgroupsv2_devices`, so no device program is attached: there the user
/// namespace is the limit (no device node can be made in it; only the ones bound in reach
/// the container).
fn device_rules(devices: &[crate::types::DeviceNode]) -> Vec<LinuxDeviceCgroup> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut deny_all = LinuxDeviceCgroup::default();
    deny_all.set_allow(false);
    deny_all.set_typ(Some(LinuxDeviceType::A));
    deny_all.set_access(Some("rwm".into()));
    let rules = devices.iter().filter_map(|d| {
        let meta = std::fs::symlink_metadata(&d.host_path).ok()?;
        let typ = if meta.file_type().is_char_device() {
            LinuxDeviceType::C
        } else if meta.file_type().is_block_device() {
            LinuxDeviceType::B
        } else {
            return None;
        };
        let rdev = meta.rdev();
        let mut rule = LinuxDeviceCgroup::default();
        rule.set_allow(true);
        rule.set_typ(Some(typ));
        rule.set_major(Some(nix::sys::stat::major(rdev) as i64));
        rule.set_minor(Some(nix::sys::stat::minor(rdev) as i64));
        rule.set_access(Some("rwm".into()));
        Some(rule)
    });
    std::iter::once(deny_all).chain(rules).collect()
}

/// Makes the host side of a container's [`KAT_DIR_PATH`] in `dir`: a directory others may
/// only search and read, holding an empty file `init` and an empty directory `log` as the
/// mount points of kat-init and the log directory (libcontainer cannot make them on a
/// read-only mount).
pub fn make_kat_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new().mode(0o755).create(dir)?;
    std::fs::DirBuilder::new()
        .mode(0o555)
        .create(dir.join("log"))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(dir.join("init"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
}

/// Refuses a destination at or under [`KAT_DIR_PATH`]: validation refuses such a
/// `mountPath` at apply, and the runtime again for anything that reaches it another way (a
/// record stored before the rule, a caller other than the supervisor).
pub fn check_destination(destination: &str, field: &str) -> Result<(), crate::RuntimeError> {
    if kat_api::names::is_reserved_container_path(destination) {
        return Err(crate::RuntimeError::InvalidOption {
            field: field.to_string(),
            reason: format!(
                "{destination:?} is at or under {KAT_DIR_PATH}, which KAT reserves for kat-init and the container's logs; mount it elsewhere"
            ),
        });
    }
    Ok(())
}

fn bind(source: &Path, destination: &str, read_only: bool) -> Mount {
    let mut options = vec!["rbind", "nosuid", "nodev"];
    if read_only {
        options.push("ro");
    }
    mount(destination, "bind", source, &options)
}

fn namespace(typ: LinuxNamespaceType, path: Option<&Path>) -> LinuxNamespace {
    let mut ns = LinuxNamespace::default();
    ns.set_typ(typ);
    ns.set_path(path.map(Path::to_path_buf));
    ns
}

fn mappings(ranges: &[crate::idmap::IdRange]) -> Result<Vec<LinuxIdMapping>, OciSpecError> {
    ranges
        .iter()
        .map(|r| {
            LinuxIdMappingBuilder::default()
                .container_id(r.inside)
                .host_id(r.outside)
                .size(r.count)
                .build()
        })
        .collect()
}

/// Builds `config.json`. Every field is set here: the crate's defaults (an `RLIMIT_NOFILE`,
/// a capability set, default mounts and namespaces) are never taken by omission.
pub fn build(input: &SpecInput<'_>) -> Result<Spec, OciSpecError> {
    let o = input.options;
    let mut init_args: Vec<String> = vec![
        INIT_PATH.into(),
        "--log-dir".into(),
        LOG_DIR_PATH.into(),
        "--log-max-bytes".into(),
        o.log.max_bytes.to_string(),
        "--log-max-files".into(),
        o.log.max_files.to_string(),
        "--seccomp".into(),
        if input.seccomp {
            "default"
        } else {
            "unconfined"
        }
        .into(),
        "--".into(),
    ];
    init_args.extend(input.argv.iter().cloned());

    let (root_path, mut mounts) = match &input.rootfs {
        Rootfs::Overlay {
            mountpoint,
            lower,
            upper,
            work,
        } => {
            let (lower, upper, work) = (
                format!("lowerdir={}", lower.display()),
                format!("upperdir={}", upper.display()),
                format!("workdir={}", work.display()),
            );
            let options = [lower.as_str(), upper.as_str(), work.as_str(), "userxattr"];
            (
                *mountpoint,
                vec![mount("/", "overlay", "overlay", &options)],
            )
        }
        Rootfs::Copy(path) => (*path, Vec::new()),
    };
    mounts.extend([
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        ),
        bind(&input.etc_dir.join("hosts"), "/etc/hosts", false),
        bind(&input.etc_dir.join("hostname"), "/etc/hostname", false),
        bind(
            &input.etc_dir.join("resolv.conf"),
            "/etc/resolv.conf",
            false,
        ),
    ]);
    if input.cgroup_mount {
        mounts.push(mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ));
    }
    for (volume, source) in o.volumes.iter().zip(&input.volume_sources) {
        mounts.push(bind(source, &volume.destination, volume.read_only));
    }
    // Device nodes cannot be made in a user namespace: the host's are bound in (without
    // `nodev`), and allowed in the device cgroup where the node manages one.
    mounts.extend(o.devices.iter().map(device_mount));
    mounts.extend(
        o.host_binds
            .iter()
            .map(|b| bind(&b.host_path, &b.container_path, b.read_only)),
    );
    // Last, so that no mount above can cover them (see `KAT_DIR_PATH`).
    mounts.extend([
        bind(input.kat_dir, KAT_DIR_PATH, true),
        bind(input.init_binary, INIT_PATH, true),
        mount(
            LOG_DIR_PATH,
            "bind",
            input.log_dir,
            &["rbind", "nosuid", "nodev", "noexec"],
        ),
    ]);

    let r = &input.options.resources;
    let mut resources = LinuxResources::default();
    resources.set_devices(Some(device_rules(&o.devices)));
    if input.memory_limit && r.memory_limit_bytes > 0 {
        // No swap beyond the limit: exceeding it means the OOM killer, as users expect.
        let limit = i64::try_from(r.memory_limit_bytes).unwrap_or(i64::MAX);
        let mut memory = LinuxMemory::default();
        memory.set_limit(Some(limit));
        memory.set_swap(Some(limit));
        resources.set_memory(Some(memory));
    }
    if input.cpu_limit && (r.cpu_limit_millis > 0 || r.cpu_request_millis > 0) {
        let mut cpu = LinuxCpu::default();
        if r.cpu_limit_millis > 0 {
            cpu.set_quota(Some(i64::try_from(r.cpu_quota_us()).unwrap_or(i64::MAX)));
            cpu.set_period(Some(Resources::CPU_PERIOD_US));
        }
        if r.cpu_request_millis > 0 {
            cpu.set_shares(Some(r.cpu_shares()));
        }
        resources.set_cpu(Some(cpu));
    }
    if input.pids_limit && r.pids_limit > 0 {
        let mut pids = LinuxPids::default();
        pids.set_limit(i64::try_from(r.pids_limit).unwrap_or(i64::MAX));
        resources.set_pids(Some(pids));
    }

    let joined = input.joined.as_ref();
    let mut linux = Linux::default();
    linux.set_namespaces(Some(vec![
        namespace(LinuxNamespaceType::User, joined.map(|j| j.0.as_path())),
        namespace(LinuxNamespaceType::Pid, None),
        namespace(LinuxNamespaceType::Mount, None),
        namespace(LinuxNamespaceType::Ipc, None),
        namespace(LinuxNamespaceType::Uts, None),
        namespace(LinuxNamespaceType::Cgroup, None),
        namespace(LinuxNamespaceType::Network, joined.map(|j| j.1.as_path())),
    ]));
    // Joined namespaces carry the container's id mappings already.
    if joined.is_none() {
        linux.set_uid_mappings(Some(mappings(&input.ids.uids)?));
        linux.set_gid_mappings(Some(mappings(&input.ids.gids)?));
    } else {
        linux.set_uid_mappings(None);
        linux.set_gid_mappings(None);
    }
    linux.set_resources((!input.omit_resources).then_some(resources));
    linux.set_masked_paths(Some(MASKED.iter().map(|p| p.to_string()).collect()));
    linux.set_readonly_paths(Some(READ_ONLY.iter().map(|p| p.to_string()).collect()));
    linux.set_cgroups_path(input.cgroups_path.as_ref().map(PathBuf::from));

    // kat-init (PID 1) also holds CAP_NET_ADMIN, to set the container's loopback up; it
    // drops it from every set before the workload starts (init/src/loopback.rs).
    let init_caps: HashSet<Capability> = CAPABILITIES
        .iter()
        .copied()
        .chain([INIT_ONLY_CAPABILITY])
        .collect();
    let mut capabilities = LinuxCapabilities::default();
    capabilities.set_bounding(Some(init_caps.clone()));
    capabilities.set_effective(Some(init_caps.clone()));
    capabilities.set_permitted(Some(init_caps));
    capabilities.set_inheritable(None);
    capabilities.set_ambient(None);

    let mut user = User::default();
    user.set_uid(input.uid);
    user.set_gid(input.gid);
    let mut process = Process::default();
    process.set_terminal(Some(false));
    process.set_user(user);
    process.set_args(Some(init_args));
    process.set_env(Some(input.env.clone()));
    process.set_cwd(PathBuf::from(&input.cwd));
    process.set_capabilities(Some(capabilities));
    process.set_no_new_privileges(Some(true));
    process.set_rlimits(None);

    let mut root = Root::default();
    root.set_path(root_path.to_path_buf());
    root.set_readonly(Some(false));

    let mut spec = Spec::default();
    spec.set_version("1.0.2".into());
    spec.set_process(Some(process));
    spec.set_root(Some(root));
    spec.set_hostname(Some(input.hostname.into()));
    spec.set_mounts(Some(mounts));
    spec.set_linux(Some(linux));
    spec.set_hooks(hooks(&o.hooks));
    spec.set_annotations(None);
    Ok(spec)
}

/// `/etc/hosts` of a container: its own name on its address (else `127.0.1.1`, as Debian).
pub fn hosts_file(
    hostname: &str,
    address: Option<std::net::Ipv4Addr>,
    extra: &BTreeMap<String, String>,
) -> String {
    let own = address.map_or_else(|| "127.0.1.1".to_string(), |a| a.to_string());
    let mut out = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}\t{hostname}\n"
    );
    for (name, ip) in extra {
        out.push_str(&format!("{ip}\t{name}\n"));
    }
    out
}

/// `/etc/resolv.conf` of a container.
pub fn resolv_conf(servers: &[String], search: &[String]) -> String {
    let mut out = String::new();
    if !search.is_empty() {
        out.push_str(&format!("search {}\n", search.join(" ")));
    }
    for s in servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    out
}

#[cfg(test)]
mod tests;
