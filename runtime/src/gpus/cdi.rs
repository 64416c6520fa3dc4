//! Container Device Interface specifications (CNCF CDI, `SPEC.md`): what a device needs in a
//! container (device nodes, mounts, environment), read from `/etc/cdi` and `/var/run/cdi`.
//!
//! Parsed here with serde rather than with the `container-device-interface` crate: that
//! crate brings a JSON-schema validator, a CLI, regex and a second major version of
//! `oci-spec`; KAT needs only the edits of named devices, and unknown fields are ignored as
//! the specification asks of consumers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One specification file: a kind (`vendor.com/class`) and its devices.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The version of the CDI specification the file follows (`cdiVersion`).
    pub cdi_version: String,
    /// The kind of its devices: `vendor.com/class`.
    pub kind: String,
    /// The devices it describes.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits every device of this spec needs.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// One device of a spec: its name and what it needs in a container.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its name within the spec's kind ([`qualified`] gives the full `kind=name`).
    pub name: String,
    /// Edits this device needs, besides those of its spec.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// What a spec or one of its devices puts in a container.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes given to the container.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Host paths mounted in the container.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Programs run around the container's life, as the agent's user.
    #[serde(default)]
    pub hooks: Vec<Hook>,
}

/// A program run at one stage of the container's life (an OCI hook).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The OCI stage: `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart` or `poststop`.
    pub hook_name: String,
    /// The program's absolute path: on the host, but in the container for a `startContainer`
    /// hook.
    pub path: String,
    /// Its arguments, as `execv`'s `argv` (the first is the program's name).
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment, `NAME=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    /// Seconds it may run; absent, a default applies, and a longer one is cut to the maximum.
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// A device node given to the container.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Where it appears in the container.
    pub path: String,
    /// Where it is on the host; `path` if absent.
    #[serde(default)]
    pub host_path: Option<String>,
}

/// A host path mounted in the container.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Where it is on the host.
    pub host_path: String,
    /// Where it appears in the container.
    pub container_path: String,
    /// Mount options (`ro`, `bind`, ...); `ro` makes it read-only.
    #[serde(default)]
    pub options: Vec<String>,
}

/// Every spec under `dirs` (`*.json`, `*.yaml`, `*.yml`), later directories first in
/// priority as the specification orders them (`/var/run/cdi` over `/etc/cdi`): a device
/// named twice is the later directory's. Files that do not parse are reported, not fatal,
/// and so are files another user could have written (see [`read_trusted`]).
pub fn load(dirs: &[PathBuf]) -> (Vec<Spec>, Vec<String>) {
    let mut by_kind: BTreeMap<String, Spec> = BTreeMap::new();
    let mut problems = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            match parse(&file) {
                Ok(spec) => {
                    let entry = by_kind.entry(spec.kind.clone()).or_insert_with(|| Spec {
                        devices: vec![],
                        ..spec.clone()
                    });
                    for d in spec.devices {
                        entry.devices.retain(|x| x.name != d.name);
                        entry.devices.push(d);
                    }
                    if spec.container_edits != ContainerEdits::default() {
                        entry.container_edits = spec.container_edits;
                    }
                }
                Err(e) => problems.push(format!("{}: {e}", file.display())),
            }
        }
    }
    (by_kind.into_values().collect(), problems)
}

/// A specification says what host paths are bound into containers and what programs run as
/// the agent: one that a user other than root or the agent's own could have written is
/// refused, so another local user cannot hand themselves a host directory or the agent's
/// identity through it. The file is opened once and judged by its descriptor (what is read
/// is what was checked), and every directory above its real path too (see [`trusted_path`]).
fn read_trusted(file: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let euid = nix::unistd::geteuid().as_raw();
    let refused = |why: String| {
        format!("{why}: a CDI specification must be writable only by root or the agent's user; not read")
    };
    // Not blocking: a FIFO put here would hold the agent's start on its open.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY).bits())
        .open(file)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file; not read".into());
    }
    if let Some(why) = writable_by_others(&meta, euid) {
        return Err(refused(format!("it {why}")));
    }
    let real = trusted_path(file, euid).map_err(refused)?;
    let at_path = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    if (at_path.dev(), at_path.ino()) != (meta.dev(), meta.ino()) {
        return Err(format!("{} changed while it was read", file.display()));
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// The real path of `path`, if no user but root and `euid` can change what it names: every
/// directory above it owned by one of them and writable by no one else, unless sticky (as
/// `/tmp`: there no one can replace an entry that is not theirs). Both chains are checked:
/// the directories of the path as given (where a symlink may be) and those of its target.
pub fn trusted_path(path: &Path, euid: u32) -> Result<std::path::PathBuf, String> {
    let given = path.parent().unwrap_or(Path::new("/"));
    trusted_dirs(given, euid)?;
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    trusted_dirs(real.parent().unwrap_or(Path::new("/")), euid)?;
    Ok(real)
}

/// `dir` (resolved) and every directory above it: see [`trusted_path`].
fn trusted_dirs(dir: &Path, euid: u32) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let real = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for dir in real.ancestors() {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = meta.permissions().mode();
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(format!("{} is owned by uid {}", dir.display(), meta.uid()));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(format!(
                "{} is writable by its group or others (mode {:o})",
                dir.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

/// Why a file someone else than root or `euid` could write is not trusted; `None` if it is.
pub fn writable_by_others(meta: &std::fs::Metadata, euid: u32) -> Option<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = meta.permissions().mode();
    if meta.uid() != 0 && meta.uid() != euid {
        return Some(format!("is owned by uid {}", meta.uid()));
    }
    (mode & 0o022 != 0).then(|| {
        format!(
            "is writable by its group or others (mode {:o})",
            mode & 0o7777
        )
    })
}

fn parse(file: &Path) -> Result<Spec, String> {
    let bytes = read_trusted(file)?;
    let spec: Spec = if file.extension().is_some_and(|e| e == "json") {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())?
    } else {
        yaml_serde::from_slice(&bytes).map_err(|e| e.to_string())?
    };
    let (vendor, class) = spec
        .kind
        .split_once('/')
        .ok_or_else(|| format!("kind {:?} is not vendor.com/class", spec.kind))?;
    if vendor.is_empty() || class.is_empty() || !vendor.contains('.') {
        return Err(format!("kind {:?} is not vendor.com/class", spec.kind));
    }
    Ok(spec)
}

/// A hook without a timeout gets this many seconds; none gets more than the maximum (a hook
/// runs while the node creates, starts or removes the container: one that hangs would hold
/// that up).
const HOOK_TIMEOUT_DEFAULT: i64 = 30;
const HOOK_TIMEOUT_MAX: i64 = 300;

/// `kind=name`, as CDI names a device.
pub fn qualified(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

/// What the named devices put in a container: host device nodes, host mounts,
/// environment and hooks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// (host path, container path).
    pub devices: Vec<(PathBuf, String)>,
    /// (host path, container path, read-only).
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// Environment variables, by name.
    pub env: BTreeMap<String, String>,
    /// Host paths under the root, but a `startContainer` hook's: that one runs in the
    /// container.
    pub hooks: Vec<crate::Hook>,
}

/// The edits of `names` (qualified), host paths taken under `root` (`/` but in tests).
pub fn edits(specs: &[Spec], names: &[String], root: &Path) -> Result<Edits, String> {
    let mut out = Edits::default();
    let mut kinds_done: Vec<&str> = Vec::new();
    for name in names {
        let (kind, device) = name
            .split_once('=')
            .ok_or_else(|| format!("{name:?} is not a CDI device name (vendor.com/class=name)"))?;
        let spec = specs
            .iter()
            .find(|s| s.kind == kind)
            .ok_or_else(|| format!("no CDI specification for {kind} on this node"))?;
        let d = spec
            .devices
            .iter()
            .find(|d| d.name == device)
            .ok_or_else(|| format!("the CDI specification of {kind} has no device {device:?}"))?;
        if !kinds_done.contains(&kind) {
            kinds_done.push(kind);
            add(&mut out, &spec.container_edits, root)?;
        }
        add(&mut out, &d.container_edits, root)?;
    }
    Ok(out)
}

fn add(out: &mut Edits, e: &ContainerEdits, root: &Path) -> Result<(), String> {
    for kv in &e.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("env {kv:?} is not NAME=VALUE"))?;
        out.env.insert(k.to_string(), v.to_string());
    }
    for n in &e.device_nodes {
        let host = under(root, n.host_path.as_deref().unwrap_or(&n.path))?;
        if !out.devices.iter().any(|(h, _)| *h == host) {
            out.devices.push((host, absolute(&n.path)?));
        }
    }
    for m in &e.mounts {
        let ro = m.options.iter().any(|o| o == "ro");
        out.mounts
            .push((under(root, &m.host_path)?, absolute(&m.container_path)?, ro));
    }
    for h in &e.hooks {
        use crate::HookStage as S;
        let stage = match h.hook_name.as_str() {
            "prestart" => S::Prestart,
            "createRuntime" => S::CreateRuntime,
            "createContainer" => S::CreateContainer,
            "startContainer" => S::StartContainer,
            "poststart" => S::Poststart,
            "poststop" => S::Poststop,
            other => return Err(format!("hook {:?}: hookName {other:?} is not an OCI hook (prestart, createRuntime, createContainer, startContainer, poststart, poststop)", h.path)),
        };
        let path = if stage == S::StartContainer {
            PathBuf::from(absolute(&h.path)?)
        } else {
            under(root, &h.path)?
        };
        let timeout = match h.timeout {
            None => HOOK_TIMEOUT_DEFAULT,
            Some(t) if t > 0 => t.min(HOOK_TIMEOUT_MAX),
            Some(t) => {
                return Err(format!(
                    "hook {:?}: timeout {t} must be a number of seconds above 0",
                    h.path
                ))
            }
        };
        out.hooks.push(crate::Hook {
            stage,
            path,
            args: h.args.clone(),
            env: h.env.clone(),
            timeout: Some(timeout),
        });
    }
    Ok(())
}

/// `path` (absolute, no `..`) under `root`.
pub fn under(root: &Path, path: &str) -> Result<PathBuf, String> {
    let p = absolute(path)?;
    Ok(root.join(p.trim_start_matches('/')))
}

fn absolute(path: &str) -> Result<String, String> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return Err(format!("{path:?} is not an absolute path without '..'"));
    }
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "cdiVersion: \"0.6.0\"\nkind: kat.test/gpu\ncontainerEdits:\n  env: [KAT_TEST_VENDOR=kat]\ndevices:\n  - name: \"0\"\n    containerEdits:\n      env: [KAT_TEST_GPU=0]\n      deviceNodes: [{path: /dev/dri/renderD128}]\n      mounts: [{hostPath: /usr/lib/kat-test, containerPath: /usr/lib/kat-test, options: [ro, bind]}]\n      hooks: [{hookName: createContainer, path: /usr/bin/true}]\n  - name: \"1\"\n    containerEdits:\n      deviceNodes: [{path: /dev/dri/renderD129, hostPath: /dev/dri/renderD129}]\n";

    #[test]
    fn a_device_brings_its_own_and_its_kind_edits_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kat.yaml"), SPEC).unwrap();
        std::fs::write(dir.path().join("broken.json"), "{").unwrap();
        std::fs::write(dir.path().join("README"), "not a spec").unwrap();
        let (specs, problems) = load(&[dir.path().to_path_buf()]);
        assert_eq!(specs.len(), 1);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("broken.json"), "{problems:?}");
        let root = Path::new("/fake");
        let e = edits(
            &specs,
            &["kat.test/gpu=0".into(), "kat.test/gpu=1".into()],
            root,
        )
        .unwrap();
        assert_eq!(e.env["KAT_TEST_VENDOR"], "kat");
        assert_eq!(e.env["KAT_TEST_GPU"], "0");
        assert_eq!(
            e.devices,
            vec![
                (
                    PathBuf::from("/fake/dev/dri/renderD128"),
                    "/dev/dri/renderD128".into()
                ),
                (
                    PathBuf::from("/fake/dev/dri/renderD129"),
                    "/dev/dri/renderD129".into()
                ),
            ]
        );
        assert_eq!(
            e.mounts,
            vec![(
                PathBuf::from("/fake/usr/lib/kat-test"),
                "/usr/lib/kat-test".into(),
                true
            )]
        );
        assert_eq!(
            e.hooks,
            vec![crate::Hook {
                stage: crate::HookStage::CreateContainer,
                path: "/fake/usr/bin/true".into(),
                args: vec![],
                env: vec![],
                timeout: Some(HOOK_TIMEOUT_DEFAULT),
            }]
        );
    }

    /// A spec another user could have written is not read: it would bind host paths into
    /// containers and run programs as the agent.
    #[test]
    fn a_spec_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kat.yaml");
        std::fs::write(&file, SPEC).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let (specs, problems) = load(&[dir.path().to_path_buf()]);
        assert!(specs.is_empty(), "{specs:?}");
        assert!(
            problems[0].contains("writable by its group or others"),
            "{problems:?}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (specs, problems) = load(&[dir.path().to_path_buf()]);
        assert!(specs.is_empty() && problems.len() == 1, "{problems:?}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(load(&[dir.path().to_path_buf()]).0.len(), 1);
    }

    /// A directory above the spec that others may write (and that is not sticky) makes it
    /// untrusted too: they could have put another file in its place.
    #[test]
    fn a_spec_under_a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("etc/cdi");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kat.yaml"), SPEC).unwrap();
        std::fs::set_permissions(
            top.path().join("etc"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let (specs, problems) = load(std::slice::from_ref(&dir));
        assert!(specs.is_empty(), "{specs:?}");
        assert!(
            problems[0].contains("etc is writable by its group or others"),
            "{problems:?}"
        );
        // Sticky, like /tmp: no one can replace an entry that is not theirs.
        std::fs::set_permissions(
            top.path().join("etc"),
            std::fs::Permissions::from_mode(0o1777),
        )
        .unwrap();
        assert_eq!(load(&[dir]).0.len(), 1);
    }

    /// A FIFO (or anything but a regular file) in a CDI directory is not opened for long:
    /// it would hold the agent's start.
    #[test]
    fn a_fifo_in_place_of_a_spec_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("kat.yaml"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let (specs, problems) = load(&[dir.path().to_path_buf()]);
        assert!(specs.is_empty());
        assert!(problems[0].contains("not a regular file"), "{problems:?}");
    }

    #[test]
    fn hook_timeouts_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let with = |timeout: &str| {
            std::fs::write(
                dir.path().join("kat.yaml"),
                SPEC.replace(
                    "path: /usr/bin/true}",
                    &format!("path: /usr/bin/true, timeout: {timeout}}}"),
                ),
            )
            .unwrap();
            let (specs, _) = load(&[dir.path().to_path_buf()]);
            edits(&specs, &["kat.test/gpu=0".into()], Path::new("/")).map(|e| e.hooks[0].timeout)
        };
        assert_eq!(with("5"), Ok(Some(5)));
        assert_eq!(with("100000"), Ok(Some(HOOK_TIMEOUT_MAX)));
        for bad in ["0", "-1"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("above 0"), "{e}");
        }
    }

    #[test]
    fn an_unknown_hook_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("kat.yaml"),
            SPEC.replace("hookName: createContainer", "hookName: sometime"),
        )
        .unwrap();
        let (specs, _) = load(&[dir.path().to_path_buf()]);
        let e = edits(&specs, &["kat.test/gpu=0".into()], Path::new("/")).unwrap_err();
        assert!(
            e.contains("hookName \"sometime\" is not an OCI hook"),
            "{e}"
        );
    }

    #[test]
    fn unknown_devices_and_bad_paths_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kat.yaml"), SPEC).unwrap();
        let bad = SPEC.replace(
            "/dev/dri/renderD129, hostPath",
            "../../etc/shadow, hostPath",
        );
        std::fs::write(dir.path().join("later.yaml"), bad).unwrap();
        let (specs, _) = load(&[dir.path().to_path_buf()]);
        let root = Path::new("/");
        let e = edits(&specs, &["kat.test/gpu=7".into()], root).unwrap_err();
        assert!(e.contains("no device \"7\""), "{e}");
        let e = edits(&specs, &["other.com/gpu=0".into()], root).unwrap_err();
        assert!(e.contains("no CDI specification for other.com/gpu"), "{e}");
        let e = edits(&specs, &["kat.test/gpu=1".into()], root).unwrap_err();
        assert!(e.contains("not an absolute path"), "{e}");
        let e = edits(&specs, &["gpu0".into()], root).unwrap_err();
        assert!(e.contains("not a CDI device name"), "{e}");
    }
}
