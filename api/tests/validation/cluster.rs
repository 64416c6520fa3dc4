//! `cluster.kat`.

use super::*;

fn cluster_with(path: &str, value: &str) -> String {
    let mut c = yaml(CLUSTER);
    set(&mut c, path, Some(yaml(value)));
    match parse_cluster("cluster.kat", yaml_serde::to_string(&c).unwrap().as_bytes()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn cluster_rules() {
    assert_eq!(cluster_with("spec.clusterDomain", "kat.cluster.local"), "");
    assert_eq!(cluster_with("spec.nodeRemoveAfterSeconds", "86400"), "");
    for (path, value, message) in [
        ("spec.clusterCIDR", "10.100.0.0/33", r#"cluster.kat: spec.clusterCIDR: "10.100.0.0/33" is not a CIDR (expected e.g. 10.100.0.0/16)"#),
        ("spec.clusterCIDR", "10.100.1.0/16", "cluster.kat: spec.clusterCIDR: \"10.100.1.0/16\" has host bits set (expected the network address, 10.100.0.0/16)"),
        ("spec.serviceCIDR", "10.100.128.0/17", "cluster.kat: spec.serviceCIDR: 10.100.128.0/17 overlaps clusterCIDR 10.100.0.0/16 (expected separate ranges)"),
        ("spec.nodeSubnetBits", "13", "cluster.kat: spec.nodeSubnetBits: 13 does not fit clusterCIDR 10.100.0.0/16: node subnets would be /29, smaller than the /28 needed for instances (expected at most 12)"),
        ("spec.nodeSubnetBits", "0", "spec.nodeSubnetBits: 0 must be at least 1"),
        ("spec.nodeSubnetBits", "4294967295", "spec.nodeSubnetBits: 4294967295 does not fit clusterCIDR"),
        ("spec.apiPort", "2379", "cluster.kat: spec.etcdClientPort: 2379 is also apiPort (every port must be different)"),
        ("spec.agentPort", "70000", "spec.agentPort: 70000 is not a port (expected 1-65535)"),
        ("spec.wireguardPort", "9115", "cluster.kat: spec.wireguardPort: 9115 is also apiPort (every port must be different)"),
        ("spec.wireguardPort", "0", "spec.wireguardPort: 0 is not a port (expected 1-65535)"),
        ("spec.volumeBasePath", "var/lib", "spec.volumeBasePath: \"var/lib\" is not an absolute path"),
        ("spec.clusterDomain", "bad_domain", "spec.clusterDomain: \"bad_domain\" is not a DNS name"),
        ("spec.agentTickSeconds", "0", "spec.agentTickSeconds: 0 must be at least 1"),
        ("spec.nodeLossTimeoutSeconds", "10", "spec.nodeLossTimeoutSeconds: 10 must be longer than agentTickSeconds (15)"),
        ("spec.nodeRemoveAfterSeconds", "60", "cluster.kat: spec.nodeRemoveAfterSeconds: 60 must be longer than nodeLossTimeoutSeconds (60)"),
        ("spec.nodeRemoveAfterSeconds", "-1", "spec.nodeRemoveAfterSeconds: invalid type"),
        ("metadata.name", "My Cluster", "cluster.kat: metadata.name: \"My Cluster\" is not a DNS label"),
        ("kind", "Workload", "cluster.kat: kind: \"Workload\" is not ClusterConfiguration"),
    ] {
        let err = cluster_with(path, value);
        assert!(err.contains(message), "{path}={value}: expected {message:?}, got {err:?}");
    }
    assert!(cluster_with("spec.clusterCIDR", "fd00:100::/48").contains("spec.serviceCIDR: 10.200.0.0/16 and clusterCIDR fd00:100::/48 are different address families"));
    assert!(cluster_with("spec.serviceCIDR", "10.0.0.0/8")
        .contains("spec.serviceCIDR: 10.0.0.0/8 overlaps clusterCIDR 10.100.0.0/16"));
    let v6 = cluster_with("spec.clusterCIDR", "fd00:100::/48");
    assert!(!v6.contains("nodeSubnetBits"), "{v6}");
}
