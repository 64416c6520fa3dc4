//! Joining: join tokens (as listed, as stored, as created), the join request and answer.

use super::*;

/// What a join token admits. A worker token makes worker nodes only; a control-plane
/// token may also make a member of the etcd quorum, which is sent the CA's key: it is made
/// on purpose (`katcall create join-token --control-plane`) and is short-lived by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum JoinRole {
    /// Records stored before tokens had a role read as this: the least a token can give.
    #[default]
    Worker,
    /// Makes worker nodes and members of the etcd quorum (which are sent the CA's key).
    ControlPlane,
}

impl JoinRole {
    /// How long a token of this role is valid unless its creator says otherwise.
    pub fn default_ttl(self) -> std::time::Duration {
        match self {
            JoinRole::Worker => std::time::Duration::from_secs(24 * 3600),
            JoinRole::ControlPlane => std::time::Duration::from_secs(3600),
        }
    }
}

impl std::fmt::Display for JoinRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JoinRole::Worker => "worker",
            JoinRole::ControlPlane => "control-plane",
        })
    }
}

/// A join token as listed (`katcall get join-tokens`): no hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenInfo {
    /// The token's id (12 hex digits): its public part.
    pub id: String,
    /// What it admits; `worker` for a record made before tokens had a role.
    #[serde(default)]
    pub role: JoinRole,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it stops admitting nodes.
    pub expires_at: Timestamp,
    /// Addresses a joining node may advertise besides the one its join comes from (a node
    /// behind NAT, say); empty: only its source address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Nodes admitted with it.
    #[serde(default)]
    pub used_by: Vec<String>,
    /// How many nodes it may admit; `None`: any number until it expires or is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
}

/// A join token as stored: what is listed, and the SHA-256 of the secret (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRecord {
    /// What is listed.
    #[serde(flatten)]
    pub info: JoinTokenInfo,
    /// The SHA-256 of the token's secret (hex).
    pub secret_sha256: String,
}

/// `POST /join-tokens`: a new token; `token` is shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NewJoinToken {
    /// The whole token, `katjoin.ID.SECRET`, for `kat-agent join`.
    pub token: String,
    /// The token's id.
    pub id: String,
    /// What it admits.
    #[serde(default)]
    pub role: JoinRole,
    /// When it stops admitting nodes.
    pub expires_at: Timestamp,
    /// Addresses a joining node may advertise besides its source address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// `sha256:…` of the cluster CA, for `kat-agent join --ca-pin`.
    pub ca_pin: String,
}

/// `POST /join`: a node asking to join, authenticated by its join token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    /// The join token.
    pub token: String,
    /// The name the node asks for.
    pub node_name: String,
    /// PKCS#10 request (PEM) for the node's own key; only its public key is used.
    pub csr: String,
    /// The address other nodes reach this one at.
    pub address: String,
    /// Become a member of the etcd quorum.
    #[serde(default)]
    pub etcd_peer: bool,
    /// The agent's `--node-type`: the node's `kat.dws.rip/nodeType` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
}

/// The answer to a join: the node's certificate, the CA, the cluster's configuration and, for
/// an etcd peer, how to start its etcd member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    /// The node's certificate (PEM), signed by the cluster CA.
    pub certificate: String,
    /// The cluster CA certificate (PEM).
    pub ca: String,
    /// `cluster.kat` as the cluster was initialized with.
    pub cluster_config: String,
    /// For an etcd peer: how to start its etcd member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdJoin>,
    /// The API endpoints of the control-plane nodes (`https://IP:PORT`): where a worker finds
    /// the leader, now and after a failover.
    #[serde(default)]
    pub api_endpoints: Vec<String>,
}
