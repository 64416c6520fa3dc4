//! A one-node KAT cluster end to end, on real parts: `kat-agent init` with its own etcd, a
//! loopback registry serving the busybox image `scripts/test-fixtures.sh` built, real
//! containers, and `katcall` as a user runs it.
//!
//! One cluster walks through every scenario in order (a cluster takes seconds to start and
//! the scenarios build on each other), each scenario a named test of its own ([`STEPS`], run
//! by libtest-mimic) so that a failure names its scenario and hides none of the others: two healthy replicas with a volume and their logs;
//! exec; a killed process restarted per policy; MaxCount exhausted to Failed; an updated
//! spec replacing the instances; a bad bundle refused with nothing changed; 401 without the
//! token; `kill -9` of the agent with no duplicate containers and no lost log lines; delete
//! leaving no container, cgroup or mount behind. On the way, 200 idle connections and an
//! exec whose command never reads its stdin must not slow the API, the heartbeats or the
//! leader, and the idle connections are closed by the server's timeouts.
//!
//! With `KAT_TEST_AGENT_USER=NAME` the agent runs as that unprivileged user, prepared by
//! `kat-agent setup --user NAME` (scripts/test-rootless.sh does this), as in production.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kat_testkit::{bin, free_port};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;

struct Cluster {
    dir: tempfile::TempDir,
    api_port: u16,
    etcd_port: u16,
    agent: Option<Child>,
    registry: String,
    init: PathBuf,
    /// A resolver standing in for the internet: the node's DNS forwards other names here.
    upstream: std::net::SocketAddr,
}

/// A DNS server on loopback that knows `www.outside.example.test` (192.0.2.77): what the
/// node's forwarder asks for names outside the cluster domain in this test.
fn outside_resolver() -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let record = kat_api::wire::DnsRecord {
                namespace: "outside".into(),
                workload: "www".into(),
                instance_id: "www-1".into(),
                ip: "192.0.2.77".parse().unwrap(),
                ready: true,
            };
            let table = kat_netns::dns::Table::new("example.test", &[record]).unwrap();
            let (_keep, table) = tokio::sync::watch::channel(std::sync::Arc::new(table));
            let server = kat_netns::dns::DnsServer::new(
                table,
                kat_netns::dns::Forwarder::new(vec![], Duration::from_secs(1)),
            );
            let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            tx.send(socket.local_addr().unwrap()).unwrap();
            let _ = server.serve_udp(socket).await;
        });
    });
    rx.recv().expect("the outside resolver")
}

/// The unprivileged user the agent runs as, if any.
fn agent_user() -> Option<String> {
    std::env::var("KAT_TEST_AGENT_USER")
        .ok()
        .filter(|u| !u.is_empty())
}

impl Cluster {
    fn start() -> Cluster {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: run `source <(scripts/test-fixtures.sh)` first (scripts/test.sh does)")
            })
        };
        let dir = tempfile::Builder::new()
            .prefix("kat-e2e-")
            .tempdir()
            .expect("temp dir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod");
        if let Some(user) = agent_user() {
            let status = Command::new("chown")
                .args([&format!("{user}:"), &dir.path().display().to_string()])
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the test directory to {user}");
        }
        let api_port = free_port();
        let etcd_port = free_port();
        let cluster = format!(
            "apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: e2e
spec:
  clusterCIDR: 10.100.0.0/16
  serviceCIDR: 10.200.0.0/16
  apiPort: {api_port}
  etcdClientPort: {}
  etcdPeerPort: {}
  agentTickSeconds: 2
  nodeLossTimeoutSeconds: 30
  volumeBasePath: {}
  backupPath: {}
  backupIntervalMinutes: 1
  backupRetention: 2
",
            etcd_port,
            free_port(),
            dir.path().join("volumes").display(),
            dir.path().join("backups").display()
        );
        std::fs::write(dir.path().join("cluster.kat"), cluster).expect("write cluster.kat");
        let mut c = Cluster {
            dir,
            api_port,
            etcd_port,
            agent: None,
            registry: var("KAT_TEST_REGISTRY"),
            init: PathBuf::from(var("KAT_INIT")),
            upstream: outside_resolver(),
        };
        c.spawn_agent(&["init", "--config", &c.path("cluster.kat")]);
        c.wait("the node to be Ready", Duration::from_secs(30), |c| {
            c.katcall_ok(&["get", "nodes"]).contains("Ready")
        });
        c
    }

    fn path(&self, p: &str) -> String {
        self.dir.path().join(p).display().to_string()
    }

    fn spawn_agent(&mut self, args: &[&str]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))
            .expect("agent log");
        let mut cmd = match agent_user() {
            Some(user) => {
                // setpriv executes the agent in place (runuser would fork and stand
                // between us and the agent we kill -9).
                let mut c = Command::new("setpriv");
                c.args(["--reuid", &user, "--regid", &user, "--init-groups", "--"])
                    .arg(bin("kat-agent"))
                    .env("HOME", self.dir.path());
                c
            }
            None => Command::new(bin("kat-agent")),
        };
        cmd.args(args)
            .args(["--data-dir", &self.path("data")])
            .args(["--node-name", "e2e-node"])
            .args(["--client-config", &self.path("katcall.yaml")])
            .args(["--insecure-registry", &self.registry])
            .args(["--stop-grace-seconds", "2"])
            .args(["--api-bind", "127.0.0.1"])
            .args(["--dns-upstream", &self.upstream.to_string()])
            .env("KAT_INIT", &self.init)
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log));
        if let Ok(parent) = std::env::var("KAT_TEST_CGROUP_PARENT") {
            cmd.args(["--cgroup-parent", &parent]);
        }
        self.agent = Some(cmd.spawn().expect("start kat-agent"));
    }

    fn katcall(&self, args: &[&str]) -> Output {
        Command::new(bin("katcall"))
            .args(args)
            .env("KAT_CONFIG", self.path("katcall.yaml"))
            .stdin(Stdio::null())
            .output()
            .expect("run katcall")
    }

    fn katcall_ok(&self, args: &[&str]) -> String {
        let out = self.katcall(args);
        if !out.status.success() {
            return String::new();
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn must(&self, args: &[&str]) -> String {
        let out = self.katcall(args);
        assert!(
            out.status.success(),
            "katcall {args:?} failed: {}{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.agent_log_tail()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn agent_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn wait(&self, what: &str, timeout: Duration, mut ok: impl FnMut(&Cluster) -> bool) {
        if kat_testkit::wait_until(timeout, || ok(self)).is_some() {
            return;
        }
        panic!(
            "timed out waiting for {what}\nagent log:\n{}",
            self.agent_log_tail()
        );
    }

    fn workload(&self, name: &str) -> Option<Value> {
        let out = self.katcall(&["get", "workloads", "-o", "json"]);
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        list.into_iter().find(|w| w["metadata"]["name"] == name)
    }

    fn instances(&self, name: &str) -> Vec<Value> {
        self.workload(name)
            .and_then(|w| w["status"]["instances"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Write a workload directory and apply it.
    fn apply(&self, dir: &str, files: &[(&str, String)]) -> String {
        let path = self.dir.path().join(dir);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("workload dir");
        for (name, text) in files {
            std::fs::write(path.join(name), text).expect("write quadlet");
        }
        self.must(&["apply", "-f", &path.display().to_string()])
    }

    fn curl(&self, args: &[&str]) -> (u16, String) {
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "--cacert",
                &self.path("data/pki/ca.crt"),
            ])
            .args(args)
            .output()
            .expect("run curl (apt install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.api_port)
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.path("data/pki/admin.token")).expect("token")
    }

    fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(a.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = a.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Never panic here: a panic while unwinding aborts and hides the first one.
        let katcall = PathBuf::from(env!("CARGO_BIN_EXE_kat-agent")).with_file_name("katcall");
        if katcall.exists() {
            for w in ["web", "crasher", "ticker", "stuck"] {
                let _ = self.katcall(&["delete", "workload", w]);
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        if let Some(a) = &self.agent {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(a.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if let Some(mut a) = self.agent.take() {
            let _ = a.wait();
        }
        // Whatever is left (a failed test) goes with its processes.
        for pid in workload_pids(None) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Host pids of workload processes (their environment names the instance), for one
/// instance or all that belong to this test's cluster.
fn workload_pids(instance: Option<&str>) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let is_ours = vars.iter().any(|v| *v == b"KAT_E2E=1");
        let matches = match instance {
            Some(id) => vars
                .iter()
                .any(|v| *v == format!("KAT_INSTANCE_ID={id}").as_bytes()),
            None => true,
        };
        if is_ours && matches {
            pids.push(pid);
        }
    }
    pids
}

/// How many containers run for an instance: its kat-init processes.
fn containers_of(instance: &str) -> usize {
    workload_pids(Some(instance))
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/.kat/init"))
        })
        .count()
}

fn web(image: &str, greeting: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: web
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 2
  updateStrategy:
    type: Rolling
    rolling:
      maxSurge: 1
  restartPolicy:
    condition: Always
  container:
    command: [\"/bin/sh\", \"-c\"]
    args: [\"echo $GREETING from $HOSTNAME; mkdir -p /data/www; echo hi > /data/www/index.html; exec httpd -f -p 8080 -h /data/www\"]
    env:
      - name: GREETING
        value: {greeting}
      - name: KAT_E2E
        value: \"1\"
    volumeMounts:
      - name: data
        mountPath: /data
    resources:
      limits:
        cpu: 200m
        memory: 64Mi
  volumes:
    - name: data
      simpleClusterStorage: {{}}
"
            ),
        ),
        (
            "VirtualLoadBalancer.kat",
            "apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8080
  healthCheck:
    exec:
      command: [\"/bin/sh\", \"-c\", \"test -f /data/www/index.html\"]
    initialDelaySeconds: 0
    periodSeconds: 1
"
            .to_string(),
        ),
    ]
}

fn simple(name: &str, image: &str, policy: &str, script: &str) -> Vec<(&'static str, String)> {
    vec![(
        "workload.kat",
        format!(
            "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: {name}
  namespace: default
spec:
  type: Service
  source:
    image: {image}
  replicas: 1
  restartPolicy:
{policy}
  container:
    command: [\"/bin/sh\", \"-c\", {script:?}]
    env:
      - name: KAT_E2E
        value: \"1\"
"
        ),
    )]
}

fn ids(instances: &[Value]) -> BTreeSet<String> {
    instances
        .iter()
        .filter_map(|i| i["instanceID"].as_str().map(str::to_string))
        .collect()
}

fn all_running_healthy(instances: &[Value], n: usize, generation: u64) -> bool {
    instances.len() == n
        && instances.iter().all(|i| {
            i["state"] == "Running" && i["health"] == "Healthy" && i["generation"] == generation
        })
}

/// What the steps share: the cluster, and what one step leaves for the next.
struct Run {
    c: Cluster,
    image: String,
    /// The first generation's instances of `web`.
    first: BTreeSet<String>,
    /// One of them, and the other.
    id: String,
    other: String,
    /// The second generation's instances of `web`.
    second: BTreeSet<String>,
    /// `web`'s instances before the agent is killed, and the `ticker` instance.
    before: BTreeSet<String>,
    ticker: String,
}

type Step = fn(&mut Run);

/// The scenarios, in order, on one cluster: each a test of its own, so that one failing
/// does not hide the rest (a later step may still fail for want of what a failed one left).
const STEPS: &[(&str, Step)] = &[
    (
        "a_service_runs_healthy_with_its_logs_and_volume",
        a_service_runs_healthy_with_its_logs_and_volume,
    ),
    (
        "exec_passes_the_exit_code_through",
        exec_passes_the_exit_code_through,
    ),
    (
        "containers_reach_each_other_and_the_outside",
        containers_reach_each_other_and_the_outside,
    ),
    ("workloads_build_from_git", workloads_build_from_git),
    (
        "a_killed_process_restarts_under_always",
        a_killed_process_restarts_under_always,
    ),
    (
        "a_stuck_pull_delays_nothing_and_max_count_ends_failed",
        a_stuck_pull_delays_nothing_and_max_count_ends_failed,
    ),
    (
        "an_updated_spec_replaces_the_instances",
        an_updated_spec_replaces_the_instances,
    ),
    (
        "a_bad_bundle_is_refused_and_changes_nothing",
        a_bad_bundle_is_refused_and_changes_nothing,
    ),
    (
        "host_mounts_off_the_allow_list_are_refused",
        host_mounts_off_the_allow_list_are_refused,
    ),
    (
        "the_api_and_etcd_refuse_strangers",
        the_api_and_etcd_refuse_strangers,
    ),
    (
        "usage_shows_in_top_and_metrics",
        usage_shows_in_top_and_metrics,
    ),
    ("the_node_never_stalls", the_node_never_stalls),
    (
        "an_agent_killed_and_restarted_duplicates_nothing",
        an_agent_killed_and_restarted_duplicates_nothing,
    ),
    (
        "a_reboot_without_etcd_runs_from_the_local_copy",
        a_reboot_without_etcd_runs_from_the_local_copy,
    ),
    (
        "node_admin_and_rollback_show_in_events",
        node_admin_and_rollback_show_in_events,
    ),
    (
        "delete_leaves_no_containers_cgroups_or_mounts",
        delete_leaves_no_containers_cgroups_or_mounts,
    ),
    (
        "backups_are_taken_listed_and_pruned",
        backups_are_taken_listed_and_pruned,
    ),
];

/// libtest's own harness cannot share one cluster between tests in order; libtest-mimic
/// runs the steps as named tests with the same command line (`--list`, filters, `--exact`).
fn main() -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    // The steps build on each other: one at a time, in order.
    args.test_threads = Some(1);
    if args.list {
        let trials = STEPS
            .iter()
            .map(|(name, _)| libtest_mimic::Trial::test(*name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let c = Cluster::start();
    let image = format!("{}/kat/busybox:latest", c.registry);
    let run = Arc::new(std::sync::Mutex::new(Run {
        c,
        image,
        first: BTreeSet::new(),
        id: String::new(),
        other: String::new(),
        second: BTreeSet::new(),
        before: BTreeSet::new(),
        ticker: String::new(),
    }));
    let trials = STEPS
        .iter()
        .map(|(name, step)| {
            let (run, step) = (run.clone(), *step);
            libtest_mimic::Trial::test(*name, move || {
                let mut run = run.lock().unwrap_or_else(|p| p.into_inner());
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut run))).map_err(
                    |e| {
                        let message = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "the step panicked".into());
                        libtest_mimic::Failed::from(message)
                    },
                )
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // The cluster stops (its Drop) before the process exits.
    drop(run);
    if conclusion.has_failed() {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

fn a_service_runs_healthy_with_its_logs_and_volume(r: &mut Run) {
    let Run {
        c,
        image,
        first,
        id: _,
        ..
    } = r;
    // A Service with 2 replicas, a health check and a volume: running, healthy, logged.
    let out = c.apply("web", &web(image, "hello"));
    assert!(
        out.contains("workload default/web created (generation 1)"),
        "{out}"
    );
    c.wait("2 healthy replicas", Duration::from_secs(60), |c| {
        all_running_healthy(&c.instances("web"), 2, 1)
    });
    let table = c.must(&["get", "workloads"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("web") && l.contains("2/2")),
        "{table}"
    );
    *first = ids(&c.instances("web"));
    for id in first.iter() {
        let logs = c.must(&["logs", &format!("web/{id}")]);
        assert_eq!(logs.trim(), format!("hello from {id}"));
    }
    assert!(Path::new(&c.path("volumes/default/web/data/www/index.html")).is_file());
}

fn exec_passes_the_exit_code_through(r: &mut Run) {
    let Run { c, first, id, .. } = r;
    // exec, with the exit code passed through.
    *id = first.iter().next().cloned().expect("an instance");
    let out = c.katcall(&[
        "exec",
        &format!("web/{id}"),
        "--",
        "sh",
        "-c",
        "cat /data/www/index.html; echo $KAT_INSTANCE_ID; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("hi\n{id}\n"));
}

fn containers_reach_each_other_and_the_outside(r: &mut Run) {
    let Run { c, image, .. } = r;
    container_network(c, image);
}

fn workloads_build_from_git(r: &mut Run) {
    let Run { c, image, .. } = r;
    git_builds(c, image);
}

fn a_killed_process_restarts_under_always(r: &mut Run) {
    let Run {
        c,
        first,
        id,
        other,
        second: _,
        ..
    } = r;
    // Killing the workload process restarts it (Always).
    *other = first
        .iter()
        .find(|i| *i != id)
        .cloned()
        .expect("a second instance");
    let pids = workload_pids(Some(id));
    assert!(!pids.is_empty(), "no process for {id}");
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    c.wait(
        "the killed instance to restart",
        Duration::from_secs(30),
        |c| {
            c.instances("web").iter().any(|i| {
                i["instanceID"] == id.as_str() && i["restarts"] == 1 && i["state"] == "Running"
            })
        },
    );
}

fn a_stuck_pull_delays_nothing_and_max_count_ends_failed(r: &mut Run) {
    let Run {
        c,
        image,
        other,
        before: _,
        ..
    } = r;
    // A registry that accepts connections and never answers: its pull runs beside the
    // convergence of everything else, so the crash loop below is not delayed by it.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole = blackhole.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in blackhole.incoming().flatten() {
            held.push(conn);
        }
    });
    c.apply(
        "stuck",
        &simple(
            "stuck",
            &format!("{hole}/kat/never:latest"),
            "    condition: Always",
            "true",
        ),
    );
    c.wait("stuck to wait for its pull", Duration::from_secs(20), |c| {
        c.instances("stuck").iter().any(|i| {
            i["state"] == "Pending" && i["reason"].as_str().unwrap_or("").contains("pulling")
        })
    });

    // MaxCount: restarted maxRestarts times within resetSeconds, then Failed.
    c.apply(
        "crasher",
        &simple(
            "crasher",
            image,
            "    condition: MaxCount\n    maxRestarts: 2\n    resetSeconds: 60",
            "echo boom $(cat /proc/sys/kernel/random/uuid); exit 3",
        ),
    );
    c.wait("crasher to fail", Duration::from_secs(30), |c| {
        c.instances("crasher")
            .iter()
            .any(|i| i["state"] == "Failed")
    });
    let crashed = &c.instances("crasher")[0];
    assert_eq!(crashed["restarts"], 2, "{crashed}");
    assert_eq!(crashed["exitCode"], 3, "{crashed}");
    assert!(
        crashed["reason"]
            .as_str()
            .unwrap_or("")
            .contains("maxRestarts"),
        "{crashed}"
    );
    assert!(
        c.instances("stuck").iter().all(|i| i["state"] == "Pending"),
        "the stuck pull is still under way"
    );
    c.must(&["delete", "workload", "stuck"]);
    // `logs --previous` shows the run before the last one: its own line, not the current.
    let crasher = format!("crasher/{}", crashed["instanceID"].as_str().unwrap_or(""));
    let last = c.must(&["logs", &crasher]);
    let previous = c.must(&["logs", "--previous", &crasher]);
    assert!(
        last.starts_with("boom ") && previous.starts_with("boom "),
        "{last} / {previous}"
    );
    assert_ne!(last, previous);
    let out = c.katcall(&["logs", "--previous", &format!("web/{other}")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no previous container"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.must(&["delete", "workload", "crasher"]);
}

fn an_updated_spec_replaces_the_instances(r: &mut Run) {
    let Run {
        c,
        image,
        first,
        id: _,
        second,
        ..
    } = r;
    // An updated spec replaces the instances.
    let out = c.apply("web", &web(image, "bonjour"));
    assert!(out.contains("configured (generation 2)"), "{out}");
    c.wait(
        "2 healthy replicas of generation 2",
        Duration::from_secs(90),
        |c| all_running_healthy(&c.instances("web"), 2, 2),
    );
    *second = ids(&c.instances("web"));
    assert!(second.is_disjoint(first), "{first:?} {second:?}");
    for id in second.iter() {
        assert_eq!(
            c.must(&["logs", &format!("web/{id}")]).trim(),
            format!("bonjour from {id}")
        );
    }
    c.wait(
        "the old instances' processes to stop",
        Duration::from_secs(20),
        |_| first.iter().all(|id| workload_pids(Some(id)).is_empty()),
    );
}

fn a_bad_bundle_is_refused_and_changes_nothing(r: &mut Run) {
    let Run {
        c, image, second, ..
    } = r;
    // A bad bundle gets 400 naming the file and field; nothing changes.
    let token = c.token();
    let bad = c.dir.path().join("bad");
    std::fs::create_dir_all(&bad).expect("dir");
    let broken = web(image, "x")[0].1.replace("replicas: 2", "replicas: -1");
    std::fs::write(bad.join("workload.kat"), broken).expect("write");
    let tgz = c.path("bad.tgz");
    assert!(Command::new("tar")
        .args(["czf", &tgz, "-C", &bad.display().to_string(), "."])
        .status()
        .expect("tar")
        .success());
    let (code, body) = c.curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("Authorization: Bearer {token}"),
        "--data-binary",
        &format!("@{tgz}"),
        &c.url("/v1alpha1/n/default/workloads/web"),
    ]);
    assert_eq!(code, 400, "{body}");
    let err: Value = serde_json::from_str(&body).expect("JSON error body");
    assert_eq!(err["error"], "invalid_quadlet");
    let message = err["message"].as_str().unwrap_or("");
    assert!(
        message.contains("workload.kat") && message.contains("spec.replicas"),
        "{message}"
    );
    let w = c.workload("web").expect("web");
    assert_eq!(w["metadata"]["generation"], 2);
    assert_eq!(ids(&c.instances("web")), *second);
}

fn host_mounts_off_the_allow_list_are_refused(r: &mut Run) {
    let Run { c, image, .. } = r;
    // hostMount of `/`, the agent's data directory or a path off the allow-list is refused
    // at apply, naming the file and field; nothing is stored.
    let data_dir = c.path("data");
    for host_path in ["/", data_dir.as_str(), "/etc"] {
        let mut files = simple("sneaky", image, "    condition: Always", "ls /host");
        files[0].1.push_str(&format!(
            "    volumeMounts:\n      - name: host\n        mountPath: /host\n  volumes:\n    - name: host\n      hostMount:\n        hostPath: {host_path}\n"
        ));
        let path = c.dir.path().join("sneaky");
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("dir");
        std::fs::write(path.join(files[0].0), &files[0].1).expect("write");
        let out = c.katcall(&["apply", "-f", &path.display().to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "hostMount {host_path} was accepted");
        assert!(
            stderr.contains("spec.volumes[0].hostMount.hostPath"),
            "{host_path}: {stderr}"
        );
        assert!(c.workload("sneaky").is_none());
    }
}

fn the_api_and_etcd_refuse_strangers(r: &mut Run) {
    let Run { c, .. } = r;
    let token = c.token();
    // Without the token, or with a wrong one: 401, with the error body.
    let (code, body) = c.curl(&[&c.url("/v1alpha1/n/default/workloads")]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"error\":\"unauthorized\""), "{body}");
    let (code, _) = c.curl(&[
        "-H",
        "Authorization: Bearer nope",
        &c.url("/v1alpha1/nodes"),
    ]);
    assert_eq!(code, 401);
    let (code, _) = c.curl(&[&c.url("/healthz")]);
    assert_eq!(code, 200);
    // etcd speaks only mutual TLS with certificates from the cluster CA, loopback included.
    let etcd = format!("https://127.0.0.1:{}/health", c.etcd_port);
    let (code, body) = c.curl(&["--max-time", "5", &etcd]);
    assert!(
        code == 0 && !body.contains("health"),
        "etcd answered without a client certificate: {code} {body}"
    );
    let (_, body) = c.curl(&["--max-time", "5", &etcd.replace("https://", "http://")]);
    assert!(
        !body.contains("\"health\""),
        "etcd answered plain HTTP: {body}"
    );
    let (code, body) = c.curl(&[
        "--max-time",
        "5",
        "--cert",
        &c.path("data/pki/node.crt"),
        "--key",
        &c.path("data/pki/node.key"),
        &etcd,
    ]);
    assert!(
        code == 200 && body.contains("\"health\":\"true\""),
        "{code} {body}"
    );
    let (code, metrics) = c.curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        &c.url("/metrics"),
    ]);
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kat_api_request_duration_seconds_bucket")
            && metrics.contains("kat_instances{state=\"Running\"}")
            && metrics.contains("kat_is_leader 1")
            && metrics.contains("kat_etcd_up 1")
            && metrics.contains("kat_scheduling_attempts_total{result=\"scheduled\",reason=\"\"}"),
        "{metrics}"
    );
}

fn usage_shows_in_top_and_metrics(r: &mut Run) {
    let Run { c, .. } = r;
    let token = c.token();
    // What the node and its running instances use, from /proc and their cgroups: in
    // `/metrics` and in `katcall top`.
    c.wait("usage in the heartbeats", Duration::from_secs(30), |c| {
        let instances: serde_json::Value =
            serde_json::from_str(&c.katcall_ok(&["top", "instances", "-A", "-o", "json"]))
                .unwrap_or_default();
        instances.as_array().is_some_and(|list| {
            list.iter().any(|i| {
                i["usage"]["memoryBytes"].as_u64().is_some_and(|m| m > 0)
                    && i["usage"]["pids"].as_u64().is_some_and(|p| p >= 1)
            })
        })
    });
    let nodes: serde_json::Value =
        serde_json::from_str(&c.katcall_ok(&["top", "nodes", "-o", "json"])).expect("json");
    let usage = &nodes[0]["usage"];
    assert!(
        usage["memoryBytes"].as_u64().is_some_and(|m| m > 0)
            && usage["pids"].as_u64().is_some_and(|p| p > 0)
            && usage["diskBytes"].as_u64().is_some_and(|d| d > 0),
        "{nodes}"
    );
    let table = c.katcall_ok(&["top", "instances"]);
    assert!(
        table.starts_with("WORKLOAD")
            && table
                .lines()
                .skip(1)
                .any(|row| row
                    .split_whitespace()
                    .nth(4)
                    .is_some_and(|m| ["B", "Ki", "Mi", "Gi"].iter().any(|u| m.ends_with(u)))),
        "{table}"
    );
    let (_, metrics) = c.curl(&[
        "-H",
        &format!("Authorization: Bearer {token}"),
        &c.url("/metrics"),
    ]);
    for family in [
        "kat_node_cpu_usage_millicores{node=",
        "kat_node_memory_used_bytes{node=",
        "kat_node_disk_used_bytes{node=",
        "kat_instance_memory_bytes{namespace=\"default\"",
        "kat_instance_pids{namespace=\"default\"",
        "kat_instance_restarts{namespace=\"default\"",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
}

fn the_node_never_stalls(r: &mut Run) {
    let Run {
        c, id: _, second, ..
    } = r;
    // A node that never stalls: idle and half-open connections, and an exec that never
    // reads its stdin, do not slow the API, the heartbeats or the leader.
    let id = second.iter().next().cloned().expect("an instance");
    never_stalls(c, &id);
    an_exec_ends_with_its_client(c, &id);
}

fn an_agent_killed_and_restarted_duplicates_nothing(r: &mut Run) {
    let Run {
        c,
        image,
        id: _,
        before,
        ticker,
        ..
    } = r;
    // kill -9 of the agent, then a restart: no duplicate containers, no lost log lines.
    c.apply(
        "ticker",
        &simple(
            "ticker",
            image,
            "    condition: Always",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done",
        ),
    );
    c.wait("ticker to run", Duration::from_secs(30), |c| {
        c.instances("ticker")
            .iter()
            .any(|i| i["state"] == "Running")
    });
    *ticker = ids(&c.instances("ticker"))
        .into_iter()
        .next()
        .expect("ticker instance");
    *before = ids(&c.instances("web"));
    c.kill_agent();
    std::thread::sleep(Duration::from_secs(2));
    c.spawn_agent(&["run"]);
    c.wait("the agent to come back", Duration::from_secs(30), |c| {
        c.katcall_ok(&["get", "nodes"]).contains("Ready")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        ids(&c.instances("web")),
        *before,
        "instances changed across an agent restart"
    );
    for id in before.iter().chain([&*ticker]) {
        let inits = containers_of(id);
        assert_eq!(inits, 1, "instance {id} must run exactly one container");
    }
    // (After counting: an exec's own kat-init is a process of the instance too.)
    // The containers kept their network across the restart.
    let web = c.instances("web");
    let (a, b) = (
        web[0]["instanceID"].as_str().unwrap(),
        web[1]["ip"].as_str().unwrap(),
    );
    let fetch = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {b} 8080");
    let out = c.katcall(&["exec", &format!("web/{a}"), "--", "sh", "-c", &fetch]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.ends_with("\nhi\n"),
        "after an agent restart: {page} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = c.must(&["logs", &format!("ticker/{ticker}")]);
    let ticks: Vec<u64> = logs
        .lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    assert!(ticks.len() > 40, "{} ticks", ticks.len());
    assert!(
        ticks.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap in the ticks: {ticks:?}"
    );
}

fn a_reboot_without_etcd_runs_from_the_local_copy(r: &mut Run) {
    let Run {
        c,
        id: _,
        before,
        ticker,
        ..
    } = r;
    // A reboot while etcd cannot start: the agent brings the workloads back from its local
    // copy of assignments; once etcd is back they converge without duplicates.
    c.kill_agent();
    let pids = workload_pids(None);
    assert!(!pids.is_empty());
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    c.wait(
        "every container process to be gone",
        Duration::from_secs(10),
        |_| workload_pids(None).is_empty(),
    );
    c.spawn_agent(&["run", "--etcd-binary", "/bin/false"]);
    c.wait(
        "the workloads to come back from the local copy",
        Duration::from_secs(30),
        |_| {
            before
                .iter()
                .chain([&*ticker])
                .all(|id| !workload_pids(Some(id)).is_empty())
        },
    );
    c.kill_agent();
    c.spawn_agent(&["run"]);
    c.wait(
        "the agent to come back with etcd",
        Duration::from_secs(30),
        |c| c.katcall_ok(&["get", "nodes"]).contains("Ready"),
    );
    c.wait(
        "2 healthy replicas after the reboot",
        Duration::from_secs(30),
        |c| all_running_healthy(&c.instances("web"), 2, 2),
    );
    assert_eq!(
        ids(&c.instances("web")),
        *before,
        "the same instances came back"
    );
    for id in before.iter().chain([&*ticker]) {
        let inits = containers_of(id);
        assert_eq!(
            inits, 1,
            "instance {id} must run exactly one container after the reboot"
        );
    }
}

fn node_admin_and_rollback_show_in_events(r: &mut Run) {
    let Run {
        c, image, id: _, ..
    } = r;
    // Node administration and rollback through katcall, seen in events.
    let mut watch = Command::new(bin("katcall"))
        .args(["events", "--watch", "-o", "json"])
        .env("KAT_CONFIG", c.path("katcall.yaml"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("katcall events --watch");
    c.must(&["label", "e2e-node", "tier=web"]);
    c.must(&["taint", "e2e-node", "dedicated=ops:PreferNoSchedule"]);
    let wide = c.must(&["get", "nodes", "-o", "wide"]);
    assert!(
        wide.contains("tier=web") && wide.contains("dedicated=ops:PreferNoSchedule"),
        "{wide}"
    );
    // The one node leads, and says so: a LEADER column, a typed field, `describe node`.
    leader_shown(c, "e2e-node");
    c.must(&["taint", "e2e-node", "dedicated-"]);
    c.must(&["drain", "e2e-node"]);
    c.wait("the node to show Draining", Duration::from_secs(10), |c| {
        c.katcall_ok(&["get", "nodes"]).contains("Draining")
    });
    c.must(&["uncordon", "e2e-node"]);
    c.wait("the node to be Ready again", Duration::from_secs(10), |c| {
        c.katcall_ok(&["get", "nodes"]).contains("Ready")
    });
    job_output_is_kept(c, image);
    let out = c.must(&["rollback", "workload", "web"]);
    assert!(out.contains("now generation 3"), "{out}");
    c.wait(
        "the rolled-back spec to run healthy",
        Duration::from_secs(60),
        |c| all_running_healthy(&c.instances("web"), 2, 3),
    );
    for id in ids(&c.instances("web")) {
        assert_eq!(
            c.must(&["logs", &format!("web/{id}")]).trim(),
            format!("hello from {id}")
        );
    }
    let describe = c.must(&["describe", "workload", "web"]);
    assert!(
        describe.contains("WorkloadRolledBack") && describe.contains("2 ready / 2 desired"),
        "{describe}"
    );
    let _ = watch.kill();
    let streamed = String::from_utf8_lossy(&watch.wait_with_output().expect("watch output").stdout)
        .into_owned();
    for reason in [
        "NodeLabeled",
        "NodeTainted",
        "NodeDraining",
        "NodeUncordoned",
        "WorkloadRolledBack",
    ] {
        assert!(
            streamed.contains(reason),
            "{reason} missing from `katcall events --watch`:\n{streamed}"
        );
    }
}

fn delete_leaves_no_containers_cgroups_or_mounts(r: &mut Run) {
    let Run {
        c,
        id: _,
        before,
        ticker,
        ..
    } = r;
    // delete leaves no containers, cgroups or mounts.
    let runtime_root = c.path("data/runtime/containers");
    for w in ["web", "ticker"] {
        c.must(&["delete", "workload", w]);
    }
    c.wait(
        "every container to be removed",
        Duration::from_secs(30),
        |c| {
            std::fs::read_dir(&runtime_root).map_or(0, |d| d.count()) == 0
                && c.instances("web").is_empty()
                && workload_pids(None).is_empty()
        },
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(c.dir.path().to_str().expect("utf-8")),
        "mounts left:\n{mounts}"
    );
    for id in before.iter().chain([&*ticker]) {
        for controller in ["memory", "pids", "cpu"] {
            let root = Path::new("/sys/fs/cgroup").join(controller);
            if let Ok(found) = Command::new("find")
                .arg(&root)
                .args(["-maxdepth", "3", "-name", &format!("{id}*")])
                .output()
            {
                assert!(
                    found.stdout.is_empty(),
                    "cgroup left: {}",
                    String::from_utf8_lossy(&found.stdout)
                );
            }
        }
    }
}

fn backups_are_taken_listed_and_pruned(r: &mut Run) {
    let Run { c, .. } = r;
    backups(c);
}

/// The leader's scheduled backups (every minute here) and `katcall backup create`: files with
/// their checksum in backupPath, recorded and listed, events, the newest two kept.
fn backups(c: &Cluster) {
    let list = |c: &Cluster| -> Vec<Value> {
        serde_json::from_str(&c.katcall_ok(&["get", "backups", "-o", "json"])).unwrap_or_default()
    };
    c.wait("a scheduled backup", Duration::from_secs(90), |c| {
        list(c).iter().any(|b| b["trigger"] == "schedule")
    });
    for _ in 0..3 {
        let made: Value =
            serde_json::from_str(&c.katcall_ok(&["backup", "create", "-o", "json"])).unwrap();
        assert_eq!(made["trigger"], "manual");
        let path = PathBuf::from(made["path"].as_str().unwrap());
        assert!(path.starts_with(c.path("backups")), "{path:?}");
        let sum = std::fs::read_to_string(format!("{}.sha256", path.display())).unwrap();
        assert!(sum.starts_with(made["sha256"].as_str().unwrap()), "{sum}");
        // `sha256sum -c` agrees.
        let check = Command::new("sha256sum")
            .arg("-c")
            .arg(format!("{}.sha256", path.display()))
            .current_dir(c.path("backups"))
            .output()
            .unwrap();
        assert!(check.status.success(), "{check:?}");
    }
    // Retention 2: the files and the records of the older ones are gone.
    let files: Vec<_> = std::fs::read_dir(c.path("backups"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".db"))
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    let listed = list(c);
    assert_eq!(listed.len(), 2, "{listed:?}");
    let out = c.katcall(&["events", "--for-kind", "Cluster", "-o", "json"]);
    let events: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        events
            .iter()
            .filter(|e| e["reason"] == "BackupCreated")
            .count()
            >= 4,
        "{events:?}"
    );
    let table = c.katcall_ok(&["get", "backups"]);
    assert!(
        table.contains("SHA256") && table.contains("manual"),
        "{table}"
    );
}

/// The node (state, lastHeartbeat) as `katcall get nodes -o json` shows it.
fn node_heartbeat(c: &Cluster) -> (String, String) {
    let out = c.must(&["get", "nodes", "-o", "json"]);
    let nodes: Vec<Value> = serde_json::from_str(&out).expect("nodes as JSON");
    let node = nodes
        .iter()
        .find(|n| n["metadata"]["name"] == "e2e-node")
        .unwrap_or_else(|| panic!("e2e-node missing: {out}"));
    (
        node["state"].as_str().unwrap_or("").to_string(),
        node["lastHeartbeat"].as_str().unwrap_or("").to_string(),
    )
}

/// `node` is shown as the leader: `yes` in the LEADER column of `get nodes`, `"leader": true`
/// (with `leaderSince`) in `-o json`, `Leader: yes` in `describe node`.
fn leader_shown(c: &Cluster, node: &str) {
    let table = c.must(&["get", "nodes"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let column = header
        .iter()
        .position(|h| *h == "LEADER")
        .unwrap_or_else(|| panic!("a LEADER column: {table}"));
    let row: Vec<&str> = lines
        .find(|l| l.starts_with(node))
        .unwrap_or_else(|| panic!("{node} listed: {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row.get(column), Some(&"yes"), "{table}");
    let out = c.must(&["get", "nodes", "-o", "json"]);
    let nodes: Vec<Value> = serde_json::from_str(&out).expect("nodes as JSON");
    let leaders: Vec<&Value> = nodes.iter().filter(|n| n["leader"] == true).collect();
    assert_eq!(leaders.len(), 1, "{out}");
    assert_eq!(leaders[0]["metadata"]["name"], node, "{out}");
    assert!(leaders[0]["leaderSince"].is_string(), "{out}");
    let described = c.must(&["describe", "node", node]);
    assert!(described.contains("Leader:      yes, since"), "{described}");
    assert!(
        described.contains(&format!("Name:        {node}")),
        "{described}"
    );
    let json: Value =
        serde_json::from_str(&c.must(&["describe", "node", node, "-o", "json"])).expect("json");
    assert_eq!(json["node"]["leader"], true, "{json}");
    // A node that does not exist: an error naming it.
    let missing = c.katcall(&["describe", "node", "nosuchnode"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("node nosuchnode not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

/// A Job that ran keeps its output: once its run succeeded its record and container are
/// gone, yet `katcall logs JOB` shows what it printed, `get instances --all` lists it with
/// its exit code, and `logs JOB/ID` reads it too (the agent kept the log).
fn job_output_is_kept(c: &Cluster, image: &str) {
    let files = vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: report
  namespace: default
spec:
  type: Job
  source:
    image: {image}
  restartPolicy:
    condition: Never
  container:
    command: [\"/bin/sh\", \"-c\", \"echo report-line-1; echo report-line-2 >&2; exit 0\"]
"
            ),
        ),
        (
            "job.kat",
            "apiVersion: kat.dws.rip/v1alpha1
kind: JobDefinition
spec:
  completions: 1
"
            .to_string(),
        ),
    ];
    c.apply("report", &files);
    let mut finished = Value::Null;
    c.wait("the report job to finish", Duration::from_secs(90), |c| {
        let out = c.katcall_ok(&["get", "instances", "--all", "-o", "json"]);
        let list: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
        match list
            .into_iter()
            .find(|i| i["workload"] == "report" && i["state"] == "Succeeded")
        {
            Some(i) => {
                finished = i;
                true
            }
            None => false,
        }
    });
    assert_eq!(finished["exitCode"], 0, "{finished}");
    assert!(finished["finishedAt"].is_string(), "{finished}");
    let id = finished["instanceID"].as_str().expect("an id").to_string();
    // Its record went (the Job counted it), so the node removed its container.
    c.wait(
        "the report container removed",
        Duration::from_secs(30),
        |c| {
            std::fs::read_to_string(c.dir.path().join("agent.log"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("kept the log of a removed container") && l.contains(&id))
        },
    );
    let live: Vec<Value> =
        serde_json::from_str(&c.must(&["get", "instances", "-o", "json"])).expect("json");
    assert!(
        !live.iter().any(|i| i["instanceID"] == id.as_str()),
        "without --all a finished instance is not listed"
    );
    let table = c.must(&["get", "instances", "--all"]);
    assert!(
        table.contains(&id) && table.contains("Succeeded"),
        "{table}"
    );

    let out = c.katcall(&["logs", "report"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("report-line-1") && stdout.contains("report-line-2"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.contains(&id) && stderr.contains("exit code 0"),
        "{stderr}"
    );
    let tail = c.must(&["logs", &format!("report/{id}"), "--tail", "1"]);
    assert!(
        tail.contains("report-line-2") && !tail.contains("report-line-1"),
        "{tail}"
    );
    c.must(&["delete", "workload", "report"]);
}

/// How often the agent log says this node became the leader.
fn times_elected(c: &Cluster) -> usize {
    std::fs::read_to_string(c.dir.path().join("agent.log"))
        .unwrap_or_default()
        .matches("this node leads the cluster")
        .count()
}

/// Whether the peer closed `tcp`, reading (and dropping) whatever it sent; `wait` at most.
fn closed_within(tcp: &mut TcpStream, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        tcp.set_read_timeout(Some(left)).expect("read timeout");
        match tcp.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// 200 idle connections (plain TCP that never starts TLS, TLS that never sends a request,
/// TLS with a partial request header) and `katcall exec -i` of a command that never reads
/// the megabytes written to its stdin, all held while `katcall get workloads` is timed; the
/// node keeps its heartbeats and its leadership; then the server's handshake and header
/// timeouts close every idle connection.
fn never_stalls(c: &Cluster, instance: &str) {
    let section = Instant::now();
    let elected = times_elected(c);
    let (_, heartbeat_before) = node_heartbeat(c);

    // An exec whose command never reads stdin, fed as fast as katcall takes it.
    let mut exec = Command::new(bin("katcall"))
        .args([
            "exec",
            "-i",
            &format!("web/{instance}"),
            "--",
            "sleep",
            "30",
        ])
        .env("KAT_CONFIG", c.path("katcall.yaml"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("katcall exec");
    let mut stdin = exec.stdin.take().expect("exec stdin");
    let written = Arc::new(AtomicUsize::new(0));
    let total = 64 << 20;
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; 64 << 10];
            while written.load(Ordering::Relaxed) < total {
                if stdin.write_all(&chunk).is_err() {
                    return;
                }
                written.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        })
    };
    // Until the stream is full: nothing more accepted for a second.
    let stalled_by = Instant::now() + Duration::from_secs(10);
    let mut last = (0, Instant::now());
    while Instant::now() < stalled_by {
        std::thread::sleep(Duration::from_millis(200));
        let now = written.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if now > 0 && last.1.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    let accepted = written.load(Ordering::Relaxed);
    assert!(
        accepted > 256 << 10 && accepted < total,
        "katcall exec took {accepted} bytes of stdin: expected more than a pipe's worth and \
         then backpressure"
    );

    // 200 idle connections.
    let ca = std::fs::read(c.path("data/pki/ca.crt")).expect("ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let mut idle: Vec<(TcpStream, Instant, &str)> = Vec::new();
    for i in 0..200 {
        let opened = Instant::now();
        let mut tcp = TcpStream::connect(("127.0.0.1", c.api_port)).expect("connect to the API");
        let kind = match i % 4 {
            0 | 1 => "plain TCP",
            2 => "TLS",
            _ => "partial request",
        };
        if kind != "plain TCP" {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let mut conn = rustls::ClientConnection::new(tls.clone(), name).expect("TLS client");
            while conn.is_handshaking() {
                conn.complete_io(&mut tcp)
                    .expect("TLS handshake with the API");
            }
            if kind == "partial request" {
                let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                stream
                    .write_all(b"GET /v1alpha1/nodes HTTP/1.1\r\nHost: e2e\r\n")
                    .expect("partial request");
                stream.flush().expect("flush");
            }
        }
        idle.push((tcp, opened, kind));
    }
    let opened_all = idle[idle.len() - 1].1.duration_since(idle[0].1);

    // Meanwhile: quick answers and fresh heartbeats.
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut heartbeat = false;
    while latencies.len() < 5 || !heartbeat {
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "no new heartbeat under load (last {heartbeat_before})\nagent log:\n{}",
            c.agent_log_tail()
        );
        let t = Instant::now();
        let table = c.must(&["get", "workloads"]);
        let took = t.elapsed();
        assert!(table.contains("web"), "{table}");
        assert!(
            took < Duration::from_secs(3),
            "`katcall get workloads` took {took:?} under load"
        );
        latencies.push(took);
        let (state, last) = node_heartbeat(c);
        assert_eq!(state, "Ready", "the node under load");
        heartbeat |= last != heartbeat_before;
        std::thread::sleep(Duration::from_millis(300));
    }
    // Everything was still held: the exec runs and no idle connection was closed yet.
    assert!(
        exec.try_wait().expect("exec status").is_none(),
        "katcall exec ended early"
    );
    for (tcp, opened, kind) in &mut idle {
        tcp.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => panic!(
                    "a {kind} connection was closed {:?} after it opened, during the measurements",
                    opened.elapsed()
                ),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("a {kind} connection failed during the measurements: {e}"),
            }
        }
        tcp.set_nonblocking(false).expect("blocking");
    }
    let _ = exec.kill();
    let _ = exec.wait();
    writer.join().expect("stdin writer");
    // The exec'd command outlives its client (as with `docker exec`): end it, so that
    // the instance runs one kat-init again.
    for pid in workload_pids(Some(instance)) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.windows(2).any(|w| w == [&b"sleep"[..], &b"30"[..]]) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    c.wait("the exec'd command to end", Duration::from_secs(10), |_| {
        containers_of(instance) == 1
    });
    assert_eq!(times_elected(c), elected, "the node lost its leadership");

    // The idle connections are closed by the handshake and header-read timeouts (10 s).
    let mut slowest_close = Duration::ZERO;
    for (tcp, opened, kind) in &mut idle {
        let limit = *opened + Duration::from_secs(15);
        assert!(
            closed_within(tcp, limit.saturating_duration_since(Instant::now())),
            "a {kind} connection is still open 15 s after it opened"
        );
        slowest_close = slowest_close.max(opened.elapsed());
    }
    c.must(&["get", "nodes"]);
    eprintln!(
        "never_stalls: exec stdin accepted {} KiB before backpressure; 200 idle connections \
         opened in {opened_all:?}; `get workloads` under load: {latencies:?}; idle connections \
         all closed within {slowest_close:?} of opening; section took {:?}",
        accepted >> 10,
        section.elapsed()
    );
}

/// Host pids whose command line is exactly `args`.
fn pids_running(args: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            (std::fs::read(e.path().join("cmdline")).ok()? == wanted).then_some(pid)
        })
        .collect()
}

/// Containers on the node network: an address of the node's subnet on eth0, the node's
/// DNS in resolv.conf, pages fetched from one instance to another by workload name (short
/// and long) and by instance name, and a published hostPort reached from the host.
fn container_network(c: &Cluster, image: &str) {
    let web = c.instances("web");
    let (a, b) = (&web[0], &web[1]);
    let (a_id, b_id) = (
        a["instanceID"].as_str().unwrap(),
        b["instanceID"].as_str().unwrap(),
    );
    let a_ip = a["ip"].as_str().expect("an address");
    assert!(a_ip.starts_with("10.100."), "{a}");
    let run = |instance: &str, script: &str| -> String {
        let out = c.katcall(&["exec", &format!("web/{instance}"), "--", "sh", "-c", script]);
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let addr = run(
        a_id,
        "ip -4 -o addr show eth0; ip route; cat /etc/resolv.conf /etc/hosts",
    );
    assert!(addr.contains(&format!("inet {a_ip}/23")), "{addr}");
    assert!(addr.contains("default via 10.100.0.1"), "{addr}");
    assert!(addr.contains("nameserver 10.100.0.1"), "{addr}");
    assert!(
        addr.contains("search default.kat.cluster.local kat.cluster.local"),
        "{addr}"
    );
    assert!(addr.contains(&format!("{a_ip}\t{a_id}")), "{addr}");
    // Names resolve through the node's DNS, then the page comes over the bridge.
    for name in [
        "web".to_string(),
        "web.default".to_string(),
        "web.default.kat.cluster.local".to_string(),
        format!("{b_id}.web.default.kat.cluster.local"),
    ] {
        // busybox-static's wget crashes in static glibc's resolver; its nc does not. The
        // records reach the node's DNS within a second or so of the instances' health.
        let fetch = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {name} 8080");
        let mut page = String::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = c.katcall(&["exec", &format!("web/{a_id}"), "--", "sh", "-c", &fetch]);
            page = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if page.starts_with("HTTP/1.1 200") {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(
            page.starts_with("HTTP/1.1 200") && page.ends_with("\nhi\n"),
            "fetching from {name}: {page}"
        );
    }
    let lookup = run(
        a_id,
        "nslookup no-such-workload.default.kat.cluster.local 10.100.0.1 || true",
    );
    assert!(
        lookup.contains("NXDOMAIN") || lookup.contains("can't resolve"),
        "{lookup}"
    );
    // A name outside the cluster, through the node's forwarder to the (stand-in) internet.
    let outside = run(a_id, "nslookup www.outside.example.test 10.100.0.1 || true");
    assert!(outside.contains("192.0.2.77"), "{outside}");

    // Health decides the answer set: unhealthy instances leave it and come back. (Both
    // replicas check the same file on their shared volume, so both go.)
    let b_ip = b["ip"].as_str().expect("an address").to_string();
    let answers = |c: &Cluster| -> String {
        let script = "nslookup web.default.kat.cluster.local 10.100.0.1 || true";
        let out = c.katcall(&["exec", &format!("web/{a_id}"), "--", "sh", "-c", script]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(b_id, "mv /data/www/index.html /data/www/away.html");
    c.wait(
        "the unhealthy instances out of the answers",
        Duration::from_secs(20),
        |c| {
            let a = answers(c);
            !a.contains(a_ip) && !a.contains(&b_ip)
        },
    );
    run(b_id, "mv /data/www/away.html /data/www/index.html");
    c.wait(
        "the healthy instance back in the answers",
        Duration::from_secs(20),
        |c| {
            let a = answers(c);
            a.contains(a_ip) && a.contains(&b_ip)
        },
    );

    // A published port, reached from the host through the node's address.
    let port = free_port();
    c.apply(
        "published",
        &[
            simple(
                "published",
                image,
                "    condition: Always",
                "mkdir -p /tmp/www; echo published page > /tmp/www/index.html; exec httpd -f -p 8081 -h /tmp/www",
            )
            .remove(0),
            (
                "VirtualLoadBalancer.kat",
                format!(
                    "apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8081
      hostPort: {port}
"
                ),
            ),
        ],
    );
    c.wait("the published page", Duration::from_secs(30), |c| {
        let (code, body) = c.curl(&[
            "--max-time",
            "2",
            &format!("http://127.0.0.1:{port}/index.html"),
        ]);
        code == 200 && body.trim() == "published page"
    });
    c.must(&["delete", "workload", "published"]);

    // The quickstart's example, as shipped: its page on the node's port 8080.
    let hello = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hello");
    c.must(&["apply", "-f", &hello.display().to_string()]);
    c.wait(
        "examples/hello on port 8080",
        Duration::from_secs(30),
        |c| {
            let (code, body) = c.curl(&["--max-time", "2", "http://127.0.0.1:8080/"]);
            code == 200 && body.starts_with("hello from hello-")
        },
    );
    c.must(&["delete", "workload", "hello"]);
    c.wait(
        "the published port to close",
        Duration::from_secs(30),
        |_| std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
    );
    // A deleted workload's names are gone.
    c.wait("published's name NXDOMAIN", Duration::from_secs(20), |c| {
        let script = "nslookup published.default.kat.cluster.local 10.100.0.1 || true";
        let out = c.katcall(&["exec", &format!("web/{a_id}"), "--", "sh", "-c", script]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("NXDOMAIN") || text.contains("can't find")
    });
}

/// `katcall exec` killed (a closed laptop, a dropped link): the process it started inside
/// the container goes too, instead of running on unseen.
/// A Git repository served by `git daemon` on loopback (killed with its process group).
struct GitRepo {
    work: PathBuf,
    url: String,
    daemon: Child,
}

impl Drop for GitRepo {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.daemon.wait();
    }
}

impl GitRepo {
    fn new(dir: &Path) -> GitRepo {
        use std::os::unix::process::CommandExt;
        let work = dir.join("app");
        std::fs::create_dir_all(&work).unwrap();
        let port = free_port();
        let repo = GitRepo {
            url: format!("git://127.0.0.1:{port}/app"),
            daemon: Command::new("git")
                .args([
                    "daemon",
                    "--reuseaddr",
                    "--export-all",
                    "--listen=127.0.0.1",
                ])
                .arg(format!("--port={port}"))
                .arg(format!("--base-path={}", dir.display()))
                .arg(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("git daemon"),
            work,
        };
        repo.git(&["init", "-q", "-b", "main"]);
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        repo
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .current_dir(&self.work)
            .args(["-c", "user.name=KAT", "-c", "user.email=kat@test.invalid"])
            .args(args)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Writes files and commits them on the current branch; the commit id.
    fn commit(&self, files: &[(&str, String)]) -> String {
        for (path, text) in files {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", "change"]);
        self.git(&["rev-parse", "HEAD"])
    }
}

fn git_workload(name: &str, repo: &str, source: &str, policy: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source:\n    git: {{repository: \"{repo}\", {source}}}\n  replicas: 1\n  restartPolicy: {{condition: {policy}}}\n  container:\n    command: [/bin/sh, -c, 'cat /greeting /commit.txt; exec sleep 3600']\n"
            ),
        ),
        (
            "build.kat",
            "apiVersion: kat.dws.rip/v1alpha1\nkind: BuildDefinition\nspec:\n  buildContext: app\n  dockerfilePath: Dockerfile\n  targetStage: final\n  buildArgs: {GREETING: hello-from-build-args}\n".to_string(),
        ),
    ]
}

/// The events about workload `name`: (reason, message).
fn events_of(c: &Cluster, name: &str) -> Vec<(String, String)> {
    let out = c.katcall(&["events", "--for-name", name, "-o", "json"]);
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    list.iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A git server's push notification to the workload's webhook, signed with `secret`.
fn push_hook(c: &Cluster, url: &str, secret: &str, branch: &str) -> (u16, String) {
    let body = format!("{{\"ref\":\"refs/heads/{branch}\",\"after\":\"0000\"}}");
    let signature = kat_pki::webhook::sign(secret, body.as_bytes());
    c.curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-H",
        &format!("X-Hub-Signature-256: sha256={signature}"),
        "--data-binary",
        &body,
        url,
    ])
}

/// The logs of the workload's running instance at `generation`, once it has one.
fn running_logs(c: &Cluster, name: &str, generation: u64) -> Option<String> {
    let instances = c.instances(name);
    let i = instances
        .iter()
        .find(|i| i["state"] == "Running" && i["generation"] == generation)?;
    let id = i["instanceID"].as_str()?;
    Some(c.katcall_ok(&["logs", &format!("{name}/{id}")]))
}

/// Git-native builds on the node: apply → the leader resolves the branch → the agent clones
/// and builds with buildah → running, with progress in describe, events and the build's
/// output in `logs --build`; the build pushed to its cache is pulled, not built, for another
/// workload; a signed push notification and `redeploy` roll out a new commit (forged ones are
/// refused); rollback runs the earlier image without building again; a broken Dockerfile and
/// an unknown commit end Failed with the reason in events; nothing is left in the workspace.
fn git_builds(c: &Cluster, image: &str) {
    let served = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(served.path());
    let dockerfile = format!(
        "FROM {image} AS base\nARG GREETING=unset\nRUN echo \"$GREETING\" > /greeting\nFROM base AS final\nCOPY commit.txt /commit.txt\nFROM base AS unwanted\nRUN echo wrong-stage > /greeting\n"
    );
    let first = repo.commit(&[
        ("app/Dockerfile", dockerfile.clone()),
        ("app/commit.txt", "first-commit\n".into()),
    ]);
    let registry = image.split('/').next().unwrap_or_default();
    let cache = format!("{registry}/kat-cache/gitapp-{}", std::process::id());
    let with_cache = |name: &str, source: &str| {
        let mut files = git_workload(name, &repo.url, source, "Always");
        files[0].1 = files[0].1.replace(
            "  source:\n",
            &format!("  source:\n    cacheImage: {cache}\n"),
        );
        files
    };
    let started = Instant::now();
    let out = c.apply("gitapp", &with_cache("gitapp", "branch: main"));
    assert!(out.contains("created (generation 1)"), "{out}");
    // While it builds, the instance says so, and describe shows the step.
    let mut said_building = false;
    let mut described_step = false;
    c.wait(
        "the git workload built and running",
        Duration::from_secs(180),
        |c| {
            said_building |= c
                .instances("gitapp")
                .iter()
                .any(|i| i["reason"].as_str().is_some_and(|r| r.contains("building")));
            if !described_step {
                let d = c.katcall_ok(&["describe", "workload", "gitapp"]);
                described_step = d.contains("Building") && d.contains(" of ");
            }
            running_logs(c, "gitapp", 1).is_some_and(|l| l.contains("first-commit"))
        },
    );
    eprintln!(
        "git workload: apply to running in {:.1} s (progress in describe seen: {described_step})",
        started.elapsed().as_secs_f64()
    );
    let logs = running_logs(c, "gitapp", 1).unwrap();
    assert!(logs.contains("hello-from-build-args"), "{logs}");
    assert!(said_building, "an instance waiting on its build says so");
    // The page shows the commit; the build's events and its whole output are there.
    let described = c.katcall_ok(&["describe", "workload", "gitapp"]);
    assert!(
        described.contains(&format!("at {first}")) && described.contains("Succeeded"),
        "{described}"
    );
    c.wait(
        "BuildStarted and BuildSucceeded",
        Duration::from_secs(20),
        |c| {
            let events = events_of(c, "gitapp");
            events.iter().any(|(r, _)| r == "BuildStarted")
                && events
                    .iter()
                    .any(|(r, m)| r == "BuildSucceeded" && m.contains("pushed to"))
        },
    );
    let build_log = c.katcall_ok(&["logs", "--build", "gitapp"]);
    assert!(
        build_log.contains("STEP") && build_log.contains("COPY commit.txt"),
        "{build_log}"
    );
    let tail = c.katcall_ok(&["logs", "--build", "--tail", "1", "gitapp"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");

    // The same commit for another workload with the same cache: pulled, not built.
    let started = Instant::now();
    c.apply(
        "gitcached",
        &with_cache("gitcached", &format!("commit: {first}")),
    );
    c.wait("the cached image running", Duration::from_secs(60), |c| {
        running_logs(c, "gitcached", 1).is_some_and(|l| l.contains("first-commit"))
    });
    let cache_hit = started.elapsed();
    eprintln!(
        "git workload from the build cache: apply to running in {:.1} s",
        cache_hit.as_secs_f64()
    );
    c.wait(
        "BuildSucceeded from the cache",
        Duration::from_secs(20),
        |c| {
            events_of(c, "gitcached")
                .iter()
                .any(|(r, m)| r == "BuildSucceeded" && m.contains("from the build cache"))
        },
    );
    // No buildah ran for it: buildah's output is what the build log holds, and there is none.
    let out = c.katcall(&["logs", "--build", "gitcached"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("build cache"),
        "{err}"
    );
    assert!(cache_hit < Duration::from_secs(15), "{cache_hit:?}");
    c.must(&["delete", "workload", "gitcached"]);

    // Push-to-deploy: a webhook secret, then a new commit and its signed notification.
    let hook: Value =
        serde_json::from_str(&c.katcall_ok(&["webhook", "gitapp", "-o", "json"])).unwrap();
    let (url, secret) = (
        hook["url"].as_str().unwrap().to_string(),
        hook["secret"].as_str().unwrap().to_string(),
    );
    let second = repo.commit(&[("app/commit.txt", "second-commit\n".into())]);
    // Forged (another secret), unsigned, or for another workload: refused, nothing moves.
    let (code, body) = push_hook(c, &url, "not-the-secret", "main");
    assert_eq!(code, 401, "{body}");
    let (code, _) = c.curl(&["-X", "POST", "-d", "{}", &url]);
    assert_eq!(code, 401);
    let (code, _) = push_hook(c, &url.replace("/gitapp", "/gitbroken"), &secret, "main");
    assert_eq!(code, 401);
    // A push to another branch: ignored.
    let (code, body) = push_hook(c, &url, &secret, "feature");
    assert!(code == 200 && body.contains("ignored"), "{code} {body}");
    assert_eq!(c.workload("gitapp").unwrap()["metadata"]["generation"], 1);
    let (code, body) = push_hook(c, &url, &secret, "main");
    assert!(
        code == 200 && body.contains("\"redeployed\":true"),
        "{code} {body}"
    );
    c.wait("the new commit running", Duration::from_secs(180), |c| {
        running_logs(c, "gitapp", 2).is_some_and(|l| l.contains("second-commit"))
    });
    let out = c.must(&["redeploy", "gitapp"]);
    assert!(out.contains("has not moved"), "{out}");
    // katcall redeploy does the same as the hook.
    let third = repo.commit(&[("app/commit.txt", "third-commit\n".into())]);
    let out = c.must(&["redeploy", "gitapp"]);
    assert!(out.contains("generation 3"), "{out}");
    c.wait("the third commit running", Duration::from_secs(180), |c| {
        running_logs(c, "gitapp", 3).is_some_and(|l| l.contains("third-commit"))
    });
    let builds = |c: &Cluster| {
        events_of(c, "gitapp")
            .iter()
            .filter(|(r, _)| r == "BuildStarted")
            .count()
    };
    c.wait("three builds in events", Duration::from_secs(20), |c| {
        builds(c) >= 3
    });
    let built = builds(c);
    // A hook turned off refuses what it accepted before.
    c.must(&["webhook", "gitapp", "--delete"]);
    let (code, _) = push_hook(c, &url, &secret, "main");
    assert_eq!(code, 401);
    // Rollback: the second commit's image is still here, nothing is built.
    c.must(&["rollback", "workload", "gitapp"]);
    c.wait(
        "the second commit running again",
        Duration::from_secs(120),
        |c| running_logs(c, "gitapp", 4).is_some_and(|l| l.contains("second-commit")),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(builds(c), built, "rollback built again");
    let _ = (second, third);

    // A broken Dockerfile and an unknown commit: Failed, with the reason.
    repo.git(&["checkout", "-q", "-b", "broken"]);
    repo.commit(&[(
        "app/Dockerfile",
        format!("FROM {image} AS final\nRUN echo about-to-fail && false\n"),
    )]);
    c.apply(
        "gitbroken",
        &git_workload("gitbroken", &repo.url, "branch: broken", "Never"),
    );
    c.apply(
        "gitunknown",
        &git_workload(
            "gitunknown",
            &repo.url,
            "commit: 0123456789abcdef0123456789abcdef01234567",
            "Never",
        ),
    );
    for (name, says) in [
        ("gitbroken", "about-to-fail"),
        ("gitunknown", "0123456789abcdef"),
    ] {
        c.wait(
            &format!("{name} Failed with its reason"),
            Duration::from_secs(120),
            |c| {
                c.instances(name).iter().any(|i| {
                    i["state"] == "Failed" && i["reason"].as_str().is_some_and(|r| r.contains(says))
                })
            },
        );
        c.wait(
            &format!("BuildFailed for {name} with the reason"),
            Duration::from_secs(20),
            |c| {
                events_of(c, name)
                    .iter()
                    .any(|(r, m)| r == "BuildFailed" && m.contains(says))
            },
        );
    }
    // The failing step and the last lines of output, in the event.
    let failed = events_of(c, "gitbroken");
    assert!(
        failed
            .iter()
            .any(|(r, m)| r == "BuildFailed" && m.contains("RUN echo about-to-fail")),
        "{failed:?}"
    );
    // Refused at apply, with the field: a branch that does not exist, a repository that
    // cannot be reached, a path on the node's disk.
    for (source, says) in [
        (
            format!("git: {{repository: \"{}\", branch: nope}}", repo.url),
            "no branch \"nope\"",
        ),
        (
            "git: {repository: \"git://127.0.0.1:1/x\", branch: main}".to_string(),
            "cannot reach",
        ),
        (
            "git: {repository: \"file:///etc\", branch: main}".to_string(),
            "expected an https://",
        ),
    ] {
        let dir = c.dir.path().join("gitbad");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files = git_workload("gitbad", "x", "branch: main", "Never");
        let text = files[0]
            .1
            .replace("git: {repository: \"x\", branch: main}", &source);
        std::fs::write(dir.join("workload.kat"), text).unwrap();
        std::fs::write(dir.join("build.kat"), &files[1].1).unwrap();
        let out = c.katcall(&["apply", "-f", &dir.display().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("spec.source.git") && err.contains(says),
            "{source}: {err}"
        );
    }
    assert!(c.workload("gitbad").is_none());
    for w in ["gitapp", "gitbroken", "gitunknown"] {
        c.must(&["delete", "workload", w]);
    }
    let left: Vec<_> = std::fs::read_dir(c.path("runtime/builds"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "build workspaces left: {left:?}");
}

fn an_exec_ends_with_its_client(c: &Cluster, instance: &str) {
    let marker = ["sleep", "3072"];
    let mut exec = Command::new(bin("katcall"))
        .args(["exec", &format!("web/{instance}"), "--"])
        .args(marker)
        .env("KAT_CONFIG", c.path("katcall.yaml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("katcall exec");
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids_running(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the exec'd sleep never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = exec.kill();
    let _ = exec.wait();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pids_running(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the exec'd process outlived its client by 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
