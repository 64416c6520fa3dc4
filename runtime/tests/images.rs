//! The image store against a real registry and real files: pulls, imports, removal, and
//! layers that try to escape.

mod support;

use std::io::Write;
use std::path::Path;

use kat_runtime::image::layer::{self, Ownership};
use kat_runtime::image::limits::Budget;
use kat_runtime::image::{snapshot, UnpackLimits};
use kat_runtime::{ContainerRuntime, PullProgress, RuntimeError};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_of_one_image_download_once() {
    let f = fixtures();
    let (rt, _dir) = runtime(&f);
    let (tx1, mut rx1) = tokio::sync::mpsc::unbounded_channel();
    let (tx2, mut rx2) = tokio::sync::mpsc::unbounded_channel();
    let img = image(&f);
    let (a, b) = tokio::join!(
        rt.pull_image(&img, Some(tx1)),
        rt.pull_image(&img, Some(tx2))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.id, b.id);
    assert!(a.id.starts_with("sha256:") && a.size > 500_000, "{a:?}");
    let mut events = Vec::new();
    while let Ok(e) = rx1.try_recv() {
        events.push(e);
    }
    while let Ok(e) = rx2.try_recv() {
        events.push(e);
    }
    let downloaded = events
        .iter()
        .filter(|e| matches!(e, PullProgress::LayerDone { .. }))
        .count();
    let cached = events
        .iter()
        .filter(|e| matches!(e, PullProgress::LayerCached { .. }))
        .count();
    assert_eq!(
        (downloaded, cached),
        (a.layers.len(), a.layers.len()),
        "{events:?}"
    );
    assert!(events.iter().any(
        |e| matches!(e, PullProgress::LayerBytes { downloaded, total, .. } if downloaded == total)
    ));
    assert_eq!(rt.list_images().await.unwrap().len(), 1);
}

/// A registry behind basic auth (htpasswd): refused without credentials and with wrong
/// ones, each with what to do next; pulled with the credentials from an auth file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_from_the_auth_file() {
    use base64::Engine;
    let f = fixtures();
    let dir = tempfile::tempdir().unwrap();
    let auth_file = dir.path().join("auth.json");
    let write_auth = |creds: &str| {
        let encoded = base64::engine::general_purpose::STANDARD.encode(creds);
        let doc = serde_json::json!({"auths": {f.auth_registry.clone(): {"auth": encoded}}});
        std::fs::write(&auth_file, doc.to_string()).unwrap();
    };
    let runtime_with_auth = || {
        let mut config = config_in(&f, dir.path());
        config.registries.insecure.push(f.auth_registry.clone());
        config.registries.auth_files = vec![auth_file.clone()];
        kat_runtime::NativeRuntime::new(config).unwrap()
    };
    let img = format!("{}/kat/busybox:latest", f.auth_registry);

    // No auth file at all.
    let rt = runtime_with_auth();
    let e = rt.pull_image(&img, None).await.unwrap_err().to_string();
    assert!(
        e.contains("refused access") && e.contains("no credentials"),
        "{e}"
    );
    assert!(rt.list_images().await.unwrap().is_empty());

    write_auth("kat-test:wrong-password");
    let e = rt.pull_image(&img, None).await.unwrap_err().to_string();
    assert!(
        e.contains("refused access") && e.contains("were refused"),
        "{e}"
    );

    write_auth(&f.auth_creds);
    let summary = rt.pull_image(&img, None).await.unwrap();
    assert!(summary.id.starts_with("sha256:"), "{summary:?}");
    assert_eq!(rt.list_images().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_from_oci_layout_runs_and_prune_reclaims() {
    let f = fixtures();
    let (rt, _dir) = runtime(&f);
    let imported = rt
        .import_image(&f.layout, "localhost/kat/built:latest")
        .await
        .unwrap();
    assert_eq!(imported.references, ["localhost/kat/built:latest"]);
    let (code, out) = run(
        &rt,
        "from-layout",
        "localhost/kat/built:latest",
        "echo imported",
    )
    .await;
    assert_eq!((code, out), (0, vec!["imported".to_string()]));

    // The same image pulled: same id, two references, layers stored once.
    let pulled = rt.pull_image(&image(&f), None).await.unwrap();
    assert_eq!(pulled.id, imported.id);
    assert_eq!(rt.list_images().await.unwrap()[0].references.len(), 2);
    assert_eq!(
        rt.remove_image("localhost/kat/built:latest").await.unwrap(),
        0,
        "still referenced"
    );
    assert_eq!(rt.prune_images().await.unwrap(), 0, "in use by a container");
    rt.remove("from-layout", false).await.unwrap();
    let reclaimed = rt.prune_images().await.unwrap();
    assert_eq!(reclaimed, pulled.size);
    assert!(rt.list_images().await.unwrap().is_empty());
    assert!(matches!(
        rt.create(&options("x", &image(&f), "true")).await,
        Err(RuntimeError::ImageNotPresent(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_layout_blob_is_rejected_and_nothing_is_stored() {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    let copy = dir.path().join("layout");
    copy_dir(&f.layout, &copy);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(copy.join("blobs/sha256").join(&manifest_digest)).unwrap(),
    )
    .unwrap();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    std::fs::OpenOptions::new()
        .append(true)
        .open(copy.join("blobs/sha256").join(&layer))
        .unwrap()
        .write_all(b"x")
        .unwrap();
    let err = rt.import_image(&copy, "localhost/bad:1").await.unwrap_err();
    assert!(matches!(err, RuntimeError::DigestMismatch { .. }), "{err}");
    assert!(rt.list_images().await.unwrap().is_empty());
    let err = rt
        .import_image(&dir.path().join("nope"), "localhost/bad:1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("index.json"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A tar entry written byte by byte, so names the `tar` crate would refuse can be made.
fn raw_entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    {
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o755);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn unpack(bytes: &[u8], dest: &Path) -> Result<layer::LayerStats, RuntimeError> {
    let mut budget = Budget::new("test/image:1", UnpackLimits::default());
    layer::unpack(bytes, dest, Ownership::Squashed, "sha256:test", &mut budget)
}

#[test]
fn hostile_layers_are_rejected_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            {
                let mut t = Vec::new();
                raw_entry(&mut t, "../evil", tar::EntryType::Regular, "", b"x");
                finish(t)
            },
            "escapes the layer",
        ),
        (
            "symlink-parent",
            {
                let mut t = Vec::new();
                raw_entry(&mut t, "link", tar::EntryType::Symlink, "/", b"");
                raw_entry(&mut t, "link/tmp/evil", tar::EntryType::Regular, "", b"x");
                finish(t)
            },
            "passes through non-directory",
        ),
        (
            "hardlink-out",
            {
                let mut t = Vec::new();
                raw_entry(&mut t, "hl", tar::EntryType::Link, "../../etc/passwd", b"");
                finish(t)
            },
            "escapes the layer",
        ),
        (
            "hardlink-missing",
            {
                let mut t = Vec::new();
                raw_entry(&mut t, "hl", tar::EntryType::Link, "etc/passwd", b"");
                finish(t)
            },
            "not a file earlier in the layer",
        ),
        (
            "truncated-gzip",
            {
                let mut gz =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                let mut t = Vec::new();
                raw_entry(&mut t, "file", tar::EntryType::Regular, "", &[7u8; 5000]);
                gz.write_all(&finish(t)).unwrap();
                let mut bytes = gz.finish().unwrap();
                bytes.truncate(bytes.len() / 2);
                bytes
            },
            "sha256:test",
        ),
    ];
    for (name, bytes, expected) in cases {
        let dest = dir.path().join(name);
        let err = unpack(&bytes, &dest).expect_err(name).to_string();
        assert!(err.contains(expected), "{name}: {err}");
        assert!(!dest.exists(), "{name}: layer directory left behind");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "partial directories left: {left:?}");
    assert!(!Path::new("/tmp/evil").exists());
}

#[test]
fn gzip_zstd_and_plain_layers_with_whiteouts_flatten_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let mut lower = tar::Builder::new(Vec::new());
    for (path, data) in [("a/x", "x"), ("a/y", "y"), ("b/z", "z"), ("keep", "k")] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        lower.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    let lower = lower.into_inner().unwrap();
    let mut upper = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("a/.wh..wh..opq", ""),
        ("a/new", "n"),
        (".wh.b", ""),
        ("keep", "k2"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        upper.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    let upper = upper.into_inner().unwrap();

    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&lower).unwrap();
        e.finish().unwrap()
    };
    let zst = zstd::encode_all(&upper[..], 3).unwrap();
    unpack(&gz, &dir.path().join("l1")).unwrap();
    unpack(&zst, &dir.path().join("l2")).unwrap();
    unpack(&lower, &dir.path().join("plain")).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("plain/b/z")).unwrap(),
        "z"
    );

    let snap = dir.path().join("snap");
    snapshot::build(
        &[&dir.path().join("l1"), &dir.path().join("l2")],
        &snap,
        None,
    )
    .unwrap();
    let mut names: Vec<String> = walk(&snap);
    names.sort();
    assert_eq!(names, ["a", "a/new", "keep"]);
    assert_eq!(std::fs::read_to_string(snap.join("keep")).unwrap(), "k2");
}

fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}
