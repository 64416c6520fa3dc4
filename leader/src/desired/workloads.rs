//! Writing desired state: apply, rollback and delete of workloads.
//!
//! The API handlers (and tests) call these; the controllers react to what they write.
//! `apply` writes every file, the new generation's metadata, an archive copy of the files and
//! an event in one transaction, guarded by a compare on the metadata's revision, so two
//! concurrent applies cannot both believe they made generation N. Re-applying the same spec
//! makes no new generation. Every generation's files are archived (the last
//! [`ARCHIVE_GENERATIONS`]); `rollback` re-applies the previous generation's files as a new
//! generation, so the workload's update strategy governs the way back.
//!
//! Apply is where Quadlet files are parsed and validated, once: it stores the typed desired
//! state in the metadata and the generation's instance template under its hash (see
//! `kat_api::template`), which the controllers and the agents read instead of the files.

use std::collections::BTreeMap;

use kat_api::keys;
use kat_api::namespace::SYSTEM_NAMESPACES;
use kat_api::wire::{EventType, NamespaceObject, ObjectMeta, WorkloadMeta};
use kat_api::WorkloadBundle;
use kat_store::{Compare, StateStore, StoreError, Txn, TxnOp};

use crate::clock::Clock;
use crate::desired::namespaces;
use crate::events::{event, workload_ref, EventLog};

pub const ARCHIVE_GENERATIONS: u64 = 10;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload {0}/{1} not found")]
    NotFound(String, String),
    #[error("workload {ns}/{name} has no generation before {generation} to roll back to")]
    NoPreviousGeneration {
        ns: String,
        name: String,
        generation: u64,
    },
    #[error("archived generation {generation} of {ns}/{name} is unreadable: {message}")]
    CorruptArchive {
        ns: String,
        name: String,
        generation: u64,
        message: String,
    },
    #[error("namespace {0} not found (create it with `katcall create namespace {0}`, or add a namespace.kat to the workload)")]
    NamespaceNotFound(String),
    #[error("workload {0}/{1} was changed concurrently; retry")]
    Conflict(String, String),
    #[error("VirtualLoadBalancer.kat: spec.ingress: host {host} path {path} is routed to workload {owner} already; choose another host or path, or remove the rule from {owner} first")]
    IngressTaken {
        host: String,
        path: String,
        owner: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The outcome of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub generation: u64,
    pub created: bool,
    /// False when the spec was unchanged and no new generation was made.
    pub changed: bool,
}

/// Apply a validated bundle: create the workload or make a new generation.
pub async fn apply(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    bundle: &WorkloadBundle,
) -> Result<Applied, WorkloadError> {
    write(store, events, clock, bundle, Existing::Either).await
}

/// A new generation of an existing workload from a validated bundle: `NotFound` if there is
/// none, also when it was deleted meanwhile (the write is one transaction with the check),
/// so an update never creates a workload.
pub async fn update(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    bundle: &WorkloadBundle,
) -> Result<Applied, WorkloadError> {
    write(store, events, clock, bundle, Existing::Required).await
}

/// What a write expects of the workload's record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Existing {
    /// None yet: a create.
    Absent,
    /// One: an update.
    Required,
    /// Either: an apply.
    Either,
}

/// What [`apply`] would do with a validated bundle, with nothing written (a dry run).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The workload's metadata now; `None` if it does not exist.
    pub previous: Option<WorkloadMeta>,
    /// The generation the apply would make, or the current one when nothing changes.
    pub generation: u64,
    pub changed: bool,
    /// Whether the bundle's namespace.kat would set the namespace's labels anew.
    pub relabels_namespace: bool,
}

/// The dry run of [`apply`]: the same generation rule and the same namespace check (the
/// namespace must exist or come with the bundle), and nothing stored.
pub async fn plan(store: &dyn StateStore, bundle: &WorkloadBundle) -> Result<Plan, WorkloadError> {
    let ns = &bundle.workload.metadata.namespace;
    let name = &bundle.workload.metadata.name;
    // An unreadable record is an error, never a new workload at generation 1.
    let previous: Option<WorkloadMeta> = store
        .get(&keys::workload_meta(ns, name))
        .await?
        .map(|kv| kat_store::decode(&kv))
        .transpose()?;
    let relabels_namespace = match store.get(&keys::namespace(ns)).await? {
        Some(kv) => relabel_op(&kv, bundle)?.is_some(),
        None if brings_namespace(bundle) => false,
        None => return Err(WorkloadError::NamespaceNotFound(ns.clone())),
    };
    check_ingress_free(store, bundle).await?;
    let changed = previous
        .as_ref()
        .is_none_or(|p| p.spec_hash != bundle.spec_hash());
    let generation = match &previous {
        Some(p) if !changed => p.metadata.generation,
        Some(p) => p.metadata.generation + 1,
        None => 1,
    };
    Ok(Plan {
        previous,
        generation,
        changed,
        relabels_namespace,
    })
}

/// Refuses an ingress rule on a host another namespace routes, or on a host and path another
/// workload routes, compared as a proxy matches them (`kat_api::wire::canonical_route`): a
/// route has one owner, the workload that claimed it first (see
/// [`kat_api::wire::route_owners`], which also settles two applies that pass this check at
/// once).
async fn check_ingress_free(
    store: &dyn StateStore,
    bundle: &WorkloadBundle,
) -> Result<(), WorkloadError> {
    use kat_api::wire::canonical_route;
    let Some(lb) = bundle
        .load_balancer
        .as_ref()
        .filter(|lb| !lb.spec.ingress.is_empty())
    else {
        return Ok(());
    };
    let (ns, name) = (
        &bundle.workload.metadata.namespace,
        &bundle.workload.metadata.name,
    );
    let wanted: Vec<(String, String)> = lb
        .spec
        .ingress
        .iter()
        .map(|r| canonical_route(&r.host, &r.path))
        .collect();
    let listing = store.list(keys::all_workloads_desired()).await?;
    for meta in listing
        .kvs
        .iter()
        .filter(|kv| kv.key.ends_with("/meta"))
        .filter_map(kat_store::decode_or_skip::<WorkloadMeta>)
    {
        // The domain only shapes upstreams, which this compares not.
        for claim in kat_api::wire::claims_of(&meta, "") {
            let held = claim.route;
            if (&held.namespace, &held.workload) == (ns, name) {
                continue;
            }
            let (host, path) = canonical_route(&held.host, &held.path);
            let other_namespace = &held.namespace != ns;
            if let Some((h, p)) = wanted
                .iter()
                .find(|(h, p)| *h == host && (other_namespace || *p == path))
            {
                return Err(WorkloadError::IngressTaken {
                    host: h.clone(),
                    path: if other_namespace {
                        "(any)".into()
                    } else {
                        p.clone()
                    },
                    owner: format!("{}/{}", held.namespace, held.workload),
                });
            }
        }
    }
    Ok(())
}

/// Whether an apply of `bundle` creates its namespace when it is missing: with a
/// namespace.kat, or for the system namespaces, which always exist.
fn brings_namespace(bundle: &WorkloadBundle) -> bool {
    bundle.namespace.is_some()
        || SYSTEM_NAMESPACES.contains(&bundle.workload.metadata.namespace.as_str())
}

/// Create a workload from a validated bundle; `Conflict` if one of that name exists, however
/// recently it was written (the check and the write are one transaction).
pub async fn create(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    bundle: &WorkloadBundle,
) -> Result<Applied, WorkloadError> {
    write(store, events, clock, bundle, Existing::Absent).await
}

async fn write(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    bundle: &WorkloadBundle,
    existing: Existing,
) -> Result<Applied, WorkloadError> {
    let ns = &bundle.workload.metadata.namespace;
    let name = &bundle.workload.metadata.name;
    let meta_key = keys::workload_meta(ns, name);
    let current = store.get(&meta_key).await?;
    match (existing, &current) {
        (Existing::Absent, Some(_)) => {
            return Err(WorkloadError::Conflict(ns.clone(), name.clone()))
        }
        (Existing::Required, None) => {
            return Err(WorkloadError::NotFound(ns.clone(), name.clone()))
        }
        _ => {}
    }
    let previous: Option<WorkloadMeta> = current.as_ref().map(kat_store::decode).transpose()?;
    let spec_hash = bundle.spec_hash();
    if let Some(p) = &previous {
        if p.spec_hash == spec_hash {
            // The workload is as it was; a namespace.kat's new labels still count.
            relabel_namespace(store, ns, bundle).await?;
            return Ok(Applied {
                generation: p.metadata.generation,
                created: false,
                changed: false,
            });
        }
    }
    check_ingress_free(store, bundle).await?;
    let generation = previous.as_ref().map_or(1, |p| p.metadata.generation + 1);
    // Parsed and validated once, here: everything downstream reads these typed records.
    let desired = bundle.template();
    let template = desired.for_instances();
    let template_hash = template.hash();
    let meta = WorkloadMeta {
        metadata: ObjectMeta {
            name: name.clone(),
            namespace: Some(ns.clone()),
            uid: previous.as_ref().map_or_else(
                || format!("{:032x}", rand::random::<u128>()),
                |p| p.metadata.uid.clone(),
            ),
            generation,
            resource_version: 0,
            creation_timestamp: Some(
                previous
                    .as_ref()
                    .and_then(|p| p.metadata.creation_timestamp)
                    .unwrap_or_else(|| clock.timestamp()),
            ),
            labels: BTreeMap::new(),
        },
        spec_hash,
        template_hash: template_hash.clone(),
        previous_template_hash: match &previous {
            Some(p) if p.template_hash != template_hash => Some(p.template_hash.clone()),
            Some(p) => p.previous_template_hash.clone(),
            None => None,
        },
        workload_type: bundle.workload.spec.workload_type,
        desired: Some(desired),
    };
    let mut ops = Vec::new();
    // The namespace must exist when the workload is written, or be created with it (a bundle
    // with a namespace.kat; the system namespaces always exist): one transaction, so a
    // refused apply leaves no namespace behind and a concurrent delete cannot orphan it.
    let ns_key = keys::namespace(ns);
    let mut guards = Vec::new();
    // A namespace.kat's labels are the namespace's: kept when it is created, and set again
    // when a later apply's namespace.kat says otherwise.
    let labels = bundle.namespace.as_ref().map(|n| n.metadata.labels.clone());
    match store.get(&ns_key).await? {
        Some(kv) => {
            ops.extend(relabel_op(&kv, bundle)?);
            guards.push(Compare::mod_revision_is(ns_key, kv.mod_revision));
        }
        None if brings_namespace(bundle) => {
            ops.push(TxnOp::put_json(
                ns_key.clone(),
                &namespaces::record(clock, ns, labels.unwrap_or_default()),
            )?);
            guards.push(Compare::absent(ns_key));
        }
        None => return Err(WorkloadError::NamespaceNotFound(ns.clone())),
    }
    let old_files = store.list(&keys::workload_manifests(ns, name)).await?;
    for kv in &old_files.kvs {
        let file = kv.key.rsplit('/').next().unwrap_or_default();
        if !bundle.files.contains_key(file) {
            ops.push(TxnOp::delete(kv.key.clone()));
        }
    }
    for (file, bytes) in &bundle.files {
        ops.push(TxnOp::put(
            keys::workload_manifest(ns, name, file),
            bytes.clone(),
        ));
        ops.push(TxnOp::put(
            keys::workload_archive(ns, name, generation, file),
            bytes.clone(),
        ));
    }
    // The commit a git source ran at (resolved from its branch or tag at apply): a rollback
    // to this generation runs that commit again, not the branch's newest.
    if let Some(commit) = bundle
        .workload
        .spec
        .source
        .git
        .as_ref()
        .and_then(|g| g.commit.as_ref())
    {
        ops.push(TxnOp::put(
            keys::workload_archive(ns, name, generation, ARCHIVED_COMMIT),
            commit.as_bytes().to_vec(),
        ));
    }
    // Immutable: the same hash is the same template, so rewriting it changes nothing.
    ops.push(TxnOp::put_json(
        keys::template(ns, name, &template_hash),
        &template,
    )?);
    ops.push(TxnOp::put_json(meta_key.clone(), &meta)?);
    let (reason, message) = match &previous {
        None => (
            "WorkloadCreated",
            format!(
                "created {ns}/{name} ({:?}) at generation 1",
                meta.workload_type
            ),
        ),
        Some(p) => (
            "WorkloadUpdated",
            format!(
                "updated {ns}/{name} from generation {} to {generation}",
                p.metadata.generation
            ),
        ),
    };
    ops.extend(events.ops(&event(
        clock.timestamp(),
        EventType::Normal,
        reason,
        workload_ref(ns, name),
        message,
    )));
    guards.push(match &current {
        Some(kv) => Compare::mod_revision_is(meta_key, kv.mod_revision),
        None => Compare::absent(meta_key),
    });
    let committed = store.txn(Txn::new().when(guards).and_then(ops)).await?;
    if !committed.succeeded {
        return Err(WorkloadError::Conflict(ns.clone(), name.clone()));
    }
    prune_archive(store, ns, name, generation).await?;
    Ok(Applied {
        generation,
        created: previous.is_none(),
        changed: true,
    })
}

async fn prune_archive(
    store: &dyn StateStore,
    ns: &str,
    name: &str,
    generation: u64,
) -> Result<(), StoreError> {
    if generation <= ARCHIVE_GENERATIONS {
        return Ok(());
    }
    let oldest_kept = generation - ARCHIVE_GENERATIONS + 1;
    for (g, _) in archived(store, ns, name).await? {
        if g < oldest_kept {
            store
                .delete_prefix(&format!("{}{g:020}/", keys::workload_archives(ns, name)))
                .await?;
        }
    }
    Ok(())
}

/// Archived generations and their files, oldest first.
pub async fn archived(
    store: &dyn StateStore,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<u64, BTreeMap<String, Vec<u8>>>, StoreError> {
    let prefix = keys::workload_archives(ns, name);
    let mut out: BTreeMap<u64, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for kv in store.list(&prefix).await?.kvs {
        let rest = &kv.key[prefix.len()..];
        if let Some((generation, file)) = rest.split_once('/') {
            if let Ok(g) = generation.parse::<u64>() {
                out.entry(g).or_default().insert(file.to_string(), kv.value);
            }
        }
    }
    Ok(out)
}

/// The archive entry beside a generation's files that holds the commit its git source ran
/// at (not a Quadlet file: rollback takes it out before parsing).
pub const ARCHIVED_COMMIT: &str = "source.git.commit";

/// The write that gives the stored namespace `kv` the labels of the bundle's namespace.kat,
/// if it has one and they differ.
fn relabel_op(
    kv: &kat_store::KeyValue,
    bundle: &WorkloadBundle,
) -> Result<Option<TxnOp>, WorkloadError> {
    let Some(wanted) = bundle.namespace.as_ref().map(|n| &n.metadata.labels) else {
        return Ok(None);
    };
    let mut existing: NamespaceObject = kat_store::decode(kv)?;
    if existing.metadata.labels == *wanted {
        return Ok(None);
    }
    existing.metadata.labels = wanted.clone();
    Ok(Some(TxnOp::put_json(kv.key.clone(), &existing)?))
}

/// Set the namespace's labels from the bundle's namespace.kat on its own (an apply that
/// changes nothing else); a concurrent change of the namespace wins.
async fn relabel_namespace(
    store: &dyn StateStore,
    ns: &str,
    bundle: &WorkloadBundle,
) -> Result<(), WorkloadError> {
    let key = keys::namespace(ns);
    let Some(kv) = store.get(&key).await? else {
        return Ok(());
    };
    if let Some(op) = relabel_op(&kv, bundle)? {
        let txn = Txn::new()
            .when([Compare::mod_revision_is(key, kv.mod_revision)])
            .and_then([op]);
        store.txn(txn).await?;
    }
    Ok(())
}

/// A generation's archived files as a bundle, its git source at the commit it ran.
fn archived_bundle(files: &BTreeMap<String, Vec<u8>>) -> Result<WorkloadBundle, String> {
    let mut files = files.clone();
    let commit = files.remove(ARCHIVED_COMMIT);
    let mut bundle = WorkloadBundle::parse(files).map_err(|e| e.to_string())?;
    if let (Some(git), Some(commit)) = (bundle.workload.spec.source.git.as_mut(), commit) {
        git.commit = Some(String::from_utf8_lossy(&commit).trim().to_string());
    }
    Ok(bundle)
}

/// Re-apply the generation before the current one as a new generation.
pub async fn rollback(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    ns: &str,
    name: &str,
) -> Result<Applied, WorkloadError> {
    let meta: WorkloadMeta = match store.get(&keys::workload_meta(ns, name)).await? {
        Some(kv) => kat_store::decode(&kv).map_err(|e| WorkloadError::CorruptArchive {
            ns: ns.into(),
            name: name.into(),
            generation: 0,
            message: e.to_string(),
        })?,
        None => return Err(WorkloadError::NotFound(ns.into(), name.into())),
    };
    let current = meta.metadata.generation;
    let archive = archived(store, ns, name).await?;
    // The newest archived generation whose spec differs from the current one.
    let target = archive
        .iter()
        .rev()
        .filter(|(g, _)| **g < current)
        .map(|(g, files)| (*g, archived_bundle(files)))
        .find(|(_, parsed)| {
            parsed
                .as_ref()
                .map_or(true, |b| b.spec_hash() != meta.spec_hash)
        });
    let Some((generation, parsed)) = target else {
        return Err(WorkloadError::NoPreviousGeneration {
            ns: ns.into(),
            name: name.into(),
            generation: current,
        });
    };
    let bundle = parsed.map_err(|e| WorkloadError::CorruptArchive {
        ns: ns.into(),
        name: name.into(),
        generation,
        message: e,
    })?;
    let applied = apply(store, events, clock, &bundle).await?;
    let message = format!(
        "rolled back {ns}/{name} to the spec of generation {generation} (now generation {})",
        applied.generation
    );
    let ops = events.ops(&event(
        clock.timestamp(),
        EventType::Normal,
        "WorkloadRolledBack",
        workload_ref(ns, name),
        message,
    ));
    store.txn(Txn::new().and_then(ops)).await?;
    Ok(applied)
}

/// Delete a workload's desired state; the controllers then stop its instances.
pub async fn delete(
    store: &dyn StateStore,
    events: &EventLog,
    clock: &Clock,
    ns: &str,
    name: &str,
) -> Result<(), WorkloadError> {
    let meta_key = keys::workload_meta(ns, name);
    let Some(current) = store.get(&meta_key).await? else {
        return Err(WorkloadError::NotFound(ns.into(), name.into()));
    };
    let mut ops: Vec<TxnOp> = store
        .list(&keys::workload_manifests(ns, name))
        .await?
        .kvs
        .into_iter()
        .map(|kv| TxnOp::delete(kv.key))
        .collect();
    ops.push(TxnOp::delete(meta_key.clone()));
    ops.push(TxnOp::delete(keys::workload_status(ns, name)));
    ops.push(TxnOp::delete(keys::workload_webhook(ns, name)));
    ops.extend(events.ops(&event(
        clock.timestamp(),
        EventType::Normal,
        "WorkloadDeleted",
        workload_ref(ns, name),
        format!("deleted {ns}/{name}"),
    )));
    let done = store
        .txn(
            Txn::new()
                .when([Compare::mod_revision_is(meta_key, current.mod_revision)])
                .and_then(ops),
        )
        .await?;
    if !done.succeeded {
        return Err(WorkloadError::Conflict(ns.into(), name.into()));
    }
    store
        .delete_prefix(&keys::workload_archives(ns, name))
        .await?;
    Ok(())
}
