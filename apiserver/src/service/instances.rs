//! Instances: finding the record of one (logs, exec); what runs now, as nodes report it.

use kat_api::finished::FinishedInstance;
use kat_api::keys;
use kat_api::wire::{ErrorCode, InstanceRecord, InstanceStatus, NodeState};
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
            if let Some(r) = kat_store::decode_or_skip::<InstanceRecord>(&found) {
                if r.workload_key() == *key {
                    return Ok(r);
                }
            }
        }
        if let Some(kv) = self
            .store
            .get(&keys::finished_instance(&key.namespace, &key.name, id))
            .await?
        {
            let f: FinishedInstance = kat_store::decode(&kv).map_err(|e| {
                Error::new(
                    ErrorCode::Internal,
                    format!("the kept record of instance {id} of {key} does not decode: {e}"),
                )
            })?;
            return self.reachable_finished(key, f).await;
        }
        Err(Error::not_found(format!(
            "instance {id} of workload {key} not found (see `katcall get instances --all -n {}`)",
            key.namespace
        )))
    }

    /// The record of a finished instance, if the node that kept its log can be asked;
    /// otherwise an error that names that node and what became of it.
    async fn reachable_finished(
        &self,
        key: &WorkloadKey,
        f: FinishedInstance,
    ) -> Result<InstanceRecord> {
        let node = f.record.node.clone();
        let id = &f.record.instance_id;
        match self.nodes().await?.get(node.as_str()) {
            None => Err(Error::not_found(format!(
                "instance {id} of {key} ran on node {node}, which is no longer in the cluster: its logs were kept on that node and cannot be read any more"
            ))),
            Some(n) if n.state == NodeState::NotReady => Err(Error::new(
                ErrorCode::Unavailable,
                format!(
                    "instance {id} of {key} ran on node {node}, which is NotReady (last heartbeat {}): its logs are kept there; try again once the node is back",
                    n.last_heartbeat
                        .map_or_else(|| "never".to_string(), |t| t.to_string())
                ),
            )),
            Some(_) => Ok(f.record),
        }
    }

    /// Finished instances kept in namespace `ns` (of `workload` only, if given), oldest
    /// first.
    pub async fn finished_instances(
        &self,
        ns: &str,
        workload: Option<&str>,
    ) -> Result<Vec<FinishedInstance>> {
        kat_leader::desired::namespaces::get(&*self.store, ns).await?;
        let prefix = match workload {
            Some(w) => keys::finished_instances(ns, w),
            None => keys::finished_in_namespace(ns),
        };
        let mut out: Vec<FinishedInstance> = self
            .store
            .list(&prefix)
            .await?
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip)
            .collect();
        out.sort_by(|a, b| {
            (a.finished_ms, &a.record.instance_id).cmp(&(b.finished_ms, &b.record.instance_id))
        });
        Ok(out)
    }

    /// Instances as their nodes last reported them, with what each uses; of namespace `ns`
    /// (which must exist), or of every namespace. Sorted by namespace, workload, instance.
    pub async fn reported_instances(&self, ns: Option<&str>) -> Result<Vec<InstanceStatus>> {
        if let Some(ns) = ns {
            kat_leader::desired::namespaces::get(&*self.store, ns).await?;
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
