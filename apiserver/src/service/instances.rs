//! Instances: finding the record of one (logs, exec); what runs now, as nodes report it.

use kat_api::keys;
use kat_api::wire::{InstanceRecord, InstanceStatus};
use kat_api::WorkloadKey;

use super::{Error, Result, Service};

impl Service {
    /// The record of instance `id` of workload `key`.
    pub async fn instance(&self, key: &WorkloadKey, id: &str) -> Result<InstanceRecord> {
        // Records live under their node, and a cluster has a handful of nodes and many
        // instances: one read per node, not a listing of every instance.
        let nodes = self.store.list(keys::node_registrations()).await?;
        for kv in &nodes.kvs {
            let node = &kv.key[keys::node_registrations().len()..];
            let Some(found) = self.store.get(&keys::instance(node, id)).await? else {
                continue;
            };
            if let Ok(r) = serde_json::from_slice::<InstanceRecord>(&found.value) {
                if r.workload_key() == *key {
                    return Ok(r);
                }
            }
        }
        Err(Error::not_found(format!(
            "instance {id} of workload {key} not found (see `katcall get instances -n {}`)",
            key.namespace
        )))
    }

    /// Instances as their nodes last reported them, with what each uses; of namespace `ns`
    /// (which must exist), or of every namespace. Sorted by namespace, workload, instance.
    pub async fn reported_instances(&self, ns: Option<&str>) -> Result<Vec<InstanceStatus>> {
        if let Some(ns) = ns {
            kat_leader::namespaces::get(&*self.store, ns).await?;
        }
        let mut out: Vec<InstanceStatus> = self
            .heartbeats()
            .await?
            .into_iter()
            .flat_map(|hb| {
                let node = hb.node;
                hb.instances.into_iter().map(move |mut i| {
                    i.node.get_or_insert_with(|| node.clone());
                    i
                })
            })
            // Leftover containers being removed carry no workload.
            .filter(|i| !i.namespace.is_empty())
            .filter(|i| ns.is_none_or(|ns| i.namespace == ns))
            .collect();
        out.sort_by(|a, b| {
            (&a.namespace, &a.workload, &a.instance_id).cmp(&(
                &b.namespace,
                &b.workload,
                &b.instance_id,
            ))
        });
        Ok(out)
    }
}
