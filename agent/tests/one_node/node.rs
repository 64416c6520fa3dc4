//! What the node survives and shows: stalls, a killed agent, a reboot without etcd, node
//! admin in events, a delete that leaves nothing, backups; and how it shows its heartbeat
//! and its leadership.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cluster::*;
use crate::jobs::*;
use crate::specs::*;
use crate::stalls::*;
use crate::workloads::*;
use crate::Run;
use kat_api::wire::InstanceState;
use kat_api::wire::{BackupRecord, Event, Node, NodeState, Timestamp};
use kat_testkit::katcall::{all_running_healthy, ids};
use kat_testkit::{bin, holds_for};

pub(crate) fn the_node_runs_without_thread_caches(r: &mut Run) {
    let c = &r.c;
    // The agent runs again at its start with glibc's thread caches off (agent/src/malloc.rs):
    // its own image was given the tunable after the caller's. (glibc's loader ends each
    // value it reads with a NUL in place, so the initial environment shows the tunables as
    // entries of their own.)
    let agent = c.agent_pid().expect("the agent runs");
    let tunables = |pid: u32| {
        environment_of(pid)
            .into_iter()
            .filter(|v| v.starts_with("GLIBC_TUNABLES=") || v.starts_with("KAT_CALLERS_"))
            .collect::<Vec<_>>()
    };
    let own = environment_of(agent);
    assert!(
        own.contains(&format!("GLIBC_TUNABLES={CALLERS_TUNABLES}"))
            && own
                .iter()
                .any(|v| v.ends_with("glibc.malloc.tcache_count=0")),
        "the agent's environment: {own:?}"
    );
    // What it starts (etcd, the network holder) gets the caller's tunables back, unchanged,
    // and no trace of the re-execution.
    let children: Vec<(u32, String)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?;
            (ppid.trim() == agent.to_string()).then_some(())?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains("etcd") || cmdline.contains("__kat-netns-holder"))
                .then_some((pid, cmdline))
        })
        .collect();
    assert!(
        children.iter().any(|(_, c)| c.contains("etcd"))
            && children
                .iter()
                .any(|(_, c)| c.contains("__kat-netns-holder")),
        "the agent's etcd and network holder: {children:?}"
    );
    for (child, cmdline) in children {
        assert_eq!(
            tunables(child),
            vec![format!("GLIBC_TUNABLES={CALLERS_TUNABLES}")],
            "the environment of the agent's child {child} ({cmdline})"
        );
    }
    // Containers get their spec's environment: none of the agent's.
    let workloads = workload_pids(None);
    assert!(!workloads.is_empty(), "no workload runs");
    for pid in workloads {
        assert_eq!(
            tunables(pid as u32),
            Vec::<String>::new(),
            "workload process {pid}"
        );
    }
}

pub(crate) fn the_node_never_stalls(r: &mut Run) {
    let Run {
        c, id: _, second, ..
    } = r;
    // A node that never stalls: idle and half-open connections, and an exec that never
    // reads its stdin, do not slow the API, the heartbeats or the leader.
    let id = second.iter().next().cloned().expect("an instance");
    never_stalls(c, &id);
    an_exec_ends_with_its_client(c, &id);
    a_deleted_tokens_exec_ends(c, &id);
}

pub(crate) fn an_agent_killed_and_restarted_duplicates_nothing(r: &mut Run) {
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
            .any(|i| i.state == InstanceState::Running)
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
        c.node_ready()
    });
    // Watched for a while, not looked at once: a duplicate that comes and goes is caught.
    holds_for(
        "the same instances, one container each, after the restart",
        Duration::from_secs(3),
        || {
            // A look the API did not answer (a timeout under load) shows nothing either way.
            let Some(web) = c.workload("web") else {
                return true;
            };
            let now = ids(&web.status.instances);
            assert_eq!(now, *before, "instances changed across an agent restart");
            for id in before.iter().chain([&*ticker]) {
                let inits = containers_of(id);
                assert_eq!(inits, 1, "instance {id} must run exactly one container");
            }
            true
        },
    );
    // (After counting: an exec's own kat-init is a process of the instance too.)
    // The containers kept their network across the restart.
    let web = c.instances("web");
    let (a, b) = (web[0].instance_id.as_str(), web[1].ip.expect("an address"));
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

pub(crate) fn a_reboot_without_etcd_runs_from_the_local_copy(r: &mut Run) {
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
        |c| c.node_ready(),
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

pub(crate) fn node_admin_and_rollback_show_in_events(r: &mut Run) {
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
        c.node_ready()
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

pub(crate) fn delete_leaves_no_containers_cgroups_or_mounts(r: &mut Run) {
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

pub(crate) fn backups_are_taken_listed_and_pruned(r: &mut Run) {
    let Run { c, .. } = r;
    backups(c);
}

/// The leader's scheduled backups (every minute here) and `katcall backup create`: files with
/// their checksum in backupPath, recorded and listed, events, the newest two kept.
pub(crate) fn backups(c: &Cluster) {
    let list = |c: &Cluster| -> Vec<BackupRecord> {
        c.k()
            .json(&["get", "backups", "-o", "json"])
            .unwrap_or_default()
    };
    c.wait("a scheduled backup", Duration::from_secs(90), |c| {
        list(c).iter().any(|b| b.trigger == "schedule")
    });
    for _ in 0..3 {
        let made: BackupRecord = c
            .k()
            .json(&["backup", "create", "-o", "json"])
            .expect("the backup as JSON");
        assert_eq!(made.trigger, "manual");
        let path = PathBuf::from(&made.path);
        assert!(path.starts_with(c.path("backups")), "{path:?}");
        let sum = std::fs::read_to_string(format!("{}.sha256", path.display())).unwrap();
        assert!(sum.starts_with(&made.sha256), "{sum}");
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
    let events: Vec<Event> = c
        .k()
        .json(&["events", "--for-kind", "Cluster", "-o", "json"])
        .expect("events as JSON");
    assert!(
        events
            .iter()
            .filter(|e| e.reason == "BackupCreated")
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
pub(crate) fn node_heartbeat(c: &Cluster) -> (NodeState, Option<Timestamp>) {
    let nodes = c.k().nodes();
    let node = nodes
        .iter()
        .find(|n| n.metadata.name == "e2e-node")
        .unwrap_or_else(|| panic!("e2e-node missing: {nodes:?}"));
    (node.state, node.last_heartbeat)
}

/// `node` is shown as the leader: `yes` in the LEADER column of `get nodes`, `"leader": true`
/// (with `leaderSince`) in `-o json`, `Leader: yes` in `describe node`.
pub(crate) fn leader_shown(c: &Cluster, node: &str) {
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
    let nodes = c.k().nodes();
    let leaders: Vec<&Node> = nodes.iter().filter(|n| n.leader).collect();
    assert_eq!(leaders.len(), 1, "{nodes:?}");
    assert_eq!(leaders[0].metadata.name, node, "{nodes:?}");
    assert!(leaders[0].leader_since.is_some(), "{nodes:?}");
    // A member's capacity is recorded from its own first heartbeat, as a worker's is.
    let approved = leaders[0]
        .approved_capacity
        .as_ref()
        .unwrap_or_else(|| panic!("the member's capacity recorded: {nodes:?}"));
    assert_eq!(approved.allocatable, leaders[0].allocatable, "{nodes:?}");
    let described = c.must(&["describe", "node", node]);
    assert!(described.contains("Leader:      yes, since"), "{described}");
    assert!(
        described.contains(&format!("Name:        {node}")),
        "{described}"
    );
    // katcall's own answer: the node beside its instances and events.
    #[derive(serde::Deserialize)]
    struct Described {
        node: Node,
    }
    let described: Described = c
        .k()
        .json(&["describe", "node", node, "-o", "json"])
        .expect("describe node as JSON");
    assert!(described.node.leader, "{:?}", described.node);
    // A node that does not exist: an error naming it.
    let missing = c.katcall(&["describe", "node", "nosuchnode"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("node nosuchnode not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}
