//! Three KAT nodes on test hosts (network namespaces on a bridge, `tests/cluster/hosts.sh`),
//! through the documented commands: `kat-agent init` on the first, `kat-agent join
//! --etcd-peer` on the others with a control-plane token (`katcall create join-token
//! --control-plane`) in KAT_JOIN_TOKEN and the printed CA pin; a 3-member etcd quorum under
//! mutual TLS; bad joins refused with nothing written (among them the worker token `init`
//! printed asking for etcd membership, and an address the join does not come from); a 6-replica Service spread 2/2/2; the
//! leader's agent and etcd killed: a new leader within 10 s, the workloads intact, the dead
//! node's instances rescheduled; the node back: nothing runs twice. A fourth host joins as a
//! worker (no `--etcd-peer`): etcd refuses its certificate, the leader's API gives it its own
//! records only, logs and exec reach its instances through the control plane, and it follows
//! the leader through a failover by itself.
//!
//! Each agent runs as its own unprivileged user (`kat-hN`, prepared by `kat-agent setup` as
//! in production: a subuid range, cgroup parents handed over on this v1/hybrid host), with
//! its own data directory; `KAT_TEST_CLUSTER_AS_ROOT=1` runs them as root instead.
//!
//! `restore_drill` is the disaster drill of docs/operations.md: a backup, every node's etcd
//! data destroyed, `kat-agent restore` on one node and `rejoin` on the others.
//!
//! Needs root (network namespaces, users), etcd, etcdctl, docker-registry and the fixtures of
//! `scripts/test-fixtures.sh` (KAT_TEST_LAYOUT); `scripts/test.sh` provides all of them.

use kat_testkit::{bin, wait};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Control-plane nodes (etcd members).
const NODES: usize = 3;
/// Test hosts: the members and one worker.
const HOSTS: usize = NODES + 1;
const WORKER: usize = HOSTS;
const API_PORT: u16 = 9115;

fn hosts_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cluster/hosts.sh")
}

/// The user host `i`'s agent runs as.
fn user(i: usize) -> String {
    format!("kat-h{i}")
}

fn ip(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

/// The test hosts and the registry on the bridge; everything goes in Drop, even on failure.
struct Hosts {
    prefix: String,
    dir: tempfile::TempDir,
    registry: Option<Child>,
    registry_addr: String,
    agents: BTreeMap<usize, Child>,
    /// Agents run as their own users (`kat-hN`), not root.
    unprivileged: bool,
    /// One set of test hosts at a time: the tests of this file share names and addresses.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    fn up() -> Hosts {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the cluster test makes network namespaces: run it as root (scripts/test.sh does)"
        );
        // A test that failed earlier poisons the lock; its hosts are gone all the same.
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let prefix = format!("kc{}", std::process::id() % 10_000);
        let _ = Command::new(hosts_sh()).args(["down", &prefix]).status();
        let ok = Command::new(hosts_sh())
            .args(["up", &prefix, &HOSTS.to_string()])
            .status()
            .expect("hosts.sh");
        assert!(ok.success(), "hosts.sh up failed");
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
    fn setup(&self, i: usize, uninstall: bool) -> Command {
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
    fn start_registry(&mut self) {
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

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    fn data(&self, i: usize) -> PathBuf {
        self.path(&format!("n{i}"))
    }

    /// The katcall configuration `init` writes (n1's is the admin's).
    fn client_config(&self, i: usize) -> PathBuf {
        self.data(i).join("katcall.yaml")
    }

    /// `nsenter` into host `i`'s network namespace (not `ip netns exec`, which mounts a
    /// fresh /sys and hides the cgroup hierarchies); it execs the program, keeping its pid.
    fn in_ns(&self, i: usize) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns(i))).arg("--");
        c
    }

    /// `kat-agent ARGS` in host `i`'s namespace, as its user, with the node's usual options.
    fn agent_command(&self, i: usize, args: &[&str]) -> Command {
        self.agent_command_advertising(i, args, &ip(i))
    }

    /// As [`Hosts::agent_command`], advertising `address` (another host's, for a join that
    /// must be refused).
    fn agent_command_advertising(&self, i: usize, args: &[&str], address: &str) -> Command {
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
    fn tool_command(&self, i: usize, args: &[&str]) -> Command {
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

    fn spawn(&mut self, i: usize, args: &[&str]) {
        let command = self.agent_command(i, args);
        self.spawn_command(i, command);
    }

    /// `kat-agent join ARGS` on host `i` with `token` in KAT_JOIN_TOKEN (never on the
    /// command line, where every local user would see it).
    fn spawn_join(&mut self, i: usize, token: &str, args: &[&str]) {
        let mut command = self.agent_command(i, args);
        command.env("KAT_JOIN_TOKEN", token);
        self.spawn_command(i, command);
    }

    fn spawn_command(&mut self, i: usize, mut command: Command) {
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
    fn kill(&mut self, i: usize) {
        if let Some(mut a) = self.agents.remove(&i) {
            // nsenter execs the agent, so this is the agent's pid.
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// katcall in host `i`'s namespace, with the admin config `init` wrote (its endpoint,
    /// 127.0.0.1:apiPort, is that host's own API).
    fn katcall(&self, i: usize, args: &[&str]) -> Output {
        self.in_ns(i)
            .arg(bin("katcall"))
            .args(args)
            .env("KAT_CONFIG", self.client_config(1))
            .stdin(Stdio::null())
            .output()
            .expect("katcall")
    }

    fn json(&self, i: usize, args: &[&str]) -> Value {
        let out = self.katcall(i, args);
        if !out.status.success() {
            return Value::Null;
        }
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// etcdctl against host `i`'s etcd, with n1's certificate.
    fn etcdctl(&self, i: usize, args: &[&str]) -> Output {
        self.etcdctl_as(1, i, args)
    }

    /// etcdctl against host `i`'s etcd, with node `cert_of`'s certificate.
    fn etcdctl_as(&self, cert_of: usize, i: usize, args: &[&str]) -> Output {
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
    fn status_as(&self, cert_of: usize, url: &str) -> String {
        self.request_as(cert_of, "GET", url, None)
    }

    /// The HTTP status of `METHOD url` (with a JSON `body`) with node `cert_of`'s certificate.
    fn request_as(&self, cert_of: usize, method: &str, url: &str, body: Option<&str>) -> String {
        let pki = self.data(cert_of).join("pki");
        let mut curl = Command::new("curl");
        curl.args(["-X", method]);
        if let Some(body) = body {
            curl.args(["-H", "content-type: application/json", "--data", body]);
        }
        let out = curl
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
            ])
            .args(["--cacert", &pki.join("ca.crt").display().to_string()])
            .args(["--cert", &pki.join("node.crt").display().to_string()])
            .args(["--key", &pki.join("node.key").display().to_string()])
            .arg(url)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn leader(&self, via: usize) -> Option<String> {
        let out = self.etcdctl(
            via,
            &["get", "--print-value-only", "/kat/config/leader_endpoint"],
        );
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    }

    /// The node `get nodes -o json` marks as the leader; panics if more than one is.
    fn leader_node(&self, via: usize) -> Option<String> {
        let nodes = self.json(via, &["get", "nodes", "-o", "json"]);
        let leaders: Vec<String> = nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["leader"] == true)
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        assert!(leaders.len() <= 1, "one leader at most: {nodes}");
        leaders.into_iter().next()
    }

    fn ready_nodes(&self, via: usize) -> Vec<String> {
        self.json(via, &["get", "nodes", "-o", "json"])
            .as_array()
            .map(|l| {
                l.iter()
                    .filter(|n| n["state"] == "Ready")
                    .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Running instances of `workload` by node.
    fn running(&self, via: usize, workload: &str) -> BTreeMap<String, usize> {
        let mut by_node = BTreeMap::new();
        if let Some(list) = self
            .json(via, &["get", "workload", "-o", "json"])
            .as_array()
        {
            for w in list.iter().filter(|w| w["metadata"]["name"] == workload) {
                for i in w["status"]["instances"].as_array().into_iter().flatten() {
                    if i["state"] == "Running" {
                        let node = i["node"].as_str().unwrap_or("?").to_string();
                        *by_node.entry(node).or_default() += 1;
                    }
                }
            }
        }
        by_node
    }
}

fn cluster_kat() -> String {
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
fn printed_join(log: &str) -> Option<(String, String)> {
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
fn control_plane_token(h: &Hosts) -> String {
    let out = h.katcall(
        1,
        &["create", "join-token", "--control-plane", "-o", "json"],
    );
    assert!(out.status.success(), "{out:?}");
    let token: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(token["role"], "control-plane", "{token}");
    token["token"].as_str().unwrap().to_string()
}

/// `kat-agent init` on n1: the (worker token, CA pin) it printed.
fn init_first(h: &mut Hosts) -> (String, String) {
    init_with(h, &cluster_kat())
}

/// `kat-agent init` on n1 with `cluster` as cluster.kat.
fn init_with(h: &mut Hosts, cluster: &str) -> (String, String) {
    std::fs::write(h.path("cluster.kat"), cluster).unwrap();
    let config = h.path("cluster.kat").display().to_string();
    h.spawn(1, &["init", "--config", &config]);
    wait("n1 to be Ready", Duration::from_secs(60), || {
        h.ready_nodes(1) == ["n1"]
    });
    let log = std::fs::read_to_string(h.path("n1.log")).unwrap();
    printed_join(&log).expect("init prints the join command")
}

fn join_args<'a>(leader_api: &'a str, pin: &'a str) -> [&'a str; 6] {
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
fn join_others(h: &mut Hosts, pin: &str) -> Duration {
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
fn apply_spread(h: &Hosts, via: usize, name: &str) -> Duration {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 6\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'echo started; while true; do sleep 1; done']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = h.katcall(via, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// kill -9 of the leader's agent (its etcd goes with it): (the dead node, a live one, the
/// time until another node leads).
fn kill_leader(h: &mut Hosts) -> (usize, usize, Duration) {
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
fn reported_running(h: &Hosts, via: usize, workload: &str) -> usize {
    h.json(via, &["top", "instances", "-o", "json"])
        .as_array()
        .map(|l| {
            l.iter()
                .filter(|i| i["workload"] == workload && i["state"] == "Running")
                .count()
        })
        .unwrap_or(0)
}

/// Apply a one-replica Service `name` placed on the worker by its hostname label, through
/// node `via`; wait until it runs there and its logs and exec work through `via` (the
/// control plane proxies to the worker's own API).
fn pinned(h: &Hosts, via: usize, name: &str) {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 1\n  nodeSelector: {{kat.dws.rip/hostname: n{WORKER}}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'echo started on $(hostname); while true; do sleep 1; done']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    let out = h.katcall(via, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait(
        &format!("{name} running on the worker"),
        Duration::from_secs(60),
        || h.running(via, name).get(&format!("n{WORKER}")) == Some(&1),
    );
    let workloads = h.json(via, &["get", "workloads", "-o", "json"]);
    let id = workloads
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["metadata"]["name"] == name)
        .flat_map(|w| {
            w["status"]["instances"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find_map(|i| i["instanceID"].as_str().map(str::to_string))
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

/// A Job that ran on the worker keeps its output after its record and container are gone:
/// asked through a control-plane node `via`, the leader finds the finished record and the
/// worker serves the log it kept (`katcall logs JOB`, `get instances --all`).
fn a_finished_job_on_the_worker_keeps_its_output(h: &Hosts, via: usize) {
    let app = h.path("report");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: report, namespace: default}}\nspec:\n  type: Job\n  source: {{image: {}/kat/busybox:latest}}\n  nodeSelector: {{kat.dws.rip/hostname: n{WORKER}}}\n  restartPolicy: {{condition: Never}}\n  container:\n    command: [/bin/sh, -c, 'echo report-from-$(hostname); exit 0']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    std::fs::write(
        app.join("job.kat"),
        "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec:\n  completions: 1\n",
    )
    .unwrap();
    let out = h.katcall(via, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut id = String::new();
    wait(
        "the report job to succeed on the worker",
        Duration::from_secs(90),
        || {
            let list = h.json(via, &["get", "instances", "--all", "-o", "json"]);
            match list
                .as_array()
                .into_iter()
                .flatten()
                .find(|i| i["workload"] == "report" && i["state"] == "Succeeded")
            {
                Some(i) => {
                    assert_eq!(i["node"], format!("n{WORKER}").as_str(), "{i}");
                    id = i["instanceID"].as_str().unwrap_or_default().to_string();
                    true
                }
                None => false,
            }
        },
    );
    let worker_log = h.dir.path().join(format!("n{WORKER}.log"));
    wait(
        "the worker to remove the report container",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&worker_log)
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("kept the log of a removed container") && l.contains(&id))
        },
    );
    let out = h.katcall(via, &["logs", "report"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("report-from-"),
        "logs of a finished Job through n{via}: stdout {stdout} stderr {stderr}"
    );
    assert!(
        stderr.contains(&id) && stderr.contains("exit code 0"),
        "{stderr}"
    );
    let out = h.katcall(via, &["delete", "workload", "report"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A worker's certificate: nothing in etcd, only its own records on the leader's API, and
/// no logs or exec on another node. Each refusal beside a positive control.
/// What a workload on the worker sends leaves from the worker's own address. A flood of
/// requests from there to the leader's API (four clients, keep-alive, for 1.5 times
/// `nodeLossTimeoutSeconds`) is limited by address, while the worker's heartbeats, made
/// with its node certificate, count against the node: it never goes NotReady.
fn a_flood_from_the_workers_address_leaves_it_ready(h: &Hosts) {
    let leader = (1..=NODES)
        .find_map(|i| h.leader(i))
        .expect("a leader endpoint");
    let flood_for = Duration::from_secs(12);
    let urls = format!("{leader}/v1alpha1/nodes?n=[1-100000]");
    let flooders: Vec<std::process::Child> = (0..4)
        .map(|_| {
            h.in_ns(WORKER)
                .args(["timeout", &flood_for.as_secs().to_string(), "curl", "-sk"])
                .args(["-w", "\\nCODE:%{http_code}\\n", &urls])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("curl")
        })
        .collect();
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < flood_for {
        let nodes = h.json(1, &["get", "nodes", "-o", "json"]);
        let state = nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["metadata"]["name"] == format!("n{WORKER}").as_str())
            .and_then(|n| n["state"].as_str().map(str::to_string));
        assert_eq!(
            state.as_deref(),
            Some("Ready"),
            "the worker under a flood from its own address, after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        checks += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let (mut sent, mut limited) = (0, 0);
    for f in flooders {
        let out = f.wait_with_output().expect("curl output");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(code) = line.strip_prefix("CODE:") {
                sent += 1;
                limited += usize::from(code == "429");
            }
        }
    }
    eprintln!(
        "flood from the worker's address: {sent} requests, {limited} answered 429; the worker stayed Ready ({checks} checks over {} s)",
        flood_for.as_secs()
    );
    assert!(
        limited > 0,
        "the flood was never limited ({sent} requests): it did not test anything"
    );
    // Each refill of the address's bucket goes to whoever asks first, so with the node
    // counted by address some heartbeats would find it empty: none may.
    let log =
        std::fs::read_to_string(h.dir.path().join(format!("n{WORKER}.log"))).unwrap_or_default();
    let starved: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("too many requests"))
        .collect();
    assert!(
        starved.is_empty(),
        "the worker's own requests were limited with the flood's: {starved:?}"
    );
}

fn worker_cannot_overreach(h: &Hosts) {
    let w = WORKER;
    let worker_pki = h.data(w).join("pki");
    assert!(
        !worker_pki.join("ca.key").exists(),
        "a worker holds the CA key"
    );
    assert!(!h.data(w).join("etcd").exists(), "a worker runs etcd");
    // etcd: a member's certificate is answered, the worker's (same CA) is not.
    assert!(h
        .etcdctl_as(2, 1, &["get", "/kat/schema_version"])
        .status
        .success());
    let out = h.etcdctl_as(w, 1, &["get", "/kat/schema_version"]);
    assert!(!out.status.success(), "etcd answered a worker: {out:?}");
    let out = h.etcdctl_as(
        w,
        1,
        &["put", "/kat/config/leader_endpoint", "https://evil"],
    );
    assert!(
        !out.status.success(),
        "etcd took a write from a worker: {out:?}"
    );

    // The leader's API: another node's records, workloads, tokens, admin routes: 403.
    let leader = (1..=NODES)
        .find_map(|i| h.leader(i))
        .expect("a leader endpoint");
    let api = |path: &str| format!("{leader}/v1alpha1/{path}");
    for path in [
        "nodes/n1/assignments",
        "nodes/n1/templates/default/spread/x",
        "nodes",
        "n/default/workloads",
        "join-tokens",
        "events",
    ] {
        assert_eq!(
            h.status_as(w, &api(path)),
            "403",
            "the worker reached {path}"
        );
    }
    for (path, body) in [
        ("nodes/n1/status", r#"{"node":"n1"}"#),
        ("join-tokens", "{}"),
        ("nodes/n1/drain", "{}"),
        ("nodes/n1/template-problems", "[]"),
    ] {
        assert_eq!(
            h.request_as(w, "POST", &api(path), Some(body)),
            "403",
            "the worker posted to {path}"
        );
    }
    assert_eq!(
        h.request_as(w, "DELETE", &api("nodes/n1"), None),
        "403",
        "the worker removed a node"
    );
    // Logs and exec of an instance on a member: a member's certificate passes (404 for an
    // instance that is not there), the worker's is forbidden.
    let stream = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(2)
    );
    assert_eq!(h.status_as(1, &stream), "404");
    assert_eq!(
        h.status_as(w, &stream),
        "403",
        "the worker read another node's logs"
    );
    // The worker's own API serves the control plane only, and sends others to the leader.
    let on_worker = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(w)
    );
    assert_eq!(h.status_as(1, &on_worker), "404");
    assert_eq!(h.status_as(w, &on_worker), "403");
    assert_eq!(
        h.status_as(1, &format!("https://{}:{API_PORT}/v1alpha1/nodes", ip(w))),
        "421"
    );
}

#[test]
fn three_nodes_join_spread_and_survive_the_leader() {
    let mut h = Hosts::up();
    let (token, pin) = init_first(&mut h);
    let leader_api = format!("{}:{API_PORT}", ip(1));

    // Refused joins write nothing: a wrong secret, a wrong CA pin, a malformed token, the
    // worker token init printed asking for etcd membership (and the CA key), an address the
    // join does not come from, a token on the command line.
    let mut wrong_secret = token.clone();
    wrong_secret.replace_range(wrong_secret.len() - 4.., "0000");
    let bad_pin = format!("sha256:{}", "0".repeat(64));
    let cp_token = control_plane_token(&h);
    let token_in_argv = ["--token", token.as_str()];
    let (own, other) = (ip(2), ip(3));
    for (tok, pin_arg, extra, address, expect) in [
        (
            wrong_secret.as_str(),
            pin.as_str(),
            &[][..],
            &own,
            "wrong secret",
        ),
        (
            token.as_str(),
            bad_pin.as_str(),
            &[][..],
            &own,
            "nothing was sent",
        ),
        (
            "katjoin.nope",
            pin.as_str(),
            &[][..],
            &own,
            "a join token looks like",
        ),
        (
            token.as_str(),
            pin.as_str(),
            &[][..],
            &own,
            "is a worker token: it admits worker nodes only",
        ),
        (
            cp_token.as_str(),
            pin.as_str(),
            &[][..],
            &other,
            "this join comes from 10.77.0.12, not from the advertised address 10.77.0.13",
        ),
        (
            "",
            pin.as_str(),
            &token_in_argv[..],
            &own,
            "visible to every local user",
        ),
    ] {
        let mut args = join_args(&leader_api, pin_arg).to_vec();
        args.extend_from_slice(extra);
        let mut command = h.agent_command_advertising(2, &args, address);
        if !tok.is_empty() {
            command.env("KAT_JOIN_TOKEN", tok);
        }
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expect),
            "{expect}: {err}"
        );
        assert!(
            !h.data(2).join("node.json").exists(),
            "a refused join wrote the identity"
        );
        assert!(
            !h.data(2).join("pki/node.key").exists(),
            "a refused join wrote a key"
        );
    }

    // The two joins as the docs give them: a 3-member quorum, all voting, mutual TLS only.
    let took = join_others(&mut h, &pin);
    eprintln!("join of 2 nodes: {:.1} s", took.as_secs_f64());
    let out = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "3",
            &format!("https://{}:2379/health", ip(2)),
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("health"),
        "etcd answered a client without a certificate"
    );

    // A 6-replica Service spreads 2/2/2.
    apply_spread(&h, 1, "spread");

    // Logs and exec of an instance on every node, through n1's API (proxied to the node
    // that runs it over mutual TLS), exit codes included.
    let workloads = h.json(1, &["get", "workloads", "-o", "json"]);
    let instances = workloads[0]["status"]["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for node in 1..=NODES {
        let id = instances
            .iter()
            .find(|i| i["node"] == format!("n{node}").as_str())
            .and_then(|i| i["instanceID"].as_str())
            .unwrap_or_else(|| panic!("an instance on n{node}: {instances:?}"))
            .to_string();
        let target = format!("spread/{id}");
        wait(
            &format!("logs of {target} through n1"),
            Duration::from_secs(20),
            || {
                let out = h.katcall(1, &["logs", &target]);
                String::from_utf8_lossy(&out.stdout).contains("started")
            },
        );
        let out = h.katcall(
            1,
            &["exec", &target, "--", "sh", "-c", "echo from-$0; exit 7"],
        );
        assert_eq!(out.status.code(), Some(7), "exec on n{node}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("from-sh"),
            "{out:?}"
        );
    }

    // A node's certificate opens no admin route: 403.
    assert_eq!(
        h.status_as(2, &format!("https://{}:{API_PORT}/v1alpha1/nodes", ip(1))),
        "403",
        "a node certificate reached an admin route"
    );

    // A worker joins (no --etcd-peer) with the token init printed, and runs an instance
    // placed on it.
    h.spawn_join(
        WORKER,
        &token,
        &["join", "--leader-api", &leader_api, "--ca-pin", &pin],
    );
    wait("the worker Ready", Duration::from_secs(60), || {
        h.ready_nodes(1).len() == HOSTS
    });
    let roles: BTreeMap<String, String> = h
        .json(1, &["get", "nodes", "-o", "json"])
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let name = n["metadata"]["name"].as_str().unwrap_or("?").to_string();
            let role = n["metadata"]["labels"]["kat.dws.rip/role"]
                .as_str()
                .unwrap_or("?")
                .to_string();
            (name, role)
        })
        .collect();
    assert_eq!(roles[&format!("n{WORKER}")], "worker", "{roles:?}");
    assert_eq!(roles["n2"], "control-plane", "{roles:?}");
    pinned(&h, 1, "onworker");
    a_finished_job_on_the_worker_keeps_its_output(&h, 2);
    worker_cannot_overreach(&h);
    a_flood_from_the_workers_address_leaves_it_ready(&h);
    if h.unprivileged {
        // Every agent (and the etcd it started) runs as its own user, none as root.
        for (i, agent) in &h.agents {
            let status = std::fs::read_to_string(format!("/proc/{}/status", agent.id())).unwrap();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .unwrap()
                .to_string();
            let expected = String::from_utf8(
                Command::new("id")
                    .args(["-u", &user(*i)])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap();
            assert_eq!(uid, expected.trim(), "n{i}'s agent runs as {}", user(*i));
        }
    }

    // The worker restarts as after a reboot (kill -9, then `kat-agent run`): it finds the
    // leader from its saved endpoints, adopts its instance (one, not two) and takes new work.
    h.kill(WORKER);
    h.spawn(WORKER, &["run"]);
    pinned(&h, 1, "afterrestart");
    wait(
        "the worker's first instance adopted, once",
        Duration::from_secs(30),
        || reported_running(&h, 1, "onworker") == 1,
    );

    container_network(&mut h);

    // `get nodes` marks the leader: the node whose endpoint the election recorded.
    let endpoint = h.leader(1).expect("a leader endpoint");
    let marked = h.leader_node(1).expect("a node marked as leader");
    let marked_index: usize = marked.trim_start_matches('n').parse().expect("nN");
    assert!(
        endpoint.contains(&format!("//{}:", ip(marked_index))),
        "{marked} is marked, {endpoint} leads"
    );
    let table = String::from_utf8_lossy(&h.katcall(1, &["get", "nodes"]).stdout).into_owned();
    let leader_rows: Vec<&str> = table
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some("yes"))
        .collect();
    assert!(
        table.lines().next().is_some_and(|h| h.contains("LEADER"))
            && leader_rows.len() == 1
            && leader_rows[0].starts_with(&marked),
        "{table}"
    );

    // Kill the leader's agent (and with it its etcd): a new leader within 10 s.
    let killed = Instant::now();
    let (dead, alive, failover) = kill_leader(&mut h);
    eprintln!("failover: {:.1} s", failover.as_secs_f64());
    assert_eq!(
        format!("n{dead}"),
        marked,
        "the marked leader was the one killed"
    );
    // The new leader is marked, not the dead one.
    wait("the new leader marked", Duration::from_secs(15), || {
        h.leader_node(alive)
            .is_some_and(|n| n != marked && n != format!("n{WORKER}"))
    });
    // Desired state intact, and the dead node's instances rescheduled after the timeout.
    wait(
        "6 running on the 2 live nodes",
        Duration::from_secs(60),
        || {
            let by_node = h.running(alive, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{dead}"))
        },
    );
    eprintln!("rescheduled after {:.1} s", killed.elapsed().as_secs_f64());
    // The worker found the new leader by itself: still Ready, its instance still running,
    // and a workload placed on it now reaches it through the new leader.
    wait(
        "the worker Ready under the new leader",
        Duration::from_secs(30),
        || h.ready_nodes(alive).contains(&format!("n{WORKER}")),
    );
    pinned(&h, alive, "afterfailover");
    assert_eq!(
        h.running(alive, "onworker").get(&format!("n{WORKER}")),
        Some(&1)
    );

    // The node comes back: it stops what was replaced elsewhere; nothing runs twice.
    h.spawn(dead, &["run"]);
    wait("4 Ready nodes again", Duration::from_secs(90), || {
        h.ready_nodes(alive).len() == HOSTS
    });
    wait(
        "exactly 6 running on the nodes",
        Duration::from_secs(30),
        || reported_running(&h, alive, "spread") == 6,
    );

    // A node cut off from the others (its link down, the process alive): its instances are
    // replaced elsewhere after the timeout; when the link is back, it stops its own copies.
    let cut = (1..=NODES).find(|i| *i != alive).unwrap();
    let other = (1..=NODES).find(|i| *i != cut).unwrap();
    let hosts = |verb: &str| {
        let ok = Command::new(hosts_sh())
            .args([verb, &h.prefix, &cut.to_string()])
            .status()
            .unwrap();
        assert!(ok.success(), "hosts.sh {verb}");
    };
    hosts("cut");
    wait(
        "the cut node's instances replaced",
        Duration::from_secs(60),
        || {
            let by_node = h.running(other, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{cut}"))
        },
    );
    hosts("heal");
    wait(
        "4 Ready nodes after the partition",
        Duration::from_secs(90),
        || h.ready_nodes(other).len() == HOSTS,
    );
    wait(
        "exactly 6 running after the partition",
        Duration::from_secs(30),
        || reported_running(&h, other, "spread") == 6,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        reported_running(&h, other, "spread"),
        6,
        "an instance runs twice"
    );
    assert_eq!(h.running(other, "spread").values().sum::<usize>(), 6);

    // `katcall delete node`: the node leaves the quorum, its instances move, its certificate
    // is refused by the API and (new connections) by etcd.
    let gone = (1..=NODES).find(|i| *i != other).unwrap();
    let out = h.katcall(other, &["delete", "node", &format!("n{gone}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait(
        "the removed node's instances moved",
        Duration::from_secs(60),
        || {
            let by_node = h.running(other, "spread");
            by_node.values().sum::<usize>() == 6 && !by_node.contains_key(&format!("n{gone}"))
        },
    );
    let members = h.etcdctl_as(other, other, &["member", "list", "-w", "json"]);
    let v: Value = serde_json::from_slice(&members.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["members"].as_array().map(Vec::len),
        Some(NODES - 1),
        "{v}"
    );
    let stream = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(other)
    );
    wait(
        "the removed node's certificate refused by the API",
        Duration::from_secs(10),
        || h.status_as(gone, &stream) == "401",
    );
    wait(
        "the removed node's certificate refused by etcd",
        Duration::from_secs(15),
        || {
            !h.etcdctl_as(gone, other, &["get", "/kat/schema_version"])
                .status
                .success()
        },
    );
    // The worker learns of it with its next heartbeat answer: its own API refuses the
    // removed node's certificate as well.
    let on_worker = format!(
        "https://{}:{API_PORT}/v1alpha1/n/default/workloads/spread/instances/x/logs",
        ip(WORKER)
    );
    wait(
        "the removed node's certificate refused by the worker",
        Duration::from_secs(15),
        || h.status_as(gone, &on_worker) == "401",
    );
    assert_eq!(h.status_as(other, &on_worker), "404");
    // The same requests with a node that is still a member: answered (the instance does not
    // exist: 404, not 401).
    assert_eq!(h.status_as(other, &stream), "404");
    assert!(h
        .etcdctl_as(other, other, &["get", "/kat/schema_version"])
        .status
        .success());
}

/// A workload `name` pinned to node `node` serving `page` over HTTP on 8080 (and, with
/// `host_port`, publishing it there), with `replicas` instances.
fn apply_server(
    h: &Hosts,
    name: &str,
    node: Option<usize>,
    replicas: u32,
    page: &str,
    host_port: Option<u16>,
) {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    let selector = node
        .map(|n| format!("  nodeSelector: {{kat.dws.rip/hostname: n{n}}}\n"))
        .unwrap_or_default();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: {replicas}\n{selector}  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www; echo {page} $(hostname) > /tmp/www/index.html; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    let ports = match host_port {
        Some(p) => format!("    - {{name: http, containerPort: 8080, hostPort: {p}}}\n"),
        None => "    - {name: http, containerPort: 8080}\n".to_string(),
    };
    std::fs::write(
        app.join("VirtualLoadBalancer.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n{ports}"
        ),
    )
    .unwrap();
    let out = h.katcall(1, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The instances of `workload` (JSON objects), through node `via`.
fn instances(h: &Hosts, via: usize, workload: &str) -> Vec<Value> {
    h.json(via, &["get", "workloads", "-o", "json"])
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["metadata"]["name"] == workload)
        .and_then(|w| w["status"]["instances"].as_array().cloned())
        .unwrap_or_default()
}

/// An HTTP GET of `/index.html` from inside instance `id` of `workload` to `host`:8080,
/// with busybox's nc (its wget crashes in static glibc's resolver).
fn fetch_inside(h: &Hosts, workload: &str, id: &str, host: &str) -> String {
    let script = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} 8080");
    let out = h.katcall(
        1,
        &[
            "exec",
            &format!("{workload}/{id}"),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// [`fetch_inside`] until the page has `token` or `timeout` passed; the last answer.
fn fetch_until(
    h: &Hosts,
    workload: &str,
    id: &str,
    host: &str,
    token: &str,
    timeout: Duration,
) -> String {
    let started = Instant::now();
    loop {
        let page = fetch_inside(h, workload, id, host);
        if page.contains(token) || started.elapsed() > timeout {
            return page;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Container networking across the test hosts: pages by DNS name and instance name across
/// the overlay in both directions (a member and the worker), a capture of the underlay
/// showing only WireGuard, egress with the node's address as source, a published hostPort
/// from the host and another test host (and Pending where every node has it taken), the
/// overlay surviving a restart of the worker's agent, and forced rekeys.
fn container_network(h: &mut Hosts) {
    let token = format!("page-{}", std::process::id());
    apply_server(h, "pa", Some(2), 1, &token, None);
    apply_server(h, "pb", Some(WORKER), 1, &token, None);
    wait(
        "pa on n2 and pb on the worker",
        Duration::from_secs(60),
        || {
            h.running(1, "pa").get("n2") == Some(&1)
                && h.running(1, "pb").get(&format!("n{WORKER}")) == Some(&1)
        },
    );
    let (pa, pb) = (
        instances(h, 1, "pa").remove(0),
        instances(h, 1, "pb").remove(0),
    );
    let (pa_id, pb_id) = (
        pa["instanceID"].as_str().unwrap().to_string(),
        pb["instanceID"].as_str().unwrap().to_string(),
    );
    let (pa_ip, pb_ip) = (
        pa["ip"].as_str().unwrap().to_string(),
        pb["ip"].as_str().unwrap().to_string(),
    );

    // Capture the underlay (the test hosts' bridge) while pages cross it.
    let capture = h.path("underlay.pcap");
    let mut tcpdump = Command::new("tcpdump")
        .args([
            "-Z",
            "root",
            "--immediate-mode",
            "-i",
            &format!("{}-br", h.prefix),
            "-n",
            "-U",
            "-w",
        ])
        .arg(&capture)
        .args(["(udp and not port 53) or net 10.100.0.0/16"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump");
    let mut err = std::io::BufReader::new(tcpdump.stderr.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0) > 0
        && !line.contains("listening")
    {
        line.clear();
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));

    // A member's container to the worker's, by workload name (short and full) and by
    // instance name; and back.
    let full = |w: &str| format!("{w}.default.kat.cluster.local");
    for (from, from_id, to) in [
        ("pa", &pa_id, "pb".to_string()),
        ("pa", &pa_id, full("pb")),
        (
            "pa",
            &pa_id,
            format!("{pb_id}.pb.default.kat.cluster.local"),
        ),
        ("pb", &pb_id, "pa".to_string()),
        ("pb", &pb_id, format!("{pa_id}.{}", full("pa"))),
    ] {
        let page = fetch_until(h, from, from_id, &to, &token, Duration::from_secs(20));
        assert!(
            page.starts_with("HTTP/1.1 200") && page.contains(&token),
            "{from} → {to}: {page}"
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tcpdump.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tcpdump.wait();
    let raw = std::fs::read(&capture).unwrap();
    assert!(
        raw.len() > 1000,
        "the capture saw almost nothing ({} bytes)",
        raw.len()
    );
    assert!(
        !raw.windows(token.len()).any(|w| w == token.as_bytes()),
        "the page crossed the underlay in clear"
    );
    for addr in [&pa_ip, &pb_ip] {
        let bytes: Vec<u8> = addr.split('.').map(|o| o.parse().unwrap()).collect();
        assert!(
            !raw.windows(4).any(|w| w == bytes),
            "container address {addr} visible on the underlay"
        );
    }
    let text = Command::new("tcpdump")
        .args(["-n", "-r"])
        .arg(&capture)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l.contains(".51820 >") && l.contains(".51820: UDP"),
            "not WireGuard on the underlay: {l}"
        );
    }
    eprintln!(
        "underlay capture: {} WireGuard datagrams, nothing else",
        lines.len()
    );

    // Egress: a server outside the cluster (the bridge's host) sees the node's address.
    let outside = std::net::TcpListener::bind("10.77.0.1:0").unwrap();
    let port = outside.local_addr().unwrap().port();
    let seen = std::thread::spawn(move || {
        let (mut c, peer) = outside.accept().ok()?;
        std::io::Write::write_all(&mut c, b"outside\n").ok()?;
        Some(peer.ip().to_string())
    });
    let out = h.katcall(
        1,
        &[
            "exec",
            &format!("pa/{pa_id}"),
            "--",
            "sh",
            "-c",
            &format!("nc -w 3 10.77.0.1 {port} </dev/null"),
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("outside"),
        "{out:?}"
    );
    assert_eq!(
        seen.join().unwrap().as_deref(),
        Some(ip(2).as_str()),
        "the outside sees the node's address"
    );

    // A published port: one instance per node; the fifth has nowhere to go.
    apply_server(h, "hp", None, HOSTS as u32 + 1, &token, Some(18080));
    let started = Instant::now();
    loop {
        let workload = h
            .json(1, &["get", "workloads", "-o", "json"])
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["metadata"]["name"] == "hp")
            .cloned()
            .unwrap_or_default();
        let all = workload["status"]["instances"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let message = workload["status"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let running = all.iter().filter(|i| i["state"] == "Running").count();
        if running == HOSTS
            && message.contains("1 instance(s) Pending")
            && message.contains("host port already in use")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "hp on every node, one Pending for its host port: {running} running, {message:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for i in 1..=HOSTS {
        let url = format!("http://{}:18080/index.html", ip(i));
        wait(
            &format!("the published page on n{i}"),
            Duration::from_secs(20),
            || {
                let from_host = Command::new("curl")
                    .args(["-s", "--max-time", "2", &url])
                    .output()
                    .unwrap();
                let from_other = h
                    .in_ns(if i == 1 { 2 } else { 1 })
                    .args(["curl", "-s", "--max-time", "2", &url])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&from_host.stdout).contains(&token)
                    && String::from_utf8_lossy(&from_other.stdout).contains(&token)
            },
        );
    }
    let out = h.katcall(1, &["delete", "workload", "hp"]);
    assert!(out.status.success());

    // The worker's agent restarts: the overlay (run by its node network holder) carries on,
    // so the member's container still reaches the worker's while the agent is down.
    h.kill(WORKER);
    let killed = Instant::now();
    let mut page = String::new();
    while killed.elapsed() < Duration::from_secs(5) {
        page = fetch_inside(h, "pa", &pa_id, &pb_ip);
        if page.contains(&token) {
            break;
        }
        eprintln!(
            "{:.1} s after the kill: {}",
            killed.elapsed().as_secs_f64(),
            page.trim()
        );
        if std::env::var("KAT_TEST_DIAG").is_ok() {
            for i in [2, WORKER] {
                let ov = std::fs::read_to_string(h.data(i).join("network/overlay.json"))
                    .unwrap_or_default();
                let rec: Value = serde_json::from_slice(
                    &std::fs::read(h.data(i).join("network/holder.json")).unwrap_or_default(),
                )
                .unwrap_or_default();
                let k = rec["keeperPid"].as_i64().unwrap_or(0).to_string();
                // `ip ARGS` in the node's namespaces, through its keeper.
                let ip = |args: &[&str]| {
                    Command::new("nsenter")
                        .args(["-t", &k, "-U", "-n", "--preserve-credentials", "--", "ip"])
                        .args(args)
                        .output()
                        .unwrap()
                };
                let link = ip(&["-s", "-o", "link", "show", "kat-wg"]);
                let neigh = ip(&["neigh"]);
                eprintln!(
                    "DIAG n{i}: {}\n{}\n{}",
                    ov.replace('\n', " "),
                    String::from_utf8_lossy(&link.stdout),
                    String::from_utf8_lossy(&neigh.stdout)
                );
            }
        }
    }
    assert!(
        page.contains(&token),
        "the overlay went down with the worker's agent: {page}"
    );
    eprintln!(
        "worker's agent down: a page across the overlay {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    h.spawn(WORKER, &["run"]);
    // The restarted agent adopts pb: its first heartbeat reports it Running (an empty first
    // report made the leader show it Pending, "not reported yet", for a moment).
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(3) {
        for i in instances(h, 1, "pb") {
            assert_ne!(i["state"], "Pending", "pb across the agent's restart: {i}");
        }
    }
    wait("the worker Ready again", Duration::from_secs(60), || {
        h.ready_nodes(1).len() == HOSTS
    });
    // (If the agent was down longer than nodeLossTimeoutSeconds, pb was replaced: ask again.)
    let running_pb = || {
        instances(h, 1, "pb")
            .iter()
            .find(|i| i["state"] == "Running" && i["node"] == format!("n{WORKER}").as_str())
            .and_then(|i| i["instanceID"].as_str().map(str::to_string))
    };
    let mut seen = None;
    wait(
        "pb running on the worker again",
        Duration::from_secs(60),
        || {
            seen = running_pb();
            seen.is_some()
        },
    );
    let pb_now = seen.expect("a running pb");
    let page = fetch_until(h, "pb", &pb_now, "pa", &token, Duration::from_secs(20));
    assert!(page.contains(&token), "after the worker's restart: {page}");

    // Rekeys (forced every 4 s here): the tunnel keeps working across them.
    let state = |i: usize| -> Vec<Value> {
        std::fs::read(h.data(i).join("network/overlay.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    let started = Instant::now();
    while !state(2).iter().any(|p| {
        p["node"] == format!("n{WORKER}").as_str() && p["handshakes"].as_u64().unwrap_or(0) >= 3
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "several handshakes between n2 and the worker: n2 {:?} worker {:?}\n{}",
            state(2),
            state(WORKER),
            std::fs::read_to_string(h.data(2).join("network/holder.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let page = fetch_until(h, "pa", &pa_id, "pb", &token, Duration::from_secs(20));
    assert!(page.contains(&token), "after rekeys: {page}");
    for w in ["pa", "pb"] {
        let out = h.katcall(1, &["delete", "workload", w]);
        assert!(out.status.success());
    }
}

/// `bench/cluster.sh`: join time, 5 leader failovers (each killed node restarted), and
/// apply-to-running of a 6-replica Service across 3 nodes. Prints one line.
#[test]
#[ignore = "a benchmark: bench/cluster.sh runs it"]
fn cluster_benchmark() {
    let mut h = Hosts::up();
    let (_, pin) = init_first(&mut h);
    let join = join_others(&mut h, &pin);
    let mut failovers = Vec::new();
    for round in 0..5 {
        let (dead, alive, failover) = kill_leader(&mut h);
        eprintln!("failover {}: {:.2} s", round + 1, failover.as_secs_f64());
        failovers.push(failover);
        h.spawn(dead, &["run"]);
        wait("3 Ready nodes again", Duration::from_secs(90), || {
            h.ready_nodes(alive).len() == NODES
        });
    }
    let via = (1..=NODES).find(|i| h.leader(*i).is_some()).unwrap_or(1);
    let mut applies: Vec<Duration> = (0..5)
        .map(|k| {
            let took = apply_spread(&h, via, &format!("bench{k}"));
            eprintln!("apply to running {}: {} ms", k + 1, took.as_millis());
            took
        })
        .collect();
    failovers.sort();
    applies.sort();
    let ready = h.ready_nodes(via).len();
    println!(
        "cluster nodes_ready={ready} join_s={:.1} failover_p50_s={:.1} failover_max_s={:.1} apply_to_running_3nodes_p50_ms={}",
        join.as_secs_f64(),
        failovers[failovers.len() / 2].as_secs_f64(),
        failovers[failovers.len() - 1].as_secs_f64(),
        applies[applies.len() / 2].as_millis()
    );
}

/// Writes `workload.kat` for `name` (and `job.kat` for a Job) and applies it through n1.
fn apply_text(h: &Hosts, name: &str, workload: &str) {
    let app = h.path(name);
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("workload.kat"), workload).unwrap();
    if workload.contains("type: Job") {
        std::fs::write(
            app.join("job.kat"),
            "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec: {completions: 1}\n",
        )
        .unwrap();
    }
    let out = h.katcall(1, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Instance ids of `workload` that run, as the workload's status (through node `via`) says.
fn running_ids(h: &Hosts, via: usize, workload: &str) -> std::collections::BTreeSet<String> {
    instances(h, via, workload)
        .iter()
        .filter(|i| i["state"] == "Running")
        .filter_map(|i| i["instanceID"].as_str().map(str::to_string))
        .collect()
}

/// The disaster drill (`bench/restore-drill.sh` runs it and prints its figures): a 3-node
/// cluster with a Service, a Job and a DaemonService; a backup; a workload applied after it;
/// every agent killed and every node's etcd data destroyed; `kat-agent restore` on n1 and
/// `kat-agent rejoin` on the others. Every workload of the backup comes back with the same
/// instances (the containers that kept running are adopted: none is started twice), and the
/// workload applied after the backup is wholly gone, its containers too.
#[test]
fn restore_drill() {
    let mut h = Hosts::up();
    let backups = h.path("backups");
    std::fs::create_dir_all(&backups).unwrap();
    // Shared by the nodes' users on this one machine (each writes files of its own name).
    std::fs::set_permissions(
        &backups,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let cluster = format!(
        "{}  nodeLossTimeoutSeconds: 45\n  backupPath: {}\n",
        cluster_kat().replace("  nodeLossTimeoutSeconds: 8\n", ""),
        backups.display()
    );
    let (_, pin) = init_with(&mut h, &cluster);
    join_others(&mut h, &pin);
    let image = format!("{}/kat/busybox:latest", h.registry_addr);
    apply_spread(&h, 1, "web");
    apply_text(
        &h,
        "daemon",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: daemon, namespace: default}}\nspec:\n  type: DaemonService\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do sleep 1; done']\n"),
    );
    apply_text(
        &h,
        "batch",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: batch, namespace: default}}\nspec:\n  type: Job\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Never}}\n  container:\n    command: [/bin/sh, -c, 'echo working; sleep 900']\n"),
    );
    let expected = [("web", 6), ("daemon", NODES), ("batch", 1)];
    wait(
        "web, daemon and batch running",
        Duration::from_secs(120),
        || {
            expected
                .iter()
                .all(|(w, n)| running_ids(&h, 1, w).len() == *n)
        },
    );
    let before: BTreeMap<&str, _> = expected
        .iter()
        .map(|(w, _)| (*w, running_ids(&h, 1, w)))
        .collect();

    let made = h.json(1, &["backup", "create", "-o", "json"]);
    let snapshot = PathBuf::from(made["path"].as_str().expect("a backup record"));
    assert!(snapshot.is_file(), "{made}");
    let listed = h.json(2, &["get", "backups", "-o", "json"]);
    assert!(
        listed
            .as_array()
            .is_some_and(|l| l.iter().any(|b| b["name"] == made["name"])),
        "{listed}"
    );
    // Written after the snapshot: must not come back, not even in part.
    apply_text(
        &h,
        "late",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: late, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {image}}}\n  replicas: 3\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do sleep 1; done']\n"),
    );
    wait("late running", Duration::from_secs(60), || {
        running_ids(&h, 1, "late").len() == 3
    });

    // The disaster: every agent (and its etcd) gone, every node's etcd data destroyed. The
    // containers keep running.
    for i in 1..=NODES {
        h.kill(i);
    }
    std::thread::sleep(Duration::from_millis(500));
    for i in 1..=NODES {
        std::fs::remove_dir_all(h.data(i).join("etcd")).expect("n's etcd data");
    }

    // A damaged snapshot is refused before anything changes.
    let damaged = h.path("damaged.db");
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0xff;
    std::fs::write(&damaged, bytes).unwrap();
    std::fs::copy(
        format!("{}.sha256", snapshot.display()),
        format!("{}.sha256", damaged.display()),
    )
    .unwrap();
    let out = h
        .tool_command(
            1,
            &["restore", "--snapshot", &damaged.display().to_string()],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");
    assert!(
        !h.data(1).join("etcd").exists(),
        "a refused restore wrote etcd data"
    );

    let started = Instant::now();
    let out = h
        .tool_command(
            1,
            &["restore", "--snapshot", &snapshot.display().to_string()],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("kat-agent rejoin --leader-api"),
        "{printed}"
    );
    h.spawn(1, &["run"]);
    let leader_api = format!("{}:{API_PORT}", ip(1));
    // (The restored state holds the old leader's endpoint until its lease runs out: wait
    // for the API itself.)
    let other = format!("https://{leader_api}/v1alpha1/nodes/n3/etcd-member");
    let mut refused = String::new();
    wait("n1's API answers", Duration::from_secs(60), || {
        refused = h.request_as(2, "POST", &other, None);
        refused != "000"
    });
    // A node's certificate cannot make another node an etcd member.
    assert_eq!(refused, "403");
    for i in 2..=NODES {
        let out = h
            .tool_command(i, &["rejoin", "--leader-api", &leader_api])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rejoin n{i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        h.spawn(i, &["run"]);
    }
    // Ready from heartbeats sent after the restore (the snapshot holds older ones).
    let restored_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    wait(
        "3 nodes heartbeating again",
        Duration::from_secs(120),
        || {
            h.json(1, &["get", "nodes", "-o", "json"])
                .as_array()
                .is_some_and(|l| {
                    l.len() == NODES
                        && l.iter().all(|n| {
                            n["state"] == "Ready"
                                && n["lastHeartbeat"]
                                    .as_str()
                                    .is_some_and(|t| t > restored_at.as_str())
                        })
                })
        },
    );
    let mut back = 0;
    wait("every workload back", Duration::from_secs(120), || {
        back = expected
            .iter()
            .filter(|(w, n)| running_ids(&h, 1, w).len() == *n)
            .count();
        back == expected.len()
    });
    let restore_s = started.elapsed().as_secs_f64();
    wait("3 voting etcd members", Duration::from_secs(60), || {
        let out = h.etcdctl(1, &["member", "list", "-w", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let members = v["members"].as_array().cloned().unwrap_or_default();
        members.len() == NODES && members.iter().all(|m| m["isLearner"] != true)
    });
    // Adopted, not started again: the same instances, and no more containers than them.
    std::thread::sleep(Duration::from_secs(3));
    let mut duplicates = 0;
    for (w, n) in expected {
        assert_eq!(
            running_ids(&h, 1, w),
            before[w],
            "{w}: other instances than before"
        );
        duplicates += reported_running(&h, 1, w).saturating_sub(n);
    }
    // Nothing of `late`: no workload, no instance, no container on any node.
    assert!(
        instances(&h, 1, "late").is_empty()
            && !h
                .json(1, &["get", "workloads", "-o", "json"])
                .to_string()
                .contains("\"late\""),
        "late came back in part"
    );
    wait("late's containers stopped", Duration::from_secs(60), || {
        reported_running(&h, 1, "late") == 0
    });
    assert_eq!(duplicates, 0, "instances running twice");
    println!(
        "restore_drill workloads_back={back}/{} duplicates={duplicates} restore_s={restore_s:.1}",
        expected.len()
    );
}

/// katcall in host `i`'s namespace with the config file `config`.
fn katcall_with(h: &Hosts, i: usize, config: &Path, args: &[&str]) -> Output {
    h.in_ns(i)
        .arg(bin("katcall"))
        .args(args)
        .env("KAT_CONFIG", config)
        .stdin(Stdio::null())
        .output()
        .expect("katcall")
}

/// Shells on this machine whose command line holds `marker`: one per running container of a
/// workload whose command carries it.
fn shells_with(marker: &str) -> usize {
    shell_pids(marker).len()
}

/// The host pids of the `sh` processes whose command line holds `marker`: a workload that
/// was restarted, however quickly, has another.
fn shell_pids(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "sh")
                && std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// A sample of n1's `/metrics` (admin token): the value of the series `name`, 0 if absent.
fn metric(h: &Hosts, name: &str) -> f64 {
    let config = std::fs::read_to_string(h.client_config(1)).unwrap_or_default();
    let token = config
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap_or_default()
        .trim()
        .to_string();
    let out = h
        .in_ns(1)
        .args(["curl", "-s", "--max-time", "5", "--cacert"])
        .arg(h.data(1).join("pki").join("ca.crt"))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("https://{}:{API_PORT}/metrics", ip(1)))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// Cut host `i` off from n1 (both ways) or restore the link; its LAN (the bridge, the
/// registry, the other hosts) stays.
fn cut_from_leader(h: &Hosts, i: usize, cut: bool) {
    for (chain, flag) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
        let ok = h
            .in_ns(i)
            .args([
                "iptables",
                if cut { "-I" } else { "-D" },
                chain,
                flag,
                &ip(1),
                "-j",
                "DROP",
            ])
            .status()
            .expect("iptables");
        assert!(ok.success(), "iptables in host {i}");
    }
}

/// Send `datagram` to the rejoin group from host `i`'s namespace; whatever comes back
/// within `wait` (nothing, for a request the leader ignores).
fn multicast_from(h: &Hosts, i: usize, datagram: Vec<u8>, wait: Duration) -> Option<Vec<u8>> {
    let ns = format!("/run/netns/{}", h.ns(i));
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).expect("the host's namespace");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a socket");
        socket.set_multicast_ttl_v4(1).unwrap();
        socket
            .send_to(&datagram, (kat_api::wire::REJOIN_GROUP, 9117))
            .expect("send");
        socket.set_read_timeout(Some(wait)).unwrap();
        let mut buf = vec![0u8; 8192];
        socket
            .recv_from(&mut buf)
            .ok()
            .map(|(n, _)| buf[..n].to_vec())
    })
    .join()
    .expect("the sending thread")
}

/// A `REJOIN_REQUEST` for node n4 of cluster trio with `certificate`, signed with `key`.
fn rejoin_request(certificate: &str, key: &str) -> Vec<u8> {
    let mut r = kat_api::wire::RejoinRequest {
        kind: kat_api::wire::REJOIN_REQUEST.into(),
        parent_cluster: "trio".into(),
        node: format!("n{WORKER}"),
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        nonce: format!("{:032x}", rand::random::<u128>()),
        certificate: certificate.into(),
        signature: String::new(),
    };
    r.signature = kat_pki::rejoin::sign(key, &r.signed_bytes()).unwrap();
    serde_json::to_vec(&r).unwrap()
}

/// Detached mode and rejoin (docs/operations.md, "Detached nodes"): n1 leads, n4 is a laptop
/// (`--parent-cluster-name trio --node-type laptop`). n4 is cut off from n1 but keeps its
/// LAN: it goes detached, keeps its Service instance running, and its own API takes a
/// workload (pinned to n4) while n1 moves the Service's instance elsewhere. Forged rejoin
/// requests from n2's namespace get no answer. With the link back, n4's request is
/// answered, it submits its workload, and the parent runs it on n4: every workload runs
/// exactly as often as it should, before, during and after.
#[test]
fn detached_laptop_rejoins() {
    let mut h = Hosts::up();
    let (token, pin) = init_first(&mut h);
    let laptop = format!("n{WORKER}");
    let leader_api = format!("{}:{API_PORT}", ip(1));
    h.spawn_join(
        WORKER,
        &token,
        &[
            "join",
            "--leader-api",
            &leader_api,
            "--ca-pin",
            &pin,
            "--parent-cluster-name",
            "trio",
            "--node-type",
            "laptop",
        ],
    );
    wait("n1 and the laptop Ready", Duration::from_secs(90), || {
        h.ready_nodes(1) == ["n1", laptop.as_str()]
    });
    let nodes = h.json(1, &["get", "nodes", "-o", "json"]);
    let n4 = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["name"] == laptop.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        n4["metadata"]["labels"]["kat.dws.rip/nodeType"], "laptop",
        "{n4}"
    );

    // A parent Service with an instance on each node.
    let image = format!("{}/kat/busybox:latest", h.registry_addr);
    let service = |name: &str, replicas: u32| {
        format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {image}}}\n  replicas: {replicas}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do sleep 1; done; echo {name}-marker']\n")
    };
    apply_text(&h, "roam", &service("roam", 2));
    wait("roam on both nodes", Duration::from_secs(60), || {
        h.running(1, "roam") == BTreeMap::from([("n1".to_string(), 1), (laptop.clone(), 1)])
    });
    assert_eq!(shells_with("roam-marker"), 2);

    // Cut: the laptop goes detached after nodeLossTimeoutSeconds (8 s).
    cut_from_leader(&h, WORKER, true);
    let cut_at = Instant::now();
    let log = h.path(&format!("n{WORKER}.log"));
    // How many times the laptop's agent has said `what` so far.
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    wait("the laptop to go detached", Duration::from_secs(60), || {
        said("is detached from trio") >= 1
    });
    let detached_after = cut_at.elapsed();
    let local = h.data(WORKER).join("detached").join("katcall.yaml");
    let listed = katcall_with(&h, WORKER, &local, &["get", "nodes", "-o", "json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
    assert_eq!(listed[0]["metadata"]["name"], laptop.as_str(), "{listed}");
    assert_eq!(listed[0]["detached"]["parentCluster"], "trio", "{listed}");
    assert!(listed[0]["detached"]["since"].is_string(), "{listed}");
    let table = katcall_with(&h, WORKER, &local, &["get", "nodes"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("Detached"),
        "{}",
        String::from_utf8_lossy(&table.stdout)
    );
    // The parent moves the laptop's instance to n1; the laptop keeps its own running.
    wait("roam rescheduled on n1", Duration::from_secs(60), || {
        h.running(1, "roam").get("n1") == Some(&2)
    });
    assert_eq!(
        shells_with("roam-marker"),
        3,
        "the laptop keeps running what it ran"
    );

    // A workload made on the laptop: pinned to it, running there.
    let app = h.path("notes");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("workload.kat"), service("notes", 1)).unwrap();
    let out = katcall_with(
        &h,
        WORKER,
        &local,
        &["apply", "-f", &app.display().to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait(
        "notes running on the laptop",
        Duration::from_secs(60),
        || shells_with("notes-marker") == 1,
    );
    // And one in a namespace made on the laptop, which the parent does not have: at rejoin
    // the parent refuses it for good, and its bundle is kept on the laptop, not lost.
    let survey = h.path("survey");
    std::fs::create_dir_all(&survey).unwrap();
    std::fs::write(
        survey.join("workload.kat"),
        service("survey", 1).replace("namespace: default", "namespace: field"),
    )
    .unwrap();
    for args in [
        vec!["create", "namespace", "field"],
        vec!["apply", "-f", survey.to_str().unwrap()],
    ] {
        let out = katcall_with(&h, WORKER, &local, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait(
        "survey running on the laptop",
        Duration::from_secs(60),
        || shells_with("survey-marker") == 1,
    );
    let file = katcall_with(&h, WORKER, &local, &["describe", "workload", "notes"]);
    assert!(
        String::from_utf8_lossy(&file.stdout).contains("kat.dws.rip/nodeName=n4"),
        "{}",
        String::from_utf8_lossy(&file.stdout)
    );
    // The laptop's DNS answers for the workload made on it.
    let mut answer = String::new();
    wait(
        "notes resolvable on the laptop",
        Duration::from_secs(30),
        || {
            let out = katcall_with(
                &h,
                WORKER,
                &local,
                &[
                    "exec",
                    "notes",
                    "--",
                    "nslookup",
                    "notes.default.kat.cluster.local",
                ],
            );
            answer = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            out.status.success() && answer.contains("Name:")
        },
    );

    // The laptop's agent restarts while detached: it is detached again at once, and neither
    // its own instance nor the parent's stops in between (they are adopted).
    h.kill(WORKER);
    h.spawn(
        WORKER,
        &[
            "run",
            "--parent-cluster-name",
            "trio",
            "--node-type",
            "laptop",
        ],
    );
    let mut fewest = (1, 3);
    wait(
        "the laptop detached again after a restart",
        Duration::from_secs(60),
        || {
            fewest = (
                fewest.0.min(shells_with("notes-marker")),
                fewest.1.min(shells_with("roam-marker")),
            );
            said("is detached from trio") == 2
                && katcall_with(&h, WORKER, &local, &["get", "nodes"])
                    .status
                    .success()
        },
    );
    assert_eq!(
        fewest,
        (1, 3),
        "an instance stopped while the laptop's agent restarted"
    );
    assert_eq!(
        (shells_with("notes-marker"), shells_with("roam-marker")),
        (1, 3)
    );

    // The parent's admin token opens nothing on the laptop.
    let admin = std::fs::read_to_string(h.client_config(1)).unwrap();
    let pointed = h.path("admin-at-laptop.yaml");
    std::fs::write(
        &pointed,
        admin
            .lines()
            .map(|l| match l.starts_with("endpoint:") {
                true => format!("endpoint: https://{}:{API_PORT}", ip(WORKER)),
                false => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let parent_cmd = katcall_with(&h, WORKER, &pointed, &["get", "workloads"]);
    assert!(
        !parent_cmd.status.success(),
        "the parent's token must not open the laptop's local API"
    );

    // Forged rejoin requests from n2's namespace: another CA's certificate for n4, and n4's
    // own certificate signed with another key. n1 answers neither.
    let ignored_before = metric(&h, "kat_rejoin_requests_total{outcome=\"ignored\"}");
    let stranger_dir = h.path("stranger");
    let stranger = kat_pki::Pki::generate(&stranger_dir, "trio", &laptop, &[]).unwrap();
    let forged = rejoin_request(&stranger.node_cert_pem, &stranger.node_key_pem);
    assert_eq!(
        multicast_from(&h, 2, forged, Duration::from_secs(3)),
        None,
        "a forged request was answered"
    );
    let real_cert = std::fs::read_to_string(h.data(WORKER).join("pki").join("node.crt")).unwrap();
    let stolen = rejoin_request(&real_cert, &stranger.node_key_pem);
    assert_eq!(
        multicast_from(&h, 2, stolen, Duration::from_secs(3)),
        None,
        "a request with a stolen certificate was answered"
    );
    wait(
        "n1 to count the forged requests",
        Duration::from_secs(10),
        || metric(&h, "kat_rejoin_requests_total{outcome=\"ignored\"}") >= ignored_before + 2.0,
    );
    let n1_log = std::fs::read_to_string(h.path("n1.log")).unwrap();
    assert!(
        n1_log.contains("ignored a rejoin request"),
        "n1 says why it ignored them"
    );

    // The link comes back: the laptop's request is answered, it submits notes and rejoins.
    let mut most = (shells_with("notes-marker"), shells_with("roam-marker"));
    cut_from_leader(&h, WORKER, false);
    let healed_at = Instant::now();
    wait("the laptop to rejoin", Duration::from_secs(90), || {
        most = (
            most.0.max(shells_with("notes-marker")),
            most.1.max(shells_with("roam-marker")),
        );
        said("rejoined trio") >= 1
    });
    let rejoined_after = healed_at.elapsed();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("answered this node's rejoin request"),
        "the rejoin went through the multicast exchange"
    );
    assert!(
        text.contains("1 of 2 workload(s) created while detached were submitted"),
        "notes went to the parent, survey did not"
    );
    let refused: Vec<String> = std::fs::read_dir(h.data(WORKER).join("agent/rejoin-refused"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        refused.len() == 1 && refused[0].starts_with("field.survey."),
        "survey's bundle is kept: {refused:?}"
    );
    let namespaces = h.katcall(1, &["get", "namespaces"]);
    assert!(namespaces.status.success());
    assert!(
        !String::from_utf8_lossy(&namespaces.stdout).contains("field"),
        "the parent has neither the laptop's namespace nor its workload"
    );
    wait(
        "survey stopped on the laptop (the parent did not take it)",
        Duration::from_secs(60),
        || shells_with("survey-marker") == 0,
    );
    assert!(metric(&h, "kat_rejoin_requests_total{outcome=\"answered\"}") >= 1.0);
    wait(
        "notes running at the parent, on the laptop",
        Duration::from_secs(60),
        || {
            most = (
                most.0.max(shells_with("notes-marker")),
                most.1.max(shells_with("roam-marker")),
            );
            h.running(1, "notes") == BTreeMap::from([(laptop.clone(), 1)])
                && shells_with("notes-marker") == 1
        },
    );
    wait(
        "roam back to two instances in all",
        Duration::from_secs(60),
        || {
            most.0 = most.0.max(shells_with("notes-marker"));
            shells_with("roam-marker") == 2
        },
    );
    assert_eq!(most.0, 1, "notes never ran twice");
    assert!(most.1 <= 3, "roam ran {} times at once", most.1);
    let at_parent = h.katcall(1, &["describe", "workload", "notes"]);
    let at_parent = String::from_utf8_lossy(&at_parent.stdout);
    assert!(at_parent.contains("kat.dws.rip/nodeName=n4"), "{at_parent}");
    let events = h.katcall(1, &["events", "--for-name", "notes"]);
    assert!(String::from_utf8_lossy(&events.stdout).contains("DetachedWorkloadAccepted"));
    wait(
        "the laptop Ready at the parent",
        Duration::from_secs(30),
        || h.ready_nodes(1).contains(&laptop),
    );
    // A LAN without multicast: cut again (the laptop detaches again), heal with n1 deaf to
    // rejoin requests; the laptop rejoins through the endpoint it knows once the leader has
    // answered it again for a while. notes, now the parent's, keeps running once throughout.
    let drop_requests = |add: bool| {
        let ok = h
            .in_ns(1)
            .args([
                "iptables",
                if add { "-I" } else { "-D" },
                "INPUT",
                "-p",
                "udp",
                "--dport",
                "9117",
                "-j",
                "DROP",
            ])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    drop_requests(true);
    let notes_before = shell_pids("notes-marker");
    cut_from_leader(&h, WORKER, true);
    let mut notes_range = (1, 1);
    wait(
        "the laptop detached a second time",
        Duration::from_secs(60),
        || {
            let n = shells_with("notes-marker");
            notes_range = (notes_range.0.min(n), notes_range.1.max(n));
            said("is detached from trio") == 3
        },
    );
    cut_from_leader(&h, WORKER, false);
    let healed_again = Instant::now();
    wait(
        "the laptop to rejoin without multicast",
        Duration::from_secs(90),
        || {
            let n = shells_with("notes-marker");
            notes_range = (notes_range.0.min(n), notes_range.1.max(n));
            said("rejoined trio") == 2
        },
    );
    let direct_after = healed_again.elapsed();
    drop_requests(false);
    assert!(said("no rejoin offer came") >= 1);
    assert_eq!(
        notes_range,
        (1, 1),
        "notes stopped or ran twice around the second detachment"
    );
    // Not restarted either, however quickly: the very same process.
    assert_eq!(
        shell_pids("notes-marker"),
        notes_before,
        "notes was restarted around the second detachment"
    );
    wait("the laptop Ready again", Duration::from_secs(30), || {
        h.ready_nodes(1).contains(&laptop)
    });
    eprintln!(
        "detached_laptop direct_rejoin_after_s={:.1}",
        direct_after.as_secs_f64()
    );

    // Bad flags are refused before anything starts, naming the flag: a parent that is not the
    // node's cluster, and detached mode on a control-plane node (n1 keeps running).
    let out = h
        .tool_command(
            WORKER,
            &[
                "run",
                "--parent-cluster-name",
                "other",
                "--node-name",
                &laptop,
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--parent-cluster-name") && err.contains("trio"),
        "{err}"
    );
    let out = h
        .tool_command(
            1,
            &["run", "--parent-cluster-name", "trio", "--node-name", "n1"],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("control-plane node"),
        "{err}"
    );
    assert!(h.ready_nodes(1).contains(&"n1".to_string()));
    assert!(
        !h.data(WORKER).join("detached").exists(),
        "the local cluster's state is moved aside"
    );
    eprintln!(
        "detached_laptop detached_after_s={:.1} rejoined_after_s={:.1}",
        detached_after.as_secs_f64(),
        rejoined_after.as_secs_f64()
    );
}

/// Seconds since boot (`/proc/uptime`, CLOCK_BOOTTIME): the clock the in-cluster clients
/// stamp their requests with.
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Writes and applies `web` (3 replicas, a health check, hostPort 18080; its page says
/// `version`) through n1. The server listens a second after it starts, so an instance that
/// took requests before its health check passed would fail them.
fn apply_rollout_web(h: &Hosts, version: &str) {
    let app = h.path("web");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("workload.kat"),
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: web, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 3\n  drainSeconds: 3\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www; echo page {version} $(hostname) > /tmp/www/index.html; sleep 1; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        ),
    )
    .unwrap();
    std::fs::write(
        app.join("VirtualLoadBalancer.kat"),
        "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n    - {name: http, containerPort: 8080, hostPort: 18080}\n  healthCheck:\n    exec: {command: [/bin/sh, -c, 'printf \"GET /index.html HTTP/1.0\\r\\n\\r\\n\" | nc -w 1 127.0.0.1 8080 | grep -q page']}\n    initialDelaySeconds: 1\n    periodSeconds: 1\n    failureThreshold: 2\n",
    )
    .unwrap();
    let out = h.katcall(1, &["apply", "-f", &app.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every instance of `web` runs `version` and is healthy, three of them, none other left.
fn web_rolled_to(h: &Hosts, version: u64) -> bool {
    let list = instances(h, 1, "web");
    list.len() == 3
        && list.iter().all(|i| {
            i["generation"].as_u64() == Some(version)
                && i["state"] == "Running"
                && i["health"] == "Healthy"
        })
}

/// One client's results: (uptime seconds, succeeded).
type Samples = Vec<(f64, bool)>;

/// `rollout requests=N failed=F max_gap_ms=G` over `streams` between `from` and `to`: the
/// gap is the longest time a client went without a successful answer.
fn rollout_figures(streams: &[Samples], from: f64, to: f64) -> (usize, usize, u64) {
    let (mut requests, mut failed, mut gap) = (0, 0, 0.0f64);
    for s in streams {
        let mut last_ok = from;
        for &(t, ok) in s.iter().filter(|(t, _)| *t >= from && *t <= to) {
            requests += 1;
            if ok {
                gap = gap.max(t - last_ok);
                last_ok = t;
            } else {
                failed += 1;
            }
        }
        gap = gap.max(to - last_ok);
    }
    (requests, failed, (gap * 1000.0).round() as u64)
}

/// Parses `ok T` / `fail T` lines.
fn samples(text: &str) -> Samples {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let ok = match w.next()? {
                "ok" => true,
                "fail" => false,
                _ => return None,
            };
            Some((w.next()?.parse().ok()?, ok))
        })
        .collect()
}

/// Rollouts lose no request (issue 28): a 3-replica Service with a health check and a
/// hostPort on 3 nodes, a client on every node asking it by name (a DaemonService) and one on
/// every test host through the published port (10 requests/s each), a Rolling update and a
/// rollback. Replacements get fresh addresses (quarantine) with a MAC derived from them and
/// announced, take traffic only once healthy, and old instances leave DNS and the ports
/// before they drain and stop. Prints `rollout requests=N failed=F max_gap_ms=G`
/// (bench/rollout.sh) and asserts no request failed.
#[test]
fn rollout_loses_no_request() {
    let mut h = Hosts::up();
    let (_, pin) = init_first(&mut h);
    join_others(&mut h, &pin);
    apply_rollout_web(&h, "v1");
    wait(
        "3 healthy instances of web",
        Duration::from_secs(120),
        || web_rolled_to(&h, 1),
    );
    // The by-name clients: one per node.
    apply_text(
        &h,
        "probe",
        &format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: probe, namespace: default}}\nspec:\n  type: DaemonService\n  source: {{image: {}/kat/busybox:latest}}\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'while true; do t=$(cut -d\" \" -f1 /proc/uptime); if printf \"GET /index.html HTTP/1.0\\r\\n\\r\\n\" | nc -w 2 web 8080 | grep -q page; then echo ok $t; else echo fail $t; fi; sleep 0.1; done']\n", h.registry_addr),
    );
    wait("a probe on every node", Duration::from_secs(60), || {
        h.running(1, "probe").len() == NODES
    });
    // The published-port clients: one in every test host's namespace, on its own address.
    let client = r#"import socket, sys, time
while True:
    t = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        s = socket.create_connection((sys.argv[1], 18080), timeout=2)
        s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
        d = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            d += b
        s.close()
        ok = b"page" in d
    except Exception:
        ok = False
    print("ok" if ok else "fail", "%.2f" % t, flush=True)
    time.sleep(max(0.0, t + 0.1 - time.clock_gettime(time.CLOCK_BOOTTIME)))
"#;
    let mut host_clients: Vec<Child> = (1..=NODES)
        .map(|i| {
            h.in_ns(i)
                .args(["python3", "-c", client, &ip(i)])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("python3 client")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let from = uptime();
    apply_rollout_web(&h, "v2");
    let update = wait(
        "web rolled to generation 2",
        Duration::from_secs(180),
        || web_rolled_to(&h, 2),
    );
    eprintln!("rolling update: {:.1} s", update.as_secs_f64());
    std::thread::sleep(Duration::from_secs(2));
    let out = h.katcall(1, &["rollback", "workload", "web"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rollback = wait("web rolled back", Duration::from_secs(180), || {
        let list = instances(&h, 1, "web");
        list.len() == 3
            && list.iter().all(|i| {
                i["generation"].as_u64().is_some_and(|g| g >= 3)
                    && i["state"] == "Running"
                    && i["health"] == "Healthy"
            })
    });
    eprintln!("rollback: {:.1} s", rollback.as_secs_f64());
    // Old instances drain (3 s) and stop after the last step: keep asking meanwhile.
    std::thread::sleep(Duration::from_secs(6));
    let to = uptime() - 1.0;
    let mut streams: Vec<Samples> = Vec::new();
    for mut c in host_clients.drain(..) {
        let _ = c.kill();
        let mut text = String::new();
        if let Some(mut out) = c.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut out, &mut text);
        }
        let _ = c.wait();
        streams.push(samples(&text));
    }
    for i in instances(&h, 1, "probe") {
        let id = i["instanceID"].as_str().unwrap_or_default().to_string();
        let text = String::from_utf8_lossy(&h.katcall(1, &["logs", &format!("probe/{id}")]).stdout)
            .into_owned();
        streams.push(samples(&text));
    }
    assert_eq!(streams.len(), 2 * NODES, "a stream per client");
    let (requests, failed, gap) = rollout_figures(&streams, from, to);
    println!("rollout requests={requests} failed={failed} max_gap_ms={gap}");
    let failures: Vec<String> = streams
        .iter()
        .enumerate()
        .flat_map(|(n, s)| {
            s.iter()
                .filter(|(t, ok)| !ok && *t >= from && *t <= to)
                .map(move |(t, _)| format!("client {n} at +{:.2} s", t - from))
        })
        .collect();
    // Every client asked all along (a busybox client manages about 5 a second).
    let counts: Vec<usize> = streams
        .iter()
        .map(|s| s.iter().filter(|(t, _)| *t >= from && *t <= to).count())
        .collect();
    eprintln!("requests per client over {:.0} s: {counts:?}", to - from);
    assert!(
        counts.iter().all(|n| *n as f64 >= (to - from) * 3.0),
        "a client asked too little: {counts:?} in {:.0} s",
        to - from
    );
    assert_eq!(failed, 0, "failed requests: {failures:?}");
}
