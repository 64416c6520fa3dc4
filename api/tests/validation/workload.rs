//! A Workload's own fields: defaults, kinds, unknown and required fields, sources, replicas, jobs, names, quantities, rollout, restart, scheduling, container and volumes.

use super::*;

#[test]
fn full_valid_service_bundle() {
    assert_valid(&service_with("spec.replicas", Some("2")));
}

#[test]
fn full_valid_job_and_git_bundles() {
    let mut w = yaml(WORKLOAD);
    set(&mut w, "spec.type", Some(yaml("Job")));
    set(&mut w, "spec.replicas", None);
    set(&mut w, "spec.updateStrategy", None);
    assert_valid(&findings(&[("workload.kat", &w), ("job.kat", &yaml(JOB))]));

    let mut g = yaml(WORKLOAD);
    set(&mut g, "spec.source", Some(yaml("git: {repository: 'https://git.example.com/web.git', commit: 0123abcd}\ncacheImage: registry.local/cache/web")));
    assert_valid(&findings(&[
        ("workload.kat", &g),
        ("build.kat", &yaml(BUILD)),
    ]));
}

#[test]
fn defaults_follow_the_rfc() {
    let minimal = "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {name: w}\nspec:\n  type: Service\n  replicas: 1\n  source: {image: busybox}\n  restartPolicy: {condition: MaxCount}\n  container: {}\n";
    let b = WorkloadBundle::parse(BTreeMap::from([(
        "workload.kat".to_string(),
        minimal.as_bytes().to_vec(),
    )]))
    .unwrap();
    assert_eq!(b.workload.metadata.namespace, "default");
    assert_eq!(
        b.workload.spec.update_strategy_type(),
        kat_api::workload::UpdateStrategyType::Rolling
    );
    assert_eq!(
        b.workload.spec.max_surge(),
        kat_api::workload::MaxSurge::Count(1)
    );
    assert_eq!(b.workload.spec.restart_policy.max_restarts(), 5);
    assert_eq!(b.workload.spec.restart_policy.reset_seconds(), 3600);

    let lb = "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 80}]\n  healthCheck: {exec: {command: [x]}}\n  ingress: [{host: a.b, servicePort: 80}]\n";
    let job = "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\n";
    let build = "apiVersion: kat.dws.rip/v1alpha1\nkind: BuildDefinition\n";
    let mut report = kat_api::Report::new();
    let Some(kat_api::Quadlet::VirtualLoadBalancer(lb)) =
        kat_api::parse_file("lb.kat", lb.as_bytes(), &mut report)
    else {
        panic!("{report}")
    };
    let h = lb.spec.health_check.unwrap();
    assert_eq!(
        (
            h.initial_delay_seconds,
            h.period_seconds,
            h.timeout_seconds,
            h.success_threshold,
            h.failure_threshold
        ),
        (0, 10, 1, 1, 3)
    );
    assert_eq!(
        lb.spec.ports[0].protocol,
        kat_api::load_balancer::Protocol::TCP
    );
    assert_eq!(lb.spec.ingress[0].path, "/");
    let Some(kat_api::Quadlet::JobDefinition(job)) =
        kat_api::parse_file("job.kat", job.as_bytes(), &mut report)
    else {
        panic!("{report}")
    };
    assert_eq!(
        (
            job.spec.completions,
            job.spec.parallelism,
            job.spec.backoff_limit
        ),
        (1, 1, 3)
    );
    let Some(kat_api::Quadlet::BuildDefinition(build)) =
        kat_api::parse_file("build.kat", build.as_bytes(), &mut report)
    else {
        panic!("{report}")
    };
    assert_eq!(
        (
            build.spec.build_context.as_str(),
            build.spec.dockerfile_path.as_str()
        ),
        (".", "./Dockerfile")
    );
    assert_eq!(
        build.spec.network,
        kat_api::build_definition::BuildNetwork::Egress
    );
    let c = parse_cluster("cluster.kat", CLUSTER.as_bytes())
        .unwrap()
        .spec;
    assert_eq!(
        (
            c.node_subnet_bits,
            c.cluster_domain.as_str(),
            c.agent_port,
            c.api_port,
            c.etcd_peer_port,
            c.etcd_client_port
        ),
        (7, "kat.cluster.local", 9116, 9115, 2380, 2379)
    );
    assert_eq!(
        (c.volume_base_path.as_str(), c.backup_path.as_str()),
        ("/var/lib/kat/volumes", "/var/lib/kat/backups")
    );
    assert_eq!(
        (
            c.backup_interval_minutes,
            c.agent_tick_seconds,
            c.node_loss_timeout_seconds
        ),
        (30, 15, 60)
    );
    assert!(report.is_empty(), "{report}");
}

#[test]
fn api_version_and_kind() {
    assert_finding(
        &service_with("apiVersion", Some("v1")),
        r#"workload.kat: apiVersion: "v1" is not supported (expected kat.dws.rip/v1alpha1)"#,
    );
    assert_finding(
        &service_with("apiVersion", None),
        "workload.kat: apiVersion: is missing",
    );
    assert_finding(
        &service_with("kind", Some("Deployment")),
        r#"workload.kat: kind: "Deployment" is not a Quadlet kind"#,
    );
    assert_finding(
        &service_with("kind", None),
        "workload.kat: kind: is missing",
    );
}

#[test]
fn deprecated_volume_kind_points_to_spec_volumes() {
    let v = yaml("apiVersion: kat.dws.rip/v1alpha1\nkind: Volume\nspec: {}");
    let found = findings(&[
        ("workload.kat", &yaml(WORKLOAD)),
        ("VirtualLoadBalancer.kat", &yaml(LB)),
        ("volume.kat", &v),
    ]);
    assert_finding(&found, "volume.kat is deprecated");
    assert_finding(&found, "spec.volumes");
    let found = findings(&[("workload.kat", &yaml(WORKLOAD)), ("vol.kat", &v)]);
    assert_finding(
        &found,
        r#"vol.kat: kind: "Volume" (volume.kat) is deprecated and not accepted: declare volumes in workload.kat under spec.volumes"#,
    );
}

#[test]
fn unknown_fields_are_errors() {
    assert_finding(
        &service_with("spec.replica", Some("2")),
        r#"workload.kat: spec.replica: unknown field "replica""#,
    );
    assert_finding(
        &service_with("spec.container.resources.limits.cpux", Some("1")),
        "spec.container.resources.limits.cpux: unknown field",
    );
    let mut lb = yaml(LB);
    set(&mut lb, "spec.healthCheck.periodSecond", Some(yaml("3")));
    assert_finding(
        &findings(&[("workload.kat", &yaml(WORKLOAD)), ("lb.kat", &lb)]),
        "lb.kat: spec.healthCheck.periodSecond: unknown field",
    );
    let mut c = yaml(CLUSTER);
    set(&mut c, "spec.apiport", Some(yaml("1")));
    let err = parse_cluster("cluster.kat", yaml_serde::to_string(&c).unwrap().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cluster.kat: spec.apiport: unknown field"),
        "{err}"
    );
}

#[test]
fn required_fields_and_enums() {
    assert_finding(
        &service_with("spec.type", None),
        r#"workload.kat: spec: missing field "type""#,
    );
    assert_finding(
        &service_with("spec.type", Some("Daemon")),
        r#"workload.kat: spec.type: unknown variant "Daemon", expected one of "Service", "Job", "DaemonService""#,
    );
    assert_finding(
        &service_with("spec.restartPolicy", None),
        r#"missing field "restartPolicy""#,
    );
    assert_finding(
        &service_with("spec.restartPolicy.condition", Some("Sometimes")),
        "spec.restartPolicy.condition: unknown variant",
    );
    assert_finding(
        &service_with("spec.updateStrategy.type", Some("Canary")),
        "spec.updateStrategy.type: unknown variant",
    );
    assert_finding(
        &service_with("spec.tolerations.0.operator", Some("In")),
        "spec.tolerations[0].operator: unknown variant",
    );
    assert_finding(
        &service_with("spec.container.resources.gpu.driver", Some("intel")),
        "spec.container.resources.gpu.driver: unknown variant",
    );
    assert_finding(
        &service_with("spec.volumes.1.hostMount.ensureType", Some("Dir")),
        "spec.volumes[1].hostMount.ensureType: unknown variant",
    );
    assert_finding(
        &service_with("metadata.name", None),
        r#"workload.kat: metadata: missing field "name""#,
    );
    assert_finding(
        &service_with("spec.container", None),
        r#"missing field "container""#,
    );
    assert_finding(
        &service_with("spec.replicas", Some("two")),
        r#"spec.replicas: invalid type: string "two", expected a whole number"#,
    );
    assert_finding(
        &service_with("spec.replicas", Some("-1")),
        r#"spec.replicas: invalid type: integer "-1", expected a whole number of at least 0"#,
    );
}

#[test]
fn exactly_one_source() {
    assert_finding(
        &service_with("spec.source.git", Some("{repository: 'https://x/y.git'}")),
        "workload.kat: spec.source: has both image and git (expected exactly one of them)",
    );
    assert_finding(
        &service_with("spec.source.image", None),
        "workload.kat: spec.source: has neither image nor git",
    );
    assert_finding(
        &service_with("spec.source.image", Some("Not An Image")),
        r#"spec.source.image: "Not An Image" is not an image reference"#,
    );
    assert_finding(
        &service_with("spec.source.cacheImage", Some("x")),
        "spec.source.cacheImage: is used only with a git source",
    );
}

#[test]
fn git_source_rules_and_build_kat() {
    let mut g = yaml(WORKLOAD);
    set(
        &mut g,
        "spec.source",
        Some(yaml("git: {repository: '', commit: xyz}")),
    );
    let found = findings(&[("workload.kat", &g)]);
    assert_finding(&found, "spec.source.git.repository: must not be empty");
    assert_finding(
        &found,
        r#"spec.source.git.commit: "xyz" is not a commit id"#,
    );
    assert_finding(&found, "workload.kat: spec.source.git: needs a build.kat");
    // build.kat with an image source
    assert_finding(
        &findings(&[
            ("workload.kat", &yaml(WORKLOAD)),
            ("build.kat", &yaml(BUILD)),
        ]),
        "build.kat: kind: BuildDefinition applies only to a git source",
    );
}

#[test]
fn replicas_by_type() {
    assert_finding(
        &service_with("spec.replicas", None),
        "workload.kat: spec.replicas: is required for type Service",
    );
    assert_valid(&service_with("spec.replicas", Some("0")));
    assert_finding(
        &service_with("spec.replicas", Some("100000")),
        "spec.replicas: 100000 is more than the maximum",
    );
    let mut d = yaml(WORKLOAD);
    set(&mut d, "spec.type", Some(yaml("DaemonService")));
    assert_finding(
        &findings(&[("workload.kat", &d)]),
        "spec.replicas: is not used by type DaemonService",
    );
    set(&mut d, "spec.replicas", None);
    assert_valid(&findings(&[("workload.kat", &d), ("lb.kat", &yaml(LB))]));
}

#[test]
fn job_rules() {
    let mut j = yaml(WORKLOAD);
    set(&mut j, "spec.type", Some(yaml("Job")));
    set(&mut j, "spec.replicas", None);
    let found = findings(&[("workload.kat", &j)]);
    assert_finding(
        &found,
        "workload.kat: spec.type: is Job, which needs a job.kat",
    );
    assert_finding(&found, "spec.updateStrategy: is not used by type Job");
    assert_finding(
        &findings(&[("workload.kat", &yaml(WORKLOAD)), ("job.kat", &yaml(JOB))]),
        "job.kat: kind: JobDefinition applies only to workloads of type Job",
    );
    set(&mut j, "spec.updateStrategy", None);
    assert_finding(
        &findings(&[
            ("workload.kat", &j),
            ("job.kat", &yaml(JOB)),
            ("lb.kat", &yaml(LB)),
        ]),
        "lb.kat: kind: VirtualLoadBalancer applies to Service and DaemonService",
    );
    for (field, value, message) in [
        (
            "spec.schedule",
            "61 * * * *",
            r#"job.kat: spec.schedule: "61 * * * *" is not a cron schedule: minute field "61": 61 is outside 0-59"#,
        ),
        (
            "spec.schedule",
            "every day",
            "job.kat: spec.schedule: \"every day\" is not a cron schedule: found 2 fields",
        ),
        (
            "spec.completions",
            "0",
            "job.kat: spec.completions: 0 must be at least 1",
        ),
        (
            "spec.parallelism",
            "0",
            "job.kat: spec.parallelism: 0 must be at least 1",
        ),
        (
            "spec.activeDeadlineSeconds",
            "0",
            "job.kat: spec.activeDeadlineSeconds: 0 must be at least 1 second",
        ),
        (
            "spec.backoffLimit",
            "-1",
            "job.kat: spec.backoffLimit: invalid type: integer \"-1\", expected a whole number",
        ),
    ] {
        let mut job = yaml(JOB);
        set(&mut job, field, Some(yaml(value)));
        let found = findings(&[("workload.kat", &j), ("job.kat", &job)]);
        assert_finding(&found, message);
        assert!(
            !found.iter().any(|f| f.contains("needs a job.kat")),
            "a broken job.kat is not a missing one: {found:#?}"
        );
    }
    let mut job = yaml(JOB);
    set(&mut job, "spec.schedule", Some(yaml("'@hourly'")));
    assert_valid(&findings(&[("workload.kat", &j), ("job.kat", &job)]));
}

#[test]
fn dns_label_names() {
    assert_finding(
        &service_with("metadata.name", Some("Web_App")),
        r#"workload.kat: metadata.name: "Web_App" is not a DNS label"#,
    );
    assert_finding(
        &service_with("metadata.name", Some("''")),
        "metadata.name: must not be empty",
    );
    assert_finding(
        &service_with("metadata.namespace", Some(&"a".repeat(64))),
        "metadata.namespace: \"aaaa",
    );
    assert_finding(
        &service_with("spec.volumes.0.name", Some("Data")),
        "spec.volumes[0].name: \"Data\" is not a DNS label",
    );
    assert_valid(&service_with("metadata.namespace", Some("team-a")));
}

#[test]
fn quantities_and_requests_within_limits() {
    assert_finding(
        &service_with("spec.container.resources.limits.memory", Some("64MB")),
        r#"workload.kat: spec.container.resources.limits.memory: "64MB" is not a memory quantity (expected e.g. 64Mi, 1Gi, 500M)"#,
    );
    assert_finding(
        &service_with("spec.container.resources.requests.cpu", Some("1.2345")),
        r#"spec.container.resources.requests.cpu: "1.2345" is not a CPU quantity (expected e.g. 100m, 1, 1.5)"#,
    );
    assert_finding(
        &service_with(
            "spec.container.resources.limits.memory",
            Some("99999999999Ei"),
        ),
        "spec.container.resources.limits.memory: \"99999999999Ei\" is too large",
    );
    assert_finding(
        &service_with("spec.container.resources.requests.cpu", Some("2")),
        r#"spec.container.resources.requests.cpu: "2" is larger than limits.cpu "1""#,
    );
    assert_finding(
        &service_with("spec.container.resources.requests.memory", Some("1Gi")),
        r#"spec.container.resources.requests.memory: "1Gi" is larger than limits.memory "256Mi""#,
    );
    assert_finding(
        &service_with("spec.container.resources.limits.cpu", Some("0")),
        "limits.cpu: \"0\" must be greater than zero",
    );
    assert_finding(
        &service_with("spec.container.resources.limits.memory", Some("1Mi")),
        "limits.memory: \"1Mi\" is below the minimum of 4Mi",
    );
    assert_finding(
        &service_with("spec.container.resources.gpu.minVRAM_MB", Some("0")),
        "gpu.minVRAM_MB: 0 must be at least 1",
    );
    assert_valid(&service_with(
        "spec.container.resources.limits.cpu",
        Some("1.5"),
    ));
    assert_valid(&service_with(
        "spec.container.resources.limits.memory",
        Some("500M"),
    ));
}

#[test]
fn max_surge_integer_or_percentage() {
    assert_valid(&service_with(
        "spec.updateStrategy.rolling.maxSurge",
        Some("'25%'"),
    ));
    assert_valid(&service_with(
        "spec.updateStrategy.rolling.maxSurge",
        Some("3"),
    ));
    assert_finding(
        &service_with("spec.updateStrategy.rolling.maxSurge", Some("0")),
        "spec.updateStrategy.rolling.maxSurge: 0 is out of range",
    );
    assert_finding(
        &service_with("spec.updateStrategy.rolling.maxSurge", Some("'150%'")),
        "maxSurge: \"150%\" is out of range",
    );
    assert_finding(
        &service_with("spec.updateStrategy.rolling.maxSurge", Some("lots")),
        "maxSurge: \"lots\" is not a surge",
    );
    assert_finding(
        &service_with("spec.updateStrategy.type", Some("Simultaneous")),
        "spec.updateStrategy.rolling: applies only to type Rolling",
    );
}

#[test]
fn restart_policy_rules() {
    assert_finding(
        &service_with("spec.restartPolicy.condition", Some("Always")),
        "spec.restartPolicy.maxRestarts: is used only with condition MaxCount, not Always",
    );
    assert_finding(
        &service_with("spec.restartPolicy.maxRestarts", Some("0")),
        "spec.restartPolicy.maxRestarts: 0 must be at least 1",
    );
    assert_finding(
        &service_with("spec.restartPolicy.resetSeconds", Some("0")),
        "spec.restartPolicy.resetSeconds: 0 must be at least 1",
    );
}

#[test]
fn selector_and_toleration_rules() {
    assert_finding(
        &service_with("spec.nodeSelector.bad key", Some("x")),
        "spec.nodeSelector.bad key: \"bad key\" is not a label key",
    );
    assert_finding(
        &service_with("spec.nodeSelector.disk", Some("-ssd")),
        "spec.nodeSelector.disk: \"-ssd\" is not a label value",
    );
    assert_finding(
        &service_with("spec.tolerations.0.operator", Some("Equal")),
        "spec.tolerations[0].value: is required with operator Equal (in toleration \"gpu\")",
    );
    assert_finding(
        &service_with("spec.tolerations.0.value", Some("x")),
        "spec.tolerations[0].value: must not be set with operator Exists",
    );
    assert_finding(
        &service_with("spec.tolerations.0.effect", Some("NoExecute")),
        "spec.tolerations[0].effect: unknown variant",
    );
}

#[test]
fn container_rules() {
    assert_finding(
        &service_with("spec.container.env.0.name", Some("1BAD")),
        r#"spec.container.env[0].name: "1BAD" is not an environment variable name"#,
    );
    assert_finding(
        &service_with(
            "spec.container.env",
            Some("[{name: A, value: x}, {name: A, value: y}]"),
        ),
        "spec.container.env[1].name: \"A\" is set more than once",
    );
    assert_finding(
        &service_with("spec.container.command", Some("['']")),
        "spec.container.command[0]: must not be empty",
    );
}

#[test]
fn volume_rules() {
    assert_finding(
        &service_with("spec.container.volumeMounts.0.name", Some("cache")),
        r#"spec.container.volumeMounts[0].name: "cache" does not refer to a volume in spec.volumes (declared: config, data)"#,
    );
    assert_finding(
        &service_with("spec.container.volumeMounts.0.mountPath", Some("data")),
        r#"spec.container.volumeMounts[0].mountPath: "data" is not an absolute path"#,
    );
    assert_finding(
        &service_with("spec.container.volumeMounts.0.mountPath", Some("/etc/web")),
        "spec.container.volumeMounts[1].mountPath: \"/etc/web\" is used by more than one mount",
    );
    assert_finding(
        &service_with("spec.container.volumeMounts.0.mountPath", Some("/")),
        "mountPath: \"/\" cannot be a mount point",
    );
    for reserved in ["/.kat", "/.kat/", "//.kat/init", "/./.kat/log/x"] {
        assert_finding(
            &service_with("spec.container.volumeMounts.0.mountPath", Some(reserved)),
            &format!(
                "spec.container.volumeMounts[0].mountPath: {reserved:?} is at or under /.kat, which KAT reserves"
            ),
        );
    }
    for local in [
        "kat-local/team_app:abc1234",
        "docker.io/kat-local/team_app:abc1234",
    ] {
        assert_finding(
            &service_with("spec.source.image", Some(local)),
            &format!("spec.source.image: {local:?} is an image a node built"),
        );
    }
    // A name that only begins like the reserved directory is the workload's own.
    assert_valid(&service_with(
        "spec.container.volumeMounts.0.mountPath",
        Some("/.katalog"),
    ));
    assert_finding(
        &service_with("spec.container.volumeMounts.0.subPath", Some("../etc")),
        "spec.container.volumeMounts[0].subPath: \"../etc\" must not contain '..'",
    );
    assert_finding(
        &service_with("spec.container.volumeMounts.0.subPath", Some("/abs")),
        "subPath: \"/abs\" must be a relative path",
    );
    assert_finding(
        &service_with("spec.volumes.1.hostMount.hostPath", Some("etc/web")),
        r#"spec.volumes[1].hostMount.hostPath: "etc/web" is not an absolute path"#,
    );
    assert_finding(
        &service_with("spec.volumes.0.hostMount", Some("{hostPath: /x}")),
        "spec.volumes[0]: has both simpleClusterStorage and hostMount (expected exactly one)",
    );
    assert_finding(
        &service_with("spec.volumes.0.simpleClusterStorage", None),
        "spec.volumes[0]: has no source",
    );
    assert_finding(
        &service_with("spec.volumes.1.name", Some("data")),
        "spec.volumes[1].name: \"data\" is declared more than once",
    );
}
