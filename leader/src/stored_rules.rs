//! Stored workloads that a rule added since they were applied refuses (a mount at `/.kat`,
//! a `kat-local/` image named in `source.image`). Such a record is
//! never dropped or rewritten: its instances stay Pending on their nodes with what to change
//! (the node's supervisor says why), and the leader writes one Warning event per workload
//! generation, `StoredWorkloadRefused`, so that `katcall events` and `describe` say it too.
//! A new generation (the workload applied again, now valid) clears it.

use std::collections::HashMap;

use kat_api::wire::EventType;
use kat_api::{Template, WorkloadKey};

use crate::controller::{Round, WorkloadCtx};

/// What a stored workload holds that apply refuses now, each with what to change.
pub fn problems(template: &Template) -> Vec<String> {
    let spec = &template.workload.spec;
    let local = spec
        .source
        .image
        .as_deref()
        .filter(|image| kat_api::build_definition::is_local_image(image))
        .map(|image| {
            format!(
                "source.image {image} names a node's local build, which only the workload built from source.git uses; apply the workload again with a registry image or source.git"
            )
        });
    spec.container
        .volume_mounts
        .iter()
        .filter(|m| kat_api::names::is_reserved_container_path(&m.mount_path))
        .map(|m| {
            format!(
                "volumeMounts {}: mountPath {} is at or under {}, which KAT reserves for kat-init; apply the workload again with another mountPath",
                m.name,
                m.mount_path,
                kat_api::names::RESERVED_CONTAINER_DIR
            )
        })
        .chain(local)
        .collect()
}

/// One Warning per refused generation; `warned` remembers which generation was told.
pub fn reconcile(
    round: &mut Round<'_>,
    warned: &mut HashMap<WorkloadKey, u64>,
    workloads: &[WorkloadCtx],
) {
    warned.retain(|key, _| workloads.iter().any(|w| &w.key == key));
    for w in workloads {
        let problems = problems(&w.desired);
        if problems.is_empty() {
            warned.remove(&w.key);
            continue;
        }
        if warned.get(&w.key) == Some(&w.generation) {
            continue;
        }
        round.event(
            EventType::Warning,
            "StoredWorkloadRefused",
            w.object(),
            format!(
                "generation {} was stored before a rule that now refuses it; its instances stay Pending: {}",
                w.generation,
                problems.join("; ")
            ),
        );
        warned.insert(w.key.clone(), w.generation);
    }
}
