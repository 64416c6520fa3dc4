//! A one-node KAT cluster end to end, on real parts: `kat-agent init` with its own etcd, a
//! loopback registry serving the busybox image `scripts/test-fixtures.sh` built, real
//! containers, and `katcall` as a user runs it.
//!
//! One cluster walks through every scenario in order (a cluster takes seconds to start and
//! the scenarios build on each other), each scenario a named test of its own ([`STEPS`], run
//! by libtest-mimic) so that a failure names its scenario and hides none of the others: two healthy replicas with a volume and their logs;
//! exec; a killed process restarted per policy; MaxCount exhausted, Never and a Job retried per its restartPolicy, ended instances replaced; an updated
//! spec replacing the instances; a bad bundle refused with nothing changed; 401 without the
//! token; `kill -9` of the agent with no duplicate containers and no lost log lines; delete
//! leaving no container, cgroup or mount behind. On the way, 200 idle connections and an
//! exec whose command never reads its stdin must not slow the API, the heartbeats or the
//! leader, and the idle connections are closed by the server's timeouts.
//!
//! With `KAT_TEST_AGENT_USER=NAME` the agent runs as that unprivileged user, prepared by
//! `kat-agent setup --user NAME` (scripts/test-rootless.sh does this), as in production.

// The tests read KAT's answers and files, never the store: no stored record to decode.
#![allow(clippy::disallowed_methods)]

mod cluster;
mod git_builds;
mod jobs;
mod network;
mod node;
mod specs;
mod stalls;
mod workloads;

use std::collections::BTreeSet;
use std::sync::Arc;

use cluster::Cluster;
use node::*;
use workloads::*;

/// What the steps share: the cluster, and what one step leaves for the next.
pub(crate) struct Run {
    pub(crate) c: Cluster,
    pub(crate) image: String,
    /// The first generation's instances of `web`.
    pub(crate) first: BTreeSet<String>,
    /// One of them, and the other.
    pub(crate) id: String,
    pub(crate) other: String,
    /// The second generation's instances of `web`.
    pub(crate) second: BTreeSet<String>,
    /// `web`'s instances before the agent is killed, and the `ticker` instance.
    pub(crate) before: BTreeSet<String>,
    pub(crate) ticker: String,
}

type Step = fn(&mut Run);

/// The scenarios, in order, on one cluster: each a test of its own, so that one failing
/// does not hide the rest (a later step may still fail for want of what a failed one left).
const STEPS: &[(&str, Step)] = &[
    (
        "a_service_runs_healthy_with_its_logs_and_volume",
        a_service_runs_healthy_with_its_logs_and_volume,
    ),
    (
        "exec_passes_the_exit_code_through",
        exec_passes_the_exit_code_through,
    ),
    (
        "containers_reach_each_other_and_the_outside",
        containers_reach_each_other_and_the_outside,
    ),
    ("workloads_build_from_git", workloads_build_from_git),
    (
        "a_killed_process_restarts_under_always",
        a_killed_process_restarts_under_always,
    ),
    (
        "a_stuck_pull_delays_nothing_and_ended_instances_follow_the_policy",
        a_stuck_pull_delays_nothing_and_ended_instances_follow_the_policy,
    ),
    (
        "an_unhealthy_instance_restarts_when_asked",
        an_unhealthy_instance_restarts_when_asked,
    ),
    (
        "a_gpu_workload_gets_its_device",
        a_gpu_workload_gets_its_device,
    ),
    (
        "an_updated_spec_replaces_the_instances",
        an_updated_spec_replaces_the_instances,
    ),
    (
        "a_bad_bundle_is_refused_and_changes_nothing",
        a_bad_bundle_is_refused_and_changes_nothing,
    ),
    (
        "host_mounts_off_the_allow_list_are_refused",
        host_mounts_off_the_allow_list_are_refused,
    ),
    (
        "the_api_and_etcd_refuse_strangers",
        the_api_and_etcd_refuse_strangers,
    ),
    (
        "usage_shows_in_top_and_metrics",
        usage_shows_in_top_and_metrics,
    ),
    (
        "the_node_runs_without_thread_caches",
        the_node_runs_without_thread_caches,
    ),
    ("the_node_never_stalls", the_node_never_stalls),
    (
        "an_agent_killed_and_restarted_duplicates_nothing",
        an_agent_killed_and_restarted_duplicates_nothing,
    ),
    (
        "a_reboot_without_etcd_runs_from_the_local_copy",
        a_reboot_without_etcd_runs_from_the_local_copy,
    ),
    (
        "node_admin_and_rollback_show_in_events",
        node_admin_and_rollback_show_in_events,
    ),
    (
        "delete_leaves_no_containers_cgroups_or_mounts",
        delete_leaves_no_containers_cgroups_or_mounts,
    ),
    (
        "backups_are_taken_listed_and_pruned",
        backups_are_taken_listed_and_pruned,
    ),
];

/// libtest's own harness cannot share one cluster between tests in order; libtest-mimic
/// runs the steps as named tests with the same command line (`--list`, filters, `--exact`).
fn main() -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    // The steps build on each other: one at a time, in order.
    args.test_threads = Some(1);
    if args.list {
        let trials = STEPS
            .iter()
            .map(|(name, _)| libtest_mimic::Trial::test(*name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let c = Cluster::start();
    let image = format!("{}/kat/busybox:latest", c.registry);
    let run = Arc::new(std::sync::Mutex::new(Run {
        c,
        image,
        first: BTreeSet::new(),
        id: String::new(),
        other: String::new(),
        second: BTreeSet::new(),
        before: BTreeSet::new(),
        ticker: String::new(),
    }));
    let trials = STEPS
        .iter()
        .map(|(name, step)| {
            let (run, step) = (run.clone(), *step);
            libtest_mimic::Trial::test(*name, move || {
                let mut run = run.lock().unwrap_or_else(|p| p.into_inner());
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut run))).map_err(
                    |e| {
                        let message = e
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "the step panicked".into());
                        libtest_mimic::Failed::from(message)
                    },
                )
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // The cluster stops (its Drop) before the process exits.
    drop(run);
    if conclusion.has_failed() {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
