//! KAT's networking. Today: the DNS server every node runs for its containers ([`dns`]).
//! The node network namespace, container links and the WireGuard overlay come next
//! (`docs/networking.md`).

pub mod dns;
