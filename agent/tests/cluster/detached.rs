//! A detached node (RFC 001 §4.9): it runs alone, keeps its workloads, and rejoins.

use super::*;

/// katcall in host `i`'s namespace with the config file `config`.
fn katcall_with(h: &Hosts, i: usize, config: &Path, args: &[&str]) -> Output {
    h.katcall_as(i, config).run(args)
}

/// Shells on this machine whose command line holds `marker`: one per running container of a
/// workload whose command carries it.
fn shells_with(marker: &str) -> usize {
    shell_pids(marker).len()
}

/// The host pids of the `sh` processes whose command line holds `marker`: a workload that
/// was restarted, however quickly, has another. A shell's own fork (a child about to exec
/// `sleep`, which is `sh` with the same command line for a moment, longer on a busy
/// machine) is the same workload: only shells whose parent is not one of them count.
fn shell_pids(marker: &str) -> Vec<u32> {
    let all = marked_shells(marker);
    let parent = |pid: u32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse().ok())
    };
    all.iter()
        .copied()
        .filter(|pid| parent(*pid).is_none_or(|p| !all.contains(&p)))
        .collect()
}

/// Every `sh` process whose command line holds `marker`, forks included.
fn marked_shells(marker: &str) -> Vec<u32> {
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
    let n4 = h
        .k(1)
        .nodes()
        .into_iter()
        .find(|n| n.metadata.name == *laptop)
        .expect("the laptop listed");
    assert_eq!(
        n4.metadata
            .labels
            .get("kat.dws.rip/nodeType")
            .map(String::as_str),
        Some("laptop"),
        "{n4:?}"
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
    let listed = h.katcall_as(WORKER, &local).nodes();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].metadata.name, *laptop, "{listed:?}");
    assert_eq!(
        listed[0]
            .detached
            .as_ref()
            .map(|d| d.parent_cluster.as_str()),
        Some("trio"),
        "{listed:?}"
    );
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
