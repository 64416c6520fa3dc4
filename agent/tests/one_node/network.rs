//! Containers on the node's network: addresses, DNS, instance to instance, hostPort.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::*;
use crate::specs::*;
use kat_testkit::free_port;

/// Containers on the node network: an address of the node's subnet on eth0, the node's
/// DNS in resolv.conf, pages fetched from one instance to another by workload name (short
/// and long) and by instance name, and a published hostPort reached from the host.
pub(crate) fn container_network(c: &Cluster, image: &str) {
    let web = c.instances("web");
    let (a, b) = (&web[0], &web[1]);
    let (a_id, b_id) = (a.instance_id.as_str(), b.instance_id.as_str());
    let a_ip = a.ip.expect("an address").to_string();
    assert!(a_ip.starts_with("10.100."), "{a:?}");
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
    let b_ip = b.ip.expect("an address").to_string();
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
            !a.contains(&a_ip) && !a.contains(&b_ip)
        },
    );
    run(b_id, "mv /data/www/away.html /data/www/index.html");
    c.wait(
        "the healthy instance back in the answers",
        Duration::from_secs(20),
        |c| {
            let a = answers(c);
            a.contains(&a_ip) && a.contains(&b_ip)
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

    // The quickstart's example as shipped, but from this run's registry and on a free host
    // port (the quickstart's own node, or anything else, may hold 8080 and 127.0.0.1:5000
    // here), answered by this node's own instance (its id is the page's hostname).
    let hello = tempfile::tempdir().unwrap();
    let hello_port = free_port();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hello");
    for file in ["workload.kat", "VirtualLoadBalancer.kat"] {
        let text = std::fs::read_to_string(shipped.join(file)).unwrap();
        assert!(
            text.contains("127.0.0.1:5000/") || file != "workload.kat",
            "examples/hello names its image at 127.0.0.1:5000: {text}"
        );
        let text = text
            .replace("127.0.0.1:5000/", &format!("{}/", c.registry))
            .replace("hostPort: 8080", &format!("hostPort: {hello_port}"));
        std::fs::write(hello.path().join(file), text).unwrap();
    }
    c.must(&["apply", "-f", &hello.path().display().to_string()]);
    c.wait(
        "examples/hello on its published port",
        Duration::from_secs(30),
        |c| {
            let ids: Vec<String> = c
                .k()
                .instances("hello")
                .iter()
                .map(|i| i.instance_id.to_string())
                .collect();
            let (code, body) = c.curl(&[
                "--max-time",
                "2",
                &format!("http://127.0.0.1:{hello_port}/"),
            ]);
            code == 200
                && ids
                    .iter()
                    .any(|id| body.trim() == format!("hello from {id}"))
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
