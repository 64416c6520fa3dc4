//! Departed nodes (RFC 001 §4.1.4): with `cluster.kat` `nodeRemoveAfterSeconds` set, a node
//! that sent no heartbeat for that long is removed as `katcall delete node` would
//! ([`node_admin::remove`]): its etcd member leaves the quorum, its certificate is revoked,
//! its registration goes. A duty of the leader; never this leader's own node.
//!
//! Silence is measured by this leader's clock from the last change of the node's status key
//! it saw (each heartbeat rewrites it), not from the timestamp inside it: a node's clock may
//! be wrong. A node first seen by this leader gets the whole period from then, so a new
//! leader never removes a node sooner than the setting says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kat_api::keys;
use kat_store::{EtcdStore, StateStore};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::desired::node_admin;
use crate::events::EventLog;

/// What the sweep needs.
pub struct Sweep {
    pub store: Arc<dyn StateStore>,
    pub etcd: Option<EtcdStore>,
    pub events: EventLog,
    pub clock: Clock,
    /// `nodeRemoveAfterSeconds`.
    pub after: Duration,
    /// This leader's node: never removed by itself.
    pub own: String,
}

/// When each node's status key last changed, as this leader saw it.
#[derive(Default)]
pub struct Silence {
    seen: HashMap<String, (i64, Instant)>,
}

impl Sweep {
    /// Look every few seconds until the leadership ends (the task is dropped).
    pub async fn run(self) {
        let period = (self.after / 4).clamp(Duration::from_secs(1), Duration::from_secs(10));
        let mut silence = Silence::default();
        loop {
            if let Err(e) = self.once(&mut silence).await {
                tracing::warn!(error = %e, "departed-node sweep failed; trying again");
            }
            tokio::time::sleep(period).await;
        }
    }

    /// One look: remove every node silent for `after`; returns the names removed.
    pub async fn once(
        &self,
        silence: &mut Silence,
    ) -> Result<Vec<String>, node_admin::NodeAdminError> {
        let now = Instant::now();
        let registrations = self.store.list(keys::node_registrations()).await?;
        let statuses = self.store.list(keys::node_statuses()).await?;
        let revision_of = |name: &str| {
            statuses
                .kvs
                .iter()
                .find(|kv| kv.key.strip_prefix(keys::node_statuses()) == Some(name))
                .map_or(0, |kv| kv.mod_revision)
        };
        let names: Vec<String> = registrations
            .kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(keys::node_registrations()))
            .map(str::to_string)
            .collect();
        silence.seen.retain(|n, _| names.contains(n));
        let mut removed = Vec::new();
        for name in names {
            let revision = revision_of(&name);
            let entry = silence.seen.entry(name.clone()).or_insert((revision, now));
            if entry.0 != revision {
                *entry = (revision, now);
            }
            if name == self.own || now.saturating_duration_since(entry.1) < self.after {
                continue;
            }
            let why = format!(
                " after {}s without a heartbeat (nodeRemoveAfterSeconds)",
                self.after.as_secs()
            );
            tracing::warn!(node = %name, "removing a departed node{why}");
            let done = node_admin::remove(
                &*self.store,
                &self.events,
                &self.clock,
                self.etcd.as_ref(),
                &name,
                &why,
                Some(revision),
            )
            .await?;
            silence.seen.remove(&name);
            if done {
                removed.push(name);
            }
        }
        Ok(removed)
    }
}
