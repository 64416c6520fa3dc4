//! The test hosts (network namespaces on a bridge, `tests/cluster/hosts.sh`), their agents
//! and registry, and what the scenarios share: init, join, apply, kill the leader.
//!
//! One file because it is the harness all the scenario files of this test binary build on:
//! `Hosts`, whose Drop takes the agents, registry and namespaces down even on failure, its
//! per-host commands, and the steps made of them (`init_first`, `join_others`, `kill_leader`).

use super::*;

/// Control-plane nodes (etcd members).
pub(crate) const NODES: usize = 3;

/// Test hosts: the members and one worker.
pub(crate) const HOSTS: usize = NODES + 1;

pub(crate) const WORKER: usize = HOSTS;

pub(crate) const API_PORT: u16 = 9115;

pub(crate) fn hosts_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/hosts.sh")
}

/// The user host `i`'s agent runs as.
pub(crate) fn user(i: usize) -> String {
    format!("kat-h{i}")
}

pub(crate) fn ip(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

/// The test hosts and the registry on the bridge; everything goes in Drop, even on failure.
pub(crate) struct Hosts {
    pub(crate) prefix: String,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) registry: Option<Child>,
    pub(crate) registry_addr: String,
    pub(crate) agents: BTreeMap<usize, Child>,
    /// Agents run as their own users (`kat-hN`), not root.
    pub(crate) unprivileged: bool,
    /// One set of test hosts at a time: the tests of this file share names and addresses.
    pub(crate) _serial: std::sync::MutexGuard<'static, ()>,
}

pub(crate) static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Drop for Hosts {
    fn drop(&mut self) {
        for (_, mut a) in std::mem::take(&mut self.agents) {
            let _ = a.kill();
            let _ = a.wait();
        }
        if let Some(mut r) = self.registry.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
        let _ = Command::new(hosts_sh())
            .args(["down", &self.prefix])
            .status();
        if self.unprivileged {
            for i in 1..=HOSTS {
                let _ = self.setup(i, true).output();
            }
        }
        // Containers' overlay mounts under the nodes' data directories.
        let dir = self.dir.path().display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(&dir))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").args(["-l", p]).status();
        }
        if std::thread::panicking() {
            for i in 1..=HOSTS {
                let log = self.dir.path().join(format!("n{i}.log"));
                if let Ok(text) = std::fs::read_to_string(&log) {
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    eprintln!("--- n{i} agent log (last lines) ---");
                    for l in tail.iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
        }
    }
}

impl Hosts {
    pub(crate) fn up() -> Hosts {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the cluster test makes network namespaces: run it as root (scripts/test.sh does)"
        );
        // A test that failed earlier poisons the lock; its hosts are gone all the same.
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // A name of its own for each set of hosts: what the previous set left while the
        // kernel tears it down (a namespace, a veth pair) never collides with this one.
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("k{:03}{}", std::process::id() % 1000, set % 100);
        let ok = Command::new(hosts_sh())
            .args(["up", &prefix, &HOSTS.to_string()])
            .status()
            .expect("hosts.sh");
        if !ok.success() {
            let _ = Command::new(hosts_sh()).args(["down", &prefix]).status();
            panic!("hosts.sh up {prefix} failed (its message is above)");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        // Searchable, so each agent user reaches its own directory below.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod");
        let mut hosts = Hosts {
            prefix,
            dir,
            registry: None,
            registry_addr: String::new(),
            agents: BTreeMap::new(),
            unprivileged: std::env::var("KAT_TEST_CLUSTER_AS_ROOT").as_deref() != Ok("1"),
            _serial: serial,
        };
        for i in 1..=HOSTS {
            let data = hosts.data(i);
            std::fs::create_dir_all(&data).expect("a node's data directory");
            if hosts.unprivileged {
                let out = hosts.setup(i, false).output().expect("kat-agent setup");
                assert!(
                    out.status.success(),
                    "kat-agent setup for {}: {}",
                    user(i),
                    String::from_utf8_lossy(&out.stderr)
                );
                let ok = Command::new("chown")
                    .arg(format!("{}:", user(i)))
                    .arg(&data)
                    .status()
                    .expect("chown");
                assert!(ok.success(), "chown of {}", data.display());
            }
        }
        hosts.start_registry();
        hosts
    }

    /// `kat-agent setup [--uninstall]` for host `i`'s user: the user, its subuid range and
    /// its cgroup parents; what it installs stays in the test directory.
    pub(crate) fn setup(&self, i: usize, uninstall: bool) -> Command {
        let base = self.path(&format!("setup-n{i}"));
        let mut c = Command::new(bin("kat-agent"));
        c.arg("setup");
        if uninstall {
            c.arg("--uninstall");
        }
        c.args(["--user", &user(i)])
            .arg("--prefix")
            .arg(base.join("prefix"))
            .arg("--config-dir")
            .arg(base.join("etc"))
            .arg("--state-dir")
            .arg(base.join("home"))
            .args(["--cgroup-parent", &format!("/{}-n{i}", self.prefix)])
            .env("KAT_INIT", std::env::var("KAT_INIT").expect("KAT_INIT"));
        c
    }

    /// The fixtures' registry storage, served on the bridge so every test host can pull.
    pub(crate) fn start_registry(&mut self) {
        let layout = std::env::var("KAT_TEST_LAYOUT")
            .expect("KAT_TEST_LAYOUT (source the output of scripts/test-fixtures.sh)");
        let storage = Path::new(&layout)
            .parent()
            .expect("fixtures dir")
            .join("registry");
        let port = {
            let l = std::net::TcpListener::bind("10.77.0.1:0").expect("a free port on the bridge");
            l.local_addr().unwrap().port()
        };
        self.registry_addr = format!("10.77.0.1:{port}");
        let config = self.dir.path().join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp: {{addr: {}}}\n",
                storage.display(),
                self.registry_addr
            ),
        )
        .unwrap();
        self.registry = Some(
            Command::new("docker-registry")
                .args(["serve", &config.display().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("docker-registry"),
        );
        wait(
            "the registry on the bridge",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(&self.registry_addr).is_ok(),
        );
    }

    pub(crate) fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub(crate) fn ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    pub(crate) fn data(&self, i: usize) -> PathBuf {
        self.path(&format!("n{i}"))
    }

    /// The katcall configuration `init` writes (n1's is the admin's).
    pub(crate) fn client_config(&self, i: usize) -> PathBuf {
        self.data(i).join("katcall.yaml")
    }

    /// `nsenter` into host `i`'s network namespace (not `ip netns exec`, which mounts a
    /// fresh /sys and hides the cgroup hierarchies); it execs the program, keeping its pid.
    pub(crate) fn in_ns(&self, i: usize) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns(i))).arg("--");
        c
    }

    /// `kat-agent ARGS` in host `i`'s namespace, as its user, with the node's usual options.
    pub(crate) fn agent_command(&self, i: usize, args: &[&str]) -> Command {
        self.agent_command_advertising(i, args, &ip(i))
    }

    /// As [`Hosts::agent_command`], advertising `address` (another host's, for a join that
    /// must be refused).
    pub(crate) fn agent_command_advertising(
        &self,
        i: usize,
        args: &[&str],
        address: &str,
    ) -> Command {
        let mut c = self.tool_command(i, args);
        c.args(["--node-name", &format!("n{i}")])
            .args(["--advertise-address", address])
            .args([
                "--client-config",
                &self.client_config(i).display().to_string(),
            ])
            .args(["--insecure-registry", &self.registry_addr])
            .args(["--stop-grace-seconds", "2"])
            .args(["--cgroup-parent", &format!("/{}-n{i}", self.prefix)])
            .env("KAT_INIT", std::env::var("KAT_INIT").expect("KAT_INIT"))
            // WireGuard rekeys every 2 minutes; the test wants to see a few.
            .env("KAT_WG_REKEY_SECONDS", "4");
        c
    }

    /// A `kat-agent` command that takes no node options (restore, rejoin), in host `i`'s
    /// namespace as its user.
    pub(crate) fn tool_command(&self, i: usize, args: &[&str]) -> Command {
        let mut c = self.in_ns(i);
        if self.unprivileged {
            // setpriv executes the agent in place: the pid we hold (and kill -9) is the agent's.
            c.args(["setpriv", "--reuid", &user(i), "--regid", &user(i)])
                .args(["--init-groups", "--"])
                .env("HOME", self.data(i));
        }
        c.arg(bin("kat-agent"))
            .args(args)
            .args(["--data-dir", &self.data(i).display().to_string()]);
        c
    }

    pub(crate) fn spawn(&mut self, i: usize, args: &[&str]) {
        let command = self.agent_command(i, args);
        self.spawn_command(i, command);
    }

    /// `kat-agent join ARGS` on host `i` with `token` in KAT_JOIN_TOKEN (never on the
    /// command line, where every local user would see it).
    pub(crate) fn spawn_join(&mut self, i: usize, token: &str, args: &[&str]) {
        let mut command = self.agent_command(i, args);
        command.env("KAT_JOIN_TOKEN", token);
        self.spawn_command(i, command);
    }

    pub(crate) fn spawn_command(&mut self, i: usize, mut command: Command) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("n{i}.log")))
            .unwrap();
        let child = command
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start kat-agent");
        self.agents.insert(i, child);
    }

    /// kill -9 of node `i`'s agent; its etcd (a child with a parent-death signal) goes too.
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut a) = self.agents.remove(&i) {
            // nsenter execs the agent, so this is the agent's pid.
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// katcall in host `i`'s namespace, with the admin config `init` wrote (its endpoint,
    /// 127.0.0.1:apiPort, is that host's own API).
    pub(crate) fn katcall(&self, i: usize, args: &[&str]) -> Output {
        self.k(i).run(args)
    }

    /// katcall in host `i`'s namespace with typed answers (see [`Hosts::katcall`]).
    pub(crate) fn k(&self, i: usize) -> Katcall {
        self.katcall_as(i, &self.client_config(1))
    }

    /// katcall in host `i`'s namespace with the client config at `config`.
    pub(crate) fn katcall_as(&self, i: usize, config: &Path) -> Katcall {
        let net = format!("--net=/run/netns/{}", self.ns(i));
        Katcall::new(config).under(&["nsenter", &net, "--"])
    }

    /// etcdctl against host `i`'s etcd, with n1's certificate.
    pub(crate) fn etcdctl(&self, i: usize, args: &[&str]) -> Output {
        self.etcdctl_as(1, i, args)
    }

    /// etcdctl against host `i`'s etcd, with node `cert_of`'s certificate.
    pub(crate) fn etcdctl_as(&self, cert_of: usize, i: usize, args: &[&str]) -> Output {
        let pki = self.data(cert_of).join("pki");
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &format!("https://{}:2379", ip(i))])
            .args(["--cacert", &pki.join("ca.crt").display().to_string()])
            .args(["--cert", &pki.join("node.crt").display().to_string()])
            .args(["--key", &pki.join("node.key").display().to_string()])
            .args(["--command-timeout", "3s"])
            .args(args)
            .output()
            .expect("etcdctl (apt install etcd-client)")
    }

    /// The HTTP status of `GET url` with node `cert_of`'s certificate as client certificate.
    pub(crate) fn status_as(&self, cert_of: usize, url: &str) -> String {
        self.request_as(cert_of, "GET", url, None)
    }

    /// The HTTP status of `METHOD url` (with a JSON `body`) with node `cert_of`'s certificate.
    pub(crate) fn request_as(
        &self,
        cert_of: usize,
        method: &str,
        url: &str,
        body: Option<&str>,
    ) -> String {
        let mut curl = self.curl_as(cert_of);
        curl.args(["-X", method]);
        if let Some(body) = body {
            curl.args(["-H", "content-type: application/json", "--data", body]);
        }
        let out = curl
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg(url)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The body of `GET url` with node `cert_of`'s certificate (empty unless 2xx).
    pub(crate) fn body_as(&self, cert_of: usize, url: &str) -> String {
        let out = self
            .curl_as(cert_of)
            .arg("--fail")
            .arg(url)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// curl with node `cert_of`'s certificate, trusting the cluster CA, 5 s at most.
    fn curl_as(&self, cert_of: usize) -> Command {
        let pki = self.data(cert_of).join("pki");
        let mut curl = Command::new("curl");
        curl.args(["-s", "--max-time", "5"])
            .args(["--cacert", &pki.join("ca.crt").display().to_string()])
            .args(["--cert", &pki.join("node.crt").display().to_string()])
            .args(["--key", &pki.join("node.key").display().to_string()]);
        curl
    }

    pub(crate) fn leader(&self, via: usize) -> Option<String> {
        let out = self.etcdctl(
            via,
            &["get", "--print-value-only", "/kat/config/leader_endpoint"],
        );
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    }

    /// The node `get nodes -o json` marks as the leader; panics if more than one is.
    pub(crate) fn leader_node(&self, via: usize) -> Option<String> {
        let nodes = self.k(via).nodes();
        let leaders: Vec<String> = nodes
            .iter()
            .filter(|n| n.leader)
            .map(|n| n.metadata.name.clone())
            .collect();
        assert!(leaders.len() <= 1, "one leader at most: {nodes:?}");
        leaders.into_iter().next()
    }

    pub(crate) fn ready_nodes(&self, via: usize) -> Vec<String> {
        self.k(via)
            .nodes()
            .into_iter()
            .filter(|n| n.state == NodeState::Ready)
            .map(|n| n.metadata.name)
            .collect()
    }

    /// Running instances of `workload` by node.
    pub(crate) fn running(&self, via: usize, workload: &str) -> BTreeMap<String, usize> {
        let mut by_node = BTreeMap::new();
        for i in self.k(via).instances(workload) {
            if i.state == InstanceState::Running {
                let node = i.node.map_or_else(|| "?".to_string(), String::from);
                *by_node.entry(node).or_default() += 1;
            }
        }
        by_node
    }
}

pub(crate) fn cluster_kat() -> String {
    "apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: trio
spec:
  clusterCIDR: 10.100.0.0/16
  serviceCIDR: 10.200.0.0/16
  agentTickSeconds: 1
  nodeLossTimeoutSeconds: 8
"
    .to_string()
}

/// What `init` printed: the worker join token (on a line of its own, not in the join
/// command) and the CA pin of the `kat-agent join …` line.
pub(crate) fn printed_join(log: &str) -> Option<(String, String)> {
    let token = log
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("katjoin."))?;
    let line = log
        .lines()
        .find(|l| l.contains("kat-agent join --leader-api"))?;
    assert!(
        line.contains("--token-file") && !line.contains(token),
        "init prints the token in a join command: {line}"
    );
    let mut words = line.split_whitespace();
    words.find(|w| *w == "--ca-pin")?;
    Some((token.to_string(), words.next()?.to_string()))
}

/// A control-plane join token made with katcall on n1, as an admin adds an etcd member.
pub(crate) fn control_plane_token(h: &Hosts) -> String {
    let token: NewJoinToken = h
        .k(1)
        .json(&["create", "join-token", "--control-plane", "-o", "json"])
        .expect("a control-plane join token as JSON");
    assert_eq!(token.role, JoinRole::ControlPlane, "{token:?}");
    token.token
}

/// `kat-agent init` on n1: the (worker token, CA pin) it printed.
pub(crate) fn init_first(h: &mut Hosts) -> (String, String) {
    init_with(h, &cluster_kat())
}

/// `kat-agent init` on n1 with `cluster` as cluster.kat.
pub(crate) fn init_with(h: &mut Hosts, cluster: &str) -> (String, String) {
    std::fs::write(h.path("cluster.kat"), cluster).unwrap();
    let config = h.path("cluster.kat").display().to_string();
    h.spawn(1, &["init", "--config", &config]);
    wait("n1 to be Ready", Duration::from_secs(60), || {
        h.ready_nodes(1) == ["n1"]
    });
    let log = std::fs::read_to_string(h.path("n1.log")).unwrap();
    printed_join(&log).expect("init prints the join command")
}

pub(crate) fn join_args<'a>(leader_api: &'a str, pin: &'a str) -> [&'a str; 6] {
    [
        "join",
        "--leader-api",
        leader_api,
        "--ca-pin",
        pin,
        "--etcd-peer",
    ]
}

/// The other nodes join as etcd peers with a control-plane token made for them; returns how
/// long until all are Ready and vote.
pub(crate) fn join_others(h: &mut Hosts, pin: &str) -> Duration {
    let leader_api = format!("{}:{API_PORT}", ip(1));
    let token = control_plane_token(h);
    let started = Instant::now();
    for i in 2..=NODES {
        h.spawn_join(i, &token, &join_args(&leader_api, pin));
    }
    wait("3 Ready nodes", Duration::from_secs(120), || {
        h.ready_nodes(1).len() == NODES
    });
    wait("3 voting etcd members", Duration::from_secs(60), || {
        let out = h.etcdctl(1, &["member", "list", "-w", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let members = v["members"].as_array().cloned().unwrap_or_default();
        members.len() == NODES && members.iter().all(|m| m["isLearner"] != true)
    });
    started.elapsed()
}

/// Apply a 6-replica Service `name` through node `via`; returns the time until all 6 run,
/// 2 on each node.
pub(crate) fn apply_spread(h: &Hosts, via: usize, name: &str) -> Duration {
    let started = Instant::now();
    apply_bundle(h, via, name, &[("workload.kat", spread_workload(h, name))]);
    let mut polls = 0;
    loop {
        let by_node = h.running(via, name);
        if by_node.len() == NODES && by_node.values().all(|n| *n == 2) {
            return started.elapsed();
        }
        polls += 1;
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "6 instances of {name} spread 2/2/2 not within 120 s (after {polls} looks): {by_node:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Service of six replicas that the scheduler spreads two per node.
pub(crate) fn spread_workload(h: &Hosts, name: &str) -> String {
    format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 6\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'echo started; while true; do sleep 1; done']\n",
        h.registry_addr
    )
}

/// kill -9 of the leader's agent (its etcd goes with it): (the dead node, a live one, the
/// time until another node leads).
pub(crate) fn kill_leader(h: &mut Hosts) -> (usize, usize, Duration) {
    let before = (1..=NODES)
        .find_map(|i| h.leader(i))
        .expect("a leader endpoint");
    let dead = (1..=NODES)
        .find(|i| before.contains(&format!("//{}:", ip(*i))))
        .expect("the leader is one of the nodes");
    let alive = (1..=NODES).find(|i| *i != dead).unwrap();
    h.kill(dead);
    let failover = wait("a new leader", Duration::from_secs(10), || {
        h.leader(alive).is_some_and(|l| l != before)
    });
    (dead, alive, failover)
}

/// Running instances of `workload` as the nodes themselves report them (records or not).
pub(crate) fn reported_running(h: &Hosts, via: usize, workload: &str) -> usize {
    h.k(via)
        .reported()
        .iter()
        .filter(|i| i.workload == workload && i.state == InstanceState::Running)
        .count()
}

/// Apply a one-replica Service `name` placed on the worker by its hostname label, through
/// node `via`; wait until it runs there and its logs and exec work through `via` (the
/// control plane proxies to the worker's own API).
pub(crate) fn pinned(h: &Hosts, via: usize, name: &str) {
    let workload = format!(
        "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 1\n  nodeSelector: {{kat.dws.rip/hostname: n{WORKER}}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'echo started on $(hostname); while true; do sleep 1; done']\n",
        h.registry_addr
    );
    apply_bundle(h, via, name, &[("workload.kat", workload)]);
    wait(
        &format!("{name} running on the worker"),
        Duration::from_secs(60),
        || h.running(via, name).get(&format!("n{WORKER}")) == Some(&1),
    );
    let id = instances(h, via, name)
        .into_iter()
        .next()
        .map(|i| i.instance_id)
        .expect("the instance");
    let target = format!("{name}/{id}");
    wait(
        &format!("logs of {target} through n{via}"),
        Duration::from_secs(20),
        || String::from_utf8_lossy(&h.katcall(via, &["logs", &target]).stdout).contains("started"),
    );
    let out = h.katcall(
        via,
        &["exec", &target, "--", "sh", "-c", "echo from-$0; exit 5"],
    );
    assert_eq!(out.status.code(), Some(5), "exec on the worker: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("from-sh"),
        "{out:?}"
    );
}

/// The instances of `workload`, through node `via`.
pub(crate) fn instances(h: &Hosts, via: usize, workload: &str) -> Vec<InstanceStatus> {
    h.k(via).instances(workload)
}

/// Writes `workload.kat` for `name` (and `job.kat` for a Job) and applies it through n1.
pub(crate) fn apply_text(h: &Hosts, name: &str, workload: &str) {
    let mut files = vec![("workload.kat", workload.to_string())];
    if workload.contains("type: Job") {
        files.push((
            "job.kat",
            "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec: {completions: 1}\n"
                .into(),
        ));
    }
    apply_bundle(h, 1, name, &files);
}

/// Writes the workload directory `name` with `files` (file name, content) and applies it
/// through node `via`, which must accept it.
pub(crate) fn apply_bundle(h: &Hosts, via: usize, name: &str, files: &[(&str, String)]) {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    for (file, text) in files {
        std::fs::write(app.join(file), text).unwrap();
    }
    let out = h.katcall(via, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "applying {name} through n{via}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
