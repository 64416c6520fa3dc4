//! What the leader remembers between rounds, per controller.

use std::collections::{HashMap, HashSet};

use kat_api::wire::InstanceId;
use kat_api::wire::WorkloadStatus;
use kat_api::WorkloadKey;
use tokio::time::Instant;

use crate::services;

/// What leader remembers between rounds; all of it can be rebuilt from the store (a new
/// leader starts with none of it and converges to the same decisions).
#[derive(Default)]
pub struct Memory {
    pub ready: HashMap<String, bool>,
    pub known_nodes: HashSet<String>,
    pub rollouts: HashMap<WorkloadKey, services::RolloutTracker>,
    pub simultaneous_since: HashMap<WorkloadKey, Instant>,
    pub pending_reason: HashMap<WorkloadKey, String>,
    pub statuses: HashMap<WorkloadKey, WorkloadStatus>,
    pub first_seen: HashMap<WorkloadKey, u64>,
    pub builds: crate::builds::BuildMemory,
    /// Ended Service instances already kept once ([`crate::finished::reconcile`]): never
    /// kept again after the retention dropped them.
    pub archived: HashSet<InstanceId>,
    /// Each instance's last reported health ([`crate::health_events`]).
    pub health: crate::health_events::HealthMemory,
    /// Replacements of ended instances in a row, per workload ([`crate::replacement`]).
    pub replacements: HashMap<WorkloadKey, crate::replacement::Streak>,
    /// Refused stored generations already told ([`crate::stored_rules`]).
    pub refused_stored: HashMap<WorkloadKey, u64>,
}
