//! Changes administrators make to nodes: drain, uncordon, taints, labels, removal.
//!
//! Each is a read-modify-write of the node's registration with a compare on its revision,
//! retried on conflict, so an agent re-registering and an administrator tainting at the same
//! moment do not lose each other's change.

use std::collections::BTreeMap;

use kat_api::keys;
use kat_api::wire::{
    ApprovedCapacity, EventType, NodeHeartbeat, NodeRegistration, RevokedNode, Taint,
    CLUSTER_ROLE_LABEL, DRAIN_TAINT_KEY, ROLE_LABEL, SYSTEM_LABELS,
};
use kat_api::workload::TaintEffect;
use kat_store::{Compare, EtcdStore, StateStore, StoreError, Txn, TxnOp};

use crate::clock::Clock;
use crate::events::{event, node_ref, EventLog};

#[derive(Debug, thiserror::Error)]
pub enum NodeAdminError {
    #[error("node {0} is not registered (see `katcall get nodes`)")]
    NotFound(String),
    #[error("node {0}'s registration is unreadable: {1}")]
    Corrupt(String, String),
    #[error("label {0} is set by the node's agent and cannot be changed (set kat.dws.rip/role or a label of your own)")]
    SystemLabel(String),
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
            Some(kv) => kat_store::decode::<NodeRegistration>(kv)
                .map_err(|e| NodeAdminError::Corrupt(name.into(), e.to_string()))?,
            None => NodeRegistration::new(name),
        };
        reg.addresses = addresses.clone();
        for (k, v) in &labels {
            reg.labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        // The cluster role is the agent's to say (its certificate's), every start; its old
        // place, `kat.dws.rip/role`, is the administrator's now.
        if let Some(role) = labels.get(CLUSTER_ROLE_LABEL) {
            reg.labels.insert(CLUSTER_ROLE_LABEL.into(), role.clone());
            if reg
                .labels
                .get(ROLE_LABEL)
                .is_some_and(|v| v == "control-plane" || v == "worker")
            {
                reg.labels.remove(ROLE_LABEL);
            }
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
        let mut reg: NodeRegistration = kat_store::decode(&kv)
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

/// A worker's heartbeat against its approved capacity, before the heartbeat is stored:
/// the first one after the node joined is recorded as approved; one that claims more than
/// approved gets a Warning event (once per new claim: `previous` is the heartbeat stored
/// before this one). The scheduler never uses more than approved (`ApprovedCapacity::clamp`).
pub async fn check_capacity(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    hb: &NodeHeartbeat,
    previous: Option<&NodeHeartbeat>,
) -> Result<(), NodeAdminError> {
    let name = hb.node.as_str();
    let key = keys::node_registration(name);
    let Some(kv) = store.get(&key).await? else {
        return Ok(());
    };
    let mut reg: NodeRegistration =
        kat_store::decode(&kv).map_err(|e| NodeAdminError::Corrupt(name.into(), e.to_string()))?;
    let (ops, guard) = match &reg.capacity {
        None => {
            reg.capacity = Some(ApprovedCapacity::claimed_by(hb));
            let mut ops = vec![TxnOp::put_json(&key, &reg)?];
            ops.extend(events.ops(&event(
                clock.timestamp(),
                EventType::Normal,
                "NodeCapacityRecorded",
                node_ref(name),
                format!(
                    "node {name}: cpu {}m, memory {} MiB, {} GPUs, as its first heartbeat said; more takes `katcall approve node {name} --capacity`",
                    hb.allocatable.cpu_millis,
                    hb.allocatable.memory_bytes >> 20,
                    hb.gpus.len()
                ),
            )));
            (ops, Some(Compare::mod_revision_is(&key, kv.mod_revision)))
        }
        Some(approved) => {
            let Some(more) = approved.exceeded_by(hb) else {
                return Ok(());
            };
            let same_claim =
                previous.is_some_and(|p| p.allocatable == hb.allocatable && p.gpus == hb.gpus);
            if same_claim {
                return Ok(());
            }
            let ops = events.ops(&event(
                clock.timestamp(),
                EventType::Warning,
                "NodeCapacityNotApproved",
                node_ref(name),
                format!(
                    "node {name} reports {more}: the scheduler keeps to the approved capacity until an administrator runs `katcall approve node {name} --capacity`"
                ),
            ));
            (ops, None)
        }
    };
    // A registration changed meanwhile (an admin's label) is left as it is: the next
    // heartbeat records the capacity.
    let txn = Txn::new().when(guard).and_then(ops);
    store.txn(txn).await?;
    Ok(())
}

/// `katcall approve node NAME --capacity`: `approved` (what the administrator saw the node
/// claim) becomes its approved capacity. Exactly that, not the node's latest heartbeat: a
/// node that raises its claim between the administrator's look and the approval gets only
/// what was looked at (the scheduler uses the smaller of claim and approval).
pub async fn approve_capacity(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    name: &str,
    approved: ApprovedCapacity,
) -> Result<NodeRegistration, NodeAdminError> {
    modify(
        store,
        events,
        clock,
        name,
        "NodeCapacityApproved",
        format!(
            "node {name}: cpu {}m, memory {} MiB, {} GPUs approved by an administrator",
            approved.allocatable.cpu_millis,
            approved.allocatable.memory_bytes >> 20,
            approved.gpus.len()
        ),
        |reg| reg.capacity = Some(approved.clone()),
    )
    .await
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
    if let Some(k) = changes.keys().find(|k| SYSTEM_LABELS.contains(&k.as_str())) {
        return Err(NodeAdminError::SystemLabel(k.clone()));
    }
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

/// Remove node `name` from the cluster (`katcall delete node`, or the departed-node sweep in
/// [`crate::departed`]): its etcd member (if `etcd` and it has one) leaves the quorum, its
/// certificate is revoked (the API refuses it; etcd refuses new connections with it once the
/// nodes have rewritten their revocation list, within seconds), and its registration,
/// status and overlay key go, so its instances are placed elsewhere. `why` ends the event.
/// With `silent_since` (the sweep), only if the node's status key is still at that revision;
/// `false` when it was not (the node spoke meanwhile) and nothing was removed.
pub async fn remove(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    etcd: Option<&EtcdStore>,
    name: &str,
    why: &str,
    silent_since: Option<i64>,
) -> Result<bool, NodeAdminError> {
    if store.get(&keys::node_registration(name)).await?.is_none() {
        return Err(NodeAdminError::NotFound(name.into()));
    }
    // The sweep removes a node only while it stays silent: its status key unchanged since
    // the revision the sweep saw (0: none).
    let status_key = keys::node_status(name);
    let unchanged = silent_since.map(|rev| {
        if rev == 0 {
            Compare::absent(&status_key)
        } else {
            Compare::mod_revision_is(&status_key, rev)
        }
    });
    if let Some(rev) = silent_since {
        let now = store
            .get(&status_key)
            .await?
            .map_or(0, |kv| kv.mod_revision);
        if now != rev {
            return Ok(false);
        }
    }
    if let Some(etcd) = etcd {
        etcd.remove_member(name).await?;
    }
    let serial = store
        .get(&keys::node_certificate(name))
        .await?
        .map(|kv| String::from_utf8_lossy(&kv.value).trim().to_string());
    let revoked = RevokedNode {
        node: name.to_string(),
        serial,
        revoked_at: clock.timestamp(),
    };
    let txn = Txn::new().when(unchanged).and_then([
        TxnOp::put_json(keys::revoked_node(name), &revoked)?,
        TxnOp::delete(keys::node_registration(name)),
        TxnOp::delete(keys::node_status(name)),
        TxnOp::delete(keys::wireguard_key(name)),
    ]);
    if !store.txn(txn).await?.succeeded {
        return Ok(false);
    }
    let ops = events.ops(&event(
        clock.timestamp(),
        EventType::Normal,
        "NodeRemoved",
        node_ref(name),
        format!("node {name} was removed{why}: its etcd member left the quorum and its certificate is revoked"),
    ));
    let _ = store.txn(Txn::new().and_then(ops)).await;
    Ok(true)
}
