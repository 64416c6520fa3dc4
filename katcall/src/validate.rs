//! `katcall validate`: offline validation of a workload directory or a `cluster.kat`.

use std::path::Path;
use std::process::ExitCode;

use kat_api::{bundle, parse_cluster, Finding, WorkloadBundle};
use serde_json::json;

use crate::Output;

pub fn run(dir: Option<&Path>, cluster: Option<&Path>, output: Output) -> ExitCode {
    let (subject, result) = match (dir, cluster) {
        (Some(dir), _) => (dir.display().to_string(), validate_dir(dir)),
        (None, Some(file)) => (file.display().to_string(), validate_cluster(file)),
        (None, None) => unreachable!("clap requires one of -f or --cluster"),
    };
    match (output, result) {
        (Output::Text, Ok(summary)) => {
            println!("{subject}: valid ({summary})");
            ExitCode::SUCCESS
        }
        (Output::Text, Err(Problem::Findings(findings))) => {
            for f in &findings {
                eprintln!("{f}");
            }
            eprintln!(
                "{subject}: {} error{} found; fix {} and run `katcall validate` again",
                findings.len(),
                if findings.len() == 1 { "" } else { "s" },
                if findings.len() == 1 { "it" } else { "them" }
            );
            ExitCode::FAILURE
        }
        (Output::Text, Err(Problem::Unreadable(message))) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
        (Output::Json, result) => {
            let body = match &result {
                Ok(summary) => {
                    json!({"valid": true, "subject": subject, "summary": summary, "errors": []})
                }
                Err(Problem::Findings(findings)) => json!({
                    "valid": false,
                    "subject": subject,
                    "errors": findings.iter().map(|f| json!({"file": f.file, "path": f.path, "message": f.message})).collect::<Vec<_>>(),
                }),
                Err(Problem::Unreadable(message)) => {
                    json!({"valid": false, "subject": subject, "errors": [{"file": subject, "path": "", "message": message}]})
                }
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&body).unwrap_or_default()
            );
            if result.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

enum Problem {
    Findings(Vec<Finding>),
    Unreadable(String),
}

fn validate_dir(dir: &Path) -> Result<String, Problem> {
    let files = bundle::read_dir(dir).map_err(|e| Problem::Unreadable(e.to_string()))?;
    let names: Vec<String> = files.keys().cloned().collect();
    let bundle =
        WorkloadBundle::parse(files).map_err(|e| Problem::Findings(e.0.findings().to_vec()))?;
    let w = &bundle.workload;
    Ok(format!(
        "workload {}/{} of type {:?}; files: {}",
        w.metadata.namespace,
        w.metadata.name,
        w.spec.workload_type,
        names.join(", ")
    ))
}

fn validate_cluster(file: &Path) -> Result<String, Problem> {
    let bytes = std::fs::read(file)
        .map_err(|e| Problem::Unreadable(format!("cannot read {}: {e}", file.display())))?;
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string());
    let config =
        parse_cluster(&name, &bytes).map_err(|e| Problem::Findings(e.0.findings().to_vec()))?;
    Ok(format!(
        "cluster {}, clusterCIDR {}, API port {}",
        config.metadata.name, config.spec.cluster_cidr, config.spec.api_port
    ))
}
