//! Types on the wire between `katcall`, agents and the leader: JSON in camelCase.
//!
//! These are the API's representation (RFC 001 §8.2). Timestamps are [`Timestamp`]s (RFC 3339 strings in UTC),
//! quantities are integers (millicores, bytes) so that clients never parse units. One file per
//! domain; every type is re-exported here, so `kat_api::wire::X` names them all.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::timestamp::Timestamp;
pub use crate::typed_names::{InstanceId, NodeName};

pub use crate::workload::TaintEffect;

mod detached;
mod events;
mod ingress;
mod join;
mod nodes;
mod tokens;
mod workloads;

pub use detached::*;
pub use events::*;
pub use ingress::*;
pub use join::*;
pub use nodes::*;
pub use tokens::*;
pub use workloads::*;

/// An address as the host part of a URL: IPv6 in brackets (`https://[fd00::1]:9115`).
pub fn url_host(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    }
}

/// The error body of every failed API request: `{"error": code, "message": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong, for machines.
    pub error: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// With `not_leader`: the API endpoint of the node that leads (`https://IP:PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// Machine-readable error codes; each has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed (400).
    BadRequest,
    /// A Quadlet file is invalid; the message lists every finding (400).
    InvalidQuadlet,
    /// No valid credentials (401).
    Unauthorized,
    /// Authenticated, but not allowed: a node's certificate outside its own records.
    Forbidden,
    /// The object does not exist (404).
    NotFound,
    /// The request conflicts with the current state of the cluster (409).
    Conflict,
    /// The body is larger than the server accepts (413).
    PayloadTooLarge,
    /// Too many requests; try again later (429).
    RateLimited,
    /// The request (its header or its body) did not arrive within the server's deadline.
    RequestTimeout,
    /// The server cannot do it now: try again, or ask another node (503).
    Unavailable,
    /// A fault of the server (500).
    Internal,
    /// A node route sent to a node that does not lead; the body names the leader.
    NotLeader,
    /// No route of the API has this method and path (a client newer than the server, or a
    /// typo): unlike [`ErrorCode::NotFound`], nothing was looked up.
    NoRoute,
    /// A code this version does not know (one a newer server sends).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The HTTP status the code is sent with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::InvalidQuadlet => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RateLimited => 429,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            ErrorCode::NotLeader => 421,
            ErrorCode::NoRoute => 404,
            ErrorCode::Unknown => 500,
        }
    }
}

/// Metadata common to stored objects.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The object's name.
    pub name: String,
    /// Its namespace; none for objects outside namespaces (nodes, namespaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A random id given when the object is first stored; it survives updates.
    pub uid: String,
    /// The version of the desired state: 1 when created, one more per new generation.
    #[serde(default)]
    pub generation: u64,
    /// The store revision this object was read at; send it back to update conditionally.
    #[serde(default)]
    pub resource_version: i64,
    /// When the object was first stored. An object KAT does not store as such (a node,
    /// assembled from its registration and heartbeat) has none, written `""` as it always
    /// was, so that clients of either version read the other's answers.
    #[serde(default, with = "crate::timestamp::empty_as_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, required = true, format = DateTime)
    )]
    pub creation_timestamp: Option<Timestamp>,
    /// The object's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wireguard_keys_are_32_bytes_of_canonical_base64() {
        let key = |k: &str| WireguardKey {
            public_key: k.into(),
        };
        assert_eq!(
            key("xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=").problem(),
            None
        );
        for bad in [
            "",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dh=",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8D==",
            "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n",
            "xTIBA5rb Uvnh4htodjb6e697QjLERt1NAB4mZqp8Dg=",
        ] {
            let problem = key(bad).problem().expect(bad);
            assert!(problem.contains("not a WireGuard public key"), "{problem}");
        }
    }

    #[test]
    fn a_join_token_record_from_before_roles_reads_as_a_worker_token() {
        // As an older version stored it: no role, no addresses.
        let old = r#"{"id":"0123456789ab","createdAt":"2026-01-01T00:00:00Z","expiresAt":"2026-01-02T00:00:00Z","usedBy":["n2"],"secretSha256":"ab"}"#;
        let record: JoinTokenRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.info.role, JoinRole::Worker);
        assert!(record.info.addresses.is_empty());
        assert_eq!(record.info.used_by, ["n2"]);
        assert_eq!(record.secret_sha256, "ab");
        // A control-plane token keeps its role through the store.
        let mut cp = record.clone();
        cp.info.role = JoinRole::ControlPlane;
        cp.info.addresses = vec!["192.0.2.7".into()];
        let text = serde_json::to_string(&cp).unwrap();
        assert!(text.contains(r#""role":"control-plane""#), "{text}");
        assert_eq!(serde_json::from_str::<JoinTokenRecord>(&text).unwrap(), cp);
        assert_eq!(JoinRole::ControlPlane.default_ttl().as_secs(), 3600);
        assert_eq!(JoinRole::Worker.default_ttl().as_secs(), 24 * 3600);
    }

    #[test]
    fn error_body_shape() {
        let body = ErrorBody {
            error: ErrorCode::InvalidQuadlet,
            message: "workload.kat: spec.replicas: is required".into(),
            leader: None,
        };
        let json = serde_json::to_string(&body).unwrap();
        assert_eq!(
            json,
            r#"{"error":"invalid_quadlet","message":"workload.kat: spec.replicas: is required"}"#
        );
        assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
    }

    #[test]
    fn camel_case_on_the_wire() {
        let s = InstanceStatus {
            node: Some("n1".parse().unwrap()),
            health: Health::Healthy,
            restarts: 1,
            started_at: Some(std::time::UNIX_EPOCH.into()),
            ..InstanceStatus::new(
                "web-abc".parse().unwrap(),
                "default".into(),
                "web".into(),
                2,
                InstanceState::Running,
            )
        };
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["instanceID"], "web-abc");
        assert_eq!(json["startedAt"], "1970-01-01T00:00:00.000Z");
        let back: InstanceStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }
}
