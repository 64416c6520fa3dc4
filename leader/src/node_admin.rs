//! Changes administrators make to nodes: drain, uncordon, taints, labels.
//!
//! Each is a read-modify-write of the node's registration with a compare on its revision,
//! retried on conflict, so an agent re-registering and an administrator tainting at the same
//! moment do not lose each other's change.

use std::collections::BTreeMap;

use kat_api::keys;
use kat_api::wire::{EventType, NodeRegistration, Taint, DRAIN_TAINT_KEY};
use kat_api::workload::TaintEffect;
use kat_store::{Compare, StateStore, StoreError, Txn, TxnOp};

use crate::clock::Clock;
use crate::events::{event, node_ref, EventLog};

#[derive(Debug, thiserror::Error)]
pub enum NodeAdminError {
    #[error("node {0} is not registered (see `katcall get nodes`)")]
    NotFound(String),
    #[error("node {0}'s registration is unreadable: {1}")]
    Corrupt(String, String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Register or refresh a node (what an agent does when it starts); keeps admin-set fields.
pub async fn register(
    store: &dyn StateStore,
    name: &str,
    addresses: Vec<String>,
    labels: BTreeMap<String, String>,
) -> Result<(), NodeAdminError> {
    let key = keys::node_registration(name);
    loop {
        let current = store.get(&key).await?;
        let mut reg = match &current {
            Some(kv) => serde_json::from_slice::<NodeRegistration>(&kv.value)
                .map_err(|e| NodeAdminError::Corrupt(name.into(), e.to_string()))?,
            None => NodeRegistration {
                name: name.into(),
                addresses: vec![],
                labels: BTreeMap::new(),
                taints: vec![],
                draining: false,
            },
        };
        reg.addresses = addresses.clone();
        for (k, v) in &labels {
            reg.labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        let guard = current.as_ref().map_or_else(
            || Compare::absent(&key),
            |kv| Compare::mod_revision_is(&key, kv.mod_revision),
        );
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put_json(&key, &reg)?]);
        if store.txn(txn).await?.succeeded {
            return Ok(());
        }
    }
}

async fn modify(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
    reason: &str,
    message: String,
    change: impl Fn(&mut NodeRegistration),
) -> Result<NodeRegistration, NodeAdminError> {
    let key = keys::node_registration(name);
    loop {
        let Some(kv) = store.get(&key).await? else {
            return Err(NodeAdminError::NotFound(name.into()));
        };
        let mut reg: NodeRegistration = serde_json::from_slice(&kv.value)
            .map_err(|e| NodeAdminError::Corrupt(name.into(), e.to_string()))?;
        change(&mut reg);
        let mut ops = vec![TxnOp::put_json(&key, &reg)?];
        ops.extend(events.ops(&event(
            clock.timestamp(),
            EventType::Normal,
            reason,
            node_ref(name),
            message.clone(),
        )));
        if store
            .txn(
                Txn::new()
                    .when([Compare::mod_revision_is(&key, kv.mod_revision)])
                    .and_then(ops),
            )
            .await?
            .succeeded
        {
            return Ok(reg);
        }
    }
}

/// `katcall drain`: a NoSchedule taint and the Draining state.
pub async fn drain(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
) -> Result<NodeRegistration, NodeAdminError> {
    modify(
        store,
        events,
        clock,
        name,
        "NodeDraining",
        format!("draining {name}: Service instances move elsewhere, jobs finish"),
        |reg| {
            reg.draining = true;
            if !reg.taints.iter().any(|t| t.key == DRAIN_TAINT_KEY) {
                reg.taints.push(Taint {
                    key: DRAIN_TAINT_KEY.into(),
                    value: None,
                    effect: TaintEffect::NoSchedule,
                });
            }
        },
    )
    .await
}

/// `katcall uncordon`: undo a drain.
pub async fn uncordon(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
) -> Result<NodeRegistration, NodeAdminError> {
    modify(
        store,
        events,
        clock,
        name,
        "NodeUncordoned",
        format!("{name} accepts instances again"),
        |reg| {
            reg.draining = false;
            reg.taints.retain(|t| t.key != DRAIN_TAINT_KEY);
        },
    )
    .await
}

/// `PUT /nodes/{name}/taints`: replace the node's taints (the drain taint is kept while draining).
pub async fn set_taints(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
    taints: Vec<Taint>,
) -> Result<NodeRegistration, NodeAdminError> {
    let summary = taints
        .iter()
        .map(|t| {
            format!(
                "{}={}:{:?}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    modify(
        store,
        events,
        clock,
        name,
        "NodeTainted",
        format!("taints of {name}: [{summary}]"),
        |reg| {
            let drain = reg
                .taints
                .iter()
                .find(|t| t.key == DRAIN_TAINT_KEY && reg.draining)
                .cloned();
            reg.taints = taints.clone();
            if let Some(d) = drain {
                if !reg.taints.iter().any(|t| t.key == DRAIN_TAINT_KEY) {
                    reg.taints.push(d);
                }
            }
        },
    )
    .await
}

/// `katcall label`: set (`Some`) or remove (`None`) labels.
pub async fn set_labels(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
    changes: BTreeMap<String, Option<String>>,
) -> Result<NodeRegistration, NodeAdminError> {
    let summary = changes
        .iter()
        .map(|(k, v)| v.as_ref().map_or(format!("{k}-"), |v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(", ");
    modify(
        store,
        events,
        clock,
        name,
        "NodeLabeled",
        format!("labels of {name}: {summary}"),
        |reg| {
            for (k, v) in &changes {
                match v {
                    Some(v) => reg.labels.insert(k.clone(), v.clone()),
                    None => reg.labels.remove(k),
                };
            }
        },
    )
    .await
}
