//! Health transitions as events (RFC 001 §4.6, §9.3): `InstanceUnhealthy` when an instance
//! turns Unhealthy, `InstanceHealthy` when one recovers from it. Transitions only, not every
//! probe: the leader remembers each instance's last known health (`Unknown` while it
//! restarts changes nothing, so Unhealthy → restart → Healthy is a recovery) and its node's
//! count of turns to Unhealthy, so a turn over between two heartbeats is not missed. An
//! instance already reported when this leader first sees it (every instance after a
//! failover) sets the baseline without an event, so a new leader does not repeat its
//! predecessor's; a new instance (its record made since this leader started, or seen by it
//! before any report) counts from nothing, however quickly it turned: on a busy machine
//! the node's first report of it can already count a turn, before any round saw it
//! unreported.

use std::collections::HashMap;

use kat_api::wire::{EventType, Health, InstanceId, Timestamp};

use crate::controller::Round;
use crate::events;

/// What the leader last knew of an instance's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The last health other than Unknown (Unknown if none yet).
    known: Health,
    /// Its node's count of turns to Unhealthy.
    unhealthy_transitions: u32,
}

/// What the leader remembers of health between rounds.
#[derive(Debug, Default)]
pub struct HealthMemory {
    seen: HashMap<InstanceId, Seen>,
    /// What this round saw, kept once its writes (the events) landed: a round whose
    /// transaction fails is decided again from what the last good round saw, so its events
    /// are written then rather than lost.
    next: Option<HashMap<InstanceId, Seen>>,
    /// This leader's first round: instances made since are new to everyone.
    since: Option<Timestamp>,
}

impl HealthMemory {
    /// The round's writes landed.
    pub fn settle(&mut self) {
        if let Some(next) = self.next.take() {
            self.seen = next;
        }
    }

    /// The round's writes did not land.
    pub fn forget_round(&mut self) {
        self.next = None;
    }
}

pub fn reconcile(round: &mut Round<'_>, memory: &mut HealthMemory) {
    let since = *memory.since.get_or_insert(round.wall());
    let last = &memory.seen;
    let mut now = HashMap::with_capacity(last.len());
    let mut found = Vec::new();
    for (id, node, status) in round.reported() {
        let Some(record) = round.view().instances.get(id) else {
            continue;
        };
        if record.node != *node {
            continue;
        }
        let count = status.unhealthy_transitions;
        let new = Seen {
            known: Health::Unknown,
            unhealthy_transitions: 0,
        };
        let before = last
            .get(id)
            .copied()
            .or_else(|| (record.created_at >= since).then_some(new));
        if before.is_none_or(|b| b.unhealthy_transitions != count || b.known != status.health) {
            tracing::debug!(
                instance = %id,
                health = ?status.health,
                count,
                ?before,
                remembered = last.contains_key(id),
                created = %record.created_at,
                %since,
                "health reported"
            );
        }
        // The node counts every turn to Unhealthy: one that came and went between two
        // heartbeats still shows (a restart for health is that quick).
        let turned = before.is_some_and(|before| {
            count > before.unhealthy_transitions
                || (status.health == Health::Unhealthy && before.known != Health::Unhealthy)
        });
        if let Some(before) = before {
            if turned {
                let times = count.saturating_sub(before.unhealthy_transitions);
                let again = if times > 1 {
                    format!(" ({times} times since the last look)")
                } else {
                    String::new()
                };
                found.push((
                    EventType::Warning,
                    "InstanceUnhealthy",
                    record,
                    format!(
                        "{id} on {node} turned unhealthy{again}: its health check failed failureThreshold times in a row"
                    ),
                ));
            }
            if status.health == Health::Healthy && (before.known == Health::Unhealthy || turned) {
                found.push((
                    EventType::Normal,
                    "InstanceHealthy",
                    record,
                    format!("{id} on {node} is healthy again"),
                ));
            }
        }
        // `Unknown` (a container restarting) keeps the last known health: Unhealthy, then a
        // restart, then Healthy is a recovery. A turn counted while the instance already
        // restarts for it (the first report since says Unknown) is Unhealthy known.
        let known = match (status.health, before) {
            (Health::Unknown, _) if turned => Health::Unhealthy,
            (Health::Unknown, Some(b)) => b.known,
            (h, _) => h,
        };
        now.insert(
            record.instance_id.clone(),
            Seen {
                known,
                unhealthy_transitions: count,
            },
        );
    }
    // An instance this leader knows but its node has not reported yet is new to everyone:
    // its first report counts from nothing (a turn to Unhealthy before this leader first
    // heard of it is an event), unlike one already running when this leader took over.
    for (id, record) in &round.view().instances {
        if !round.is_reported(id) && !now.contains_key(id.as_str()) {
            let seen = last.get(id.as_str()).copied().unwrap_or(Seen {
                known: Health::Unknown,
                unhealthy_transitions: 0,
            });
            now.insert(record.instance_id.clone(), seen);
        }
    }
    // In a stable order: `reported` is a hash map.
    found.sort_by(|a, b| a.2.instance_id.cmp(&b.2.instance_id));
    for (event_type, reason, record, message) in found {
        let object = events::workload_ref(&record.namespace, &record.workload);
        round.event(event_type, reason, object, message);
    }
    memory.next = Some(now);
}
