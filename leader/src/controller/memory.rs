//! What the leader remembers between rounds: one memory per controller. All of it can be
//! rebuilt from the store (a new leader starts with none of it and converges to the same
//! decisions).

use std::collections::HashMap;

use kat_api::wire::WorkloadStatus;
use kat_api::WorkloadKey;

/// Every controller's memory.
#[derive(Default)]
pub struct Memory {
    /// The node controller's ([`crate::nodes`]).
    pub nodes: crate::nodes::NodeMemory,
    /// The Service controller's ([`crate::services`]).
    pub services: crate::services::ServiceMemory,
    /// The Job controller's ([`crate::jobs`]).
    pub jobs: crate::jobs::JobMemory,
    /// What the three workload controllers (Services, DaemonServices, Jobs) keep alike.
    pub workloads: WorkloadMemory,
    /// Each workload's status as last written: a round writes one only when it changed.
    pub statuses: HashMap<WorkloadKey, WorkloadStatus>,
    /// The build controller's ([`crate::builds`]).
    pub builds: crate::builds::BuildMemory,
    /// The finished-runs controller's ([`crate::finished`]).
    pub finished: crate::finished::FinishedMemory,
    /// The health events controller's ([`crate::health_events`]).
    pub health: crate::health_events::HealthMemory,
    /// Refused stored generations already told ([`crate::stored_rules`]).
    pub refused_stored: HashMap<WorkloadKey, u64>,
}

/// What each workload controller keeps per workload.
#[derive(Default)]
pub struct WorkloadMemory {
    /// Why instances stay Pending, as last told in an event (told again only when it changes).
    pub pending_reason: HashMap<WorkloadKey, String>,
    /// Replacements of ended instances in a row ([`crate::replacement`]).
    pub replacements: HashMap<WorkloadKey, crate::replacement::Streak>,
}
