//! `katcall validate` as a user runs it: the real binary on real directories.

use std::path::{Path, PathBuf};
use std::process::Command;

fn katcall(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_katcall"))
        .args(args)
        .output()
        .expect("run katcall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn shipped_examples_are_valid() {
    for dir in ["hello", "nightly-report"] {
        let (code, stdout, stderr) =
            katcall(&["validate", "-f", examples().join(dir).to_str().unwrap()]);
        assert_eq!(code, 0, "{dir}: {stdout}{stderr}");
        assert!(stdout.contains("valid"), "{stdout}");
    }
    let (code, stdout, stderr) = katcall(&[
        "validate",
        "--cluster",
        examples().join("cluster.kat").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("cluster homelab"), "{stdout}");
}

#[test]
fn every_error_is_printed_and_exit_is_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let workload = std::fs::read_to_string(examples().join("hello/workload.kat"))
        .unwrap()
        .replace("memory: 64Mi", "memory: 64MB")
        .replace("name: hello", "name: Hello");
    std::fs::write(dir.path().join("workload.kat"), workload).unwrap();
    std::fs::write(dir.path().join("lb.kat"), "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{containerPort: 0}]\n").unwrap();
    let (code, _, stderr) = katcall(&["validate", "-f", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains(r#"workload.kat: spec.container.resources.limits.memory: "64MB" is not a memory quantity (expected e.g. 64Mi, 1Gi, 500M)"#), "{stderr}");
    assert!(
        stderr.contains(r#"workload.kat: metadata.name: "Hello" is not a DNS label"#),
        "{stderr}"
    );
    assert!(
        stderr.contains("lb.kat: spec.ports[0].containerPort: 0 is not a port"),
        "{stderr}"
    );
    assert!(stderr.contains("3 errors found"), "{stderr}");

    let (code, stdout, _) =
        katcall(&["validate", "-f", dir.path().to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 1);
    let body: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(body["valid"], false);
    assert_eq!(body["errors"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_cluster_and_missing_paths() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.kat");
    std::fs::write(
        &file,
        std::fs::read_to_string(examples().join("cluster.kat"))
            .unwrap()
            .replace("10.200.0.0/16", "10.100.5.0/24"),
    )
    .unwrap();
    let (code, _, stderr) = katcall(&["validate", "--cluster", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(
            "cluster.kat: spec.serviceCIDR: 10.100.5.0/24 overlaps clusterCIDR 10.100.0.0/16"
        ),
        "{stderr}"
    );
    let (code, _, stderr) = katcall(&["validate", "-f", "/no/such/dir"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot read /no/such/dir"), "{stderr}");
    let (code, _, stderr) = katcall(&["validate"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn completions_generate() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, stdout, _) = katcall(&["completion", shell]);
        assert_eq!(code, 0);
        assert!(stdout.contains("validate"), "{shell}");
    }
}
