//! The cluster's DNS records (RFC 001 §7.3): one per running instance with an address, at
//! `/kat/dns/{ns}/{workload}/{A|AAAA}/{ip}`, saying whether the instance is ready (healthy,
//! or running where the workload has no health check). Every node's DNS server answers from
//! them (`kat_netns::dns`). The leader rewrites a record only when it changes, in the round
//! that sees the instance's state change, so names follow health as fast as heartbeats do.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::{DnsRecord, InstanceState};
use kat_api::WorkloadKey;
use kat_store::{Revision, StateStore, StoreError, TxnOp};

use crate::controller::{Round, WorkloadCtx};

/// Every DNS record of the cluster, as stored (what a node's DNS server answers from).
pub async fn records(store: &dyn StateStore) -> Result<Vec<DnsRecord>, StoreError> {
    Ok(records_at(store).await?.0)
}

/// [`records`], and the store revision they were read at: a watch of
/// [`keys::dns_records`] from the next revision sees every later change.
pub async fn records_at(store: &dyn StateStore) -> Result<(Vec<DnsRecord>, Revision), StoreError> {
    let listing = store.list(keys::dns_records()).await?;
    let records = listing
        .kvs
        .iter()
        .filter_map(kat_store::decode_or_skip)
        .collect();
    Ok((records, listing.revision))
}

/// Returns once the records read at `revision` ([`records_at`]) may have changed, or after
/// `at_most`.
pub async fn records_changed(store: &dyn StateStore, revision: Revision, at_most: Duration) {
    kat_store::changes::changed_after(store, keys::dns_records(), revision, at_most).await
}

pub fn reconcile(round: &mut Round<'_>, workloads: &[WorkloadCtx]) {
    let health_checked: HashMap<&WorkloadKey, bool> = workloads
        .iter()
        .map(|w| (&w.key, w.has_health_check))
        .collect();
    let view = round.view();
    let mut desired: BTreeMap<String, DnsRecord> = BTreeMap::new();
    for r in view.instances.values() {
        let Some(ip) = r.ip else {
            continue;
        };
        let key = r.workload_key();
        let Some(checked) = health_checked.get(&key) else {
            continue; // the workload is gone or mid-update: its instances are going
        };
        if round
            .status_of(&r.instance_id)
            .is_none_or(|s| s.state != InstanceState::Running)
        {
            continue;
        }
        let record_type = if ip.is_ipv4() { "A" } else { "AAAA" };
        desired.insert(
            keys::dns_record(&r.namespace, &r.workload, record_type, &ip.to_string()),
            DnsRecord {
                namespace: r.namespace.clone(),
                workload: r.workload.clone(),
                instance_id: r.instance_id.clone(),
                ip,
                ready: round.healthy(r, *checked),
            },
        );
    }
    let mut ops = Vec::new();
    for (key, record) in &desired {
        if view.dns.get(key) != Some(record) {
            match TxnOp::put_json(key, record) {
                Ok(op) => ops.push(op),
                Err(e) => return round.push_group(Err(e)),
            }
        }
    }
    for key in view.dns.keys() {
        if !desired.contains_key(key) {
            ops.push(TxnOp::delete(key));
        }
    }
    for op in ops {
        round.push_ops(vec![op]);
    }
}
