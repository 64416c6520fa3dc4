//! `--advertise-address IP|IFACE`: an address as given, or the address of a network
//! interface (its first IPv4 address, else its first global IPv6 one), read once at start.

use std::net::IpAddr;

/// Parse `--advertise-address`; the error says what was expected and what the host has.
pub fn parse(text: &str) -> Result<IpAddr, String> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("{text:?} is not an IP, and the interfaces cannot be read: {e}"))?;
    let mut names = std::collections::BTreeSet::new();
    let mut v6 = None;
    for a in addrs {
        names.insert(a.interface_name.clone());
        if a.interface_name != text {
            continue;
        }
        let Some(address) = a.address else { continue };
        if let Some(v4) = address.as_sockaddr_in() {
            return Ok(IpAddr::V4(v4.ip()));
        }
        if let Some(v6addr) = address.as_sockaddr_in6() {
            let ip = v6addr.ip();
            // Link-local (fe80::/10) needs a scope: not an address other nodes can use.
            if (ip.segments()[0] & 0xffc0) != 0xfe80 && v6.is_none() {
                v6 = Some(IpAddr::V6(ip));
            }
        }
    }
    if let Some(ip) = v6 {
        return Ok(ip);
    }
    if names.contains(text) {
        return Err(format!("interface {text} has no usable address"));
    }
    Err(format!(
        "{text:?} is neither an IP address nor an interface of this host (interfaces: {})",
        names.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_or_an_interface() {
        assert_eq!(parse("10.0.0.5"), Ok("10.0.0.5".parse().unwrap()));
        assert_eq!(parse("::1"), Ok("::1".parse().unwrap()));
        assert_eq!(parse("lo"), Ok("127.0.0.1".parse().unwrap()));
        let err = parse("no-such-if0").unwrap_err();
        assert!(
            err.contains("neither an IP address nor an interface"),
            "{err}"
        );
        assert!(err.contains("lo"), "{err}");
    }
}
