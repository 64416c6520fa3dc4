//! Shared setup of the runtime tests: fixtures from `scripts/test-fixtures.sh`, a fresh
//! runtime root per test, and waiting helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kat_runtime::{
    ContainerRuntime, ContainerState, CreateOptions, LogOptions, LogRecord, NativeConfig,
    NativeRuntime,
};

pub struct Fixtures {
    pub init: PathBuf,
    pub registry: String,
    pub layout: PathBuf,
    /// A registry that wants basic auth, serving the same image, and its `user:password`.
    pub auth_registry: String,
    pub auth_creds: String,
}

/// The fixtures, or a panic that says how to make them.
pub fn fixtures() -> Fixtures {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run `source <(scripts/test-fixtures.sh)` first (scripts/test.sh does)"))
    };
    Fixtures {
        init: PathBuf::from(var("KAT_INIT")),
        registry: var("KAT_TEST_REGISTRY"),
        layout: PathBuf::from(var("KAT_TEST_LAYOUT")),
        auth_registry: var("KAT_TEST_AUTH_REGISTRY"),
        auth_creds: var("KAT_TEST_AUTH_CREDS"),
    }
}

pub fn image(f: &Fixtures) -> String {
    format!("{}/kat/busybox:latest", f.registry)
}

/// A runtime in a fresh directory; the directory lives as long as the returned guard.
pub fn runtime(f: &Fixtures) -> (NativeRuntime, tempfile::TempDir) {
    let dir = runtime_dir("kat-rt-");
    (runtime_in(f, dir.path()), dir)
}

/// A fresh directory for a runtime's root under [`test_root`], named with `prefix`.
pub fn runtime_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(test_root())
        .expect("temp dir");
    // Like any agent root's parents: searchable by the container's (mapped) root.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .expect("chmod");
    dir
}

/// A runtime whose root is `DIR/root` (a second agent on the same directory finds the
/// first one's containers).
pub fn runtime_in(f: &Fixtures, dir: &std::path::Path) -> NativeRuntime {
    NativeRuntime::new(config_in(f, dir)).expect("runtime")
}

/// Loopback allowed, as an admin allows it with `--allow-fetch-from 127.0.0.0/8`.
pub fn loopback() -> kat_outbound::OutboundPolicy {
    kat_outbound::OutboundPolicy::allow(["127.0.0.0/8".parse().expect("a network")])
}

/// The test configuration of a runtime whose root is `DIR/root`.
pub fn config_in(f: &Fixtures, dir: &std::path::Path) -> NativeConfig {
    let mut config = NativeConfig::new(dir.join("root"), &f.init);
    config.registries.insecure = vec![f.registry.clone()];
    // The tests' git daemons are on loopback, which a node refuses unless allowed.
    config.outbound = loopback();
    config.cgroup_parent = std::env::var("KAT_TEST_CGROUP_PARENT").ok();
    // The VM stage copies the test binaries elsewhere and says where the helper went.
    config.create_helper = std::env::var("KAT_TEST_CREATE_HELPER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kat-runtime-helper").into())
        .into();
    config.cgroup_manager = match std::env::var("KAT_TEST_CGROUP_MANAGER").as_deref() {
        Ok("systemd") => kat_runtime::CgroupManager::Systemd,
        Ok("cgroupfs") => kat_runtime::CgroupManager::Cgroupfs,
        _ => kat_runtime::CgroupManager::Auto,
    };
    config.force_copy_rootfs = std::env::var("KAT_TEST_COPY_ROOTFS").is_ok();
    if nix::unistd::geteuid().is_root() {
        // As root, an unused range of 16 slices, as `kat-agent setup` would allocate.
        config.id_range = Some(kat_runtime::idmap::NodeIdRange {
            uid_start: 300_000,
            uid_count: 16 * kat_runtime::idmap::SLICE_SIZE,
            gid_start: 300_000,
            gid_count: 16 * kat_runtime::idmap::SLICE_SIZE,
        });
    }
    config
}

/// Where test runtimes live: a directory the unprivileged test user can use too.
pub fn test_root() -> PathBuf {
    let root = std::env::var("KAT_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    std::fs::create_dir_all(&root).expect("test root");
    root
}

pub fn options(id: &str, image: &str, script: &str) -> CreateOptions {
    CreateOptions {
        id: id.into(),
        namespace: "default".into(),
        workload: "test".into(),
        image: image.into(),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

/// Pulls the test image into a fresh runtime.
pub async fn ready_runtime() -> (NativeRuntime, tempfile::TempDir, Fixtures) {
    let f = fixtures();
    let (rt, dir) = runtime(&f);
    rt.pull_image(&image(&f), None)
        .await
        .expect("pull the test image");
    (rt, dir, f)
}

pub async fn wait_state(
    rt: &dyn ContainerRuntime,
    id: &str,
    state: ContainerState,
    timeout: Duration,
) -> kat_runtime::ContainerStatus {
    let start = Instant::now();
    loop {
        let s = rt.status(id).await.expect("status");
        if s.state == state {
            return s;
        }
        assert!(
            start.elapsed() < timeout,
            "{id} did not become {state} in {timeout:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn all_logs(rt: &dyn ContainerRuntime, id: &str) -> Vec<LogRecord> {
    logs_with(rt, id, LogOptions::default()).await
}

/// Every record `logs` returns for these options, until the stream ends.
pub async fn logs_with(rt: &dyn ContainerRuntime, id: &str, options: LogOptions) -> Vec<LogRecord> {
    let mut rx = rt.logs(id, options).await.expect("logs");
    let mut out = Vec::new();
    while let Some(r) = rx.recv().await {
        out.push(r);
    }
    out
}

pub async fn texts(rt: &dyn ContainerRuntime, id: &str) -> Vec<String> {
    all_logs(rt, id).await.into_iter().map(|r| r.text).collect()
}

/// Runs a script to completion; its exit code and output lines.
pub async fn run(
    rt: &dyn ContainerRuntime,
    id: &str,
    image: &str,
    script: &str,
) -> (i32, Vec<String>) {
    rt.create(&options(id, image, script))
        .await
        .expect("create");
    rt.start(id).await.expect("start");
    let s = wait_state(rt, id, ContainerState::Exited, Duration::from_secs(20)).await;
    (s.exit_code.expect("exit code"), texts(rt, id).await)
}

// ---- hostile images, pushed to the loopback registry as an attacker would ----

/// Pushes an image of one layer (`tar`, gzipped here) whose config runs `cmd`, as
/// `{registry}/{repo}:latest`; returns that reference.
pub fn push_image(registry: &str, repo: &str, tar: &[u8], cmd: &[&str]) -> String {
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(tar).unwrap();
        e.finish().unwrap()
    };
    let diff_id = {
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(tar)))
    };
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "config": {"Cmd": cmd},
    })
    .to_string();
    let layer_digest = push_blob(registry, repo, &gz);
    let config_digest = push_blob(registry, repo, config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": gz.len()}],
    })
    .to_string();
    let (status, headers) = http(
        registry,
        "PUT",
        &format!("/v2/{repo}/manifests/latest"),
        "application/vnd.oci.image.manifest.v1+json",
        manifest.as_bytes(),
    );
    assert_eq!(status, 201, "pushing the manifest: {headers}");
    format!("{registry}/{repo}:latest")
}

/// One blob pushed to the loopback registry (distribution's monolithic upload: POST, then
/// PUT with the digest), over a plain HTTP/1.1 connection.
pub fn push_blob(registry: &str, repo: &str, bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
    let (status, headers) = http(
        registry,
        "POST",
        &format!("/v2/{repo}/blobs/uploads/"),
        "",
        &[],
    );
    assert_eq!(status, 202, "starting an upload to {registry}: {headers}");
    let location = headers
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("location")
                .then(|| v.trim().to_string())
        })
        .expect("the upload's location");
    let path = location
        .strip_prefix(&format!("http://{registry}"))
        .unwrap_or(&location)
        .to_string();
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, headers) = http(
        registry,
        "PUT",
        &format!("{path}{sep}digest={digest}"),
        "application/octet-stream",
        bytes,
    );
    assert_eq!(status, 201, "uploading {digest}: {headers}");
    digest
}

/// A request with `Connection: close`; the status and the response's header block.
pub fn http(
    registry: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(registry).expect("the test registry");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {registry}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !content_type.is_empty() {
        request.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    request.push_str("\r\n");
    conn.write_all(request.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut response = Vec::new();
    conn.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}
