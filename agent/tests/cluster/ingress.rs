//! The ingress recipe (`examples/ingress/`) on a real node: its image built with buildah from
//! Debian's Caddy and kat-ingress, run as the DaemonService on the node labelled
//! `kat.dws.rip/role=ingress`, reading the API with an ingress token. Routes by host and
//! path, a rolling update of the backing workload and a change of Caddy's configuration under
//! traffic through the ingress without a failed request, `tls: true` served over HTTPS by
//! Caddy's own CA (`tls internal`, the host has no public name), a rule removed and a
//! VirtualLoadBalancer removed → their routes gone, and the updater's token refused for
//! anything but reading.

use super::*;

/// A Service `name` (2 replicas, health-checked) whose page says `name version`, with the
/// ingress rules `rules` (YAML of one `ingress` entry each).
fn backend(h: &Hosts, name: &str, version: &str, rules: &[&str]) {
    let ingress = if rules.is_empty() {
        String::new()
    } else {
        let entries: String = rules.iter().map(|r| format!("    - {r}\n")).collect();
        format!("  ingress:\n{entries}")
    };
    apply_bundle(h, 1, name, &[
        ("workload.kat", format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: Service\n  source: {{image: {}/kat/busybox:latest}}\n  replicas: 2\n  drainSeconds: 3\n  restartPolicy: {{condition: Always}}\n  container:\n    command: [/bin/sh, -c, 'mkdir -p /tmp/www/api; echo {name} {version} > /tmp/www/index.html; cp /tmp/www/index.html /tmp/www/api/index.html; sleep 1; exec httpd -f -p 8080 -h /tmp/www']\n",
            h.registry_addr
        )),
        ("VirtualLoadBalancer.kat", format!("apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports:\n    - {{name: http, containerPort: 8080}}\n  healthCheck:\n    exec: {{command: [/bin/sh, -c, 'printf \"GET / HTTP/1.0\\r\\n\\r\\n\" | nc -w 1 127.0.0.1 8080 | grep -q {name}']}}\n    initialDelaySeconds: 1\n    periodSeconds: 1\n    failureThreshold: 2\n{ingress}")),
    ]);
}

/// `GET http://IP:port/path` with `Host: host` from host 1's namespace: the status and body.
fn through_ingress(h: &Hosts, port: u16, host: &str, path: &str) -> (String, String) {
    let out = h
        .in_ns(1)
        .args([
            "curl",
            "-s",
            "--max-time",
            "3",
            "-H",
            &format!("Host: {host}"),
        ])
        .args(["-w", "\n%{http_code}"])
        .arg(format!("http://{}:{port}{path}", ip(1)))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().to_string(), body.trim().to_string())
}

/// `GET https://host:port/` from host 1's namespace, `host` resolved to host 1, without
/// verifying the certificate: the body, and curl's verbose report (the certificate's issuer).
fn over_https(h: &Hosts, port: u16, host: &str) -> (String, String) {
    let out = h
        .in_ns(1)
        .args(["curl", "-skv", "--max-time", "3", "--resolve"])
        .arg(format!("{host}:{port}:{}", ip(1)))
        .arg(format!("https://{host}:{port}/"))
        .output()
        .expect("curl");
    (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ingress_routes_by_host_and_path_through_updates() {
    let mut h = Hosts::up();
    // Caddy's certificates go on a simpleClusterStorage volume: under n1's own directory.
    let volumes = h.data(1).join("volumes");
    let cluster = format!("{}  volumeBasePath: {}\n", cluster_kat(), volumes.display());
    init_with(&mut h, &cluster);
    // The recipe's image, from this build's kat-ingress.
    let build = Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ingress/build-image.sh"),
    )
    .args([
        &h.registry_addr,
        &bin("kat-ingress").display().to_string(),
        "--tls-verify=false",
    ])
    .output()
    .expect("build-image.sh");
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );

    // The updater's client config: n1's API on its address, an ingress token, written by
    // `katcall create token --client-config` (0600; the container's user reads it: 0644).
    let dir = PathBuf::from(format!("/srv/kat-ingress-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Cleanup(dir.clone());
    let file = dir.join("client.yaml");
    let endpoint = format!("https://{}:{API_PORT}", ip(1));
    let made: kat_api::wire::NewApiToken = h
        .k(1)
        .json(&[
            "create",
            "token",
            "--ingress",
            "--description",
            "ingress",
            "--client-config",
            &file.display().to_string(),
            "--endpoint",
            &endpoint,
            "-o",
            "json",
        ])
        .expect("an ingress token");
    let written = kat_api::client_config::ClientConfig::load(&file).unwrap();
    // Never over an existing file.
    let again = h.katcall(
        1,
        &[
            "create",
            "token",
            "--read-only",
            "--client-config",
            &file.display().to_string(),
        ],
    );
    assert!(
        !again.status.success(),
        "an existing --client-config file is not overwritten"
    );
    assert_eq!(
        (written.token.as_str(), written.endpoint.as_str()),
        (made.token.as_str(), endpoint.as_str())
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();

    // The recipe as shipped, with the test's registry, ports and config directory.
    let (http, https) = (18180u16, 18543u16);
    let example = |file: &str| {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/ingress")
                .join(file),
        )
        .unwrap()
        .replace("127.0.0.1:5000", &h.registry_addr)
        .replace("hostPort: 80\n", &format!("hostPort: {http}\n"))
        .replace("hostPort: 443\n", &format!("hostPort: {https}\n"))
        .replace("/srv/kat-ingress\n", &format!("{}\n", dir.display()))
    };
    let out = h.katcall(1, &["label", "n1", "kat.dws.rip/role=ingress"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    apply_bundle(
        &h,
        1,
        "ingress",
        &[
            ("workload.kat", example("workload.kat")),
            (
                "VirtualLoadBalancer.kat",
                example("VirtualLoadBalancer.kat"),
            ),
        ],
    );
    backend(
        &h,
        "web",
        "v1",
        &["{host: hello.test, servicePortName: http}"],
    );
    backend(
        &h,
        "api",
        "v1",
        &["{host: hello.test, path: /api, servicePort: 8080}"],
    );
    wait(
        "the ingress routing hello.test",
        Duration::from_secs(120),
        || {
            through_ingress(&h, http, "hello.test", "/")
                .1
                .starts_with("web v1")
                && through_ingress(&h, http, "hello.test", "/api/")
                    .1
                    .starts_with("api v1")
        },
    );
    // An unknown host: 404.
    let (code, body) = through_ingress(&h, http, "other.test", "/");
    assert_eq!(code, "404", "{body}");

    // A rolling update of web under traffic through the ingress: no failed request.
    let client = format!(
        r#"import sys, time, urllib.request
while True:
    t = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        r = urllib.request.urlopen(urllib.request.Request("http://{}:{http}/", headers={{"Host": "hello.test"}}), timeout=3)
        ok = r.status == 200 and r.read().startswith(b"web")
    except Exception:
        ok = False
    print("ok" if ok else "fail", "%.2f" % t, flush=True)
    time.sleep(max(0.0, t + 0.1 - time.clock_gettime(time.CLOCK_BOOTTIME)))
"#,
        ip(1)
    );
    let mut traffic = h
        .in_ns(1)
        .args(["python3", "-c", &client])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 client");
    std::thread::sleep(Duration::from_secs(2));
    // Caddy's configuration changes under the same traffic: a new HTTPS site.
    backend(
        &h,
        "api",
        "v1",
        &[
            "{host: hello.test, path: /api, servicePort: 8080}",
            "{host: secure.test, servicePort: 8080, tls: true}",
        ],
    );
    wait(
        "the HTTPS site secure.test",
        Duration::from_secs(25),
        || over_https(&h, https, "secure.test").0.starts_with("api v1"),
    );
    backend(
        &h,
        "web",
        "v2",
        &["{host: hello.test, servicePortName: http}"],
    );
    wait(
        "web rolled to v2 behind the ingress",
        Duration::from_secs(120),
        || {
            let list = instances(&h, 1, "web");
            list.len() == 2
                && list
                    .iter()
                    .all(|i| i.generation == 2 && i.health == Health::Healthy)
        },
    );
    // The old instances drain (3 s) and stop: keep asking meanwhile.
    std::thread::sleep(Duration::from_secs(6));
    let _ = traffic.kill();
    let mut text = String::new();
    if let Some(mut out) = traffic.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut out, &mut text);
    }
    let _ = traffic.wait();
    let requests = text.lines().count();
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("fail")).collect();
    println!(
        "ingress rollout requests={requests} failed={}",
        failed.len()
    );
    assert!(requests > 50, "the client asked too little: {requests}");
    assert!(
        failed.is_empty(),
        "failed requests through the ingress: {failed:?}"
    );
    assert!(through_ingress(&h, http, "hello.test", "/")
        .1
        .starts_with("web v2"));

    // `tls: true` on a name with no public certificate: Caddy's own CA signed it.
    let (body, verbose) = over_https(&h, https, "secure.test");
    assert!(body.starts_with("api v1"), "{body}");
    assert!(
        verbose.contains("issuer: CN=Caddy Local Authority"),
        "not signed by Caddy's internal CA: {verbose}"
    );

    // A rule removed: its route goes; the other stays.
    backend(
        &h,
        "api",
        "v1",
        &["{host: hello.test, path: /api, servicePort: 8080}"],
    );
    // Gone: plain HTTP for it is no longer redirected to HTTPS but gets the unknown host's 404.
    // Within 15 s: the updater rereads the routes on the workload's event, not on its 30 s
    // tick.
    let removed = Instant::now();
    wait("the secure.test site gone", Duration::from_secs(15), || {
        through_ingress(&h, http, "secure.test", "/").0 == "404"
    });
    assert!(through_ingress(&h, http, "hello.test", "/api/")
        .1
        .starts_with("api v1"));
    // The VirtualLoadBalancer removed: the workload's route goes; the other stays.
    std::fs::remove_file(h.path("api").join("VirtualLoadBalancer.kat")).unwrap();
    apply_bundle(&h, 1, "api", &[]);
    // Gone: /api/ falls to the host's `/` route, web.
    println!(
        "ingress rule removed -> route gone in {:.1} s",
        removed.elapsed().as_secs_f64()
    );
    wait("the /api route gone", Duration::from_secs(15), || {
        through_ingress(&h, http, "hello.test", "/api/")
            .1
            .starts_with("web")
    });
    assert!(through_ingress(&h, http, "hello.test", "/")
        .1
        .starts_with("web"));

    // The updater's token reads the routes and does nothing else: no workload files (their
    // environment), no logs, no writes.
    let token_config = dir.join("client.yaml");
    let k = h.katcall_as(1, &token_config);
    assert!(
        k.run(&["get", "ingress"]).status.success(),
        "it reads the routes"
    );
    for args in [
        &["get", "workloads"][..],
        &["describe", "workload", "web"],
        &["logs", "web"],
        &["delete", "workload", "web"],
        &["create", "namespace", "evil"],
        &["create", "token", "--read-only"],
        &["get", "join-tokens"],
        &["exec", "web", "--", "true"],
    ] {
        let out = k.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && (err.contains("403")
                    || err.contains("ingress token")
                    || err.contains("read-only")
                    || err.contains("admin token")),
            "{args:?}: {err}"
        );
    }
}

/// Removes the updater's config directory, even when the test fails.
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
