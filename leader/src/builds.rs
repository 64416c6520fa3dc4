//! Builds of `source.git` images as the nodes report them in their heartbeats: an event when
//! one starts, succeeds or fails (`BuildStarted`, `BuildSucceeded`, `BuildFailed`), and each
//! workload's builds in its status (`katcall describe` shows the step a running build is at).
//!
//! A node's report counts only for a workload with an instance assigned to that node, for the
//! image name the node builds for that commit, once, and at most [`PER_NODE_LIMIT`] per
//! heartbeat: a worker cannot put builds, and so events, on workloads it does not run, nor
//! flood the event log with made-up images.

use std::collections::{HashMap, HashSet};

use kat_api::build_definition::local_reference;
use kat_api::wire::{BuildReport, BuildState, EventType};
use kat_api::WorkloadKey;

use crate::controller::Round;
use crate::events::workload_ref;

/// The longest build message kept in an event or a status (a failure's last lines).
const MESSAGE_LIMIT: usize = 4000;
/// The most builds one node's heartbeat counts (a node builds one image per workload and
/// commit at a time; more is a node flooding the event log).
const PER_NODE_LIMIT: usize = 32;

/// What the leader remembers of the builds it has reported.
#[derive(Default)]
pub struct BuildMemory {
    /// The state last turned into an event, by (node, image).
    seen: HashMap<(String, String), BuildState>,
    /// False until the first round: a new leader takes what is reported then as already
    /// told (the previous leader did), so a failover repeats no event.
    primed: bool,
}

/// Every report that counts, with its node set and its message bounded.
pub fn reported(round: &Round<'_>) -> Vec<BuildReport> {
    let any = round
        .view()
        .nodes
        .values()
        .any(|n| n.heartbeat.as_ref().is_some_and(|hb| !hb.builds.is_empty()));
    if !any {
        // Every round, for every workload: nothing to index when no node builds.
        return Vec::new();
    }
    let runs: HashSet<(&str, &str, &str)> = round
        .view()
        .instances
        .values()
        .map(|r| (r.node.as_str(), r.namespace.as_str(), r.workload.as_str()))
        .collect();
    let mut out = Vec::new();
    for (node, entry) in &round.view().nodes {
        let Some(hb) = &entry.heartbeat else { continue };
        let mut seen = HashSet::new();
        for b in &hb.builds {
            if !runs.contains(&(node.as_str(), b.namespace.as_str(), b.workload.as_str())) {
                continue;
            }
            // The image is the one the node builds for that workload and commit (not a
            // name made up to mint events), once.
            let expected = local_reference(&b.namespace, &b.workload, &b.commit);
            if b.image != expected
                || b.commit.len() != 40
                || !b.commit.bytes().all(|c| c.is_ascii_hexdigit())
                || !seen.insert(b.image.as_str())
            {
                continue;
            }
            if seen.len() > PER_NODE_LIMIT {
                break;
            }
            let mut b = b.clone();
            b.node = Some(node.to_string());
            if b.message.len() > MESSAGE_LIMIT {
                let mut cut = b.message.len() - MESSAGE_LIMIT;
                while !b.message.is_char_boundary(cut) {
                    cut += 1;
                }
                b.message = format!("…{}", &b.message[cut..]);
            }
            out.push(b);
        }
    }
    out.sort_by_key(|b| b.started_at);
    out
}

/// Events for builds that started, succeeded or failed since the last round.
pub fn reconcile(round: &mut Round<'_>, memory: &mut BuildMemory, builds: &[BuildReport]) {
    let mut live = HashSet::new();
    for b in builds {
        let node = b.node.clone().unwrap_or_default();
        let key = (node.clone(), b.image.clone());
        live.insert(key.clone());
        let before = memory.seen.insert(key, b.state);
        if before == Some(b.state) || !memory.primed {
            continue;
        }
        let short: String = b.commit.chars().take(7).collect();
        let started = format!("building {short} on {node} as {}", b.image);
        if before.is_none() && b.state != BuildState::Building {
            // Started and ended between two rounds: both are told.
            round.event(
                EventType::Normal,
                "BuildStarted",
                workload_ref(&b.namespace, &b.workload),
                started.clone(),
            );
        }
        let (kind, reason, message) = match b.state {
            BuildState::Building => (EventType::Normal, "BuildStarted", started),
            BuildState::Succeeded => (
                EventType::Normal,
                "BuildSucceeded",
                format!("{short} on {node}: {}", b.message),
            ),
            BuildState::Failed => (
                EventType::Warning,
                "BuildFailed",
                format!("{short} on {node}: {}", b.message),
            ),
        };
        round.event(
            kind,
            reason,
            workload_ref(&b.namespace, &b.workload),
            message,
        );
    }
    memory.seen.retain(|k, _| live.contains(k));
    memory.primed = true;
}

/// The reports of one workload.
pub fn of(builds: &[BuildReport], key: &WorkloadKey) -> Vec<BuildReport> {
    builds
        .iter()
        .filter(|b| b.namespace == key.namespace && b.workload == key.name)
        .cloned()
        .collect()
}
