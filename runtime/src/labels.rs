//! The labels that tie a container to the instance it runs: set by the node's supervisor
//! when it creates a container, read back by everything that finds an instance's containers
//! (adoption after an agent restart, exec and logs, kept logs, usage).

use std::collections::BTreeMap;

/// The instance the container runs (an instance id).
pub const INSTANCE: &str = "kat.instance";
/// The container's attempt: how many restarts of its instance came before it (0 for the
/// first run).
pub const ATTEMPT: &str = "kat.attempt";
/// The generation of the workload that made the instance.
pub const GENERATION: &str = "kat.generation";

/// The attempt `labels` name; 0 when they name none (a container made before the label was).
pub fn attempt(labels: &BTreeMap<String, String>) -> u32 {
    labels
        .get(ATTEMPT)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}
