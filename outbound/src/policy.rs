//! The rule: which addresses are refused, which an admin allowed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use ipnet::IpNet;

/// Why a connection was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    #[error(
        "{host} is {addr}, {reason}: the node does not connect there on a workload's behalf \
         (an admin can allow it with `kat-agent --allow-fetch-from {addr}`)"
    )]
    Refused {
        host: String,
        addr: IpAddr,
        reason: &'static str,
    },
    #[error("cannot resolve {host}: {message}")]
    Resolve { host: String, message: String },
}

/// Which addresses a node connects to on a user's behalf. The default refuses loopback,
/// link-local, unspecified and multicast addresses, the clouds' metadata services
/// (`169.254.169.254` is link-local; also `fd00:ec2::254` and `100.100.100.200`), IPv6
/// addresses that embed a refused IPv4 one (NAT64, IPv4-compatible), and every address of
/// the node's own interfaces; [`OutboundPolicy::allow`] lets networks through, and
/// endpoints the admin named (`--insecure-registry HOST:PORT`) are trusted as they are.
#[derive(Clone, Debug, Default)]
pub struct OutboundPolicy {
    allowed: Vec<IpNet>,
    trusted_endpoints: Vec<String>,
}

impl OutboundPolicy {
    /// Refuses what the rule refuses, except in `allowed`.
    pub fn allow(allowed: impl IntoIterator<Item = IpNet>) -> OutboundPolicy {
        OutboundPolicy {
            // An IPv4-mapped network is the IPv4 one: addresses are compared canonical.
            allowed: allowed.into_iter().map(canonical_net).collect(),
            trusted_endpoints: Vec::new(),
        }
    }

    /// Trusts `host:port` (an endpoint the admin named) whatever it resolves to.
    pub fn trust_endpoints(mut self, endpoints: impl IntoIterator<Item = String>) -> Self {
        self.trusted_endpoints.extend(endpoints);
        self
    }

    /// The networks an admin allowed.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allowed
    }

    /// Whether `endpoint` (`host[:port]`, as a registry is named) is one the admin named.
    pub fn trusts_endpoint(&self, endpoint: &str) -> bool {
        self.trusted_endpoints
            .iter()
            .any(|t| t.eq_ignore_ascii_case(endpoint))
    }

    /// Whether the node may connect to `addr` (which `host` resolved to).
    pub fn check(&self, host: &str, addr: IpAddr) -> Result<(), OutboundError> {
        let addr = addr.to_canonical();
        if self.allowed.iter().any(|net| net.contains(&addr)) {
            return Ok(());
        }
        let reason = refusal(addr).or_else(|| {
            node_addresses()
                .contains(&addr)
                .then_some("one of this node's own addresses")
        });
        match reason {
            Some(reason) => Err(OutboundError::Refused {
                host: host.to_string(),
                addr,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Resolves `host` (blocking) and checks every address: one refused address refuses the
    /// name, so a name cannot mix an allowed answer with a forbidden one.
    pub fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, OutboundError> {
        self.check_all(host, (host, port).to_socket_addrs())
    }

    /// Resolves `host:port` for a connection: an endpoint the admin named (`host:port`, or
    /// `host` alone for 443) is trusted whatever it resolves to; any other name is
    /// [`OutboundPolicy::resolve`]d and checked.
    pub fn resolve_endpoint(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, OutboundError> {
        let trusted = self.trusts_endpoint(&format!("{host}:{port}"))
            || (port == 443 && self.trusts_endpoint(host));
        if !trusted {
            return self.resolve(host, port);
        }
        (host, port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|e| OutboundError::Resolve {
                host: host.to_string(),
                message: e.to_string(),
            })
    }

    /// [`OutboundPolicy::resolve`] without blocking.
    pub async fn resolve_async(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, OutboundError> {
        self.check_all(host, tokio::net::lookup_host((host, port)).await)
    }

    /// What a lookup of `host` found, every address checked.
    fn check_all(
        &self,
        host: &str,
        found: std::io::Result<impl Iterator<Item = SocketAddr>>,
    ) -> Result<Vec<SocketAddr>, OutboundError> {
        let addrs: Vec<SocketAddr> = found
            .map_err(|e| OutboundError::Resolve {
                host: host.to_string(),
                message: e.to_string(),
            })?
            .collect();
        if addrs.is_empty() {
            return Err(OutboundError::Resolve {
                host: host.to_string(),
                message: "no addresses".into(),
            });
        }
        for addr in &addrs {
            self.check(host, addr.ip())?;
        }
        Ok(addrs)
    }
}

/// Why `addr` (canonical) is refused whatever the node's own addresses are.
fn refusal(addr: IpAddr) -> Option<&'static str> {
    const METADATA: [IpAddr; 2] = [
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    ];
    if addr.is_loopback() {
        Some("a loopback address")
    } else if addr.is_unspecified() {
        Some("the unspecified address")
    } else if matches!(addr, IpAddr::V4(v4) if v4.octets()[0] == 0) {
        // Linux takes `0.0.0.0/8` for this host.
        Some("an address of 0.0.0.0/8, taken for this host")
    } else if addr.is_multicast() || addr == IpAddr::from([255, 255, 255, 255]) {
        Some("a multicast or broadcast address")
    } else if is_link_local(addr) {
        Some("a link-local address")
    } else if METADATA.contains(&addr) {
        Some("a cloud's metadata service")
    } else if let Some(v4) = embedded_v4(addr) {
        refusal(IpAddr::V4(v4)).map(|_| "an IPv6 address that embeds a refused IPv4 one")
    } else {
        None
    }
}

/// The IPv4 address a NAT64 (`64:ff9b::/96`) or IPv4-compatible (`::/96`) address carries.
fn embedded_v4(addr: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = addr else { return None };
    let s = v6.segments();
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    let compatible = s[..6] == [0, 0, 0, 0, 0, 0];
    (nat64 || compatible).then(|| {
        let o = v6.octets();
        Ipv4Addr::new(o[12], o[13], o[14], o[15])
    })
}

/// An IPv4-mapped IPv6 network (`::ffff:a.b.c.d/n`, n ≥ 96) as the IPv4 network it is.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

fn is_link_local(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4.is_link_local(),
        // fe80::/10 (Ipv6Addr::is_unicast_link_local is stable since 1.84; spelled out for
        // the workspace's rust-version).
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Every address of the node's interfaces, read now: addresses come and go.
fn node_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6()
                    .map(|v6| IpAddr::V6(v6.ip()).to_canonical())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(policy: &OutboundPolicy, addr: &str) -> Option<&'static str> {
        match policy.check("h", addr.parse().unwrap()) {
            Ok(()) => None,
            Err(OutboundError::Refused { reason, .. }) => Some(reason),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn loopback_link_local_and_the_unspecified_address_are_refused() {
        let strict = OutboundPolicy::default();
        for addr in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "fd00:ec2::254",
            "100.100.100.200",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(refused(&strict, addr).is_some(), "{addr}");
        }
        for addr in [
            "192.0.2.10",
            "10.1.2.3",
            "2001:db8::1",
            "64:ff9b::c000:20a",
            "100.64.0.1",
        ] {
            assert_eq!(refused(&strict, addr), None, "{addr}");
        }
    }

    #[test]
    fn the_nodes_own_addresses_are_refused() {
        // Every machine has an interface address that is not loopback or it has none at all;
        // whichever it has must be refused.
        let own: Vec<IpAddr> = node_addresses()
            .into_iter()
            .filter(|a| !a.is_loopback() && !is_link_local(*a))
            .collect();
        for addr in own {
            let e = OutboundPolicy::default().check("h", addr).unwrap_err();
            assert!(e.to_string().contains("this node's own addresses"), "{e}");
        }
    }

    #[test]
    fn an_allowed_network_passes_and_the_error_says_how_to_allow() {
        let policy = OutboundPolicy::allow(["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(refused(&policy, "127.0.0.1"), None);
        let mapped = OutboundPolicy::allow(["::ffff:127.0.0.1/128".parse().unwrap()]);
        assert_eq!(refused(&mapped, "127.0.0.1"), None);
        assert_eq!(refused(&policy, "::ffff:127.0.0.1"), None);
        let e = policy
            .check("meta", "169.254.169.254".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--allow-fetch-from 169.254.169.254"), "{e}");
        assert!(e.contains("link-local"), "{e}");
    }

    #[test]
    fn a_name_with_one_forbidden_answer_is_refused() {
        let e = OutboundPolicy::default()
            .resolve("localhost", 80)
            .unwrap_err();
        assert!(matches!(e, OutboundError::Refused { .. }), "{e}");
    }

    #[test]
    fn endpoints_the_admin_named_are_trusted() {
        let policy = OutboundPolicy::default().trust_endpoints(["127.0.0.1:5000".to_string()]);
        assert!(policy.trusts_endpoint("127.0.0.1:5000"));
        assert!(!policy.trusts_endpoint("127.0.0.1:5001"));
    }
}
