//! Time from a create request to the workload's first byte of output, for KAT's runtime,
//! `crun run` and `podman run --rm`, measured the same way in one run. Driven by
//! `bench/runtime-start.sh`, which prepares the image, the registry and the peers.
//!
//! Also reports the host memory each running container costs outside the container itself:
//! the RSS of helper processes (podman's `conmon`; KAT has none: kat-init is inside).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kat_runtime::{ContainerRuntime, CreateOptions, NativeConfig, NativeRuntime};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run bench/runtime-start.sh"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// Spawns a command and returns the time until its first byte on stdout.
fn first_byte(mut cmd: Command) -> Duration {
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut byte = [0u8; 1];
    let n = child
        .stdout
        .as_mut()
        .expect("stdout")
        .read(&mut byte)
        .expect("read");
    let elapsed = t0.elapsed();
    assert_eq!(n, 1, "{cmd:?} printed nothing");
    child.wait().expect("wait");
    elapsed
}

fn summary(name: &str, mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let (p50, p95) = (percentile(&v, 0.5), percentile(&v, 0.95));
    println!(
        "{name:>7}: p50 {p50:7.2} ms  p95 {p95:7.2} ms  ({} runs)",
        v.len()
    );
    p50
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

/// The phase events of the runtime (`kat_runtime::phases`): operation, container, phases.
type PhaseEvent = (String, String, Vec<(String, f64)>);
static PHASES: std::sync::Mutex<Vec<PhaseEvent>> = std::sync::Mutex::new(Vec::new());

/// Keeps every phase event the runtime writes, for the breakdown.
struct PhaseLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PhaseLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != kat_runtime::phases::TARGET {
            return;
        }
        #[derive(Default)]
        struct Fields(std::collections::HashMap<String, String>);
        impl tracing::field::Visit for Fields {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.insert(field.name().into(), value.into());
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.insert(field.name().into(), format!("{value:?}"));
            }
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let get = |k: &str| f.0.get(k).cloned().unwrap_or_default();
        let phases = kat_runtime::phases::parse(&get("phases"));
        if let Ok(mut all) = PHASES.lock() {
            all.push((get("operation"), get("id"), phases));
        }
    }
}

/// The median of each phase of `operation` over the measured containers, in order.
fn phase_medians(
    operation: &str,
    measured: &std::collections::HashSet<String>,
) -> Vec<(String, f64)> {
    let all = PHASES.lock().map(|a| a.clone()).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    let mut values: std::collections::HashMap<String, Vec<f64>> = Default::default();
    for (_, _, phases) in all
        .iter()
        .filter(|(op, id, _)| op == operation && measured.contains(id))
    {
        for (name, ms) in phases {
            if !names.contains(name) {
                names.push(name.clone());
            }
            values.entry(name.clone()).or_default().push(*ms);
        }
    }
    names
        .into_iter()
        .map(|n| {
            let mut v = values.remove(&n).unwrap_or_default();
            v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
            let p50 = if v.is_empty() {
                0.0
            } else {
                percentile(&v, 0.5)
            };
            (n, p50)
        })
        .collect()
}

fn main() -> std::process::ExitCode {
    // Container creation re-executes this binary as a single-threaded helper.
    if let Some(code) = kat_runtime::create_helper::run_if_requested() {
        return code;
    }
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;
    let subscriber = tracing_subscriber::registry().with(
        PhaseLayer.with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(kat_runtime::phases::TARGET, tracing::Level::DEBUG),
        ),
    );
    tracing::subscriber::set_global_default(subscriber).expect("a subscriber");
    bench();
    std::process::ExitCode::SUCCESS
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn bench() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(100);
    let image = format!("{}/kat/busybox:latest", env("KAT_TEST_REGISTRY"));
    let work = PathBuf::from(env("BENCH_DIR"));
    let mut config = NativeConfig::new(work.join("kat-root"), env("KAT_INIT"));
    config.registries.insecure = vec![env("KAT_TEST_REGISTRY")];
    let rt = NativeRuntime::new(config).expect("runtime");
    let summary_img = rt.pull_image(&image, None).await.expect("pull");
    let record = rt.images().resolve(&image).expect("image");
    let snapshot = rt.images().snapshot(&record).await.expect("snapshot");

    // KAT: create + start, until kat-init has written the first byte of the log.
    let mut kat = Vec::new();
    let mut after_start = Vec::new();
    let mut measured = std::collections::HashSet::new();
    for i in 0..runs + 3 {
        let id = format!("bench-{i}");
        let options = CreateOptions {
            id: id.clone(),
            image: image.clone(),
            command: vec!["/bin/echo".into(), "hi".into()],
            ..Default::default()
        };
        let t0 = Instant::now();
        rt.create(&options).await.expect("create");
        rt.start(&id).await.expect("start");
        let started = Instant::now();
        let log = rt.container_dir(&id).join("logs/stdio.log");
        while std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        let elapsed = t0.elapsed();
        if i >= 3 {
            kat.push(elapsed.as_secs_f64() * 1000.0);
            after_start.push(started.elapsed().as_secs_f64() * 1000.0);
            measured.insert(id.clone());
        }
        rt.remove(&id, true).await.expect("remove");
    }

    // crun: an OCI bundle of the same image, through the private-mount-namespace trick.
    let bundle = work.join("crun-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(&bundle).expect("bundle");
    kat_runtime::image::snapshot::copy_tree(&snapshot, &bundle.join("rootfs"), true)
        .expect("copy rootfs");
    let status = Command::new("crun")
        .arg("spec")
        .current_dir(&bundle)
        .status()
        .expect("crun spec");
    assert!(status.success());
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).expect("spec"))
            .expect("json");
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/echo", "hi"]);
    std::fs::write(bundle.join("config.json"), spec.to_string()).expect("write spec");
    let crun = crun_runs(&bundle, "crun-bench", runs);

    // crun again with the user-namespace isolation KAT's create has: the container's ids
    // mapped to a slice of host ids (as KAT maps a workload's), its root file system a copy
    // owned by that slice, and no cgroup file system inside (KAT mounts none on a hybrid
    // host). KAT also mounts an overlay and its log and `/etc` files, and its kat-init starts
    // the workload (measured in the phases above); crun here does neither.
    let userns_bundle = work.join("crun-userns-bundle");
    let _ = std::fs::remove_dir_all(&userns_bundle);
    std::fs::create_dir_all(&userns_bundle).expect("bundle");
    kat_runtime::image::snapshot::copy_tree(&snapshot, &userns_bundle.join("rootfs"), true)
        .expect("copy rootfs");
    shift_owners(&userns_bundle.join("rootfs"), USERNS_BASE);
    let mut userns_spec = spec.clone();
    let linux = &mut userns_spec["linux"];
    linux["namespaces"]
        .as_array_mut()
        .expect("namespaces")
        .push(serde_json::json!({"type": "user"}));
    let mapping = serde_json::json!([{"containerID": 0, "hostID": USERNS_BASE, "size": 65536}]);
    linux["uidMappings"] = mapping.clone();
    linux["gidMappings"] = mapping;
    userns_spec["mounts"]
        .as_array_mut()
        .expect("mounts")
        .retain(|m| m["type"] != "cgroup");
    std::fs::write(userns_bundle.join("config.json"), userns_spec.to_string()).expect("write spec");
    let crun_userns = crun_runs(&userns_bundle, "crun-userns-bench", runs);

    // podman run --rm (runc; this host needs the ulimits).
    let podman_args = |extra: &[&str]| {
        let mut cmd = Command::new("podman");
        cmd.args([
            "run",
            "--runtime",
            "runc",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "none",
        ]);
        cmd.args(extra);
        cmd
    };
    let mut podman = Vec::new();
    for i in 0..runs + 3 {
        let mut cmd = podman_args(&["--rm"]);
        cmd.args([image.as_str(), "echo", "hi"]);
        let d = first_byte(cmd);
        if i >= 3 {
            podman.push(d.as_secs_f64() * 1000.0);
        }
    }

    // Host memory outside the container, per running container.
    let opts = CreateOptions {
        id: "bench-mem".into(),
        image: image.clone(),
        command: vec!["/bin/sleep".into(), "30".into()],
        ..Default::default()
    };
    rt.create(&opts).await.expect("create");
    rt.start("bench-mem").await.expect("start");
    let status = rt.status("bench-mem").await.expect("status");
    let init_pid = status.pid.expect("pid");
    let outside: Vec<u32> = helper_processes(init_pid as u32);
    let kat_helper_kib: u64 = outside.iter().map(|p| rss_kib(*p)).sum();
    // Not per container: the one create helper started ahead of the next create, until 20 s
    // after the last one (`kat_runtime::create_helper`).
    let spares = spare_helpers();
    let spare_kib: u64 = spares.iter().map(|p| rss_kib(*p)).sum();
    rt.remove("bench-mem", true).await.expect("remove");
    let out = podman_args(&["-d", "--rm"])
        .args([image.as_str(), "sleep", "30"])
        .output()
        .expect("podman -d");
    let cid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let conmon = Command::new("podman")
        .args(["inspect", "--format", "{{.State.ConmonPid}}", &cid])
        .output()
        .expect("inspect");
    let conmon_pid: u32 = String::from_utf8_lossy(&conmon.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    let podman_helper_kib = if conmon_pid > 0 {
        rss_kib(conmon_pid)
    } else {
        0
    };
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &cid])
        .output();

    println!("image: {} ({} bytes unpacked)", image, summary_img.size);
    // Where KAT's time goes: each phase's median (they need not add up to the total's).
    for operation in ["create", "start"] {
        let line: Vec<String> = phase_medians(operation, &measured)
            .iter()
            .map(|(n, ms)| format!("{n}={ms:.2}"))
            .collect();
        println!("kat_{operation}_phases_p50_ms {}", line.join(" "));
    }
    after_start.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    println!(
        "kat_first_byte_after_start_p50_ms {:.2} (kat-init and the workload)",
        percentile(&after_start, 0.5)
    );
    let k = summary("kat", kat);
    let c = summary("crun", crun);
    let cu = summary("crun+userns", crun_userns);
    let p = summary("podman", podman);
    println!(
        "helper_rss_kib kat={kat_helper_kib} ({} helper processes outside the container) podman_conmon={podman_helper_kib}",
        outside.len()
    );
    println!(
        "spare create helper: {} process, RSS {spare_kib} KiB (one per node, ended 20 s after the last create)",
        spares.len()
    );
    println!(
        "start_p50_ms kat={k:.2} crun={c:.2} podman={p:.2} kat/crun={:.2} kat/podman={:.2}",
        k / c,
        k / p
    );
    println!(
        "start_userns_p50_ms kat={k:.2} crun={cu:.2} kat/crun={:.2}",
        k / cu
    );
}

/// The first host id of the slice the `crun+userns` runs map their container's ids to.
const USERNS_BASE: u32 = 3_000_000;

/// `runs` (after 3 warm-up runs) of `crun run` of `bundle`, each until its first byte, with
/// the unified cgroup mount hidden in a private mount namespace (crun takes this hybrid host
/// for a pure cgroup v2 one otherwise).
fn crun_runs(bundle: &Path, name: &str, runs: usize) -> Vec<f64> {
    let mut times = Vec::new();
    for i in 0..runs + 3 {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs x /sys/fs/cgroup/unified && exec crun run --bundle {} {name}-{i}",
                bundle.display()
            ));
        let d = first_byte(cmd);
        if i >= 3 {
            times.push(d.as_secs_f64() * 1000.0);
        }
    }
    times
}

/// Gives every file under `root` to the host ids `base` + its own (without following
/// links), as a user namespace mapping 0 → `base` expects.
fn shift_owners(root: &Path, base: u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(root).expect("stat");
    std::os::unix::fs::lchown(root, Some(base + meta.uid()), Some(base + meta.gid()))
        .expect("lchown");
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).expect("read_dir") {
            shift_owners(&entry.expect("entry").path(), base);
        }
    }
}

/// Processes that exist for this container but live outside it: any process whose parent
/// is the container's init's parent and that is not the init (a shim), excluding ourselves.
/// Our children that are spare create helpers (`… __kat-create-container -`).
fn spare_helpers() -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let parent = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(str::trim);
        if parent == Some(me.as_str())
            && args.get(1) == Some(&b"__kat-create-container".as_slice())
            && args.get(2) == Some(&b"-".as_slice())
        {
            found.push(pid);
        }
    }
    found
}

fn helper_processes(init_pid: u32) -> Vec<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{init_pid}/stat")).unwrap_or_default();
    let ppid: u32 = stat
        .rsplit(") ")
        .next()
        .and_then(|r| r.split(' ').nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let me = std::process::id();
    if ppid == me || ppid <= 1 {
        // Our child directly (or re-parented to init): no shim between agent and container.
        return Vec::new();
    }
    vec![ppid]
        .into_iter()
        .filter(|p| Path::new(&format!("/proc/{p}")).exists())
        .collect()
}
