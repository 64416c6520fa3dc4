//! IP address management (RFC 001 §7.2): each node a subnet of `clusterCIDR`, each instance an
//! address of its node's subnet.
//!
//! The leader is the only writer, so allocation needs no locks: it decides in its round from
//! its view, and writes in the round's plan. A node gets the lowest free subnet (`clusterCIDR`
//! split by `nodeSubnetBits`) as soon as it is registered, kept until its registration is gone
//! and no instance of it remains (`/kat/network/nodes/{node}/subnet`). An instance gets the
//! lowest free address of its node's subnet when it is placed, in its record and under
//! `/kat/network/allocations/{id}/ip`, released with the record. The subnet's first address
//! is the node's own (its bridge, the containers' gateway and DNS server), and an address stays
//! taken while the node still reports a container with it (a deleted instance that is still
//! stopping), so two live containers never share one.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kat_api::keys;
use kat_store::TxnOp;

use crate::controller::Round;

/// How a cluster's addresses are cut: `cluster` into subnets of `prefix` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressPlan {
    pub cluster: IpNet,
    /// The node subnets' prefix length (`clusterCIDR`'s plus `nodeSubnetBits`).
    pub node_prefix: u8,
}

impl AddressPlan {
    /// From `clusterCIDR` and `nodeSubnetBits` (validated with `cluster.kat`); `None` when
    /// they do not make a plan.
    pub fn new(cluster: IpNet, node_subnet_bits: u32) -> Option<AddressPlan> {
        let node_prefix = u32::from(cluster.prefix_len()).checked_add(node_subnet_bits)?;
        let node_prefix = u8::try_from(node_prefix).ok()?;
        (node_subnet_bits > 0 && node_prefix < cluster.max_prefix_len()).then_some(AddressPlan {
            cluster: cluster.trunc(),
            node_prefix,
        })
    }

    /// The lowest subnet not in `taken`; `None` when every one is.
    pub fn free_subnet(&self, taken: &BTreeSet<IpNet>) -> Option<IpNet> {
        self.cluster
            .subnets(self.node_prefix)
            .ok()?
            .find(|s| !taken.contains(s))
    }
}

/// A subnet's usable addresses: IPv4 without network and broadcast, IPv6 without the
/// all-zeros (subnet-router anycast) address.
fn hosts(subnet: &IpNet) -> impl Iterator<Item = IpAddr> {
    let skip = usize::from(matches!(subnet, IpNet::V6(_)));
    subnet.hosts().skip(skip)
}

/// The node's own address in its subnet: the first host.
pub fn node_address(subnet: &IpNet) -> Option<IpAddr> {
    hosts(subnet).next()
}

/// How many instances a subnet holds: its hosts but the node's own address.
pub fn capacity(subnet: &IpNet) -> u64 {
    let host_bits = u32::from(subnet.max_prefix_len() - subnet.prefix_len());
    let total = if host_bits >= 64 {
        u64::MAX
    } else {
        1u64 << host_bits
    };
    // IPv4 loses the network and broadcast addresses; both lose the node's own.
    match subnet {
        IpNet::V4(_) => total.saturating_sub(3),
        IpNet::V6(_) => total.saturating_sub(2),
    }
}

/// Addresses left in `subnet` for instances when `used` of them are taken.
pub fn free_count(subnet: &IpNet, used: usize) -> u64 {
    capacity(subnet).saturating_sub(used as u64)
}

/// The lowest address of `subnet` for an instance: not the node's, not in `used`.
pub fn free_address(subnet: &IpNet, used: &HashSet<IpAddr>) -> Option<IpAddr> {
    // At most used.len() + 2 steps: the lazy iterator never walks a big IPv6 subnet.
    hosts(subnet).skip(1).find(|ip| !used.contains(ip))
}

/// Give every registered node without a subnet one, and take back the subnets of nodes that
/// are gone (no registration, no instance). Newly given subnets count in this round already,
/// so a node's first instances are placed in the round it gets its subnet.
pub fn reconcile(round: &mut Round<'_>) {
    let Some(plan) = round.config.addresses else {
        return;
    };
    let view = round.view;
    let mut taken: BTreeSet<IpNet> = view.subnets.values().copied().collect();
    let mut given: BTreeMap<String, IpNet> = BTreeMap::new();
    for (name, entry) in &view.nodes {
        if entry.registration.is_none() || view.subnets.contains_key(name) {
            continue;
        }
        let Some(subnet) = plan.free_subnet(&taken) else {
            round.event(
                kat_api::wire::EventType::Warning,
                "NoSubnet",
                crate::events::node_ref(name),
                format!(
                    "node {name} gets no subnet: every /{} of clusterCIDR {} is taken (remove nodes, or use a larger clusterCIDR or fewer nodeSubnetBits)",
                    plan.node_prefix, plan.cluster
                ),
            );
            continue;
        };
        taken.insert(subnet);
        let key = keys::node_subnet(name);
        round
            .plan
            .groups
            .push(vec![TxnOp::put(&key, subnet.to_string())]);
        round.event(
            kat_api::wire::EventType::Normal,
            "SubnetAssigned",
            crate::events::node_ref(name),
            format!("node {name} has subnet {subnet}"),
        );
        given.insert(name.clone(), subnet);
    }
    for (name, subnet) in given {
        round.give_subnet(&name, subnet);
    }
    let in_use: HashSet<&str> = view.instances.values().map(|r| r.node.as_str()).collect();
    for name in view.subnets.keys() {
        let registered = view
            .nodes
            .get(name)
            .is_some_and(|n| n.registration.is_some());
        if !registered && !in_use.contains(name.as_str()) {
            round
                .plan
                .groups
                .push(vec![TxnOp::delete(keys::node_subnet(name))]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn subnets_are_carved_lowest_first_and_never_twice() {
        let plan = AddressPlan::new(net("10.100.0.0/16"), 7).unwrap();
        assert_eq!(plan.node_prefix, 23);
        let mut taken = BTreeSet::new();
        let a = plan.free_subnet(&taken).unwrap();
        assert_eq!(a, net("10.100.0.0/23"));
        taken.insert(a);
        assert_eq!(plan.free_subnet(&taken), Some(net("10.100.2.0/23")));
        // A freed subnet is reused before a new one.
        taken.insert(net("10.100.2.0/23"));
        taken.insert(net("10.100.4.0/23"));
        taken.remove(&net("10.100.2.0/23"));
        assert_eq!(plan.free_subnet(&taken), Some(net("10.100.2.0/23")));
        // All 128 taken: none.
        let all: BTreeSet<IpNet> = net("10.100.0.0/16").subnets(23).unwrap().collect();
        assert_eq!(all.len(), 128);
        assert_eq!(plan.free_subnet(&all), None);
        // Plans that cannot work.
        assert!(AddressPlan::new(net("10.0.0.0/30"), 2).is_none());
        assert!(AddressPlan::new(net("10.0.0.0/16"), 0).is_none());
        assert!(AddressPlan::new(net("10.0.0.0/16"), 40).is_none());
    }

    #[test]
    fn instance_addresses_skip_the_node_and_the_used() {
        let s = net("10.100.2.0/23");
        assert_eq!(node_address(&s), Some("10.100.2.1".parse().unwrap()));
        assert_eq!(capacity(&s), 509);
        let mut used = HashSet::new();
        let first = free_address(&s, &used).unwrap();
        assert_eq!(first, "10.100.2.2".parse::<IpAddr>().unwrap());
        used.insert(first);
        assert_eq!(free_address(&s, &used), Some("10.100.2.3".parse().unwrap()));
        // A full /30 (one instance address) has none left.
        let tiny = net("10.0.0.0/30");
        assert_eq!(capacity(&tiny), 1);
        let used: HashSet<IpAddr> = ["10.0.0.2".parse().unwrap()].into();
        assert_eq!(free_address(&tiny, &used), None);
        // IPv6: no broadcast, the node takes the first host.
        let v6 = net("fd00:0:0:1::/120");
        assert_eq!(capacity(&v6), 254);
        assert_eq!(
            free_address(&v6, &HashSet::new()),
            Some("fd00:0:0:1::2".parse().unwrap())
        );
        // A huge IPv6 subnet is never walked.
        let huge = net("fd00::/64");
        assert_eq!(capacity(&huge), u64::MAX - 2);
        assert!(free_address(&huge, &HashSet::new()).is_some());
    }
}
