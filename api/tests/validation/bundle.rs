//! A bundle as a whole: one file per kind, every error at once, malformed files, the spec and template hashes, drains.

use super::*;

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
