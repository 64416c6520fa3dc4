//! The rejoin exchange (RFC 001 §4.9), as datagrams: a detached node multicasts a signed
//! `REJOIN_REQUEST`; the parent's leader checks it and sends a signed `REJOIN_OFFER` straight
//! back. Each side proves itself with its certificate from the cluster CA and a signature by
//! its key ([`kat_pki::rejoin`]); a request names a worker, an offer a control-plane node.
//! Timestamps older or newer than [`MAX_SKEW`] and repeated nonces are refused, so a
//! recorded datagram cannot be played again.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use kat_api::wire::{RejoinOffer, RejoinRequest, REJOIN_OFFER, REJOIN_REQUEST};
use kat_pki::{NodeRole, Pki};

/// How far a datagram's timestamp may be from this node's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(60);
/// Larger datagrams are not read (a request is about 1.2 KB).
pub const MAX_DATAGRAM: usize = 8 * 1024;

fn unix_now(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn fresh(timestamp: u64, now: SystemTime) -> Result<(), String> {
    let now = unix_now(now);
    if timestamp.abs_diff(now) > MAX_SKEW.as_secs() {
        return Err(format!(
            "its timestamp is {} s away from this node's clock (at most {} s)",
            timestamp.abs_diff(now),
            MAX_SKEW.as_secs()
        ));
    }
    Ok(())
}

fn new_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn nonce_ok(nonce: &str) -> bool {
    nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Nonces seen in the last [`MAX_SKEW`] × 2 (a replay inside the timestamp window is caught
/// here; after it, by the timestamp). Bounded: when full, the oldest go.
#[derive(Default)]
pub struct Nonces(HashMap<String, Instant>);

impl Nonces {
    const CAPACITY: usize = 4096;

    /// `true` the first time `nonce` is seen.
    pub fn first_time(&mut self, nonce: &str) -> bool {
        let now = Instant::now();
        self.0.retain(|_, t| now.duration_since(*t) < MAX_SKEW * 2);
        if self.0.contains_key(nonce) {
            return false;
        }
        if self.0.len() >= Self::CAPACITY {
            if let Some(oldest) = self
                .0
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
            {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(nonce.to_string(), now);
        true
    }
}

/// A detached node's request, signed with its key.
pub fn request(
    parent_cluster: &str,
    node: &str,
    pki: &Pki,
    now: SystemTime,
) -> Result<RejoinRequest> {
    let mut r = RejoinRequest {
        kind: REJOIN_REQUEST.to_string(),
        parent_cluster: parent_cluster.to_string(),
        node: node.to_string(),
        timestamp: unix_now(now),
        nonce: new_nonce(),
        certificate: pki.node_cert_pem.clone(),
        signature: String::new(),
    };
    r.signature = kat_pki::rejoin::sign(&pki.node_key_pem, &r.signed_bytes())?;
    Ok(r)
}

/// The leader's check of a datagram: a request for `cluster`, fresh, new, from a worker whose
/// certificate (from the CA of `ca_pem`) names the node it claims and signed it. The error
/// says why it is ignored. Revocation is the caller's to check (it needs the store). The
/// listener runs the two parts itself, with its rate limit between them.
#[cfg(test)]
pub fn check_request(
    datagram: &[u8],
    cluster: &str,
    ca_pem: &str,
    now: SystemTime,
    nonces: &mut Nonces,
) -> Result<(RejoinRequest, kat_pki::rejoin::ProvenNode), String> {
    let r = parse_request(datagram, cluster, now)?;
    let proven = verify_request(&r, ca_pem, now, nonces)?;
    Ok((r, proven))
}

/// The cheap part of [`check_request`]: a well-formed request for `cluster`, fresh.
pub fn parse_request(
    datagram: &[u8],
    cluster: &str,
    now: SystemTime,
) -> Result<RejoinRequest, String> {
    // A datagram from the network, not a stored record.
    #[allow(clippy::disallowed_methods)]
    let r: RejoinRequest =
        serde_json::from_slice(datagram).map_err(|e| format!("not a rejoin request: {e}"))?;
    if r.kind != REJOIN_REQUEST {
        return Err(format!("type {:?} is not {REJOIN_REQUEST}", r.kind));
    }
    if r.parent_cluster != cluster {
        return Err(format!(
            "it is for cluster {:?}, not {cluster:?}",
            r.parent_cluster
        ));
    }
    fresh(r.timestamp, now)?;
    if !nonce_ok(&r.nonce) {
        return Err("its nonce is not 32 hex digits".into());
    }
    Ok(r)
}

/// The costly part of [`check_request`]: the certificate, the signature, the nonce.
pub fn verify_request(
    r: &RejoinRequest,
    ca_pem: &str,
    now: SystemTime,
    nonces: &mut Nonces,
) -> Result<kat_pki::rejoin::ProvenNode, String> {
    let proven =
        kat_pki::rejoin::verify(ca_pem, &r.certificate, &r.signed_bytes(), &r.signature, now)?;
    if proven.node != r.node {
        return Err(format!(
            "it claims node {:?} but its certificate is node {:?}'s",
            r.node, proven.node
        ));
    }
    if proven.role != NodeRole::Worker {
        return Err(format!(
            "node {} is not a worker (only workers run detached)",
            r.node
        ));
    }
    // Last, so that a forged datagram cannot use up a genuine nonce.
    if !nonces.first_time(&r.nonce) {
        return Err("its nonce was seen before (a replay)".into());
    }
    Ok(proven)
}

/// The leader's offer in answer to `request`, signed with its key.
pub fn offer(
    request: &RejoinRequest,
    leader: &str,
    pki: &Pki,
    now: SystemTime,
) -> Result<RejoinOffer> {
    let mut o = RejoinOffer {
        kind: REJOIN_OFFER.to_string(),
        parent_cluster: request.parent_cluster.clone(),
        leader: leader.to_string(),
        nonce: request.nonce.clone(),
        timestamp: unix_now(now),
        certificate: pki.node_cert_pem.clone(),
        signature: String::new(),
    };
    o.signature = kat_pki::rejoin::sign(&pki.node_key_pem, &o.signed_bytes())?;
    Ok(o)
}

/// The detached node's check of an answer: an offer from `cluster`'s control plane (its
/// certificate from the CA of `ca_pem`, its signature), fresh, for one of `nonces` (the
/// node's own outstanding requests), naming an `https://` endpoint, from a certificate whose
/// serial is not among `revoked` (a removed control-plane node's).
pub fn check_offer(
    datagram: &[u8],
    cluster: &str,
    ca_pem: &str,
    now: SystemTime,
    outstanding: &[String],
    revoked: &std::collections::HashSet<String>,
) -> Result<RejoinOffer, String> {
    // A datagram from the network, not a stored record.
    #[allow(clippy::disallowed_methods)]
    let o: RejoinOffer =
        serde_json::from_slice(datagram).map_err(|e| format!("not a rejoin offer: {e}"))?;
    if o.kind != REJOIN_OFFER || o.parent_cluster != cluster {
        return Err(format!("not an offer of cluster {cluster:?}"));
    }
    if !outstanding.contains(&o.nonce) {
        return Err("it answers no request of this node".into());
    }
    fresh(o.timestamp, now)?;
    let proven =
        kat_pki::rejoin::verify(ca_pem, &o.certificate, &o.signed_bytes(), &o.signature, now)?;
    if proven.role != NodeRole::ControlPlane {
        return Err(format!("node {} is not a control-plane node", proven.node));
    }
    if proven.serial.as_ref().is_some_and(|s| revoked.contains(s)) {
        return Err(format!("node {} was removed from the cluster", proven.node));
    }
    if !o.leader.starts_with("https://") || o.leader.len() > 300 {
        return Err(format!("leader {:?} is not an https:// endpoint", o.leader));
    }
    Ok(o)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use kat_pki::{key_and_csr, Authority};

    /// A cluster's first (control-plane) node, a worker's certificate from its CA, and
    /// another cluster's CA with a node of the worker's name.
    pub(in crate::detached) struct Cluster {
        _dir: tempfile::TempDir,
        pub(in crate::detached) leader: Pki,
        pub(in crate::detached) laptop: Pki,
        pub(in crate::detached) stranger: Pki,
    }

    pub(in crate::detached) fn cluster() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let leader = Pki::generate(
            &dir.path().join("n1"),
            "home",
            "n1",
            &["10.0.0.1".parse().unwrap()],
        )
        .unwrap();
        let authority = Authority::load(&dir.path().join("n1")).unwrap();
        let (key, csr) = key_and_csr("laptop").unwrap();
        let cert = authority
            .sign_csr(&csr, "laptop", &[], NodeRole::Worker)
            .unwrap();
        let mut laptop = Pki::generate(&dir.path().join("laptop"), "home", "laptop", &[]).unwrap();
        laptop.node_cert_pem = cert;
        laptop.node_key_pem = key;
        laptop.ca_pem = leader.ca_pem.clone();
        // Another cluster's CA, with a node called laptop.
        let stranger = Pki::generate(&dir.path().join("x"), "home", "laptop", &[]).unwrap();
        Cluster {
            _dir: dir,
            leader,
            laptop,
            stranger,
        }
    }

    fn bytes<T: serde::Serialize>(t: &T) -> Vec<u8> {
        serde_json::to_vec(t).unwrap()
    }

    #[test]
    fn a_request_and_its_offer_go_through_once() {
        let c = cluster();
        let now = SystemTime::now();
        let mut seen = Nonces::default();
        let r = request("home", "laptop", &c.laptop, now).unwrap();
        assert!(
            bytes(&r).len() < 1400,
            "a request fits a datagram: {}",
            bytes(&r).len()
        );
        let (got, proven) =
            check_request(&bytes(&r), "home", &c.leader.ca_pem, now, &mut seen).unwrap();
        assert_eq!(
            (got.node.as_str(), proven.node.as_str()),
            ("laptop", "laptop")
        );
        // The same datagram again is a replay.
        let err = check_request(&bytes(&r), "home", &c.leader.ca_pem, now, &mut seen).unwrap_err();
        assert!(err.contains("replay"), "{err}");

        let none = std::collections::HashSet::new();
        let o = offer(&r, "https://10.0.0.1:9115", &c.leader, now).unwrap();
        let got = check_offer(
            &bytes(&o),
            "home",
            &c.laptop.ca_pem,
            now,
            std::slice::from_ref(&r.nonce),
            &none,
        )
        .unwrap();
        assert_eq!(got.leader, "https://10.0.0.1:9115");
        // An offer for a request the node did not send, by a worker, or by a removed
        // control-plane node (its certificate revoked) is refused.
        assert!(check_offer(
            &bytes(&o),
            "home",
            &c.laptop.ca_pem,
            now,
            &["0".repeat(32)],
            &none
        )
        .is_err());
        let removed =
            std::collections::HashSet::from([kat_pki::serial_of(&c.leader.node_cert_pem).unwrap()]);
        let err = check_offer(
            &bytes(&o),
            "home",
            &c.laptop.ca_pem,
            now,
            std::slice::from_ref(&r.nonce),
            &removed,
        )
        .unwrap_err();
        assert!(err.contains("removed"), "{err}");
        let by_worker = offer(&r, "https://10.0.0.66:9115", &c.laptop, now).unwrap();
        let err = check_offer(
            &bytes(&by_worker),
            "home",
            &c.laptop.ca_pem,
            now,
            std::slice::from_ref(&r.nonce),
            &none,
        )
        .unwrap_err();
        assert!(err.contains("not a control-plane node"), "{err}");
    }

    #[test]
    fn forged_stale_and_foreign_requests_are_ignored() {
        let c = cluster();
        let now = SystemTime::now();
        let mut seen = Nonces::default();
        let check = |r: &RejoinRequest, seen: &mut Nonces| {
            check_request(&bytes(r), "home", &c.leader.ca_pem, now, seen).unwrap_err()
        };
        // A certificate from another CA.
        let r = request("home", "laptop", &c.stranger, now).unwrap();
        assert!(check(&r, &mut seen).contains("not from the cluster CA"));
        // The laptop's real certificate, signed by another key.
        let mut r = request("home", "laptop", &c.stranger, now).unwrap();
        r.certificate = c.laptop.node_cert_pem.clone();
        assert!(check(&r, &mut seen).contains("signature"));
        // A genuine request edited to name another node.
        let mut r = request("home", "laptop", &c.laptop, now).unwrap();
        r.node = "n2".into();
        assert!(check(&r, &mut seen).contains("signature"));
        // Signed, but claiming another node's name.
        let r = request("home", "n2", &c.laptop, now).unwrap();
        assert!(check(&r, &mut seen).contains("certificate is node \"laptop\""));
        // Old, another cluster, a control-plane node, junk.
        let r = request("home", "laptop", &c.laptop, now - Duration::from_secs(300)).unwrap();
        assert!(check(&r, &mut seen).contains("timestamp"));
        let r = request("work", "laptop", &c.laptop, now).unwrap();
        assert!(check(&r, &mut seen).contains("cluster"));
        let r = request("home", "n1", &c.leader, now).unwrap();
        assert!(check(&r, &mut seen).contains("not a worker"));
        assert!(check_request(b"\x00junk", "home", &c.leader.ca_pem, now, &mut seen).is_err());
        // None of these used up a nonce: the genuine request still goes through.
        let r = request("home", "laptop", &c.laptop, now).unwrap();
        assert!(check_request(&bytes(&r), "home", &c.leader.ca_pem, now, &mut seen).is_ok());
    }
}
