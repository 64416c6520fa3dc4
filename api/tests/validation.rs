//! Every validation rule, positive and negative, through the public entry points.

use std::collections::BTreeMap;

use kat_api::{parse_cluster, WorkloadBundle};
use yaml_serde::Value;

const WORKLOAD: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: web
spec:
  type: Service
  source:
    image: registry.local:5000/web:1.0
  replicas: 2
  updateStrategy:
    type: Rolling
    rolling:
      maxSurge: 1
  restartPolicy:
    condition: MaxCount
    maxRestarts: 3
    resetSeconds: 600
  nodeSelector:
    disk: ssd
  tolerations:
    - key: gpu
      operator: Exists
      effect: NoSchedule
  container:
    name: main
    command: ["/bin/server"]
    args: ["--port", "8080"]
    env:
      - name: MODE
        value: prod
    volumeMounts:
      - name: data
        mountPath: /data
        subPath: web
      - name: config
        mountPath: /etc/web
        readOnly: true
    resources:
      requests:
        cpu: 100m
        memory: 64Mi
      limits:
        cpu: "1"
        memory: 256Mi
      gpu:
        driver: nvidia
        minVRAM_MB: 1024
  volumes:
    - name: data
      simpleClusterStorage: {}
    - name: config
      hostMount:
        hostPath: /etc/web
        ensureType: DirectoryOrCreate
"#;

const LB: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports:
    - name: http
      containerPort: 8080
    - name: dns
      containerPort: 53
      protocol: UDP
  healthCheck:
    exec:
      command: ["/bin/check"]
    initialDelaySeconds: 2
    periodSeconds: 5
  ingress:
    - host: web.example.com
      servicePortName: http
    - host: alt.example.com
      path: /api
      servicePort: 8080
      tls: true
"#;

const JOB: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: JobDefinition
spec:
  schedule: "*/5 * * * *"
  completions: 3
  parallelism: 2
  activeDeadlineSeconds: 600
  backoffLimit: 2
"#;

const BUILD: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: BuildDefinition
spec:
  buildContext: ./app
  dockerfilePath: Dockerfile
  buildArgs:
    VERSION: "1.2.3"
  targetStage: runtime
  platform: linux/arm64
  cache:
    registryPath: registry.local:5000/cache/web
"#;

const CLUSTER: &str = r#"
apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: home
spec:
  clusterCIDR: 10.100.0.0/16
  serviceCIDR: 10.200.0.0/16
"#;

fn yaml(s: &str) -> Value {
    yaml_serde::from_str(s).unwrap()
}

/// Set (or with `Value::Null` as value and `remove`, delete) a dotted path such as
/// `spec.container.resources.limits.memory` or `spec.volumes.0.name`.
fn set(doc: &mut Value, path: &str, value: Option<Value>) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur = doc;
    for part in &parts[..parts.len() - 1] {
        cur = match part.parse::<usize>() {
            Ok(i) => &mut cur.as_sequence_mut().unwrap()[i],
            Err(_) => {
                let map = cur.as_mapping_mut().unwrap();
                map.entry(Value::from(*part))
                    .or_insert_with(|| Value::Mapping(Default::default()))
            }
        };
    }
    let last = parts[parts.len() - 1];
    match (last.parse::<usize>(), value) {
        (Ok(i), Some(v)) => cur.as_sequence_mut().unwrap()[i] = v,
        (Ok(i), None) => {
            cur.as_sequence_mut().unwrap().remove(i);
        }
        (Err(_), Some(v)) => {
            cur.as_mapping_mut().unwrap().insert(Value::from(last), v);
        }
        (Err(_), None) => {
            cur.as_mapping_mut().unwrap().remove(last);
        }
    }
}

fn files(list: &[(&str, &Value)]) -> BTreeMap<String, Vec<u8>> {
    list.iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                yaml_serde::to_string(v).unwrap().into_bytes(),
            )
        })
        .collect()
}

fn findings(list: &[(&str, &Value)]) -> Vec<String> {
    match WorkloadBundle::parse(files(list)) {
        Ok(_) => vec![],
        Err(e) => e.0.findings().iter().map(|f| f.to_string()).collect(),
    }
}

fn service_with(path: &str, value: Option<&str>) -> Vec<String> {
    let mut w = yaml(WORKLOAD);
    set(&mut w, path, value.map(yaml));
    findings(&[("workload.kat", &w), ("VirtualLoadBalancer.kat", &yaml(LB))])
}

#[track_caller]
fn assert_finding(found: &[String], expected: &str) {
    assert!(
        found.iter().any(|f| f.contains(expected)),
        "expected a finding containing {expected:?}, got {found:#?}"
    );
}

#[track_caller]
fn assert_valid(found: &[String]) {
    assert!(found.is_empty(), "expected no findings, got {found:#?}");
}

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

#[test]
fn one_file_per_kind_and_only_kat_files() {
    let found = findings(&[
        ("workload.kat", &yaml(WORKLOAD)),
        ("a.kat", &yaml(LB)),
        ("b.kat", &yaml(LB)),
    ]);
    assert_finding(&found, "b.kat: kind: a VirtualLoadBalancer is already defined in a.kat (expected one file per kind)");
    let found = findings(&[
        ("workload.kat", &yaml(WORKLOAD)),
        ("notes.txt", &yaml("x: 1")),
    ]);
    assert_finding(&found, "notes.txt: is not a Quadlet file");
    assert_finding(
        &findings(&[("lb.kat", &yaml(LB))]),
        "workload.kat: is missing",
    );
    assert_finding(
        &findings(&[
            ("workload.kat", &yaml(WORKLOAD)),
            ("cluster.kat", &yaml(CLUSTER)),
        ]),
        "cluster.kat: kind: ClusterConfiguration is read by `kat-agent init --config`",
    );
    let ns = yaml("apiVersion: kat.dws.rip/v1alpha1\nkind: Namespace\nmetadata: {name: other}");
    assert_finding(
        &findings(&[("workload.kat", &yaml(WORKLOAD)), ("ns.kat", &ns)]),
        "ns.kat: metadata.name: \"other\" differs from the workload's namespace \"default\"",
    );
}

#[test]
fn all_errors_of_a_bundle_are_reported() {
    let mut w = yaml(WORKLOAD);
    set(&mut w, "metadata.name", Some(yaml("Bad")));
    set(
        &mut w,
        "spec.container.resources.limits.memory",
        Some(yaml("64MB")),
    );
    set(
        &mut w,
        "spec.volumes.1.hostMount.hostPath",
        Some(yaml("rel")),
    );
    let mut lb = yaml(LB);
    set(&mut lb, "spec.ports.0.containerPort", Some(yaml("0")));
    let found = findings(&[
        ("workload.kat", &w),
        ("lb.kat", &lb),
        ("broken.kat", &yaml("kind: [1]")),
    ]);
    assert!(found.len() >= 5, "{found:#?}");
    assert_finding(&found, "workload.kat: metadata.name");
    assert_finding(
        &found,
        "workload.kat: spec.container.resources.limits.memory",
    );
    assert_finding(&found, "workload.kat: spec.volumes[1].hostMount.hostPath");
    assert_finding(&found, "lb.kat: spec.ports[0].containerPort");
    assert_finding(&found, "broken.kat: apiVersion: is missing");
}

#[test]
fn malformed_files() {
    let bad = BTreeMap::from([("workload.kat".to_string(), b"key: [unclosed".to_vec())]);
    let err = WorkloadBundle::parse(bad).unwrap_err().to_string();
    assert!(err.starts_with("workload.kat: is not valid YAML"), "{err}");
    let bad = BTreeMap::from([("workload.kat".to_string(), vec![0xff, 0xfe, 0x00])]);
    assert!(WorkloadBundle::parse(bad)
        .unwrap_err()
        .to_string()
        .contains("is not UTF-8"));
    let bad = BTreeMap::from([("workload.kat".to_string(), b"- a\n- b\n".to_vec())]);
    assert!(WorkloadBundle::parse(bad)
        .unwrap_err()
        .to_string()
        .contains("is not a YAML mapping"));
}

fn cluster_with(path: &str, value: &str) -> String {
    let mut c = yaml(CLUSTER);
    set(&mut c, path, Some(yaml(value)));
    match parse_cluster("cluster.kat", yaml_serde::to_string(&c).unwrap().as_bytes()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn cluster_rules() {
    assert_eq!(cluster_with("spec.clusterDomain", "kat.cluster.local"), "");
    for (path, value, message) in [
        ("spec.clusterCIDR", "10.100.0.0/33", r#"cluster.kat: spec.clusterCIDR: "10.100.0.0/33" is not a CIDR (expected e.g. 10.100.0.0/16)"#),
        ("spec.clusterCIDR", "10.100.1.0/16", "cluster.kat: spec.clusterCIDR: \"10.100.1.0/16\" has host bits set (expected the network address, 10.100.0.0/16)"),
        ("spec.serviceCIDR", "10.100.128.0/17", "cluster.kat: spec.serviceCIDR: 10.100.128.0/17 overlaps clusterCIDR 10.100.0.0/16 (expected separate ranges)"),
        ("spec.nodeSubnetBits", "13", "cluster.kat: spec.nodeSubnetBits: 13 does not fit clusterCIDR 10.100.0.0/16: node subnets would be /29, smaller than the /28 needed for instances (expected at most 12)"),
        ("spec.nodeSubnetBits", "0", "spec.nodeSubnetBits: 0 must be at least 1"),
        ("spec.nodeSubnetBits", "4294967295", "spec.nodeSubnetBits: 4294967295 does not fit clusterCIDR"),
        ("spec.apiPort", "2379", "cluster.kat: spec.etcdClientPort: 2379 is also apiPort (every port must be different)"),
        ("spec.agentPort", "70000", "spec.agentPort: 70000 is not a port (expected 1-65535)"),
        ("spec.wireguardPort", "9115", "cluster.kat: spec.wireguardPort: 9115 is also apiPort (every port must be different)"),
        ("spec.wireguardPort", "0", "spec.wireguardPort: 0 is not a port (expected 1-65535)"),
        ("spec.volumeBasePath", "var/lib", "spec.volumeBasePath: \"var/lib\" is not an absolute path"),
        ("spec.clusterDomain", "bad_domain", "spec.clusterDomain: \"bad_domain\" is not a DNS name"),
        ("spec.agentTickSeconds", "0", "spec.agentTickSeconds: 0 must be at least 1"),
        ("spec.nodeLossTimeoutSeconds", "10", "spec.nodeLossTimeoutSeconds: 10 must be longer than agentTickSeconds (15)"),
        ("metadata.name", "My Cluster", "cluster.kat: metadata.name: \"My Cluster\" is not a DNS label"),
        ("kind", "Workload", "cluster.kat: kind: \"Workload\" is not ClusterConfiguration"),
    ] {
        let err = cluster_with(path, value);
        assert!(err.contains(message), "{path}={value}: expected {message:?}, got {err:?}");
    }
    assert!(cluster_with("spec.clusterCIDR", "fd00:100::/48").contains("spec.serviceCIDR: 10.200.0.0/16 and clusterCIDR fd00:100::/48 are different address families"));
    assert!(cluster_with("spec.serviceCIDR", "10.0.0.0/8")
        .contains("spec.serviceCIDR: 10.0.0.0/8 overlaps clusterCIDR 10.100.0.0/16"));
    let v6 = cluster_with("spec.clusterCIDR", "fd00:100::/48");
    assert!(!v6.contains("nodeSubnetBits"), "{v6}");
}

#[test]
fn spec_hash_ignores_formatting_but_not_content() {
    let text = WORKLOAD.to_string();
    let a = WorkloadBundle::parse(BTreeMap::from([(
        "workload.kat".into(),
        text.clone().into_bytes(),
    )]))
    .unwrap();
    let b = WorkloadBundle::parse(BTreeMap::from([(
        "w.kat".into(),
        format!("# a comment\n{text}").into_bytes(),
    )]))
    .unwrap();
    assert_eq!(a.spec_hash(), b.spec_hash());
    let c = WorkloadBundle::parse(BTreeMap::from([(
        "workload.kat".into(),
        text.replace("replicas: 2", "replicas: 3").into_bytes(),
    )]))
    .unwrap();
    assert_ne!(a.spec_hash(), c.spec_hash());
}

#[test]
fn every_finding_of_a_file_at_once_whatever_its_kind() {
    // A bad name (semantic), a bad restart condition (an unknown enum value), a string where
    // a number goes, a missing replicas (semantic), a bad port in the load balancer, and a
    // volume with a bad host path: all reported in one run.
    let mut w = yaml(WORKLOAD);
    set(&mut w, "metadata.name", Some(yaml("Bad_Name")));
    set(
        &mut w,
        "spec.restartPolicy.condition",
        Some(yaml("Sometimes")),
    );
    set(
        &mut w,
        "spec.restartPolicy.maxRestarts",
        Some(yaml("three")),
    );
    set(&mut w, "spec.replicas", None);
    set(
        &mut w,
        "spec.volumes.1.hostMount.hostPath",
        Some(yaml("relative/dir")),
    );
    let mut lb = yaml(LB);
    set(&mut lb, "spec.ports.0.containerPort", Some(yaml("70000")));
    set(&mut lb, "spec.ports.1.protocol", Some(yaml("SCTP")));
    let found = findings(&[("workload.kat", &w), ("VirtualLoadBalancer.kat", &lb)]);
    assert_finding(&found, "workload.kat: metadata.name:");
    assert_finding(
        &found,
        "workload.kat: spec.restartPolicy.condition: unknown variant \"Sometimes\"",
    );
    assert_finding(
        &found,
        "workload.kat: spec.restartPolicy.maxRestarts: invalid type: string \"three\"",
    );
    assert_finding(&found, "workload.kat: spec.replicas:");
    // Named items are named as well as indexed.
    assert_finding(&found, "(in volume \"config\")");
    assert_finding(
        &found,
        "70000 is not a port (expected 1-65535) (in port \"http\")",
    );
    assert_finding(
        &found,
        "VirtualLoadBalancer.kat: spec.ports[1].protocol: unknown variant \"SCTP\"",
    );
    // Setting a field aside never invents a "missing field" finding of its own.
    assert!(
        !found.iter().any(|f| f.contains("missing field `condition`")
            || f.contains("missing field \"condition\"")),
        "{found:#?}"
    );
    // And the consequence in the other file: the ingress names a port no longer declared.
    assert_finding(
        &found,
        "spec.ingress[1].servicePort: 8080 is not a port declared",
    );
    assert_eq!(found.len(), 8, "{found:#?}");
}

#[test]
fn drain_seconds_is_bounded_and_named() {
    assert_valid(&service_with("spec.drainSeconds", Some("0")));
    assert_valid(&service_with("spec.drainSeconds", Some("30")));
    assert_finding(
        &service_with("spec.drainSeconds", Some("7200")),
        "workload.kat: spec.drainSeconds: 7200 is more than the maximum of 3600",
    );
    let negative = service_with("spec.drainSeconds", Some("-1"));
    assert_finding(&negative, "drainSeconds");
    let words = service_with("spec.drainSeconds", Some("soon"));
    assert_finding(&words, "drainSeconds");
}

#[test]
fn a_jobs_instances_never_drain() {
    let bundle = |kind: &str, extra: &str| {
        let workload = format!("apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: w\nspec:\n  type: {kind}\n  drainSeconds: 30\n  source:\n    image: busybox:1\n  restartPolicy:\n    condition: Never\n  container: {{}}\n");
        let mut files = BTreeMap::from([("workload.kat".to_string(), workload.into_bytes())]);
        if !extra.is_empty() {
            files.insert("job.kat".to_string(), extra.as_bytes().to_vec());
        }
        WorkloadBundle::parse(files).expect("valid").workload
    };
    let job = bundle(
        "Job",
        "apiVersion: kat.dws.rip/v1alpha1\nkind: JobDefinition\nspec:\n  completions: 1\n",
    );
    assert_eq!(job.spec.drain(), std::time::Duration::ZERO);
    let service = bundle("Service\n  replicas: 1", "");
    assert_eq!(service.spec.drain(), std::time::Duration::from_secs(30));
}

/// The template hash of a workload (with its CPU and memory amounts) is pinned: a change to
/// how KAT reads or writes a spec that moves it would roll every workload of a cluster on
/// upgrade. Amounts are hashed as written ("0.5" is not "500m").
#[test]
fn the_template_hash_of_a_known_spec_does_not_move() {
    let text = WORKLOAD.replace("cpu: 100m", "cpu: \"0.1\"");
    let bundle =
        WorkloadBundle::parse(BTreeMap::from([("workload.kat".into(), text.into_bytes())]))
            .unwrap();
    assert_eq!(
        bundle.template_hash(),
        "de43afe08cb8533b572a991c6bbc28240c6446836528f999c0f0d427babbc33a"
    );
}
