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
//!
//! An address that has just been freed is **quarantined** for [`QUARANTINE`] ([`Quarantine`]):
//! the bridge and the node's other containers still hold a neighbour entry for it, and a
//! rolling update's replacement that took it at once would meet entries for its predecessor
//! (before MACs were derived from addresses, 20–45 s of lost requests). The lowest address
//! that is neither in use nor quarantined is given; only when the subnet has no other is a
//! quarantined one given, the one freed longest ago. The leader keeps the release times in
//! memory; a new leader does not know them, so it counts every free address as freed when it
//! started.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use kat_api::keys;
use kat_api::wire::NodeName;
use kat_store::TxnOp;
use tokio::time::Instant;

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

/// How long a freed address is not given again (unless its subnet has no other): longer than
/// the kernel keeps an unconfirmed neighbour entry in use (`gc_stale_time`, 60 s).
pub const QUARANTINE: Duration = Duration::from_secs(60);

/// When each node's recently freed addresses were freed, as this leader saw it.
#[derive(Debug, Default)]
pub struct Quarantine {
    /// The first round this leader made: addresses freed before it count as freed then.
    since: Option<Instant>,
    /// Addresses in use at the last round, per node.
    in_use: HashMap<NodeName, HashSet<IpAddr>>,
    /// Addresses freed less than [`QUARANTINE`] ago, per node, with when.
    released: HashMap<NodeName, HashMap<IpAddr, Instant>>,
}

impl Quarantine {
    /// Takes in a round's addresses in use (per node): those in use last round and no longer
    /// are freed `now`; a release older than [`QUARANTINE`] is forgotten, and so is one whose
    /// address is in use again.
    pub fn observe(&mut self, in_use: &HashMap<NodeName, HashSet<IpAddr>>, now: Instant) {
        self.since.get_or_insert(now);
        for (node, before) in &self.in_use {
            let current = in_use.get(node);
            let freed = before
                .iter()
                .filter(|ip| !current.is_some_and(|c| c.contains(*ip)));
            let released = self.released.entry(node.clone()).or_default();
            for ip in freed {
                released.insert(*ip, now);
            }
        }
        for (node, released) in &mut self.released {
            let current = in_use.get(node);
            released.retain(|ip, at| {
                now.duration_since(*at) < QUARANTINE && !current.is_some_and(|c| c.contains(ip))
            });
        }
        self.released.retain(|_, r| !r.is_empty());
        self.in_use = in_use.clone();
    }

    /// When `ip` of `node` was freed as far as quarantine goes: `None` once it is free to give.
    fn freed_at(&self, node: &str, ip: &IpAddr, now: Instant) -> Option<Instant> {
        let at = match self.released.get(node).and_then(|r| r.get(ip)) {
            Some(at) => *at,
            // Unknown to this leader: freed before it started, or never used.
            None => self.since?,
        };
        (now.duration_since(at) < QUARANTINE).then_some(at)
    }

    /// The address of `subnet` (node `node`'s) to give a new instance: not the node's, not
    /// in `used`; the lowest one not quarantined, or if every free one is, the one freed
    /// longest ago. `None` when the subnet is full.
    pub fn pick(
        &self,
        node: &str,
        subnet: &IpNet,
        used: &HashSet<IpAddr>,
        now: Instant,
    ) -> Option<IpAddr> {
        let mut oldest: Option<(Instant, IpAddr)> = None;
        for ip in hosts(subnet).skip(1).filter(|ip| !used.contains(ip)) {
            let Some(at) = self.freed_at(node, &ip, now) else {
                return Some(ip);
            };
            if self.released.get(node).is_none_or(|r| !r.contains_key(&ip)) {
                // Unknown and still quarantined: this leader started less than QUARANTINE
                // ago, every free address is quarantined and none was freed earlier than
                // this one (known releases are later than the start).
                return Some(ip);
            }
            if oldest.is_none_or(|(t, _)| at < t) {
                oldest = Some((at, ip));
            }
        }
        // Only known, quarantined releases were free (at most as many steps as there are
        // addresses in use or quarantined: a big IPv6 subnet is never walked).
        oldest.map(|(_, ip)| ip)
    }
}

/// Give every registered node without a subnet one, and take back the subnets of nodes that
/// are gone (no registration, no instance). Newly given subnets count in this round already,
/// so a node's first instances are placed in the round it gets its subnet.
pub fn reconcile(round: &mut Round<'_>) {
    let Some(plan) = round.config().addresses else {
        return;
    };
    let view = round.view();
    let mut taken: BTreeSet<IpNet> = view.subnets.values().copied().collect();
    let mut given: BTreeMap<NodeName, IpNet> = BTreeMap::new();
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
        round.push_ops(vec![TxnOp::put(&key, subnet.to_string())]);
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
            .get(name.as_str())
            .is_some_and(|n| n.registration.is_some());
        if !registered && !in_use.contains(name.as_str()) {
            round.push_ops(vec![TxnOp::delete(keys::node_subnet(name))]);
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

    fn ips(list: &[&str]) -> HashSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_address_waits_out_its_quarantine_unless_none_other_is_free() {
        let subnet = net("10.0.0.0/29"); // .1 the node's, .2 to .6 for instances
        let in_use = |list: &[&str]| HashMap::from([(NodeName::parse("n").unwrap(), ips(list))]);
        let mut q = Quarantine::default();
        let now = Instant::now();
        q.observe(&in_use(&[]), now);
        // A new leader knows no release: the lowest free address, as before.
        assert_eq!(
            q.pick("n", &subnet, &ips(&[]), now),
            Some("10.0.0.2".parse().unwrap())
        );
        tokio::time::advance(QUARANTINE).await;
        q.observe(&in_use(&["10.0.0.2", "10.0.0.3"]), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        // .2 is freed (its instance replaced, its container gone).
        q.observe(&in_use(&["10.0.0.3"]), Instant::now());
        let used = ips(&["10.0.0.3"]);
        assert_eq!(
            q.pick("n", &subnet, &used, Instant::now()),
            Some("10.0.0.4".parse().unwrap()),
            "not the address freed a moment ago"
        );
        // The subnet has nothing else: the quarantined one freed longest ago.
        tokio::time::advance(Duration::from_secs(5)).await;
        q.observe(&in_use(&["10.0.0.3", "10.0.0.5"]), Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        q.observe(&in_use(&["10.0.0.3"]), Instant::now()); // .5 freed after .2
        let full = ips(&["10.0.0.3", "10.0.0.4", "10.0.0.6"]);
        assert_eq!(
            q.pick("n", &subnet, &full, Instant::now()),
            Some("10.0.0.2".parse().unwrap())
        );
        let fuller = ips(&["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.6"]);
        assert_eq!(
            q.pick("n", &subnet, &fuller, Instant::now()),
            Some("10.0.0.5".parse().unwrap())
        );
        let all = ips(&["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
        assert_eq!(q.pick("n", &subnet, &all, Instant::now()), None);
        // Quarantine over: the lowest free address again.
        tokio::time::advance(QUARANTINE).await;
        q.observe(&in_use(&["10.0.0.3"]), Instant::now());
        assert_eq!(
            q.pick("n", &subnet, &used, Instant::now()),
            Some("10.0.0.2".parse().unwrap())
        );
        assert!(q.released.is_empty(), "{:?}", q.released);
        // A huge IPv6 subnet is never walked, even in a new leader's first minute.
        let fresh = Quarantine {
            since: Some(Instant::now()),
            ..Default::default()
        };
        assert!(fresh
            .pick("n", &net("fd00::/64"), &HashSet::new(), Instant::now())
            .is_some());
    }
}
