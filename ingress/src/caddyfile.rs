//! The Caddyfile for a set of ingress routes: one site per host (HTTPS when any of its
//! routes asks for `tls`), one `handle` per path prefix, longest prefix first, each proxying
//! to its workload's ready instances through the cluster DNS (`dynamic a`, looked up again
//! every second: an instance that leaves DNS during a rollout gets no new requests, and a
//! request whose instance is gone is tried on another for a few seconds).

use std::collections::BTreeMap;
use std::fmt::Write;

use kat_api::wire::IngressRoute;

/// Where Caddy listens, and its admin endpoint (loopback: the updater's only).
#[derive(Debug, Clone)]
pub struct Listen {
    pub http_port: u16,
    pub https_port: u16,
    pub admin: String,
}

/// Whether `host` can have a publicly trusted certificate (ACME): not a name reserved for
/// tests, examples or local networks, not a single label, not an address. Otherwise Caddy's
/// own CA signs it (`tls internal`).
pub fn public_name(host: &str) -> bool {
    const LOCAL: [&str; 9] = [
        ".local",
        ".localhost",
        ".test",
        ".example",
        ".invalid",
        ".internal",
        ".lan",
        ".home.arpa",
        ".cluster.local",
    ];
    const EXAMPLES: [&str; 3] = ["example.com", "example.net", "example.org"];
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host.contains('.')
        && host.parse::<std::net::IpAddr>().is_err()
        && !LOCAL.iter().any(|s| host.ends_with(s))
        && !EXAMPLES
            .iter()
            .any(|e| host == *e || host.ends_with(&format!(".{e}")))
}

/// Render the Caddyfile for `routes`. Routes with the same host and path: the first (in the
/// API's sorted order) wins; the others, and routes whose host, path or upstream are not
/// plain names, are returned so the caller can say so.
pub fn render(routes: &[IngressRoute], listen: &Listen) -> (String, Vec<IngressRoute>) {
    let mut sites: BTreeMap<&str, Vec<&IngressRoute>> = BTreeMap::new();
    let mut shadowed = Vec::new();
    for r in routes {
        // The API validates both; checked again here because they are written into the
        // configuration: a route that could change its meaning is left out.
        if kat_api::names::dns_name_problem(&r.host).is_some()
            || kat_api::load_balancer::ingress_path_problem(&r.path).is_some()
            || !r
                .upstream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.:".contains(c))
        {
            shadowed.push(r.clone());
            continue;
        }
        let site = sites.entry(r.host.as_str()).or_default();
        if site.iter().any(|x| x.path == r.path) {
            shadowed.push(r.clone());
        } else {
            site.push(r);
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by kat-ingress from the cluster's VirtualLoadBalancers; changes here are lost.\n{{\n\tadmin {}\n\thttp_port {}\n\thttps_port {}\n}}",
        listen.admin, listen.http_port, listen.https_port
    );
    for (host, mut rules) in sites {
        let tls = rules.iter().any(|r| r.tls);
        let scheme = if tls { "https" } else { "http" };
        let _ = writeln!(out, "\n{scheme}://{host} {{");
        if tls && !public_name(host) {
            let _ = writeln!(out, "\ttls internal");
        }
        // Longest prefix first: `handle` blocks with named matchers run in written order.
        rules.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.path.cmp(&b.path)));
        for (i, r) in rules.iter().enumerate() {
            let prefix = r.path.trim_end_matches('/');
            if prefix.is_empty() {
                let _ = writeln!(out, "\thandle {{");
            } else {
                let _ = writeln!(out, "\t@route{i} path {prefix} {prefix}/*");
                let _ = writeln!(out, "\thandle @route{i} {{");
            }
            let (name, port) = r.upstream.rsplit_once(':').unwrap_or((&r.upstream, "80"));
            let _ = writeln!(
                out,
                "\t\t# {}/{}\n\t\treverse_proxy {{\n\t\t\tdynamic a {name} {port} {{\n\t\t\t\trefresh 1s\n\t\t\t}}\n\t\t\tlb_policy round_robin\n\t\t\tlb_try_duration 5s\n\t\t\tlb_try_interval 100ms\n\t\t\tfail_duration 2s\n\t\t}}\n\t}}",
                r.namespace, r.workload
            );
        }
        if !rules
            .iter()
            .any(|r| r.path.trim_end_matches('/').is_empty())
        {
            let _ = writeln!(
                out,
                "\thandle {{\n\t\trespond \"no route for this path\" 404\n\t}}"
            );
        }
        let _ = writeln!(out, "}}");
    }
    // A host no rule names: 404 (Caddy's own answer would be an empty 200).
    let _ = writeln!(
        out,
        "\nhttp:// {{\n\trespond \"no route for this host\" 404\n}}"
    );
    (out, shadowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(host: &str, path: &str, workload: &str, tls: bool) -> IngressRoute {
        IngressRoute {
            host: host.into(),
            path: path.into(),
            namespace: "default".into(),
            workload: workload.into(),
            upstream: format!("{workload}.default.kat.cluster.local:8080"),
            tls,
        }
    }

    fn listen() -> Listen {
        Listen {
            http_port: 80,
            https_port: 443,
            admin: "127.0.0.1:2019".into(),
        }
    }

    #[test]
    fn hosts_paths_and_tls() {
        let routes = vec![
            route("hello.example.com", "/", "web", false),
            route("hello.example.com", "/api", "api", false),
            route("shop.example.org", "/", "shop", true),
            route("kat.dws.rip", "/", "site", true),
        ];
        let (text, shadowed) = render(&routes, &listen());
        assert!(shadowed.is_empty());
        assert!(text.contains("http://hello.example.com {"), "{text}");
        // /api before the catch-all.
        let api = text.find("@route0 path /api /api/*").expect("api matcher");
        let root = text
            .find("\thandle {\n\t\t# default/web")
            .expect("root handle");
        assert!(api < root, "{text}");
        assert!(
            text.contains("dynamic a api.default.kat.cluster.local 8080"),
            "{text}"
        );
        assert!(
            text.contains("https://shop.example.org {\n\ttls internal"),
            "{text}"
        );
        assert!(
            text.contains("https://kat.dws.rip {\n\t# default/site")
                || text.contains("https://kat.dws.rip {\n\thandle {"),
            "{text}"
        );
        assert!(
            !text.contains("https://kat.dws.rip {\n\ttls internal"),
            "a public name gets ACME: {text}"
        );
    }

    #[test]
    fn a_host_without_a_root_route_answers_404_elsewhere_and_duplicates_are_reported() {
        let routes = vec![
            route("a.test", "/api/", "one", false),
            route("a.test", "/api/", "two", false),
        ];
        let (text, shadowed) = render(&routes, &listen());
        assert_eq!(shadowed.len(), 1);
        assert_eq!(shadowed[0].workload, "two");
        assert!(
            text.contains("respond \"no route for this path\" 404"),
            "{text}"
        );
        assert!(!text.contains("two.default"), "{text}");
    }

    /// What `render` writes is a Caddyfile Caddy takes (Caddy is installed with the recipe:
    /// scripts/install-deps.sh).
    #[test]
    fn caddy_adapts_what_is_rendered() {
        let routes = vec![
            route("hello.example.com", "/", "web", false),
            route("hello.example.com", "/api", "api", false),
            route("shop.example.org", "/", "shop", true),
        ];
        let (text, _) = render(&routes, &listen());
        let dir = std::env::temp_dir().join(format!("kat-ingress-adapt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("Caddyfile");
        std::fs::write(&file, &text).unwrap();
        let out = std::process::Command::new("caddy")
            .args(["adapt", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            .output()
            .expect("caddy (scripts/install-deps.sh installs it)");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json = String::from_utf8_lossy(&out.stdout);
        assert!(json.contains("dynamic_upstreams"), "{json}");
        assert!(json.contains("no route for this host"), "{json}");
    }

    /// A host or path that would write its own Caddyfile directives is left out.
    #[test]
    fn routes_that_would_inject_configuration_are_left_out() {
        let evil = [
            route(
                "a.test",
                "/x\n}\n:80 {\n\tfile_server\n\troot /",
                "evil",
                false,
            ),
            route("a.test\n}", "/", "evil", false),
            route("a.test", "/ok {", "evil", false),
        ];
        let (text, left_out) = render(&evil, &listen());
        assert_eq!(left_out.len(), 3);
        assert!(
            !text.contains("file_server") && !text.contains("evil"),
            "{text}"
        );
    }

    #[test]
    fn which_names_are_public() {
        for public in ["kat.dws.rip", "www.example.co.uk"] {
            assert!(public_name(public), "{public}");
        }
        for local in [
            "hello.example.com",
            "example.org",
            "app.test",
            "nas.local",
            "router",
            "10.0.0.1",
            "x.home.arpa",
        ] {
            assert!(!public_name(local), "{local}");
        }
    }
}
