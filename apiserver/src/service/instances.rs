//! Instances: finding the record of one, for logs and exec.

use kat_api::keys;
use kat_api::wire::InstanceRecord;
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
}
