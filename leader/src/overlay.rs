//! The overlay's peer list: every node with a subnet and a published WireGuard key, at its
//! registered address and the cluster's `wireguardPort`. Members read it from etcd, workers
//! through the leader (`GET /nodes/{name}/peers`); both come here.
//!
//! A node publishes only its key: the endpoint comes from its registration (the address it
//! joined with), so a node cannot point other nodes' tunnels elsewhere.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kat_api::keys::{self, Key};
use kat_api::wire::{url_host, NodeRegistration, OverlayPeer};
use kat_store::{StateStore, StoreError};

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
    let mut nodes: BTreeMap<String, Parts> = BTreeMap::new();
    for kv in store.list(keys::node_registrations()).await?.kvs {
        let Ok(reg) = serde_json::from_slice::<NodeRegistration>(&kv.value) else {
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
    Ok(nodes
        .into_iter()
        .filter_map(|(node, p)| {
            Some(OverlayPeer {
                endpoint: format!("{}:{wireguard_port}", url_host(&p.address?.to_string())),
                public_key: p.key?,
                subnet: p.subnet?,
                node,
            })
        })
        .collect())
}
