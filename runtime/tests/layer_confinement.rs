//! Nothing an image's layers say reaches outside the image store.
//!
//! A property test applies random layers (directories, files, symlinks aiming outside,
//! hard links, the same names repeated with other kinds, whiteouts and opaque markers,
//! modes like 6777 and 0000) through the whole path an image takes on a node: unpack each
//! layer, flatten them into a snapshot, copy the snapshot (the rootfs without overlay),
//! remove everything. Beside it lies a sentinel tree the symlinks point at; afterwards every
//! sentinel entry has the same kind, content, mode, owner and modification time, and
//! nothing new exists outside the work directory. It runs as root (with ids mapped, the way
//! a root agent unpacks) and again unprivileged (`scripts/test-rootless.sh`).
//!
//! And the attack that was found, as it was found: a layer that creates directory `x` with
//! mode 6777 and then, in the same layer, a symlink `x -> HOST_FILE`.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use kat_runtime::idmap::{IdMap, NodeIdRange};
use kat_runtime::image::layer::{self, Ownership};
use kat_runtime::image::limits::Budget;
use kat_runtime::image::unpack_sandbox::{self, UnpackSandbox};
use kat_runtime::image::{snapshot, UnpackLimits};
use kat_runtime::tree_dir::remove_tree;
use proptest::prelude::*;

// ---- the sentinel ----

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    kind: &'static str,
    content: Vec<u8>,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
}

/// Every entry under `root` (not following symlinks), by relative path.
fn survey(root: &Path) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let ft = meta.file_type();
        let (kind, content) = if ft.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
            ("dir", Vec::new())
        } else if ft.is_symlink() {
            (
                "symlink",
                std::fs::read_link(&p)
                    .map(|t| t.into_os_string().into_encoded_bytes())
                    .unwrap_or_default(),
            )
        } else if ft.is_file() {
            ("file", std::fs::read(&p).unwrap_or_default())
        } else {
            ("other", Vec::new())
        };
        out.insert(
            p.strip_prefix(root).unwrap().to_path_buf(),
            Seen {
                kind,
                content,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
            },
        );
    }
    out
}

/// A tree worth attacking: files of several modes, a read-only directory, a symlink.
fn plant_sentinel(dir: &Path) {
    std::fs::create_dir_all(dir.join("etc/sub")).unwrap();
    for (name, mode) in [
        ("secret", 0o600),
        ("etc/passwd", 0o644),
        ("etc/sub/key", 0o400),
    ] {
        std::fs::write(dir.join(name), format!("sentinel {name}")).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::symlink("secret", dir.join("link")).unwrap();
    std::fs::set_permissions(dir.join("etc/sub"), std::fs::Permissions::from_mode(0o555)).unwrap();
}

// ---- layers ----

#[derive(Clone, Debug)]
enum Item {
    Dir(u32),
    File(u32, Vec<u8>),
    /// A symlink to the sentinel (`0`: its top, `1`: its secret, `2`: its etc, `3`: a
    /// relative way out, `4`: `/`, `5`: an entry of the layer).
    Symlink(u8),
    /// A hard link to another path of the layer.
    HardLink(String),
    Fifo,
    Whiteout,
    Opaque,
}

#[derive(Clone, Debug)]
struct Spec {
    path: String,
    item: Item,
}

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "x", "etc"]).prop_map(str::to_string)
}

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(name(), 1..=3).prop_map(|parts| parts.join("/"))
}

fn mode() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![
        0o6777, 0o4755, 0o755, 0o700, 0o555, 0o000, 0o1777, 0o644,
    ])
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        3 => mode().prop_map(Item::Dir),
        2 => (mode(), prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(m, c)| Item::File(m, c)),
        3 => (0u8..6).prop_map(Item::Symlink),
        1 => rel_path().prop_map(Item::HardLink),
        1 => Just(Item::Fifo),
        1 => Just(Item::Whiteout),
        1 => Just(Item::Opaque),
    ]
}

fn layer_specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec(
        (rel_path(), item()).prop_map(|(path, item)| Spec { path, item }),
        1..24,
    )
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn tar_of(specs: &[Spec], sentinel: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for spec in specs {
        let path = spec.path.as_str();
        let (parent, last) = match path.rsplit_once('/') {
            Some((p, l)) => (Some(p), l),
            None => (None, path),
        };
        let in_parent = |n: &str| match parent {
            Some(p) => format!("{p}/{n}"),
            None => n.to_string(),
        };
        match &spec.item {
            Item::Dir(m) => {
                let mut h = header(tar::EntryType::Directory, *m, 0);
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Item::File(m, content) => {
                let mut h = header(tar::EntryType::Regular, *m, content.len() as u64);
                b.append_data(&mut h, path, content.as_slice()).unwrap();
            }
            Item::Symlink(to) => {
                let target = match to {
                    0 => sentinel.to_path_buf(),
                    1 => sentinel.join("secret"),
                    2 => sentinel.join("etc"),
                    3 => PathBuf::from("../../../../../../../..")
                        .join(sentinel.strip_prefix("/").unwrap()),
                    4 => PathBuf::from("/"),
                    _ => PathBuf::from("a"),
                };
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                b.append_link(&mut h, path, target).unwrap();
            }
            Item::HardLink(to) => {
                let mut h = header(tar::EntryType::Link, 0o644, 0);
                b.append_link(&mut h, path, to).unwrap();
            }
            Item::Fifo => {
                let mut h = header(tar::EntryType::Fifo, 0o6777, 0);
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Item::Whiteout => {
                let mut h = header(tar::EntryType::Regular, 0o644, 0);
                b.append_data(&mut h, in_parent(&format!(".wh.{last}")), std::io::empty())
                    .unwrap();
            }
            Item::Opaque => {
                let mut h = header(tar::EntryType::Regular, 0o644, 0);
                b.append_data(&mut h, in_parent(".wh..wh..opq"), std::io::empty())
                    .unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn budget() -> Budget {
    Budget::new("test/confinement:1", UnpackLimits::default())
}

/// A root test maps the image's ids the way a root agent does; unprivileged, they are
/// squashed to ours.
fn with_ownership<T>(f: impl FnOnce(Ownership<'_>, bool) -> T) -> T {
    if nix::unistd::geteuid().is_root() {
        let ids = IdMap::identity();
        f(Ownership::Mapped(&ids), true)
    } else {
        f(Ownership::Squashed, false)
    }
}

/// The unpacker a node with this test's user's id range uses: in a helper that is root of
/// the reserved id slice (an id owning nothing on the host).
fn sandbox() -> UnpackSandbox {
    let range = NodeIdRange::for_current_user().expect("the test user has a subuid range");
    // The VM stage runs this binary away from its build tree, with the helper beside it.
    let helper = std::env::var_os("KAT_TEST_CREATE_HELPER")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_kat-runtime-helper").into());
    UnpackSandbox::new(helper, range).expect("the test user's range has a slice to spare")
}

/// How a test unpacks: the descriptor code alone, or inside the sandbox as well.
#[derive(Clone, Copy)]
enum Unpacker {
    InProcess,
    Sandboxed,
}

/// Everything a node does with an image's layers, from unpack to removal. Errors (a layer
/// refused) are fine; reaching outside is not.
fn run_image(work: &Path, layers: &[Vec<u8>]) {
    run_image_with(Unpacker::InProcess, work, layers);
}

/// Returns how many layers were unpacked.
fn run_image_with(unpacker: Unpacker, work: &Path, layers: &[Vec<u8>]) -> usize {
    std::fs::create_dir_all(work).unwrap();
    let mut dirs = Vec::new();
    let sandbox = matches!(unpacker, Unpacker::Sandboxed).then(sandbox);
    with_ownership(|ownership, privileged| {
        for (i, bytes) in layers.iter().enumerate() {
            let dest = work.join(format!("layer{i}"));
            let unpacked = match &sandbox {
                None => layer::unpack(
                    bytes.as_slice(),
                    &dest,
                    ownership,
                    "sha256:prop",
                    &mut budget(),
                ),
                Some(sandbox) => {
                    let blob = work.join(format!("blob{i}"));
                    std::fs::write(&blob, bytes).unwrap();
                    sandbox.unpack(&blob, &dest, "sha256:prop", &mut budget())
                }
            };
            if unpacked.is_ok() {
                dirs.push(dest);
            }
        }
        let refs: Vec<&Path> = dirs.iter().map(|p| p.as_path()).collect();
        let snap = work.join("snap");
        let root_owner = privileged.then_some((0, 0));
        if snapshot::build(&refs, &snap, root_owner).is_ok() {
            let _ = snapshot::copy_tree(&snap, &work.join("copy"), privileged);
        }
    });
    remove_tree(work).unwrap();
    assert!(!work.exists(), "the work directory was removed");
    dirs.len()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_layers_change_nothing_outside(layers in prop::collection::vec(layer_specs(), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let sentinel = tmp.path().join("sentinel");
        plant_sentinel(&sentinel);
        let before = survey(&sentinel);
        let tars: Vec<Vec<u8>> = layers.iter().map(|l| tar_of(l, &sentinel)).collect();
        run_image(&tmp.path().join("work"), &tars);
        prop_assert_eq!(before, survey(&sentinel));
        let beside: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        prop_assert_eq!(beside, vec![std::ffi::OsString::from("sentinel")]);
        // Make the read-only sentinel removable by tempdir's cleanup.
        let _ = std::fs::set_permissions(sentinel.join("etc/sub"), std::fs::Permissions::from_mode(0o755));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// The same, unpacked in the sandbox (fewer cases: each layer is a helper process).
    #[test]
    fn random_layers_unpacked_in_the_sandbox_change_nothing_outside(layers in prop::collection::vec(layer_specs(), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let sentinel = tmp.path().join("sentinel");
        plant_sentinel(&sentinel);
        let before = survey(&sentinel);
        let tars: Vec<Vec<u8>> = layers.iter().map(|l| tar_of(l, &sentinel)).collect();
        run_image_with(Unpacker::Sandboxed, &tmp.path().join("work"), &tars);
        prop_assert_eq!(before, survey(&sentinel));
        let beside: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        prop_assert_eq!(beside, vec![std::ffi::OsString::from("sentinel")]);
        let _ = std::fs::set_permissions(sentinel.join("etc/sub"), std::fs::Permissions::from_mode(0o755));
    }
}

/// The attack as reported: directory `x` (6777), then symlink `x -> HOST_FILE` in the same
/// layer. The directory modes applied after unpacking once made the host file setuid.
#[test]
fn a_layer_cannot_chmod_a_host_file_through_a_replaced_directory() {
    for unpacker in [Unpacker::InProcess, Unpacker::Sandboxed] {
        chmod_attack(unpacker);
    }
}

fn chmod_attack(unpacker: Unpacker) {
    let tmp = tempfile::tempdir().unwrap();
    let host_file = tmp.path().join("host-file");
    std::fs::write(&host_file, "root's").unwrap();
    std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let host_dir = tmp.path().join("host-dir");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let specs = [
        Spec {
            path: "x".into(),
            item: Item::Dir(0o6777),
        },
        Spec {
            path: "d".into(),
            item: Item::Dir(0o6777),
        },
    ];
    let mut bytes = tar_of(&specs, tmp.path());
    // Then, in the same layer, the symlinks over the directories (tar_of's symlinks aim at
    // fixed targets; these aim at the host's file and directory).
    let mut b = tar::Builder::new(Vec::new());
    for (name, target) in [("x", &host_file), ("d", &host_dir)] {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, name, target).unwrap();
    }
    let tail = b.into_inner().unwrap();
    // Both archives end with two zero blocks; splice the second after the first's entries.
    bytes.truncate(bytes.len() - 1024);
    bytes.extend_from_slice(&tail);
    let work = tmp.path().join("work");
    let unpacked = run_image_with(unpacker, &work, &[bytes.clone(), bytes]);
    assert_eq!(
        unpacked, 2,
        "both layers are accepted (the symlinks replace the directories)"
    );
    let file_mode = std::fs::metadata(&host_file).unwrap().mode() & 0o7777;
    let dir_mode = std::fs::metadata(&host_dir).unwrap().mode() & 0o7777;
    assert_eq!(
        file_mode, 0o600,
        "the host file's mode changed: {file_mode:o}"
    );
    assert_eq!(
        dir_mode, 0o700,
        "the host directory's mode changed: {dir_mode:o}"
    );
}

/// A hard-link bomb: one file and many links to it cost one file in every copy of the
/// image (the rootfs without overlay, each slice's copy), not one file per link.
#[test]
fn a_copy_keeps_hard_links_as_links() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let data = vec![7u8; 64 * 1024];
    let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
    b.append_data(&mut h, "big", data.as_slice()).unwrap();
    for i in 0..500 {
        let mut h = header(tar::EntryType::Link, 0o644, 0);
        b.append_link(&mut h, format!("d{}/link{i}", i % 7), "big")
            .unwrap();
    }
    let bytes = b.into_inner().unwrap();
    let layer_dir = tmp.path().join("layer");
    with_ownership(|ownership, privileged| {
        layer::unpack(
            bytes.as_slice(),
            &layer_dir,
            ownership,
            "sha256:links",
            &mut budget(),
        )
        .unwrap();
        let snap = tmp.path().join("snap");
        snapshot::build(&[&layer_dir], &snap, privileged.then_some((0, 0))).unwrap();
        let copy = tmp.path().join("copy");
        snapshot::copy_tree(&snap, &copy, privileged).unwrap();
        let first = std::fs::metadata(copy.join("big")).unwrap();
        assert_eq!(first.nlink(), 501, "the copy's links are links");
        let other = std::fs::metadata(copy.join("d3/link3")).unwrap();
        assert_eq!(other.ino(), first.ino());
    });
}

/// A layer nesting deeper than `tree_dir::MAX_DEPTH` directories is refused: every later
/// walk of the tree would hold a descriptor per level.
#[test]
fn a_layer_nesting_too_deep_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = vec!["d"; kat_runtime::tree_dir::MAX_DEPTH + 1].join("/");
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(tar::EntryType::Regular, 0o644, 1);
    b.append_data(&mut h, &deep, &b"x"[..]).unwrap();
    let bytes = b.into_inner().unwrap();
    let dest = tmp.path().join("layer");
    let err = layer::unpack(
        bytes.as_slice(),
        &dest,
        Ownership::Squashed,
        "sha256:deep",
        &mut budget(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("deeper than"), "{err}");
    assert!(!dest.exists());
}

/// The unpacker holds the reserved slice's root and no other credential while it reads a
/// layer: its blob here is a FIFO, so the test can look at it from outside while it waits.
#[test]
fn the_unpacker_runs_as_an_id_that_owns_nothing() {
    let sandbox = sandbox();
    let (uid, gid) = sandbox.unpacks_as();
    // A slice of its own: not the builds' (the last), whose steps run untrusted code.
    let range = NodeIdRange::for_current_user().expect("a subuid range");
    assert_eq!((uid, gid), range.slot_root(range.slots() - 2));
    assert_ne!(
        uid,
        range.slot_root(range.slots() - 1).0,
        "the builds' slice"
    );
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("blob");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let digest = format!("sha256:{:064x}", std::process::id());
    let dest = tmp.path().join("layer");
    let unpacking = {
        let (fifo, dest, digest) = (fifo.clone(), dest.clone(), digest.clone());
        std::thread::spawn(move || sandbox.unpack(&fifo, &dest, &digest, &mut budget()))
    };
    // Opening the FIFO for writing waits until the helper has opened it for reading,
    // which it does before it drops its credentials: then wait until it has.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let helper = find_helper(&digest);
    // The helper becomes the slice's root (groups, then gid, then uid) once it is mapped.
    let status = |field: &str, want: u32| -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with(field))
                .unwrap()
                .to_string();
            if line.split_whitespace().nth(1) == Some(want.to_string().as_str())
                || std::time::Instant::now() > deadline
            {
                return line;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let uids = status("Uid:", uid);
    let gids = status("Gid:", gid);
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec![uid.to_string(); 4],
        "real, effective, saved and file-system uid: {uids}"
    );
    assert_eq!(
        gids.split_whitespace().skip(1).collect::<Vec<_>>(),
        vec![gid.to_string(); 4],
        "{gids}"
    );
    let groups = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap();
    let groups = groups.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(groups.trim(), "Groups:", "no supplementary group: {groups}");
    // Now a real layer, which it unpacks and hands to the store's owner.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header(tar::EntryType::Regular, 0o644, 5);
    b.append_data(&mut h, "etc/hostname", &b"kat\n"[..])
        .unwrap();
    std::io::Write::write_all(&mut writer, &b.into_inner().unwrap()).unwrap();
    drop(writer);
    let stats = unpacking.join().unwrap().expect("the layer unpacks");
    assert_eq!(stats.bytes, 5);
    let file = std::fs::metadata(dest.join("etc/hostname")).unwrap();
    assert_eq!(
        file.uid(),
        nix::unistd::geteuid().as_raw(),
        "the store owns what the sandbox unpacked"
    );
}

/// The helper process unpacking `digest`.
fn find_helper(digest: &str) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains(unpack_sandbox::HELPER_ARG) && cmdline.contains(digest) {
                return pid;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no unpack helper for {digest}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
