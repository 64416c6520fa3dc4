//! The overlay's peer list: every node with a subnet and a published WireGuard key, at its
//! registered address and the cluster's `wireguardPort`. Members read it from etcd, workers
//! through the leader (`GET /nodes/{name}/peers`); both come here.
//!
//! A node publishes only its key: the endpoint comes from its registration (the address it
//! joined with), so a node cannot point other nodes' tunnels elsewhere.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use kat_api::keys::{self, Key};
use kat_api::wire::{url_host, NodeRegistration, OverlayPeer};
use kat_store::changes::changed_after;
use kat_store::{Revision, StateStore, StoreError};

#[derive(Default)]
struct Parts {
    address: Option<IpAddr>,
    key: Option<String>,
    subnet: Option<String>,
}

pub async fn peers(
    store: &dyn StateStore,
    wireguard_port: u32,
) -> Result<Vec<OverlayPeer>, StoreError> {
    Ok(peers_at(store, wireguard_port).await?.0)
}

/// [`peers`], and a revision to wait for changes after ([`peers_changed`]).
pub async fn peers_at(
    store: &dyn StateStore,
    wireguard_port: u32,
) -> Result<(Vec<OverlayPeer>, Revision), StoreError> {
    let mut nodes: BTreeMap<String, Parts> = BTreeMap::new();
    let registrations = store.list(keys::node_registrations()).await?;
    // The first listing's: a change to either prefix after it is seen, one between the two
    // listings at worst twice.
    let revision = registrations.revision;
    for kv in registrations.kvs {
        let Some(reg) = kat_store::decode_or_skip::<NodeRegistration>(&kv) else {
            continue;
        };
        let address = reg.addresses.iter().find_map(|a| a.parse::<IpAddr>().ok());
        nodes.entry(reg.name).or_default().address = address;
    }
    for kv in store.list(keys::node_subnets()).await?.kvs {
        let value = String::from_utf8_lossy(&kv.value).trim().to_string();
        match keys::parse(&kv.key) {
            Some(Key::NodeSubnet { node }) => {
                nodes.entry(node.to_string()).or_default().subnet = Some(value)
            }
            Some(Key::WireguardKey { node }) => {
                nodes.entry(node.to_string()).or_default().key = Some(value)
            }
            _ => {}
        }
    }
    let peers = nodes
        .into_iter()
        .filter_map(|(node, p)| {
            Some(OverlayPeer {
                endpoint: format!("{}:{wireguard_port}", url_host(&p.address?.to_string())),
                public_key: p.key?,
                subnet: p.subnet?,
                node,
            })
        })
        .collect();
    Ok((peers, revision))
}

/// Returns once the peers read at `revision` ([`peers_at`]) may have changed, or after
/// `at_most`.
pub async fn peers_changed(store: &dyn StateStore, revision: Revision, at_most: Duration) {
    tokio::select! {
        _ = changed_after(store, keys::node_registrations(), revision, at_most) => {}
        _ = changed_after(store, keys::node_subnets(), revision, at_most) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kat_api::keys;
    use kat_store::{MemStore, StateStore};
    use tokio::time::Instant;

    use super::{peers_at, peers_changed};

    const AT_MOST: Duration = Duration::from_secs(30);

    /// How long `peers_changed` waits when `write` (if any) happens 2 s into the wait.
    async fn waited_for(store: &Arc<MemStore>, write: Option<(String, &'static str)>) -> Duration {
        let (_, revision) = peers_at(&**store, 51820).await.unwrap();
        let writer = write.map(|(key, value)| {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                store
                    .put(&key, value.as_bytes().to_vec(), None)
                    .await
                    .unwrap();
            })
        });
        let start = Instant::now();
        peers_changed(&**store, revision, AT_MOST).await;
        if let Some(w) = writer {
            w.await.unwrap();
        }
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_key_subnet_or_registration_wakes_the_overlay_and_a_heartbeat_does_not() {
        let store = Arc::new(MemStore::new());
        let two = Duration::from_secs(2);
        let key = Some((keys::wireguard_key("n2"), "a2V5"));
        assert_eq!(waited_for(&store, key).await, two);
        let subnet = Some((keys::node_subnet("n2"), "10.100.2.0/23"));
        assert_eq!(waited_for(&store, subnet).await, two);
        let registration = Some((format!("{}n3", keys::node_registrations()), "{}"));
        assert_eq!(waited_for(&store, registration).await, two);
        let status = Some((keys::node_status("n2"), "{}"));
        assert_eq!(waited_for(&store, status).await, AT_MOST);
    }
}
