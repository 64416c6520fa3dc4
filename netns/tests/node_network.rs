//! The node network on the real kernel: the holder's namespaces, two containers' namespaces
//! linked to the bridge, TCP between them and to the node, egress through slirp4netns with
//! the host's address as source, sockets made in the node namespace, adoption by a second
//! handle, and the holder stopping once its record is gone. Runs as root and (through
//! scripts/test-rootless.sh) as an unprivileged user with a subordinate id range.
//!
//! One file because its seven tests build their node networks with the same helpers: `config`
//! and `attach_at` (on the run's subordinate ids), `keeper_of`, and `nsenter` and `inside` to
//! run tools in a container's namespaces; each test is one scenario on the real kernel.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use kat_netns::{NodeNetwork, NodeNetworkConfig};
use socket2::{Domain, Type};

fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kat-netns-helper"))
}

/// Our subordinate range, or `None` as root (identity mapping).
fn subordinate() -> Option<(u32, u32, u32, u32)> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return None;
    }
    let name = nix::unistd::User::from_uid(uid).ok()??.name;
    let read = |file: &str| -> Option<(u32, u32)> {
        std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
            let mut f = l.split(':');
            if f.next()? != name {
                return None;
            }
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
    };
    let (us, uc) = read("/etc/subuid").expect("a subuid range for the test user");
    let (gs, gc) = read("/etc/subgid").expect("a subgid range for the test user");
    Some((us, uc, gs, gc))
}

/// The host ids of a container slice: 65536 ids from the first of our range (or 300000).
fn slice() -> (u32, u32) {
    match subordinate() {
        Some((us, _, gs, _)) => (us, gs),
        None => (300_000, 300_000),
    }
}

fn config(dir: &std::path::Path, third: u8) -> NodeNetworkConfig {
    NodeNetworkConfig {
        dir: dir.join("network"),
        helper: helper(),
        subnet: format!("10.231.{third}.0/24").parse().unwrap(),
        cluster_cidr: "10.231.0.0/16".parse().unwrap(),
        subordinate: subordinate(),
        egress: true,
        overlay_port: None,
        systemd_scope: false,
    }
}

/// `nsenter` into the user and network namespaces of `pid`, keeping our credentials.
fn nsenter(pid: i32) -> Command {
    let mut c = Command::new("nsenter");
    c.args([
        "--target",
        &pid.to_string(),
        "--user",
        "--net",
        "--preserve-credentials",
        "--",
    ]);
    c
}

/// A container's namespaces at `address`, mapping the test's id slice.
fn attach_at(
    net: &NodeNetwork,
    address: Ipv4Addr,
) -> Result<kat_netns::Attachment, kat_netns::NetError> {
    let (uid, gid) = slice();
    net.attach(address, vec![(0, uid, 65536)], vec![(0, gid, 65536)])
}

/// Runs `program args` in the user and network namespaces of `pid`.
fn inside(pid: i32, program: &str, args: &[&str]) -> Output {
    nsenter(pid)
        .arg(program)
        .args(args)
        .output()
        .expect("nsenter")
}

fn keeper_of(a: &kat_netns::Attachment) -> i32 {
    a.network_namespace()
        .to_string_lossy()
        .split('/')
        .nth(2)
        .and_then(|p| p.parse().ok())
        .expect("a /proc/PID path")
}

/// A TCP connection from inside `pid` to `to`, through bash's /dev/tcp; returns what the
/// peer answered.
fn fetch_from(pid: i32, to: SocketAddr) -> Output {
    let script = format!(
        "exec 3<>/dev/tcp/{}/{}; echo ping >&3; head -c 64 <&3",
        to.ip(),
        to.port()
    );
    inside(pid, "timeout", &["5", "bash", "-c", &script])
}

/// Accepts one connection on `listener` and answers with the peer's address.
fn answer_once(listener: TcpListener) -> std::thread::JoinHandle<Option<SocketAddr>> {
    std::thread::spawn(move || {
        listener.set_nonblocking(false).ok()?;
        let (mut c, peer) = listener.accept().ok()?;
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).ok()?;
        c.write_all(format!("pong from {peer}\n").as_bytes()).ok()?;
        Some(peer)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_talk_to_each_other_the_node_and_the_outside() {
    let tmp = tempfile::tempdir().unwrap();
    let net = NodeNetwork::start(config(tmp.path(), 1)).expect("node network");
    assert_eq!(net.gateway(), Ipv4Addr::new(10, 231, 1, 1));
    let bridge_mac = || {
        let out = inside(net.keeper_pid(), "ip", &["-br", "link", "show", "kat0"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(bridge_mac(), "02:4b:0a:e7:01:01");
    let (uid, _) = slice();
    let a = attach_at(&net, Ipv4Addr::new(10, 231, 1, 2)).expect("container a");
    let b = attach_at(&net, Ipv4Addr::new(10, 231, 1, 3)).expect("container b");
    let (ka, kb) = (keeper_of(&a), keeper_of(&b));
    // Containers coming and going leave the gateway's hardware address alone (a bridge
    // takes its lowest port's address unless given one; the others would keep sending to
    // the old address until their neighbour entries went stale).
    for i in 10..14 {
        drop(attach_at(&net, Ipv4Addr::new(10, 231, 1, i)).expect("a passing container"));
    }
    assert_eq!(bridge_mac(), "02:4b:0a:e7:01:01");

    // Each container's namespaces map its slice: container root is the slice's first id.
    let map = std::fs::read_to_string(format!("/proc/{ka}/uid_map")).unwrap();
    assert_eq!(
        map.split_whitespace().collect::<Vec<_>>(),
        ["0", &uid.to_string(), "65536"],
        "{map}"
    );
    let addr = inside(ka, "ip", &["-4", "-o", "addr", "show", "eth0"]);
    assert!(
        String::from_utf8_lossy(&addr.stdout).contains("10.231.1.2/24"),
        "{addr:?}"
    );
    let route = inside(ka, "ip", &["route"]);
    assert!(
        String::from_utf8_lossy(&route.stdout).contains("default via 10.231.1.1"),
        "{route:?}"
    );

    // A server in the node namespace (a socket the keeper made), reached from a container.
    let socket = net
        .socket(Domain::IPV4, Type::STREAM)
        .await
        .expect("node socket");
    socket.set_reuse_address(true).unwrap();
    socket
        .bind(&SocketAddr::from(([10, 231, 1, 1], 8080)).into())
        .expect("bind on the bridge address");
    socket.listen(8).unwrap();
    let server = answer_once(socket.into());
    let out = fetch_from(ka, "10.231.1.1:8080".parse().unwrap());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("pong from 10.231.1.2:"),
        "{out:?}"
    );
    assert_eq!(
        server.join().unwrap().map(|p| p.ip()),
        Some("10.231.1.2".parse().unwrap())
    );

    // Container to container across the bridge: b listens (bash cannot, so a node-made
    // socket cannot either: use busybox nc in b).
    let mut nc = nsenter(kb)
        .args([
            "busybox",
            "nc",
            "-l",
            "-p",
            "9000",
            "-e",
            "echo",
            "hello from b",
        ])
        .spawn()
        .expect("busybox nc in b");
    // Waits on a condition: generous, so that a loaded machine only makes it slower.
    let deadline = Instant::now() + Duration::from_secs(20);
    let reply = loop {
        let out = inside(
            ka,
            "timeout",
            &[
                "2",
                "bash",
                "-c",
                "exec 3<>/dev/tcp/10.231.1.3/9000; head -c 64 <&3",
            ],
        );
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = nc.kill();
    let _ = nc.wait();
    assert!(
        String::from_utf8_lossy(&reply.stdout).contains("hello from b"),
        "{reply:?}"
    );

    // Egress: a server on the host's own address (not loopback, which slirp4netns keeps
    // out of reach) sees the host's address as the source, not the container's.
    if let Some(problem) = net.egress_problem() {
        panic!("no egress: {problem}");
    }
    let host_ip = host_address().expect("the host has a non-loopback IPv4 address");
    let listener = TcpListener::bind((host_ip, 0)).unwrap();
    let to = listener.local_addr().unwrap();
    let server = answer_once(listener);
    let out = fetch_from(ka, to);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("pong from"),
        "{out:?}"
    );
    let peer = server.join().unwrap().expect("a connection");
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(host_ip),
        "the outside sees the node's address"
    );

    // The host's loopback is not reachable from a container.
    let local = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = local.local_addr().unwrap().port();
    for target in ["127.0.0.1", "10.0.2.2"] {
        let out = inside(
            ka,
            "timeout",
            &[
                "3",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{target}/{port}"),
            ],
        );
        assert!(
            !out.status.success(),
            "reached the host's loopback through {target}: {out:?}"
        );
    }

    // A second handle (a restarted agent) adopts the same holder.
    let again = NodeNetwork::start(config(tmp.path(), 1)).expect("adopt");
    assert_eq!(again.keeper_pid(), net.keeper_pid());

    // Dropping an attachment ends its keeper; its namespaces go with it.
    drop(a);
    assert!(!std::path::Path::new(&format!("/proc/{ka}")).exists());
    drop(b);

    // The holder stops once its record is gone (a removed data directory).
    let keeper = net.keeper_pid();
    net.remove();
    // Waits on a condition: generous, so that a loaded machine only makes it slower.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::path::Path::new(&format!("/proc/{keeper}")).exists() {
        assert!(Instant::now() < deadline, "the holder did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_address_outside_the_node_subnet_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let net = NodeNetwork::start(config(tmp.path(), 2)).expect("node network");
    let (_, gid) = slice();
    for bad in [Ipv4Addr::new(10, 231, 9, 2), Ipv4Addr::new(10, 231, 2, 1)] {
        let e = attach_at(&net, bad).err().expect("refused");
        assert!(e.to_string().contains("not a container address"), "{e}");
    }
    // Ids outside what the node user namespace maps are refused with the reason.
    let e = net
        .attach(
            Ipv4Addr::new(10, 231, 2, 5),
            vec![(0, u32::MAX - 100, 65536)],
            vec![(0, gid, 65536)],
        )
        .err()
        .expect("refused");
    assert!(e.to_string().contains("not mapped"), "{e}");
    net.remove();
}

/// The MAC `ip neigh` holds for `address` in the namespaces of `pid` (on `dev`), if any.
fn neighbour_mac(pid: i32, address: &str, dev: &str) -> Option<String> {
    let out = inside(pid, "ip", &["neigh", "show", address, "dev", dev]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "lladdr")?;
    words.next().map(str::to_string)
}

/// A container that takes over an address (a replacement in a rolling update) has the MAC
/// derived from it, and announces itself: the bridge (the hostPort relays dial from it) and
/// the node's other containers drop a wrong entry for that address at once instead of
/// sending into nothing until it goes stale.
#[test]
fn a_container_takes_over_its_address_in_neighbour_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let net = NodeNetwork::start(config(tmp.path(), 6)).expect("node network");
    let node = net.keeper_pid();
    let other = attach_at(&net, Ipv4Addr::new(10, 231, 6, 3)).expect("another container");
    let ko = keeper_of(&other);
    // Entries left by a predecessor with another MAC, never confirmed since.
    let stale = "02:00:00:00:00:99";
    for (pid, dev) in [(node, "kat0"), (ko, "eth0")] {
        // As the namespace's root (with our own credentials, `ip` would keep no
        // capability in a container's user namespace, where they are not mapped).
        let out = Command::new("nsenter")
            .args(["--target", &pid.to_string(), "--user", "--net", "--", "ip"])
            .args([
                "neigh",
                "replace",
                "10.231.6.5",
                "lladdr",
                stale,
                "dev",
                dev,
                "nud",
                "stale",
            ])
            .output()
            .expect("nsenter");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            neighbour_mac(pid, "10.231.6.5", dev).as_deref(),
            Some(stale)
        );
    }
    let a = attach_at(&net, Ipv4Addr::new(10, 231, 6, 5)).expect("the replacement");
    let ka = keeper_of(&a);
    let link = inside(ka, "ip", &["-br", "link", "show", "eth0"]);
    let want = kat_netns::neighbour::format_mac(kat_netns::neighbour::mac_for(Ipv4Addr::new(
        10, 231, 6, 5,
    )));
    assert_eq!(want, "02:4b:0a:e7:06:05");
    assert!(
        String::from_utf8_lossy(&link.stdout).contains(&want),
        "{link:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    for (pid, dev) in [(node, "kat0"), (ko, "eth0")] {
        loop {
            let now = neighbour_mac(pid, "10.231.6.5", dev);
            if now.as_deref() == Some(want.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the entry for 10.231.6.5 on {dev} is still {now:?}, not {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(a);
    drop(other);
    net.remove();
}

/// The slirp4netns serving the node network whose keeper is `keeper`.
fn slirp_of(keeper: i32) -> Option<i32> {
    // The holder starts it on the keeper's pid (`slirp4netns [OPTIONS] PID tap0`).
    let wanted = keeper.to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let named = args.first()?.ends_with(b"slirp4netns");
        (named && args.contains(&wanted.as_bytes())).then_some(pid)
    })
}

/// slirp4netns parses every packet containers send out: it runs in its own mount namespace
/// (`--enable-sandbox`) under a seccomp filter (`--enable-seccomp`), and egress still works
/// (`containers_talk_to_each_other_the_node_and_the_outside` fetches through it).
#[test]
fn slirp4netns_runs_sandboxed_under_a_seccomp_filter() {
    let tmp = tempfile::tempdir().unwrap();
    let net = NodeNetwork::start(config(tmp.path(), 3)).expect("node network");
    assert!(net.egress_problem().is_none(), "{:?}", net.egress_problem());
    let pid = slirp_of(net.keeper_pid()).expect("slirp4netns for this node network");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let seccomp = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim);
    assert_eq!(seccomp, Some("2"), "not in seccomp filter mode:\n{status}");
    let mount_ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
    assert_ne!(
        mount_ns(&pid.to_string()),
        mount_ns("self"),
        "slirp4netns shares the host's mount namespace"
    );
    net.remove();
}

fn host_address() -> Option<Ipv4Addr> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().nth(3)?.split('/').next()?.parse().ok())
}

/// Two node networks joined by the overlay on this host's loopback: a container of one
/// fetches a token from a container of the other; a capture of the underlay meanwhile shows
/// only WireGuard datagrams between the two ports (no container address, not the token);
/// a forced rekey keeps the connection; a packet claiming another node's source is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overlay_carries_container_traffic_encrypted() {
    use kat_netns::overlay::Peer;
    let tmp = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_udp_port(), free_udp_port());
    // Rekeys every 2 s (WireGuard's own are every 2 minutes), inherited by the holders.
    std::env::set_var("KAT_WG_REKEY_SECONDS", "2");
    let make = |name: &str, third: u8, port: u16| {
        let mut c = config(&tmp.path().join(name), third);
        c.overlay_port = Some(port);
        NodeNetwork::start(c).expect("node network with an overlay")
    };
    let a = make("a", 11, port_a);
    let b = make("b", 12, port_b);
    assert!(a.overlay_problem().is_none(), "{:?}", a.overlay_problem());
    let key = |n: &NodeNetwork| n.public_key().expect("a public key").to_string();
    let peer = |node: &str, n: &NodeNetwork, port: u16| Peer {
        node: node.into(),
        public_key: key(n),
        endpoint: SocketAddr::from(([127, 0, 0, 1], port)),
        subnet: n.subnet(),
    };
    a.set_peers(&[peer("b", &b, port_b)]).unwrap();
    b.set_peers(&[peer("a", &a, port_a)]).unwrap();
    // The private key never leaves its file, which only the agent's user may read.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(tmp.path().join("a/network/wireguard.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    let ca = attach_at(&a, Ipv4Addr::new(10, 231, 11, 2)).unwrap();
    let cb = attach_at(&b, Ipv4Addr::new(10, 231, 12, 2)).unwrap();
    let (ka, kb) = (keeper_of(&ca), keeper_of(&cb));

    // Capture the underlay (loopback) while the page goes across: as root (an unprivileged
    // run of this test cannot capture; the root run checks it).
    let capture = tmp.path().join("underlay.pcap");
    let as_root = nix::unistd::geteuid().is_root();
    let mut tcpdump = as_root.then(|| {
        let mut child = Command::new("tcpdump")
            .args([
                "-Z",
                "root",
                "--immediate-mode",
                "-i",
                "lo",
                "-n",
                "-U",
                "-w",
            ])
            .arg(&capture)
            .args([
                "udp",
                "port",
                &port_a.to_string(),
                "or",
                "udp",
                "port",
                &port_b.to_string(),
                "or",
                "net",
                "10.231.0.0/16",
            ])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tcpdump (scripts/install-deps.sh installs it)");
        // It says "listening on lo" once it captures.
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0) > 0
            && !line.contains("listening")
        {
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        child
    });

    let token = format!("token-{:016x}", rand_u64());
    let serve = format!("echo {token} | busybox nc -l -p 9000");
    let mut server = nsenter(kb).args(["sh", "-c", &serve]).spawn().unwrap();
    let fetch = "exec 3<>/dev/tcp/10.231.12.2/9000; head -c 64 <&3";
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = inside(ka, "timeout", &["3", "bash", "-c", fetch]);
        if String::from_utf8_lossy(&out.stdout).contains(&token) || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&token),
        "across the overlay: {out:?}"
    );

    if let Some(mut t) = tcpdump.take() {
        std::thread::sleep(Duration::from_secs(1));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(t.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = t.wait();
        let raw = std::fs::read(&capture).unwrap_or_default();
        let text = Command::new("tcpdump")
            .args(["-n", "-r"])
            .arg(&capture)
            .output()
            .unwrap();
        assert!(
            raw.len() > 200,
            "the capture saw nothing: {} bytes, {:?} {:?}",
            raw.len(),
            t.try_wait(),
            String::from_utf8_lossy(&text.stderr)
        );
        assert!(
            !contains(&raw, token.as_bytes()),
            "the token crossed the underlay in clear"
        );
        for addr in [[10u8, 231, 11, 2], [10, 231, 12, 2]] {
            assert!(
                !contains(&raw, &addr),
                "a container address crossed the underlay in clear"
            );
        }
        let text = Command::new("tcpdump")
            .args(["-n", "-r"])
            .arg(&capture)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.lines()
                .all(|l| l.contains(&format!(".{port_a}")) || l.contains(&format!(".{port_b}"))),
            "something other than WireGuard on the underlay:\n{text}"
        );
    }
    // A container of b claiming an address of a's subnet: b's overlay carries the packet,
    // a's drops it (a peer speaks only for its own subnet), so the connection never opens.
    let listen = nsenter(ka)
        .args(["busybox", "nc", "-l", "-p", "9001", "-e", "echo", "reached"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut listen = listen.unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // As the container's root (nsenter without --preserve-credentials becomes uid 0 there).
    let added = Command::new("nsenter")
        .args(["--target", &kb.to_string(), "--user", "--net", "--"])
        .args(["ip", "addr", "add", "10.231.11.99/32", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let forged = inside(
        kb,
        "timeout",
        &[
            "3",
            "busybox",
            "nc",
            "-s",
            "10.231.11.99",
            "10.231.11.2",
            "9001",
        ],
    );
    assert!(
        !String::from_utf8_lossy(&forged.stdout).contains("reached"),
        "a forged source got through: {forged:?}"
    );
    let honest = inside(
        kb,
        "timeout",
        &["3", "busybox", "nc", "10.231.11.2", "9001"],
    );
    assert!(
        String::from_utf8_lossy(&honest.stdout).contains("reached"),
        "{honest:?}"
    );
    let _ = listen.kill();
    let _ = listen.wait();

    // Waits on a condition: generous, so that a loaded machine only makes it slower.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut state = a.overlay_state();
    while state.first().is_none_or(|p| p.rx_bytes == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        state = a.overlay_state();
    }
    assert_eq!(state.len(), 1, "{state:?}");
    assert!(
        state[0].handshakes >= 1 && state[0].rx_bytes > 0,
        "{state:?}"
    );
    // Forced rekeys (every 2 s here) complete, and pages keep coming across meanwhile.
    let mut web = nsenter(kb)
        .args(["busybox", "httpd", "-f", "-p", "9003", "-h", "/"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (mut ok, mut failed) = (0, Vec::new());
    while started.elapsed() < Duration::from_secs(8) {
        let get = "exec 3<>/dev/tcp/10.231.12.2/9003; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; head -c 12 <&3";
        let out = inside(ka, "timeout", &["2", "bash", "-c", get]);
        if String::from_utf8_lossy(&out.stdout).starts_with("HTTP/1") {
            ok += 1;
        } else {
            failed.push(format!("{:.1} s", started.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = web.kill();
    let _ = web.wait();
    let state = a.overlay_state();
    assert!(state[0].handshakes >= 3, "no rekeys: {state:?}");
    assert!(
        failed.is_empty(),
        "{ok} pages, none at {failed:?} (rekeys: {state:?})"
    );
    drop((ca, cb));
    a.remove();
    b.remove();
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

/// Published ports: the relay carries TCP and UDP from the host's addresses to a container,
/// and stops when the port is no longer published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_ports_relay_tcp_and_udp() {
    use kat_api::load_balancer::Protocol;
    use kat_netns::host_ports::PublishedPort;
    let tmp = tempfile::tempdir().unwrap();
    let net = std::sync::Arc::new(NodeNetwork::start(config(tmp.path(), 3)).expect("node network"));
    let address = Ipv4Addr::new(10, 231, 3, 2);
    let c = attach_at(&net, address).unwrap();
    let k = keeper_of(&c);
    let server = "import socket\n\
u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); u.bind(('0.0.0.0',9999))\n\
t=socket.socket(); t.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); t.bind(('0.0.0.0',9998)); t.listen(1)\n\
d,a=u.recvfrom(100); u.sendto(b'udp '+d,a)\n\
s,_=t.accept(); s.sendall(b'tcp '+s.recv(100)); s.close()\n";
    let mut py = nsenter(k)
        .args(["python3", "-c", server])
        .spawn()
        .expect("python3 in the container");
    let tcp_port = TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let udp_port = free_udp_port();
    let ports = vec![
        PublishedPort {
            host_port: tcp_port,
            protocol: Protocol::TCP,
            address,
            container_port: 9998,
        },
        PublishedPort {
            host_port: udp_port,
            protocol: Protocol::UDP,
            address,
            container_port: 9999,
        },
    ];
    let (published, rx) = tokio::sync::watch::channel(ports);
    tokio::spawn(kat_netns::host_ports::serve(net.clone(), rx));
    std::thread::sleep(Duration::from_millis(500));

    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut answer = vec![0u8; 100];
    let mut got = None;
    for _ in 0..20 {
        udp.send_to(b"ping", ("127.0.0.1", udp_port)).await.unwrap();
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(300), udp.recv(&mut answer)).await
        {
            got = Some(String::from_utf8_lossy(&answer[..n]).into_owned());
            break;
        }
    }
    assert_eq!(got.as_deref(), Some("udp ping"));
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", tcp_port))
        .await
        .expect("the TCP port");
    tokio::io::AsyncWriteExt::write_all(&mut tcp, b"hello")
        .await
        .unwrap();
    let mut reply = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut tcp, &mut reply)
        .await
        .unwrap();
    assert_eq!(reply, "tcp hello");
    let _ = py.wait();

    // No longer published: the host port closes.
    published.send_replace(vec![]);
    // Waits on a condition: generous, so that a loaded machine only makes it slower.
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", tcp_port))
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the port stayed open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(c);
    net.remove();
}

/// A rolling update on one node: the relay follows its targets (old, old and new, new)
/// without closing its port, spreads connections over both while both are ready, and a
/// connection under way to the instance that left still completes (it drains).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_port_moves_between_instances_without_refusing() {
    use kat_api::load_balancer::Protocol;
    use kat_netns::host_ports::PublishedPort;
    let tmp = tempfile::tempdir().unwrap();
    let net = std::sync::Arc::new(NodeNetwork::start(config(tmp.path(), 7)).expect("node network"));
    let (old_ip, new_ip) = (Ipv4Addr::new(10, 231, 7, 2), Ipv4Addr::new(10, 231, 7, 3));
    let old = attach_at(&net, old_ip).unwrap();
    let new = attach_at(&net, new_ip).unwrap();
    // Each answers every connection with its name and what it was sent.
    let serve = |name: &str| {
        format!(
            "import socketserver\n\
class H(socketserver.BaseRequestHandler):\n    def handle(self): self.request.sendall(b'{name} '+self.request.recv(100))\n\
socketserver.ThreadingTCPServer.allow_reuse_address=True\n\
socketserver.ThreadingTCPServer(('0.0.0.0',9998),H).serve_forever()\n"
        )
    };
    let mut servers = Vec::new();
    for (k, name) in [(keeper_of(&old), "old"), (keeper_of(&new), "new")] {
        servers.push(
            nsenter(k)
                .args(["python3", "-c", &serve(name)])
                .spawn()
                .expect("python3 in the container"),
        );
    }
    let port = TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let at = |address| PublishedPort {
        host_port: port,
        protocol: Protocol::TCP,
        address,
        container_port: 9998,
    };
    async fn ask(port: u16, what: &str) -> Result<String, String> {
        tokio::time::timeout(Duration::from_secs(5), ask_once(port, what))
            .await
            .map_err(|_| "no answer within 5 s".to_string())?
    }
    async fn ask_once(port: u16, what: &str) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        c.write_all(what.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = String::new();
        c.read_to_string(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply)
    }
    let (published, rx) = tokio::sync::watch::channel(vec![at(old_ip)]);
    tokio::spawn(kat_netns::host_ports::serve(net.clone(), rx));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ask(port, "x").await.as_deref() != Ok("old x") {
        assert!(Instant::now() < deadline, "the old instance never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A connection to the old instance, opened before it leaves and used after.
    let mut draining = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Both ready: new connections go to both, none refused while the targets change.
    published.send_replace(vec![at(old_ip), at(new_ip)]);
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut failures = Vec::new();
    for _ in 0..20 {
        match ask(port, "x").await {
            Ok(reply) => *seen.entry(reply).or_default() += 1,
            Err(e) => failures.push(e),
        }
    }
    assert!(
        seen.contains_key("old x") && seen.contains_key("new x"),
        "{seen:?}"
    );
    // The old one leaves: the port never refuses meanwhile.
    published.send_replace(vec![at(new_ip)]);
    let started = Instant::now();
    let mut asked = 0;
    while started.elapsed() < Duration::from_secs(1) {
        asked += 1;
        match ask(port, "y").await {
            Ok(reply) => assert!(reply == "new y" || reply == "old y", "{reply}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {asked}: {failures:?}",
        failures.len()
    );
    // The connection opened before still reaches the old instance.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        draining.write_all(b"late").await.unwrap();
        let mut reply = String::new();
        draining.read_to_string(&mut reply).await.unwrap();
        assert_eq!(reply, "old late");
    }
    // After the switch settles, only the new instance answers.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        assert_eq!(ask(port, "z").await.as_deref(), Ok("new z"));
    }
    for mut s in servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    drop((old, new));
    net.remove();
}
