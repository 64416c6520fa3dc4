//! Detached nodes: the detachment record and the rejoin request and offer on the LAN.

use super::*;

/// A node that lost its parent cluster's leader and leads a one-node cluster of its own
/// (RFC 001 §4.9) until it rejoins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Detachment {
    /// The name of the cluster it left.
    pub parent_cluster: String,
    /// RFC 3339.
    pub since: Timestamp,
}

/// What a detached node multicasts on its LAN (to [`REJOIN_GROUP`] on `rejoinPort`), every
/// 2 s, to find its parent's leader.
/// The leader answers only if `certificate` chains to the cluster CA, names `node`, is not
/// revoked, and `signature` (ECDSA P-256 with SHA-256, hex, by the certificate's key) covers
/// [`RejoinRequest::signed_bytes`]; `timestamp` is within a minute and `nonce` is new.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RejoinRequest {
    /// Always `REJOIN_REQUEST`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The name of the cluster the node belongs to.
    pub parent_cluster: String,
    /// The node's name.
    pub node: String,
    /// Seconds since the Unix epoch.
    pub timestamp: u64,
    /// 32 hex digits, new for every request; the answer repeats it.
    pub nonce: String,
    /// The node's certificate (PEM).
    pub certificate: String,
    /// The signature over [`RejoinRequest::signed_bytes`] (ECDSA P-256 with SHA-256, hex).
    pub signature: String,
}

/// The value of [`RejoinRequest::kind`].
pub const REJOIN_REQUEST: &str = "REJOIN_REQUEST";

impl RejoinRequest {
    /// The bytes the signature covers: every field but the certificate and the signature.
    pub fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "kat-rejoin-v1\n{}\n{}\n{}\n{}\n{}",
            self.kind, self.parent_cluster, self.node, self.timestamp, self.nonce
        )
        .into_bytes()
    }
}

/// The parent leader's answer to a [`RejoinRequest`], sent straight back (UDP, to the
/// address and port the request came from), proven as the request is: the leader's
/// control-plane certificate and its signature over [`RejoinOffer::signed_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RejoinOffer {
    /// Always `REJOIN_OFFER`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The name of the leader's cluster.
    pub parent_cluster: String,
    /// The leader's API endpoint (`https://IP:PORT`).
    pub leader: String,
    /// The request's nonce.
    pub nonce: String,
    /// Seconds since the Unix epoch.
    pub timestamp: u64,
    /// The leader's control-plane certificate (PEM).
    pub certificate: String,
    /// The signature over [`RejoinOffer::signed_bytes`] by the certificate's key (hex).
    pub signature: String,
}

/// The value of [`RejoinOffer::kind`].
pub const REJOIN_OFFER: &str = "REJOIN_OFFER";

/// The multicast group detached nodes send [`RejoinRequest`]s to (organization-local scope,
/// RFC 2365), on `rejoinPort`.
pub const REJOIN_GROUP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(239, 255, 75, 75);

impl RejoinOffer {
    /// The bytes the signature covers: every field but the certificate and the signature.
    pub fn signed_bytes(&self) -> Vec<u8> {
        format!(
            "kat-rejoin-v1\n{}\n{}\n{}\n{}\n{}",
            self.kind, self.parent_cluster, self.leader, self.nonce, self.timestamp
        )
        .into_bytes()
    }
}
