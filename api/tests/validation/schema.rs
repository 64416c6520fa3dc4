//! The JSON Schemas of docs/schema/: generated from the types (the files must be what the
//! types make now), described field by field, passed by every example and by the valid
//! files these tests hold, and failed by the invalid ones that validation refuses for what
//! one file says (unknown or missing fields, wrong types, enums, names, quantities, ranges).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema_of(kind: &str) -> Json {
    let file = match kind {
        "Workload" => "workload.json",
        "VirtualLoadBalancer" => "virtual-load-balancer.json",
        "JobDefinition" => "job-definition.json",
        "BuildDefinition" => "build-definition.json",
        "Namespace" => "namespace.json",
        "ClusterConfiguration" => "cluster-configuration.json",
        other => panic!("no schema for kind {other:?}"),
    };
    kat_api::schema::kinds()
        .into_iter()
        .find(|(name, _)| *name == file)
        .map(|(_, schema)| schema)
        .unwrap_or_else(|| panic!("kat_api::schema::kinds() lacks {file}"))
}

/// The schema's complaints about a YAML document, checked against the schema of `kind`.
fn schema_errors(kind: &str, doc: &Value) -> Vec<String> {
    let schema = schema_of(kind);
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let instance: Json = serde_json::to_value(doc).expect("YAML as JSON");
    validator
        .iter_errors(&instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn docs_schema_is_what_the_types_make() {
    let dir = repo().join("docs/schema");
    let update = std::env::var_os("KAT_UPDATE_SCHEMAS").is_some();
    for (file, schema) in kat_api::schema::kinds() {
        let path = dir.join(file);
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            stored == text,
            "{} is not the schema the types make now: run `KAT_UPDATE_SCHEMAS=1 cargo test -p kat-api --test validation schema` and commit docs/schema/",
            path.display()
        );
    }
}

/// Every property of every object in `schema` (and its definitions), by path.
fn properties<'a>(at: &str, schema: &'a Json, out: &mut Vec<(String, &'a Json)>) {
    if let Some(props) = schema.get("properties").and_then(Json::as_object) {
        for (name, prop) in props {
            out.push((format!("{at}.{name}"), prop));
            properties(&format!("{at}.{name}"), prop, out);
        }
    }
    for key in ["definitions", "$defs"] {
        if let Some(defs) = schema.get(key).and_then(Json::as_object) {
            for (name, def) in defs {
                properties(&format!("#{name}"), def, out);
            }
        }
    }
}

#[test]
fn every_field_is_described_and_the_kinds_are_fixed() {
    for (file, schema) in kat_api::schema::kinds() {
        let mut props = Vec::new();
        properties("", &schema, &mut props);
        assert!(props.len() >= 3, "{file}: {props:?}");
        let undescribed: Vec<&str> = props
            .iter()
            .filter(|(_, p)| p.get("description").is_none())
            .map(|(path, _)| path.as_str())
            .collect();
        assert!(
            undescribed.is_empty(),
            "{file}: no description: {undescribed:?}"
        );
        assert_eq!(
            schema["properties"]["apiVersion"]["const"], "kat.dws.rip/v1alpha1",
            "{file}"
        );
        assert!(schema["properties"]["kind"]["const"].is_string(), "{file}");
        assert_eq!(
            schema["$schema"], "http://json-schema.org/draft-07/schema#",
            "{file}"
        );
    }
}

#[test]
fn every_example_and_every_valid_file_here_passes() {
    let mut checked = 0;
    let mut dirs = vec![repo().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "kat") {
                let doc = yaml(&std::fs::read_to_string(&path).unwrap());
                let kind = doc["kind"].as_str().unwrap().to_string();
                let errors = schema_errors(&kind, &doc);
                assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 7, "only {checked} examples found");
    let mut job = yaml(WORKLOAD);
    set(&mut job, "spec.type", Some(yaml("Job")));
    for (kind, doc) in [
        ("Workload", yaml(WORKLOAD)),
        ("Workload", job),
        ("VirtualLoadBalancer", yaml(LB)),
        ("JobDefinition", yaml(JOB)),
        ("BuildDefinition", yaml(BUILD)),
        ("ClusterConfiguration", yaml(CLUSTER)),
        (
            "Namespace",
            yaml("apiVersion: kat.dws.rip/v1alpha1\nkind: Namespace\nmetadata: {name: team, labels: {tier: web}}"),
        ),
    ] {
        let errors = schema_errors(kind, &doc);
        assert!(errors.is_empty(), "{kind}: {errors:#?}");
    }
    // A bare number is a quantity too, as the parser reads it.
    let mut w = yaml(WORKLOAD);
    set(
        &mut w,
        "spec.container.resources.limits.cpu",
        Some(yaml("2")),
    );
    assert_valid(&findings(&[("workload.kat", &w), ("lb.kat", &yaml(LB))]));
    assert_eq!(schema_errors("Workload", &w), Vec::<String>::new());
}

/// `doc` with `path` set to `value` (`None`: removed).
fn changed(doc: &str, path: &str, value: Option<&str>) -> Value {
    let mut d = yaml(doc);
    set(&mut d, path, value.map(yaml));
    d
}

/// Validation found something wrong with `doc` (`path` set to `value`), and so does the
/// schema of `kind`.
#[track_caller]
fn both_refuse(kind: &str, doc: &Value, found: &[String], path: &str, value: Option<&str>) {
    assert!(!found.is_empty(), "{path}={value:?}: validation accepts it");
    assert!(
        !schema_errors(kind, doc).is_empty(),
        "{path}={value:?}: the schema accepts what validation refuses: {found:?}"
    );
}

#[test]
fn files_validation_refuses_fail_the_schema_too() {
    let workload_cases: &[(&str, Option<&str>)] = &[
        ("apiVersion", Some("v1")),
        ("apiVersion", None),
        ("kind", Some("Deployment")),
        ("kind", None),
        ("spec.replica", Some("2")),
        ("spec.container.resources.limits.cpux", Some("1")),
        ("spec.type", None),
        ("spec.type", Some("Daemon")),
        ("spec.restartPolicy", None),
        ("spec.restartPolicy.condition", Some("Sometimes")),
        ("spec.updateStrategy.type", Some("Canary")),
        ("spec.tolerations.0.operator", Some("In")),
        ("spec.container.resources.gpu.driver", Some("intel")),
        ("spec.container.resources.gpu.count", Some("0")),
        ("spec.volumes.1.hostMount.ensureType", Some("Dir")),
        ("spec.volumes.1.hostMount.hostPath", Some("etc/web")),
        ("metadata.name", None),
        ("metadata.name", Some("Web_1")),
        ("spec.container", None),
        ("spec.replicas", Some("two")),
        ("spec.replicas", Some("-1")),
        ("spec.container.resources.limits.memory", Some("lots")),
        ("spec.container.resources.requests.cpu", Some("'0.0001'")),
        ("spec.container.volumeMounts.0.mountPath", Some("data")),
    ];
    for (path, value) in workload_cases {
        let w = changed(WORKLOAD, path, *value);
        let found = findings(&[("workload.kat", &w), ("lb.kat", &yaml(LB))]);
        both_refuse("Workload", &w, &found, path, *value);
    }
    let lb_cases: &[(&str, Option<&str>)] = &[
        ("spec.healthCheck.periodSecond", Some("3")),
        ("spec.ports", None),
        ("spec.ports.0.containerPort", Some("70000")),
        ("spec.ports.1.protocol", Some("SCTP")),
        ("spec.ingress.1.path", Some("api")),
        ("spec.healthCheck.onFailure", Some("reboot")),
    ];
    for (path, value) in lb_cases {
        let lb = changed(LB, path, *value);
        let found = findings(&[("workload.kat", &yaml(WORKLOAD)), ("lb.kat", &lb)]);
        both_refuse("VirtualLoadBalancer", &lb, &found, path, *value);
    }
    let mut job_workload = yaml(WORKLOAD);
    set(&mut job_workload, "spec.type", Some(yaml("Job")));
    set(&mut job_workload, "spec.replicas", None);
    set(&mut job_workload, "spec.updateStrategy", None);
    assert_valid(&findings(&[
        ("workload.kat", &job_workload),
        ("job.kat", &yaml(JOB)),
    ]));
    for (path, value) in [
        ("spec.completions", Some("0")),
        ("spec.parallelism", Some("0")),
        ("spec.schedul", Some("'* * * * *'")),
        ("spec.backoffLimit", Some("-2")),
    ] {
        let job = changed(JOB, path, value);
        let found = findings(&[("workload.kat", &job_workload), ("job.kat", &job)]);
        both_refuse("JobDefinition", &job, &found, path, value);
    }
    for (path, value) in [
        ("spec.apiport", Some("1")),
        ("spec.clusterCIDR", None),
        ("spec.agentPort", Some("70000")),
        ("spec.volumeBasePath", Some("var/lib")),
        ("metadata.name", Some("My Cluster")),
        ("kind", Some("Workload")),
    ] {
        let c = changed(CLUSTER, path, value);
        let text = yaml_serde::to_string(&c).unwrap();
        let found: Vec<String> = parse_cluster("cluster.kat", text.as_bytes())
            .err()
            .map(|e| e.to_string())
            .into_iter()
            .collect();
        both_refuse("ClusterConfiguration", &c, &found, path, value);
    }
}
