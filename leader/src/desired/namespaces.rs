//! Namespaces: create, list, delete. `kat-core` and `default` always exist and cannot go.

use kat_api::keys;
use kat_api::names::dns_label_problem;
use kat_api::namespace::SYSTEM_NAMESPACES;
use kat_api::wire::{NamespaceObject, ObjectMeta};
use kat_store::{Compare, JsonStore, StateStore, StoreError, Txn, TxnOp};

use crate::clock::Clock;

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("namespace name {name:?}: {problem}")]
    InvalidName { name: String, problem: String },
    #[error("namespace {0} already exists")]
    Exists(String),
    #[error("namespace {0} not found (create it with `katcall create namespace {0}`, or add a namespace.kat to the workload)")]
    NotFound(String),
    #[error("namespace {0} is a system namespace and cannot be deleted")]
    System(String),
    #[error("namespace {0} still has workloads ({1}); delete them first")]
    NotEmpty(String, String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub async fn get(store: &dyn StateStore, name: &str) -> Result<NamespaceObject, NamespaceError> {
    let (mut ns, kv) = store
        .get_json::<NamespaceObject>(&keys::namespace(name))
        .await?
        .ok_or_else(|| NamespaceError::NotFound(name.into()))?;
    ns.metadata.resource_version = kv.mod_revision;
    Ok(ns)
}

pub async fn list(store: &dyn StateStore) -> Result<Vec<NamespaceObject>, NamespaceError> {
    let listing = store.list(keys::namespaces()).await?;
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| {
            let mut ns: NamespaceObject = kat_store::decode_or_skip(kv)?;
            ns.metadata.resource_version = kv.mod_revision;
            Some(ns)
        })
        .collect())
}

/// A new namespace's record, with the labels of its `namespace.kat` (if any).
pub fn record(
    clock: &Clock,
    name: &str,
    labels: std::collections::BTreeMap<String, String>,
) -> NamespaceObject {
    NamespaceObject {
        metadata: ObjectMeta {
            name: name.into(),
            namespace: None,
            uid: format!("{:032x}", rand::random::<u128>()),
            generation: 1,
            resource_version: 0,
            creation_timestamp: Some(clock.timestamp()),
            labels,
        },
    }
}

/// Create `name`; with `exist_ok`, an existing namespace is not an error (init, apply).
pub async fn create(
    store: &dyn StateStore,
    clock: &Clock,
    name: &str,
    exist_ok: bool,
) -> Result<NamespaceObject, NamespaceError> {
    if let Some(problem) = dns_label_problem(name) {
        return Err(NamespaceError::InvalidName {
            name: name.into(),
            problem,
        });
    }
    let key = keys::namespace(name);
    let ns = record(clock, name, Default::default());
    let txn = Txn::new()
        .when([Compare::absent(&key)])
        .and_then([TxnOp::put_json(&key, &ns)?]);
    if store.txn(txn).await?.succeeded {
        return get(store, name).await;
    }
    if exist_ok {
        get(store, name).await
    } else {
        Err(NamespaceError::Exists(name.into()))
    }
}

pub async fn delete(store: &dyn StateStore, name: &str) -> Result<(), NamespaceError> {
    if SYSTEM_NAMESPACES.contains(&name) {
        return Err(NamespaceError::System(name.into()));
    }
    get(store, name).await?;
    let workloads = store.list(&keys::workloads_desired(name)).await?;
    let names: std::collections::BTreeSet<&str> = workloads
        .kvs
        .iter()
        .filter_map(|kv| {
            kv.key[keys::workloads_desired(name).len()..]
                .split('/')
                .next()
        })
        .collect();
    if !names.is_empty() {
        let list: Vec<&str> = names.into_iter().collect();
        return Err(NamespaceError::NotEmpty(name.into(), list.join(", ")));
    }
    store.delete(&keys::namespace(name)).await?;
    Ok(())
}
