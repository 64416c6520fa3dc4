//! A Job's output, kept after its container is gone.

use std::time::Duration;

use crate::cluster::*;
use kat_api::wire::{InstanceState, InstanceStatus};

/// A Job that ran keeps its output: once its run succeeded its record and container are
/// gone, yet `katcall logs JOB` shows what it printed, `get instances --all` lists it with
/// its exit code, and `logs JOB/ID` reads it too (the agent kept the log).
pub(crate) fn job_output_is_kept(c: &Cluster, image: &str) {
    let files = vec![
        (
            "workload.kat",
            format!(
                "apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: report
  namespace: default
spec:
  type: Job
  source:
    image: {image}
  restartPolicy:
    condition: Never
  container:
    command: [\"/bin/sh\", \"-c\", \"echo report-line-1; echo report-line-2 >&2; exit 0\"]
"
            ),
        ),
        (
            "job.kat",
            "apiVersion: kat.dws.rip/v1alpha1
kind: JobDefinition
spec:
  completions: 1
"
            .to_string(),
        ),
    ];
    c.apply("report", &files);
    let mut finished = None;
    c.wait("the report job to finish", Duration::from_secs(90), |c| {
        let list: Vec<InstanceStatus> = c
            .k()
            .json(&["get", "instances", "--all", "-o", "json"])
            .unwrap_or_default();
        finished = list
            .into_iter()
            .find(|i| i.workload == "report" && i.state == InstanceState::Succeeded);
        finished.is_some()
    });
    let finished = finished.expect("the finished run");
    assert_eq!(finished.exit_code, Some(0), "{finished:?}");
    assert!(finished.finished_at.is_some(), "{finished:?}");
    let id = finished.instance_id.to_string();
    // Its record went (the Job counted it), so the node removed its container.
    c.wait(
        "the report container removed",
        Duration::from_secs(30),
        |c| {
            std::fs::read_to_string(c.dir.path().join("agent.log"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("kept the log of a removed container") && l.contains(&id))
        },
    );
    let live: Vec<InstanceStatus> = c
        .k()
        .json(&["get", "instances", "-o", "json"])
        .expect("instances as JSON");
    assert!(
        !live.iter().any(|i| i.instance_id == id),
        "without --all a finished instance is not listed"
    );
    let table = c.must(&["get", "instances", "--all"]);
    assert!(
        table.contains(&id) && table.contains("Succeeded"),
        "{table}"
    );

    let out = c.katcall(&["logs", "report"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("report-line-1") && stdout.contains("report-line-2"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.contains(&id) && stderr.contains("exit code 0"),
        "{stderr}"
    );
    let tail = c.must(&["logs", &format!("report/{id}"), "--tail", "1"]);
    assert!(
        tail.contains("report-line-2") && !tail.contains("report-line-1"),
        "{tail}"
    );
    c.must(&["delete", "workload", "report"]);
}
