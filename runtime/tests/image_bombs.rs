//! Hostile images, attempted for real: whiteouts that aim outside the layer or snapshot
//! (directly or through a symlink a lower layer planted), gzip, inode and header bombs,
//! setuid files, device nodes, and registries that send more than they declared, stall or
//! trickle. After each, the victim outside is intact and nothing partial is left.
//!
//! Self-contained: no fixtures are needed (the registries are tiny HTTP servers here).
//!
//! One file because its thirteen tests share one set of makers: the raw tar writers
//! (`raw_entry`, `tar_of`, `gzip`, `zero_bomb`) make the layers for the unpacker, the store
//! and the registries alike; `leftovers` or `assert_store_empty` then checks nothing is left.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kat_runtime::idmap::IdMap;
use kat_runtime::image::layer::{self, LayerStats, Ownership};
use kat_runtime::image::limits::Budget;
use kat_runtime::image::{self, snapshot, ImageStore, PullTimeouts, RegistryConfig, UnpackLimits};
use kat_runtime::RuntimeError;

// ---- building layers ----

/// A tar entry written byte by byte, so names the `tar` crate would refuse can be made.
fn raw_entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    raw_entry_mode(out, name, kind, link, data, 0o755)
}

fn raw_entry_mode(
    out: &mut Vec<u8>,
    name: &str,
    kind: tar::EntryType,
    link: &str,
    data: &[u8],
    mode: u32,
) {
    let mut h = tar::Header::new_ustar();
    {
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut t = Vec::new();
    for (name, kind, link) in entries {
        raw_entry(&mut t, name, *kind, link, b"");
    }
    finish(t)
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A gzipped tar of `files` files of `each` zero bytes, streamed (never all in memory).
fn zero_bomb(files: usize, each: u64) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    for i in 0..files {
        let mut h = tar::Header::new_gnu();
        h.set_size(each);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("zero{i}"), std::io::repeat(0).take(each))
            .unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

const R: tar::EntryType = tar::EntryType::Regular;
const D: tar::EntryType = tar::EntryType::Directory;
const S: tar::EntryType = tar::EntryType::Symlink;

fn unlimited() -> Budget {
    Budget::new("test/image:1", UnpackLimits::default())
}

fn unpack(bytes: &[u8], dest: &Path) -> Result<LayerStats, RuntimeError> {
    layer::unpack(
        bytes,
        dest,
        Ownership::Squashed,
        "sha256:test",
        &mut unlimited(),
    )
}

/// A directory outside every layer and snapshot, with something to lose.
struct Victim(PathBuf);

impl Victim {
    fn new(parent: &Path) -> Victim {
        let dir = parent.join("victim");
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(dir.join("precious"), "keep me").unwrap();
        std::fs::write(dir.join("etc/passwd"), "root:x:0:0").unwrap();
        Victim(dir)
    }

    fn assert_intact(&self, case: &str) {
        assert_eq!(
            std::fs::read_to_string(self.0.join("precious"))
                .ok()
                .as_deref(),
            Some("keep me"),
            "{case}: the victim's file is gone"
        );
        assert!(
            self.0.join("etc/passwd").is_file(),
            "{case}: the victim's etc/passwd is gone"
        );
    }
}

/// Names in `dir` other than `except`: partial layers and snapshots would show here.
fn leftovers(dir: &Path, except: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !except.contains(&n.as_str()))
        .collect()
}

// ---- whiteouts ----

#[test]
fn hostile_whiteouts_are_rejected_when_unpacking() {
    let dir = tempfile::tempdir().unwrap();
    let victim = Victim::new(dir.path());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", tar_of(&[(".wh.", R, "")]), "names nothing"),
        ("dot", tar_of(&[(".wh..", R, "")]), "names \".\""),
        ("dotdot", tar_of(&[(".wh...", R, "")]), "names \"..\""),
        (
            "nested-dotdot",
            tar_of(&[("a/.wh...", R, "")]),
            "names \"..\"",
        ),
        (
            "under-a-whiteout",
            tar_of(&[(".wh.victim/precious", R, "")]),
            "under whiteout",
        ),
        (
            "under-opaque",
            tar_of(&[("a/.wh..wh..opq/x", R, "")]),
            "under whiteout",
        ),
        (
            "parent-path",
            tar_of(&[("../victim/.wh.precious", R, "")]),
            "escapes the layer",
        ),
        (
            "parent-in-the-middle",
            tar_of(&[("a/../../victim/.wh.etc", R, "")]),
            "escapes the layer",
        ),
        (
            "through-own-symlink",
            tar_of(&[
                ("a", S, victim.0.to_str().unwrap()),
                ("a/.wh.precious", R, ""),
            ]),
            "passes through non-directory",
        ),
    ];
    for (name, bytes, expected) in cases {
        let dest = dir.path().join(name);
        let err = unpack(&bytes, &dest).expect_err(name);
        assert!(
            matches!(err, RuntimeError::BadLayer { .. }),
            "{name}: {err}"
        );
        let err = err.to_string();
        assert!(err.contains(expected), "{name}: {err}");
        assert!(!dest.exists(), "{name}: layer directory left behind");
        victim.assert_intact(name);
    }
    assert_eq!(leftovers(dir.path(), &["victim"]), Vec::<String>::new());
}

/// Layer 1 plants symlinks to a directory outside; layer 2 whites out and opaques through
/// them. The snapshot replaces the symlinks with real directories: nothing outside goes.
#[test]
fn whiteouts_through_planted_symlinks_remove_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let victim = Victim::new(dir.path());
    let target = victim.0.to_str().unwrap();
    let lower = tar_of(&[
        ("a", S, target),
        ("b", S, target),
        ("c", S, target),
        ("etc-link", S, target),
        ("keep", R, ""),
    ]);
    let upper = tar_of(&[
        ("a/.wh.precious", R, ""),
        ("b/.wh..wh..opq", R, ""),
        ("etc-link/.wh.etc", R, ""),
        (".wh.c", R, ""),
    ]);
    unpack(&gzip(&lower), &dir.path().join("l1")).unwrap();
    unpack(&upper, &dir.path().join("l2")).unwrap();
    let snap = dir.path().join("snap");
    snapshot::build(
        &[&dir.path().join("l1"), &dir.path().join("l2")],
        &snap,
        None,
    )
    .unwrap();
    victim.assert_intact("snapshot");
    for d in ["a", "b", "etc-link"] {
        let meta = std::fs::symlink_metadata(snap.join(d)).unwrap();
        assert!(meta.is_dir(), "{d} should now be a real directory");
        assert_eq!(leftovers(&snap.join(d), &[]), Vec::<String>::new(), "{d}");
    }
    // `.wh.c` removed the symlink itself, not what it points at.
    assert!(std::fs::symlink_metadata(snap.join("c")).is_err());
    assert!(snap.join("keep").is_file());
}

/// Layers written by an older KAT are on disk unchecked: the snapshot checks again. Here
/// `.wh..` at the top would have removed the snapshot's parent, every other snapshot.
#[test]
fn snapshot_refuses_hostile_whiteouts_of_stored_layers() {
    let dir = tempfile::tempdir().unwrap();
    let snapshots = dir.path().join("snapshots");
    let other = snapshots.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("keep"), "k").unwrap();
    let victim = Victim::new(dir.path());
    for (case, path) in [
        ("dotdot", ".wh..."),
        ("nested-dotdot", "sub/.wh..."),
        ("dot", ".wh.."),
        ("empty", ".wh."),
    ] {
        let lower = dir.path().join(format!("lower-{case}"));
        std::fs::create_dir_all(lower.join("sub")).unwrap();
        std::fs::write(lower.join("sub/file"), "f").unwrap();
        let upper = dir.path().join(format!("upper-{case}"));
        let marker = upper.join(path);
        std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
        std::fs::write(&marker, "").unwrap();
        let dest = snapshots.join(format!("new-{case}"));
        let err = snapshot::build(&[&lower, &upper], &dest, None).expect_err(case);
        assert!(
            matches!(err, RuntimeError::BadLayer { .. }),
            "{case}: {err}"
        );
        assert!(err.to_string().contains("whiteout"), "{case}: {err}");
        assert!(!dest.exists(), "{case}: snapshot left behind");
        assert_eq!(leftovers(&snapshots, &["other"]), Vec::<String>::new());
        assert!(
            other.join("keep").is_file(),
            "{case}: another snapshot went"
        );
        victim.assert_intact(case);
    }
}

// ---- bombs ----

fn small(max_bytes: u64, max_entries: u64) -> Budget {
    Budget::new(
        "example.org/bomb:1",
        UnpackLimits {
            max_bytes,
            max_entries,
        },
    )
}

#[test]
fn gzip_bombs_stop_at_the_byte_limit_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // One 64 MiB file of zeros, 64 KiB compressed: refused from its header, before a
        // byte of it is inflated.
        ("one-huge-file", zero_bomb(1, 64 << 20)),
        // Many files each under the limit, together over it.
        ("many-files", zero_bomb(64, 64 << 10)),
    ];
    for (name, bytes) in cases {
        assert!(bytes.len() < 1 << 20, "{name}: the bomb itself is small");
        let dest = dir.path().join(name);
        let started = Instant::now();
        let err = layer::unpack(
            &bytes[..],
            &dest,
            Ownership::Squashed,
            "sha256:bomb",
            &mut small(1 << 20, 1000),
        )
        .expect_err(name)
        .to_string();
        assert!(
            err.contains("image example.org/bomb:1 unpacks to more than 1 MiB")
                && err.contains("layer sha256:bomb")
                && err.contains("raise --image-max-unpacked-bytes if it is legitimate"),
            "{name}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{name}: slow");
        assert!(!dest.exists(), "{name}: layer left behind");
    }
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

/// The limit is per image: two layers under it each, over it together.
#[test]
fn the_byte_limit_counts_every_layer_of_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let mut budget = small(1 << 20, 1000);
    let half = zero_bomb(1, 600 << 10);
    layer::unpack(
        &half[..],
        &dir.path().join("l1"),
        Ownership::Squashed,
        "sha256:one",
        &mut budget,
    )
    .unwrap();
    let err = layer::unpack(
        &half[..],
        &dir.path().join("l2"),
        Ownership::Squashed,
        "sha256:two",
        &mut budget,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("layer sha256:two") && err.contains("1 MiB"),
        "{err}"
    );
    assert_eq!(leftovers(dir.path(), &[]), ["l1"]);
}

#[test]
fn inode_bombs_stop_at_the_entry_limit_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Vec::new();
    for i in 0..5000 {
        raw_entry(&mut t, &format!("d{i}"), D, "", b"");
    }
    let dest = dir.path().join("inodes");
    let err = layer::unpack(
        &gzip(&finish(t))[..],
        &dest,
        Ownership::Squashed,
        "sha256:inodes",
        &mut small(1 << 30, 100),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("image example.org/bomb:1 unpacks to more than 100 entries")
            && err.contains("raise --image-max-entries if it is legitimate"),
        "{err}"
    );
    assert!(!dest.exists());
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

/// PAX records and GNU long names are read into memory before their entry is seen: a
/// huge one is cut off at 1 MiB, not read.
#[test]
fn oversized_tar_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let long_name = vec![b'a'; 8 << 20];
    let mut pax = Vec::new();
    let record_body = format!("path={}\n", "p".repeat(8 << 20));
    // The length counts itself: 7 digits and a space.
    let record = format!("{} {record_body}", record_body.len() + 8);
    pax.extend_from_slice(record.as_bytes());
    for (name, kind, data) in [
        ("gnu", tar::EntryType::GNULongName, long_name),
        ("pax", tar::EntryType::XHeader, pax),
    ] {
        let mut t = Vec::new();
        raw_entry(&mut t, "././@LongLink", kind, "", &data);
        raw_entry(&mut t, "short", R, "", b"x");
        let dest = dir.path().join(name);
        let err = unpack(&gzip(&finish(t)), &dest).unwrap_err().to_string();
        assert!(err.contains("tar headers"), "{name}: {err}");
        assert!(!dest.exists(), "{name}");
    }
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

// ---- setuid and devices ----

#[test]
fn setuid_and_setgid_bits_are_dropped_and_devices_never_created() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Vec::new();
    raw_entry_mode(&mut t, "bin/", D, "", b"", 0o2755);
    raw_entry_mode(&mut t, "bin/su", R, "", b"#!", 0o4755);
    raw_entry_mode(&mut t, "bin/wall", R, "", b"#!", 0o2755);
    raw_entry_mode(&mut t, "bin/both", R, "", b"#!", 0o6711);
    raw_entry_mode(&mut t, "bin/sticky", R, "", b"#!", 0o1755);
    raw_entry_mode(&mut t, "dev/mem", tar::EntryType::Char, "", b"", 0o666);
    raw_entry_mode(&mut t, "dev/sda", tar::EntryType::Block, "", b"", 0o666);
    let dest = dir.path().join("layer");
    let stats = unpack(&finish(t), &dest).unwrap();
    assert_eq!(stats.entries, 7);
    let mode = |p: &str| std::fs::metadata(dest.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("bin/su"), 0o755);
    assert_eq!(mode("bin/wall"), 0o755);
    assert_eq!(mode("bin/both"), 0o711);
    assert_eq!(mode("bin/sticky"), 0o1755);
    // A directory's setgid only passes its group on to new files: kept.
    assert_eq!(mode("bin"), 0o2755);
    for dev in ["dev/mem", "dev/sda"] {
        assert!(
            std::fs::symlink_metadata(dest.join(dev)).is_err(),
            "{dev} was created"
        );
    }
}

// ---- a store: an OCI layout with a bomb ----

/// Writes an OCI layout of one image with these layers; returns the layer digests.
fn write_layout(dir: &Path, layers: &[Vec<u8>]) -> Vec<String> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> (String, usize) {
        let digest = sha256(bytes);
        std::fs::write(blobs.join(digest.trim_start_matches("sha256:")), bytes).unwrap();
        (digest, bytes.len())
    };
    let (config, config_size) = put(br#"{"architecture":"amd64","os":"linux","config":{}}"#);
    let mut digests = Vec::new();
    let mut descriptors = Vec::new();
    for l in layers {
        let (d, size) = put(l);
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": d, "size": size,
        }));
        digests.push(d);
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": descriptors,
    })
    .to_string();
    let (m, m_size) = put(manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": m_size}],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    digests
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

fn store_in(dir: &Path, limits: UnpackLimits, timeouts: PullTimeouts) -> ImageStore {
    ImageStore::open(&dir.join("images"), IdMap::identity())
        .unwrap()
        .with_limits(limits)
        .with_timeouts(timeouts)
}

/// The store is as empty as it started: no image, no layer, nothing in flight.
fn assert_store_empty(dir: &Path, store: &ImageStore) {
    assert!(store.list().unwrap().is_empty());
    for sub in ["layers", "snapshots", "tmp"] {
        assert_eq!(
            leftovers(&dir.join("images").join(sub), &[]),
            Vec::<String>::new(),
            "{sub}"
        );
    }
}

#[tokio::test]
async fn imported_bomb_is_refused_by_the_store_limits() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    // Two small layers, then a bomb: the limit counts the earlier layers too.
    let fine = gzip(&tar_of(&[("etc/", D, ""), ("etc/hostname", R, "")]));
    let digests = write_layout(&layout, &[fine, zero_bomb(1, 64 << 20)]);
    let limits = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };
    let store = store_in(dir.path(), limits, PullTimeouts::default());
    let err = image::layout::import(&store, &layout, "localhost/bomb:1")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("layer {}", digests[1]))
            && err.contains("image localhost/bomb:1 unpacks to more than 1 MiB"),
        "{err}"
    );
    assert!(store.list().unwrap().is_empty());
    assert_eq!(
        leftovers(&dir.path().join("images/layers"), &[]),
        [digests[0].trim_start_matches("sha256:")],
        "only the good layer is stored"
    );
    assert_eq!(
        leftovers(&dir.path().join("images/tmp"), &[]),
        Vec::<String>::new()
    );
}

// ---- registries ----

/// How the registry answers a request for the layer blob.
#[derive(Clone)]
enum Blob {
    /// These bytes, with a Content-Length.
    Exact(Vec<u8>),
    /// Zeros, far more than declared (256 MiB), no Content-Length.
    Endless,
    /// A Content-Length larger than the descriptor's size.
    Declares(u64),
    /// Headers, then nothing.
    Stall,
    /// One byte every 100 ms.
    Trickle,
}

/// What stands in front of the image: nothing, a bearer-token challenge, or a flood where a
/// manifest or a token should be.
#[derive(Clone, Copy, PartialEq)]
enum Front {
    Open,
    Bearer,
    ManifestFlood,
    TokenFlood,
}

struct Registry {
    host: String,
    /// Layer bytes written before the client went away.
    sent: Arc<AtomicU64>,
}

/// A registry of one image, `HOST/evil/img:latest`, on 127.0.0.1. Each connection gets
/// one answer and is closed.
fn registry(layer_digest: &str, layer_size: usize, blob: Blob) -> Registry {
    registry_behind(Front::Open, layer_digest, layer_size, blob)
}

fn registry_behind(front: Front, layer_digest: &str, layer_size: usize, blob: Blob) -> Registry {
    let config = br#"{"architecture":"amd64","os":"linux","config":{}}"#.to_vec();
    let config_digest = sha256(&config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer_size}],
    })
    .to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let served = host.clone();
    let layer_path = format!("/v2/evil/img/blobs/{layer_digest}");
    let config_path = format!("/v2/evil/img/blobs/{config_digest}");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (manifest, config, blob, counter) = (
                manifest.clone(),
                config.clone(),
                blob.clone(),
                counter.clone(),
            );
            let (layer_path, config_path) = (layer_path.clone(), config_path.clone());
            let host = host.clone();
            std::thread::spawn(move || {
                let Some((path, head)) = request_path(&mut conn) else {
                    return;
                };
                let token = "Bearer the-token";
                let challenged = matches!(front, Front::Bearer | Front::TokenFlood)
                    && path.starts_with("/v2/")
                    && !head.contains(&format!("authorization: {}", token.to_ascii_lowercase()));
                let _ = if challenged {
                    write!(
                        conn,
                        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://{host}/token\",service=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                } else if path.starts_with("/token?") {
                    if front == Front::TokenFlood {
                        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"token\": \"")
                            .and_then(|()| flood(&mut conn, &counter))
                    } else {
                        answer(&mut conn, "application/json", br#"{"token": "the-token"}"#)
                    }
                } else if front == Front::ManifestFlood && path.contains("/manifests/") {
                    conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n")
                        .and_then(|()| flood(&mut conn, &counter))
                } else if path == "/v2/" {
                    answer(&mut conn, "application/json", b"{}")
                } else if path == "/v2/evil/img/manifests/latest" {
                    answer(
                        &mut conn,
                        "application/vnd.oci.image.manifest.v1+json",
                        manifest.as_bytes(),
                    )
                } else if path == config_path {
                    answer(&mut conn, "application/octet-stream", &config)
                } else if path == layer_path {
                    send_blob(&mut conn, &blob, &counter)
                } else {
                    conn.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                };
            });
        }
    });
    Registry { host: served, sent }
}

/// The request's path and its head in lower case.
fn request_path(conn: &mut TcpStream) -> Option<(String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    Some((
        text.split_whitespace().nth(1)?.to_string(),
        text.to_ascii_lowercase(),
    ))
}

fn answer(conn: &mut TcpStream, content_type: &str, body: &[u8]) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    conn.write_all(body)
}

/// 256 MiB of zeros, or less if the client hangs up first.
fn flood(conn: &mut TcpStream, sent: &AtomicU64) -> std::io::Result<()> {
    for _ in 0..4096 {
        conn.write_all(&[0u8; 64 << 10])?;
        sent.fetch_add(64 << 10, Ordering::Relaxed);
    }
    Ok(())
}

fn send_blob(conn: &mut TcpStream, blob: &Blob, sent: &AtomicU64) -> std::io::Result<()> {
    let head = |len: Option<u64>| {
        let len = len
            .map(|l| format!("Content-Length: {l}\r\n"))
            .unwrap_or_default();
        format!("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n{len}Connection: close\r\n\r\n")
    };
    match blob {
        Blob::Exact(bytes) => {
            conn.write_all(head(Some(bytes.len() as u64)).as_bytes())?;
            conn.write_all(bytes)
        }
        Blob::Declares(len) => {
            conn.write_all(head(Some(*len)).as_bytes())?;
            flood(conn, sent)
        }
        Blob::Endless => {
            conn.write_all(head(None).as_bytes())?;
            flood(conn, sent)
        }
        Blob::Stall => {
            conn.write_all(head(None).as_bytes())?;
            std::thread::sleep(Duration::from_secs(30));
            Ok(())
        }
        Blob::Trickle => {
            conn.write_all(head(None).as_bytes())?;
            for _ in 0..300 {
                conn.write_all(b"x")?;
                sent.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        }
    }
}

/// Pulls `HOST/evil/img:latest` into a fresh store; the error, the store and its dir.
async fn pull_from(
    reg: &Registry,
    timeouts: PullTimeouts,
) -> (kat_runtime::Result<()>, ImageStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path(), UnpackLimits::default(), timeouts);
    let config = RegistryConfig {
        insecure: vec![reg.host.clone()],
        // Not the test user's own credentials.
        auth_files: vec![dir.path().join("no-auth.json")],
    };
    let reference = format!("{}/evil/img:latest", reg.host);
    let result = image::pull::pull(&store, &config, &Default::default(), &reference, None)
        .await
        .map(|_| ());
    (result, store, dir)
}

fn quick() -> PullTimeouts {
    PullTimeouts {
        connect: Duration::from_secs(5),
        read: Duration::from_secs(1),
        blob: Duration::from_secs(2),
    }
}

/// The harness itself: an honest registry is pulled from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_test_registry_is_pulled_from() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let reg = registry(&sha256(&layer), layer.len(), Blob::Exact(layer));
    let (result, store, _dir) = pull_from(&reg, quick()).await;
    result.unwrap();
    assert_eq!(store.list().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_larger_than_its_descriptor_is_cut_off() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let digest = sha256(&layer);
    for (case, blob) in [
        // Right bytes, then more: the digest would not even be computed.
        ("endless", Blob::Endless),
        ("declared", Blob::Declares(1 << 40)),
    ] {
        let reg = registry(&digest, layer.len(), blob);
        let started = Instant::now();
        // Bounded, so a regression fails rather than hangs.
        let timeouts = PullTimeouts {
            blob: Duration::from_secs(30),
            ..PullTimeouts::default()
        };
        let (result, store, dir) = pull_from(&reg, timeouts).await;
        let err = result.expect_err(case).to_string();
        assert!(
            err.contains(&format!(
                "blob {digest} from registry {}: the registry sends more than the {} bytes its descriptor declares",
                reg.host,
                layer.len()
            )),
            "{case}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}: slow");
        // The client hung up: the server could not have written a gigabyte.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            reg.sent.load(Ordering::Relaxed) < 64 << 20,
            "{case}: read on after the size"
        );
        assert_store_empty(dir.path(), &store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_with_the_wrong_digest_is_refused() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let mut forged = layer.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0xff;
    let reg = registry(&sha256(&layer), layer.len(), Blob::Exact(forged));
    let (result, store, dir) = pull_from(&reg, quick()).await;
    let err = result.unwrap_err().to_string();
    assert!(err.to_lowercase().contains("digest"), "{err}");
    assert_store_empty(dir.path(), &store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_trickling_registry_times_out() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let digest = sha256(&layer);
    for (case, blob, expected) in [
        (
            "stall",
            Blob::Stall,
            "nothing received for 1s, the read timeout",
        ),
        ("trickle", Blob::Trickle, "not complete within 2s"),
    ] {
        // A trickle never trips the read timeout, only the deadline.
        let reg = registry(&digest, 1 << 20, blob);
        let started = Instant::now();
        let (result, store, dir) = pull_from(&reg, quick()).await;
        let err = result.expect_err(case).to_string();
        assert!(
            err.contains(&format!("blob {digest} from registry {}", reg.host))
                && err.contains(expected),
            "{case}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}: slow");
        assert_store_empty(dir.path(), &store);
    }
}

/// A pull while the highest resident memory is sampled; the result and the peak growth.
async fn pull_measured(reg: &Registry) -> (kat_runtime::Result<()>, u64) {
    let before = kat_testkit::resident_bytes();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(kat_testkit::resident_bytes());
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let timeouts = PullTimeouts {
        blob: Duration::from_secs(30),
        ..PullTimeouts::default()
    };
    let (result, _store, _dir) = pull_from(reg, timeouts).await;
    done.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    (result, peak.saturating_sub(before))
}

/// A manifest or a token response of gigabytes: the pull stops at the cap (4 MiB for a
/// manifest, 1 MiB for a token) and the process's memory grows by a few megabytes, not by
/// what the registry sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_in_place_of_a_manifest_or_a_token_is_cut_off() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    for (case, front) in [
        ("manifest", Front::ManifestFlood),
        ("token", Front::TokenFlood),
    ] {
        let reg = registry_behind(
            front,
            &sha256(&layer),
            layer.len(),
            Blob::Exact(layer.clone()),
        );
        let started = Instant::now();
        let (result, grew) = pull_measured(&reg).await;
        let err = result.expect_err(case).to_string();
        assert!(err.contains("larger than the"), "{case}: {err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{case}: slow");
        std::thread::sleep(Duration::from_millis(200));
        let sent = reg.sent.load(Ordering::Relaxed);
        eprintln!(
            "{case} flood: the registry wrote {} KiB, memory grew {} KiB",
            sent >> 10,
            grew >> 10
        );
        assert!(
            sent < 64 << 20,
            "{case}: read on after the cap ({sent} bytes)"
        );
        assert!(grew < 48 << 20, "{case}: memory grew by {grew} bytes");
    }
}

/// The bearer-token dance as registries do it: challenged, a token from the realm, then
/// the manifest and blobs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_behind_a_token_service_is_pulled_from() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let reg = registry_behind(
        Front::Bearer,
        &sha256(&layer),
        layer.len(),
        Blob::Exact(layer),
    );
    let (result, store, _dir) = pull_from(&reg, quick()).await;
    result.unwrap();
    assert_eq!(store.list().unwrap().len(), 1);
}

/// A registry on loopback that the admin did not name is not contacted: the image
/// reference of a workload cannot aim the node at its own services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_on_loopback_is_refused_unless_the_admin_named_it() {
    let layer = gzip(&tar_of(&[("hello", R, "")]));
    let reg = registry(&sha256(&layer), layer.len(), Blob::Exact(layer));
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path(), UnpackLimits::default(), quick());
    let config = RegistryConfig {
        insecure: vec![],
        auth_files: vec![dir.path().join("no-auth.json")],
    };
    for reference in [
        format!("{}/evil/img:latest", reg.host),
        format!(
            "localhost:{}/evil/img:latest",
            reg.host.rsplit(':').next().unwrap()
        ),
    ] {
        let err = image::pull::pull(&store, &config, &Default::default(), &reference, None)
            .await
            .expect_err(&reference)
            .to_string();
        assert!(
            err.contains("a loopback address") && err.contains("--allow-fetch-from"),
            "{reference}: {err}"
        );
    }
    assert_eq!(reg.sent.load(Ordering::Relaxed), 0);
    assert_store_empty(dir.path(), &store);
}
