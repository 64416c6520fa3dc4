//! The one-node cluster the steps share: `kat-agent init` on a temporary data directory,
//! katcall against it, and the host's view of its workload processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use kat_api::wire::{InstanceStatus, NodeState, WorkloadObject};
use kat_testkit::{bin, free_ports, Katcall};

pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) api_port: u16,
    pub(crate) etcd_port: u16,
    pub(crate) agent: Option<Child>,
    pub(crate) registry: String,
    pub(crate) init: PathBuf,
    /// A resolver standing in for the internet: the node's DNS forwards other names here.
    pub(crate) upstream: std::net::SocketAddr,
}

/// A DNS server on loopback that knows `www.outside.example.test` (192.0.2.77): what the
/// node's forwarder asks for names outside the cluster domain in this test.
pub(crate) fn outside_resolver() -> std::net::SocketAddr {
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
                instance_id: "www-1".parse().unwrap(),
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
pub(crate) fn agent_user() -> Option<String> {
    std::env::var("KAT_TEST_AGENT_USER")
        .ok()
        .filter(|u| !u.is_empty())
}

/// A node with one GPU that is not there: a CDI specification of `kat.test/gpu` whose device
/// `0` is a character device made here (10:237, what /dev/loop-control is: a device no
/// container may open unless its device cgroup allows it, which opens without privilege)
/// with an environment variable and a `createRuntime` hook (`hooks/mark`: it writes the
/// container's state it reads on its input to `marks/created`), and the sysfs of an AMD card
/// with 8 GiB behind it. The agent reads it as its GPU root (`KAT_GPU_ROOT`).
pub(crate) fn fake_gpu_root(root: &Path) {
    let write = |path: &str, text: &str| {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    write(
        "etc/cdi/kat-test.yaml",
        &format!(
            "cdiVersion: \"0.6.0\"\nkind: kat.test/gpu\ncontainerEdits:\n  env: [KAT_TEST_GPU_VENDOR=kat]\n  hooks: [{{hookName: createRuntime, path: /hooks/mark, args: [mark, {}]}}]\ndevices:\n  - name: \"0\"\n    containerEdits:\n      env: [KAT_TEST_GPU=0]\n      deviceNodes: [{{path: /dev/dri/renderD128}}]\n",
            root.join("marks/created").display()
        ),
    );
    write("hooks/mark", "#!/bin/sh\n/bin/cat > \"$1\"\n");
    write("sys/class/drm/renderD128/device/vendor", "0x1002\n");
    write(
        "sys/class/drm/renderD128/device/mem_info_vram_total",
        "8589934592\n",
    );
    write(
        "sys/class/drm/renderD128/device/product_name",
        "Kat Test GPU\n",
    );
    let node = root.join("dev/dri/renderD128");
    std::fs::create_dir_all(node.parent().expect("parent")).expect("mkdir");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(10, 237),
    )
    .expect("mknod (the test runs as root)");
    // Readable by the agent's user, writable by no one else whatever the umask (the agent
    // refuses a CDI specification others could write).
    let status = Command::new("chmod")
        .args(["-R", "a+rX,go-w", &root.display().to_string()])
        .status()
        .expect("chmod");
    assert!(status.success());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("hooks/mark"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod the hook");
    // The hook runs as the agent's user, which may not be root.
    std::fs::create_dir_all(root.join("marks")).expect("mkdir");
    std::fs::set_permissions(root.join("marks"), std::fs::Permissions::from_mode(0o777))
        .expect("chmod the marks");
}

impl Cluster {
    pub(crate) fn start() -> Cluster {
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
        // Three at once: ports asked for one by one can come back equal.
        let [api_port, etcd_port, peer_port] = free_ports();
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
            peer_port,
            dir.path().join("volumes").display(),
            dir.path().join("backups").display()
        );
        std::fs::write(dir.path().join("cluster.kat"), cluster).expect("write cluster.kat");
        fake_gpu_root(&dir.path().join("gpu-root"));
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
            c.node_ready()
        });
        c
    }

    pub(crate) fn path(&self, p: &str) -> String {
        self.dir.path().join(p).display().to_string()
    }

    pub(crate) fn spawn_agent(&mut self, args: &[&str]) {
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
            // The tests' git daemons are on loopback.
            .args(["--allow-fetch-from", "127.0.0.0/8"])
            .args(["--stop-grace-seconds", "2"])
            .args(["--api-bind", "127.0.0.1"])
            .args(["--dns-upstream", &self.upstream.to_string()])
            .env("KAT_INIT", &self.init)
            // A caller's own tunables (harmless ones): the node's children get them back
            // (the_node_runs_without_thread_caches).
            .env("GLIBC_TUNABLES", CALLERS_TUNABLES)
            .env("KAT_GPU_ROOT", self.path("gpu-root"))
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log));
        if let Ok(parent) = std::env::var("KAT_TEST_CGROUP_PARENT") {
            cmd.args(["--cgroup-parent", &parent]);
        }
        self.agent = Some(cmd.spawn().expect("start kat-agent"));
    }

    /// katcall with the admin config `init` wrote, typed answers and all.
    pub(crate) fn k(&self) -> Katcall {
        Katcall::new(self.path("katcall.yaml"))
    }

    pub(crate) fn katcall(&self, args: &[&str]) -> Output {
        self.k().run(args)
    }

    pub(crate) fn katcall_ok(&self, args: &[&str]) -> String {
        let out = self.katcall(args);
        if !out.status.success() {
            return String::new();
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub(crate) fn must(&self, args: &[&str]) -> String {
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

    pub(crate) fn agent_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub(crate) fn wait(&self, what: &str, timeout: Duration, mut ok: impl FnMut(&Cluster) -> bool) {
        if kat_testkit::wait_until(timeout, || ok(self)).is_some() {
            return;
        }
        // The whole log outlives the test's directory, for what the tail does not show.
        let kept = std::env::temp_dir().join(format!("kat-e2e-agent-{}.log", std::process::id()));
        let _ = std::fs::copy(self.dir.path().join("agent.log"), &kept);
        panic!(
            "timed out waiting for {what} (the whole agent log: {})\nagent log:\n{}",
            kept.display(),
            self.agent_log_tail()
        );
    }

    /// Whether the node is listed `Ready` (not `NotReady`, not `Draining`).
    pub(crate) fn node_ready(&self) -> bool {
        self.k()
            .nodes()
            .iter()
            .any(|n| n.metadata.name == "e2e-node" && n.state == NodeState::Ready)
    }

    pub(crate) fn workload(&self, name: &str) -> Option<WorkloadObject> {
        self.k().workload(name)
    }

    pub(crate) fn instances(&self, name: &str) -> Vec<InstanceStatus> {
        self.k().instances(name)
    }

    /// Whether every instance of `name` is Pending on an image pull.
    pub(crate) fn stuck_pull_pending(&self, name: &str) -> bool {
        let instances = self.instances(name);
        !instances.is_empty()
            && instances.iter().all(|i| {
                i.state == kat_api::wire::InstanceState::Pending
                    && i.reason.as_deref().unwrap_or("").contains("pulling")
            })
    }

    /// Write a workload directory and apply it.
    pub(crate) fn apply(&self, dir: &str, files: &[(&str, String)]) -> String {
        let path = self.write_dir(dir, files);
        self.must(&["apply", "-f", &path])
    }

    /// A Quadlet directory `dir` (under the test's directory) holding `files`, written anew.
    pub(crate) fn write_dir(&self, dir: &str, files: &[(&str, String)]) -> String {
        let path = self.dir.path().join(dir);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("workload dir");
        for (name, text) in files {
            std::fs::write(path.join(name), text).expect("write quadlet");
        }
        path.display().to_string()
    }

    pub(crate) fn curl(&self, args: &[&str]) -> (u16, String) {
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

    pub(crate) fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.api_port)
    }

    pub(crate) fn token(&self) -> String {
        std::fs::read_to_string(self.path("data/pki/admin.token")).expect("token")
    }

    /// The running agent's pid.
    pub(crate) fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(|a| a.id())
    }

    pub(crate) fn kill_agent(&mut self) {
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

/// The `GLIBC_TUNABLES` the tests start the agent with.
pub(crate) const CALLERS_TUNABLES: &str = "glibc.malloc.perturb=0";

/// A process's initial environment: `NAME=value` entries.
pub(crate) fn environment_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// Host pids of workload processes (their environment names the instance), for one
/// instance or all that belong to this test's cluster.
pub(crate) fn workload_pids(instance: Option<&str>) -> Vec<i32> {
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
pub(crate) fn containers_of(instance: &str) -> usize {
    // A container's kat-init has its log directory; an exec's (a health probe's, every
    // second) has none and is no container.
    workload_pids(Some(instance))
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.starts_with(b"/.kat/init") && c.windows(10).any(|w| w == b"--log-dir\0")
            })
        })
        .count()
}

/// Host pids whose command line is exactly `args`.
pub(crate) fn pids_running(args: &[&str]) -> Vec<i32> {
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
