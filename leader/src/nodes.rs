//! Node liveness (RFC 001 §4.1.4): Ready while heartbeats arrive, NotReady after
//! `nodeLossTimeoutSeconds` without one. Join, leave and readiness changes become events.
//! What happens to a lost node's instances is each workload controller's business.

use kat_api::wire::{EventType, NodeName};

use std::collections::{HashMap, HashSet};

use crate::controller::Round;
use crate::events::node_ref;

/// What the node controller remembers: each node's readiness and the nodes it has seen join.
#[derive(Default)]
pub struct NodeMemory {
    /// Each node's readiness at the last round.
    pub ready: HashMap<NodeName, bool>,
    /// Nodes whose join was told.
    pub known: HashSet<NodeName>,
}

/// Readiness of every node this round, and its join, leave and readiness events.
pub fn reconcile(round: &mut Round<'_>, memory: &mut NodeMemory) {
    let timeout = round.config().node_loss_timeout;
    let now = round.now();
    let mut transitions = Vec::new();
    for (name, entry) in &round.view().nodes {
        let ready = entry.heartbeat.is_some()
            && entry
                .last_seen
                .is_some_and(|seen| now.saturating_duration_since(seen) <= timeout);
        if entry.registration.is_some() && memory.known.insert(name.clone()) {
            transitions.push((
                EventType::Normal,
                "NodeJoined",
                name.to_string(),
                format!("node {name} registered"),
            ));
        }
        match memory.ready.insert(name.clone(), ready) {
            Some(was) if was == ready => {}
            None if ready => transitions.push((
                EventType::Normal,
                "NodeReady",
                name.to_string(),
                format!("node {name} is ready"),
            )),
            None => {}
            Some(_) if ready => transitions.push((
                EventType::Normal,
                "NodeReady",
                name.to_string(),
                format!("node {name} is ready again"),
            )),
            Some(_) => transitions.push((
                EventType::Warning,
                "NodeNotReady",
                name.to_string(),
                format!(
                    "node {name} sent no heartbeat for {}s; its Service instances are rescheduled",
                    timeout.as_secs()
                ),
            )),
        }
    }
    let gone: Vec<NodeName> = memory
        .known
        .iter()
        .filter(|n| {
            round
                .view()
                .nodes
                .get(n.as_str())
                .is_none_or(|e| e.registration.is_none())
        })
        .cloned()
        .collect();
    for name in gone {
        memory.known.remove(&name);
        memory.ready.remove(&name);
        transitions.push((
            EventType::Normal,
            "NodeLeft",
            name.to_string(),
            format!("node {name} was removed"),
        ));
    }
    for (t, reason, name, message) in transitions {
        round.event(t, reason, node_ref(&name), message);
    }
    round.set_readiness(memory.ready.clone());
}
