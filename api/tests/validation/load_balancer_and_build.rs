//! The load balancer (ports, ingress, health checks) and the build definition.

use super::*;

fn lb_with(path: &str, value: Option<&str>) -> Vec<String> {
    let mut lb = yaml(LB);
    set(&mut lb, path, value.map(yaml));
    findings(&[
        ("workload.kat", &yaml(WORKLOAD)),
        ("VirtualLoadBalancer.kat", &lb),
    ])
}

#[test]
fn port_rules() {
    assert_finding(
        &lb_with("spec.ports.0.containerPort", Some("0")),
        "VirtualLoadBalancer.kat: spec.ports[0].containerPort: 0 is not a port (expected 1-65535) (in port \"http\")",
    );
    assert_finding(
        &lb_with("spec.ports.0.containerPort", Some("70000")),
        "spec.ports[0].containerPort: 70000 is not a port",
    );
    assert_finding(
        &lb_with("spec.ports.1", Some("{containerPort: 8080}")),
        "spec.ports[1].containerPort: 8080/TCP is declared more than once",
    );
    assert_valid(&lb_with(
        "spec.ports.1",
        Some("{containerPort: 8080, protocol: UDP}"),
    ));
    assert_finding(
        &lb_with("spec.ports.1.name", Some("http")),
        "spec.ports[1].name: \"http\" is used by more than one port",
    );
    assert_finding(
        &lb_with("spec.ports", Some("[]")),
        "spec.ports: must list at least one port",
    );
    assert_finding(
        &lb_with("spec.ports.0.protocol", Some("SCTP")),
        "spec.ports[0].protocol: unknown variant",
    );
    // hostPort: a port, published once per protocol.
    assert_valid(&lb_with("spec.ports.0.hostPort", Some("8080")));
    assert_finding(
        &lb_with("spec.ports.0.hostPort", Some("0")),
        "VirtualLoadBalancer.kat: spec.ports[0].hostPort: 0 is not a port (expected 1-65535) (in port \"http\")",
    );
    assert_finding(
        &lb_with("spec.ports.0.hostPort", Some("65536")),
        "spec.ports[0].hostPort: 65536 is not a port",
    );
    let mut twice = yaml(LB);
    set(&mut twice, "spec.ports.0.hostPort", Some(yaml("80")));
    set(
        &mut twice,
        "spec.ports.1",
        Some(yaml("{containerPort: 9090, hostPort: 80}")),
    );
    assert_finding(
        &findings(&[
            ("workload.kat", &yaml(WORKLOAD)),
            ("VirtualLoadBalancer.kat", &twice),
        ]),
        "spec.ports[1].hostPort: 80/TCP is published more than once",
    );
    // The same number over UDP is another port.
    set(
        &mut twice,
        "spec.ports.1",
        Some(yaml("{containerPort: 9090, hostPort: 80, protocol: UDP}")),
    );
    assert_valid(&findings(&[
        ("workload.kat", &yaml(WORKLOAD)),
        ("VirtualLoadBalancer.kat", &twice),
    ]));
}

#[test]
fn ingress_refers_to_declared_port() {
    assert_finding(
        &lb_with("spec.ingress.0.servicePortName", Some("web")),
        r#"spec.ingress[0].servicePortName: "web" is not the name of a port in spec.ports (named ports: http, dns)"#,
    );
    assert_finding(&lb_with("spec.ingress.1.servicePort", Some("9090")), "spec.ingress[1].servicePort: 9090 is not a port declared in spec.ports (declared: 8080, 53)");
    assert_finding(
        &lb_with("spec.ingress.0.servicePortName", None),
        "spec.ingress[0]: needs servicePortName or servicePort",
    );
    assert_finding(
        &lb_with("spec.ingress.0.host", Some("bad host")),
        "spec.ingress[0].host: \"bad host\" is not a DNS name",
    );
    assert_finding(
        &lb_with("spec.ingress.0.path", Some("api")),
        "spec.ingress[0].path: \"api\" must start with '/'",
    );
    assert_finding(
        &lb_with("spec.ingress.0.path", Some("'/api {\n}'")),
        "has ' ': a path holds only letters, digits and -._~/%",
    );
    assert_finding(
        &lb_with("spec.ingress.0.path", Some("/a/../b")),
        "has a '..' segment",
    );
}

#[test]
fn health_check_numbers_positive() {
    for field in [
        "periodSeconds",
        "timeoutSeconds",
        "successThreshold",
        "failureThreshold",
    ] {
        assert_finding(
            &lb_with(&format!("spec.healthCheck.{field}"), Some("0")),
            &format!("spec.healthCheck.{field}: 0 must be at least 1"),
        );
    }
    assert_finding(&lb_with("spec.healthCheck.initialDelaySeconds", Some("-5")), "spec.healthCheck.initialDelaySeconds: invalid type: integer \"-5\", expected a whole number of at least 0");
    assert_finding(
        &lb_with("spec.healthCheck.exec.command", Some("[]")),
        "spec.healthCheck.exec.command: must name a command",
    );
    assert_valid(&lb_with("spec.healthCheck.initialDelaySeconds", Some("0")));
    assert_valid(&lb_with("spec.healthCheck.onFailure", Some("restart")));
    assert_valid(&lb_with("spec.healthCheck.onFailure", Some("none")));
    assert_finding(
        &lb_with("spec.healthCheck.onFailure", Some("Restart")),
        "spec.healthCheck.onFailure: unknown variant \"Restart\", expected \"none\" or \"restart\"",
    );
}

#[test]
fn build_rules() {
    let mut g = yaml(WORKLOAD);
    set(
        &mut g,
        "spec.source",
        Some(yaml("git: {repository: 'https://git.example.com/web.git'}")),
    );
    for (field, value, message) in [
        (
            "spec.buildContext",
            "/abs",
            "build.kat: spec.buildContext: \"/abs\" must be a relative path",
        ),
        (
            "spec.dockerfilePath",
            "../Dockerfile",
            "build.kat: spec.dockerfilePath: \"../Dockerfile\" must not contain '..'",
        ),
        (
            "spec.platform",
            "arm64",
            "build.kat: spec.platform: \"arm64\" is not a platform",
        ),
        (
            "spec.cache.registryPath",
            "Bad Path",
            "build.kat: spec.cache.registryPath: \"Bad Path\" is not an image reference",
        ),
        (
            "spec.network",
            "host",
            "build.kat: spec.network: unknown variant \"host\", expected \"egress\" or \"none\"",
        ),
    ] {
        let mut b = yaml(BUILD);
        set(&mut b, field, Some(yaml(value)));
        assert_finding(
            &findings(&[("workload.kat", &g), ("build.kat", &b)]),
            message,
        );
    }
    // `network: none`: RUN steps get no network at all.
    let mut b = yaml(BUILD);
    set(&mut b, "spec.network", Some(yaml("none")));
    let b = yaml_serde::to_string(&b).unwrap();
    let mut report = kat_api::Report::new();
    let Some(kat_api::Quadlet::BuildDefinition(build)) =
        kat_api::parse_file("build.kat", b.as_bytes(), &mut report)
    else {
        panic!("{report}")
    };
    assert_eq!(
        build.spec.network,
        kat_api::build_definition::BuildNetwork::None
    );
}
