//! Health transitions as events (RFC 001 §4.6, §9.3): `InstanceUnhealthy` when an instance
//! turns Unhealthy, `InstanceHealthy` when one recovers from it. Transitions only, not every
//! probe: the leader remembers each instance's last known health (`Unknown` while it
//! restarts changes nothing, so Unhealthy → restart → Healthy is a recovery). An instance first seen
//! by this leader (a new instance, or every instance after a failover) sets the baseline
//! without an event, so a new leader does not repeat its predecessor's.

use std::collections::HashMap;

use kat_api::wire::{EventType, Health, InstanceId};

use crate::controller::Round;
use crate::events;

pub fn reconcile(round: &mut Round<'_>, last: &mut HashMap<InstanceId, Health>) {
    let mut now = HashMap::with_capacity(last.len());
    let mut found = Vec::new();
    for (id, (node, status)) in &round.reported {
        let Some(record) = round.view.instances.get(*id) else {
            continue;
        };
        if record.node != *node {
            continue;
        }
        let before = last.get(*id).copied();
        match (before, status.health) {
            (Some(b), Health::Unhealthy) if b != Health::Unhealthy => found.push((
                EventType::Warning,
                "InstanceUnhealthy",
                record,
                format!(
                    "{id} on {node} is unhealthy: its health check failed failureThreshold times in a row"
                ),
            )),
            (Some(Health::Unhealthy), Health::Healthy) => found.push((
                EventType::Normal,
                "InstanceHealthy",
                record,
                format!("{id} on {node} is healthy again"),
            )),
            _ => {}
        }
        // `Unknown` (a container restarting) keeps the last known health: Unhealthy, then a
        // restart, then Healthy is a recovery.
        let known = match (status.health, before) {
            (Health::Unknown, Some(b)) => b,
            (h, _) => h,
        };
        now.insert(record.instance_id.clone(), known);
    }
    // In a stable order: `reported` is a hash map.
    found.sort_by(|a, b| a.2.instance_id.cmp(&b.2.instance_id));
    for (event_type, reason, record, message) in found {
        let object = events::workload_ref(&record.namespace, &record.workload);
        round.event(event_type, reason, object, message);
    }
    *last = now;
}
