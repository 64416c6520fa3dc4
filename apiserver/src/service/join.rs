//! Admitting nodes: join tokens (create, list, delete) and the join itself.
//!
//! A join is authenticated by its token alone (the node has no certificate yet). Everything is
//! checked before anything is written: the token (known, right secret, not expired), what the
//! token admits (a worker token never makes an etcd member, which would be sent the CA's
//! key), the node name (a DNS label, not the name of a node that is alive), the address, the
//! request's signature. Then the CA signs the node's key with the name the token admitted,
//! an etcd peer is added to the quorum as a learner (promoted by the leader once it has caught
//! up), and the token records the node.
//!
//! The address written into the node's certificate is one the leader can check: the one the
//! join came from, or one the token's creator listed (`katcall create join-token --address`);
//! a joining node cannot have a certificate for another machine's address.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::{
    ErrorCode, EtcdJoin, JoinRequest, JoinResponse, JoinRole, JoinTokenInfo, JoinTokenRecord,
    NewJoinToken, NodeState, CLUSTER_ROLE_LABEL, HOSTNAME_LABEL, NODE_TYPE_LABEL,
};
use kat_pki::{Authority, JoinToken, NodeRole};
use kat_store::{Compare, EtcdStore, JsonStore, KeyValue, Txn, TxnOp};

use super::{Error, Result, Service};

/// What a node that admits others holds: the CA with its key, and (for etcd peers) a handle
/// on the etcd cluster to add members to.
pub struct Admission {
    /// The node serving this API.
    pub node: String,
    pub authority: Arc<Authority>,
    pub etcd: Option<EtcdStore>,
}

fn unauthorized(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::Unauthorized, message)
}

/// Most addresses one token may list.
pub const MAX_TOKEN_ADDRESSES: usize = 16;

/// What a new join token admits and for how long.
#[derive(Debug, Clone, Default)]
pub struct JoinTokenOptions {
    pub role: JoinRole,
    /// How long it is valid; `None`: the role's default (24 h for a worker token, 1 h for a
    /// control-plane token).
    pub ttl: Option<Duration>,
    /// How many nodes it may admit; `None`: any number until it expires.
    pub max_uses: Option<u32>,
    /// Addresses a joining node may advertise besides the one its join comes from.
    pub addresses: Vec<IpAddr>,
}

/// One form of an address, so that `::ffff:10.0.0.1` (an IPv4 client of a dual-stack
/// socket) is `10.0.0.1`.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

impl Service {
    pub(super) fn admission(&self) -> Result<&Admission> {
        self.admission.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::Unavailable,
                "this node does not hold the cluster CA's key, so it cannot admit nodes: ask a node of the etcd quorum (the one that ran `kat-agent init`, or one joined with --etcd-peer)",
            )
        })
    }

    /// `kat-agent rejoin`: a control-plane node of this cluster (its certificate says so, and
    /// it is registered) becomes an etcd member again after a restore, as a learner at the
    /// peer URL of its registered address. The answer is the member list it starts with.
    pub async fn readmit_etcd_member(
        &self,
        node: &str,
        role: Option<NodeRole>,
    ) -> Result<kat_api::wire::EtcdMembership> {
        if role == Some(NodeRole::Worker) {
            return Err(Error::forbidden(format!(
                "node {node} is a worker: it has no etcd member to rejoin with"
            )));
        }
        let admission = self.admission()?;
        let members = admission.etcd.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::Unavailable,
                "this node cannot add etcd members; rejoin through the restored node",
            )
        })?;
        let registration: kat_api::wire::NodeRegistration = self
            .store
            .get(&keys::node_registration(node))
            .await?
            .and_then(|kv| kat_store::decode_or_skip(&kv))
            .ok_or_else(|| {
                Error::not_found(format!(
                    "node {node} is not registered in this cluster's state: join it as a new node instead"
                ))
            })?;
        if kat_api::wire::cluster_role(&registration.labels) == Some("worker") {
            return Err(Error::forbidden(format!(
                "node {node} is registered as a worker"
            )));
        }
        let address = registration
            .addresses
            .first()
            .ok_or_else(|| Error::bad_request(format!("node {node} has no registered address")))?;
        let peer_url = format!(
            "https://{}:{}",
            kat_api::wire::url_host(address),
            self.cluster.spec.etcd_peer_port
        );
        let initial_cluster = members.add_learner(node, &peer_url).await?;
        tracing::info!(%node, %peer_url, "etcd member readmitted");
        Ok(kat_api::wire::EtcdMembership { initial_cluster })
    }

    /// A new join token. Its secret is in the answer only.
    pub async fn create_join_token(&self, options: &JoinTokenOptions) -> Result<NewJoinToken> {
        let token =
            JoinToken::generate().map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?;
        self.store_join_token(&token, options).await
    }

    /// Store `token` (its secret's hash) with what it admits: a new one, or the worker token
    /// `kat-agent init` made and prints.
    pub async fn store_join_token(
        &self,
        token: &JoinToken,
        options: &JoinTokenOptions,
    ) -> Result<NewJoinToken> {
        let admission = self.admission()?;
        let ttl = options.ttl.unwrap_or(options.role.default_ttl());
        if ttl.is_zero() || ttl > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::bad_request(
                "ttl: must be between 1s and 365d (e.g. 24h)",
            ));
        }
        if options.max_uses == Some(0) {
            return Err(Error::bad_request(
                "maxUses: must be at least 1 (leave it out for any number)",
            ));
        }
        if options.addresses.len() > MAX_TOKEN_ADDRESSES {
            return Err(Error::bad_request(format!(
                "addresses: at most {MAX_TOKEN_ADDRESSES} per token"
            )));
        }
        let mut addresses: Vec<String> = Vec::new();
        for ip in options.addresses.iter().copied().map(canonical) {
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(Error::bad_request(format!(
                    "addresses: {ip} is not an address a node can be reached at"
                )));
            }
            if !addresses.contains(&ip.to_string()) {
                addresses.push(ip.to_string());
            }
        }
        let now = self.clock.wall();
        let record = JoinTokenRecord {
            info: JoinTokenInfo {
                id: token.id.clone(),
                role: options.role,
                created_at: now.into(),
                expires_at: (now + ttl).into(),
                addresses,
                used_by: vec![],
                max_uses: options.max_uses,
            },
            secret_sha256: token.secret_sha256(),
        };
        self.store
            .put_json(&keys::join_token(&token.id), &record, None)
            .await?;
        tracing::info!(token = %token.id, role = %options.role, expires_at = %record.info.expires_at, "join token created");
        Ok(NewJoinToken {
            token: token.to_string(),
            id: token.id.clone(),
            role: options.role,
            expires_at: record.info.expires_at,
            addresses: record.info.addresses,
            ca_pin: kat_pki::ca_pin(&admission.authority.ca_pem())
                .map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?,
        })
    }

    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenInfo>> {
        Ok(self
            .store
            .list(keys::join_tokens())
            .await?
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip::<JoinTokenRecord>)
            .map(|r| r.info)
            .collect())
    }

    pub async fn delete_join_token(&self, id: &str) -> Result<()> {
        let key = keys::join_token(id);
        if self.store.get(&key).await?.is_none() {
            return Err(Error::not_found(format!(
                "join token {id} not found (see `katcall get join-tokens`)"
            )));
        }
        self.store.delete(&key).await?;
        Ok(())
    }

    /// Admit a node whose join came from `source`: check everything, then sign, add the etcd
    /// member, record the use.
    pub async fn join(&self, request: JoinRequest, source: IpAddr) -> Result<JoinResponse> {
        let admission = self.admission()?;
        let token = JoinToken::parse(&request.token).map_err(unauthorized)?;
        let key = keys::join_token(&token.id);
        let stored = self.store.get(&key).await?.ok_or_else(|| {
            unauthorized(format!(
                "join token {} is not known (deleted, or from another cluster); create one with `katcall create join-token`",
                token.id
            ))
        })?;
        let record = token_record(&stored)?;
        if !token.matches(&record.secret_sha256) {
            tracing::warn!(token = %token.id, node = %request.node_name, "join refused: wrong secret");
            return Err(unauthorized(format!(
                "join token {}: wrong secret",
                token.id
            )));
        }
        let expires = record.info.expires_at.system_time();
        if self.clock.wall() > expires {
            return Err(unauthorized(format!(
                "join token {} expired at {}; create a new one with `katcall create join-token`",
                token.id, record.info.expires_at
            )));
        }
        // What the token admits, before anything else: a worker token never makes an etcd
        // member (which is sent the CA's key), whatever the joining node asks for.
        if request.etcd_peer && record.info.role != JoinRole::ControlPlane {
            tracing::warn!(token = %token.id, node = %request.node_name, %source, "join refused: a worker token asked for etcd membership");
            return Err(Error::forbidden(format!(
                "join token {} is a {} token: it admits worker nodes only, not members of the etcd quorum (--etcd-peer, which are sent the CA's key). Join without --etcd-peer, or have the admin create a control-plane token: `katcall create join-token --control-plane` (valid 1 h by default)",
                token.id, record.info.role
            )));
        }
        if let Some(problem) = kat_api::names::dns_label_problem(&request.node_name) {
            return Err(Error::bad_request(format!("nodeName: {problem}")));
        }
        if let Some(problem) = request
            .node_type
            .as_deref()
            .and_then(kat_api::names::label_value_problem)
        {
            return Err(Error::bad_request(format!("nodeType: {problem}")));
        }
        let address: IpAddr = request.address.parse().map(canonical).map_err(|_| {
            Error::bad_request(format!(
                "address: {:?} is not an IP address",
                request.address
            ))
        })?;
        // The certificate names an address the leader can vouch for: where the join came
        // from, or one the token's creator listed.
        let source = canonical(source);
        if address != source && !record.info.addresses.contains(&address.to_string()) {
            tracing::warn!(token = %token.id, node = %request.node_name, %source, %address, "join refused: advertised address is not the source");
            return Err(Error::forbidden(format!(
                "address: this join comes from {source}, not from the advertised address {address}, and join token {} does not list {address}. Run the join with --advertise-address {source}, or, if this node is reached at {address} (behind NAT, say), have the admin create a token that allows it: `katcall create join-token --address {address}`",
                token.id
            )));
        }
        if let Ok(existing) = self.node(&request.node_name).await {
            if existing.state != NodeState::NotReady {
                return Err(Error::new(
                    ErrorCode::Conflict,
                    format!(
                        "node {} is already a live member of the cluster; pick another --node-name, or remove it first",
                        request.node_name
                    ),
                ));
            }
        }
        // A node that joined before keeps its certificate; a second join in its name (a
        // leaked token, a lost data directory) could take it over, with another role.
        if self
            .store
            .get(&keys::node_certificate(&request.node_name))
            .await?
            .is_some()
        {
            return Err(Error::new(
                ErrorCode::Conflict,
                format!(
                    "node {} has joined before and holds a certificate; remove it first (katcall delete node {}) or join under another --node-name",
                    request.node_name, request.node_name
                ),
            ));
        }
        if self.node_revoked(&request.node_name).await? {
            return Err(Error::new(
                ErrorCode::Conflict,
                format!(
                    "node {} was removed from the cluster and its certificate revoked; join under another --node-name",
                    request.node_name
                ),
            ));
        }
        // A control-plane token may admit a worker (less than it allows); only a control-plane
        // token makes a member (checked above).
        let role = match request.etcd_peer {
            true => NodeRole::ControlPlane,
            false => NodeRole::Worker,
        };
        let members = match request.etcd_peer {
            true => Some(admission.etcd.as_ref().ok_or_else(|| {
                Error::new(
                    ErrorCode::Unavailable,
                    "this node cannot add etcd members; join through a node of the quorum",
                )
            })?),
            false => None,
        };
        let certificate = admission
            .authority
            .sign_csr(&request.csr, &request.node_name, &[address], role)
            .map_err(|e| Error::bad_request(format!("csr: {e:#}")))?;
        // Everything checked: count this use (or refuse one past the token's limit) before
        // anything else is written.
        self.record_token_use(&key, stored, &request.node_name)
            .await?;
        let etcd = if let Some(members) = members {
            let peer_url = format!(
                "https://{}:{}",
                kat_api::wire::url_host(&address.to_string()),
                self.cluster.spec.etcd_peer_port
            );
            let initial_cluster = members.add_learner(&request.node_name, &peer_url).await?;
            Some(EtcdJoin {
                initial_cluster,
                ca_key: admission.authority.key_pem(),
            })
        } else {
            None
        };
        if role == NodeRole::Worker {
            // A worker never writes to etcd: the cluster registers it and records its
            // certificate (so that removing the node revokes it) now.
            kat_leader::desired::node_admin::register(
                &*self.store,
                &request.node_name,
                vec![address.to_string()],
                node_labels(&request.node_name, role, request.node_type.as_deref()),
            )
            .await?;
        }
        if let Some(serial) = kat_pki::serial_of(&certificate) {
            self.store
                .put(
                    &keys::node_certificate(&request.node_name),
                    serial.into_bytes(),
                    None,
                )
                .await?;
        }
        tracing::info!(node = %request.node_name, %address, %role, token = %token.id, token_role = %record.info.role, "node admitted");
        Ok(JoinResponse {
            certificate,
            ca: admission.authority.ca_pem(),
            cluster_config: serde_json::to_string_pretty(&self.cluster)
                .map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?,
            etcd,
            api_endpoints: self.api_endpoints().await?,
        })
    }
}

fn token_record(kv: &KeyValue) -> Result<JoinTokenRecord> {
    kat_store::decode(kv)
        .map_err(|e| Error::new(ErrorCode::Internal, format!("join token record: {e}")))
}

impl Service {
    /// Record `node` as a use of the token stored at `key` (read as `kv`), refusing a use past
    /// its limit. Compare-and-swap on the record, so two joins at once cannot both take the
    /// last use; a node already recorded (a join resumed) takes no second one.
    async fn record_token_use(&self, key: &str, mut kv: KeyValue, node: &str) -> Result<()> {
        loop {
            let mut record = token_record(&kv)?;
            if record.info.used_by.iter().any(|n| n == node) {
                return Ok(());
            }
            if let Some(max) = record.info.max_uses {
                if record.info.used_by.len() >= max as usize {
                    return Err(unauthorized(format!(
                        "join token {} has admitted {max} node(s), its limit ({}); create another with `katcall create join-token`",
                        record.info.id,
                        record.info.used_by.join(", ")
                    )));
                }
            }
            record.info.used_by.push(node.to_string());
            let txn = Txn::new()
                .when([Compare::mod_revision_is(key, kv.mod_revision)])
                .and_then([TxnOp::put_json(key, &record)?]);
            if self.store.txn(txn).await?.succeeded {
                return Ok(());
            }
            kv = self.store.get(key).await?.ok_or_else(|| {
                unauthorized(format!(
                    "join token {} was deleted during the join",
                    record.info.id
                ))
            })?;
        }
    }
}

/// The labels a node is registered with: its host name, its role and, if its agent was given
/// `--node-type`, that.
pub fn node_labels(
    node: &str,
    role: NodeRole,
    node_type: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (HOSTNAME_LABEL.to_string(), node.to_string()),
        (CLUSTER_ROLE_LABEL.to_string(), role.to_string()),
    ]);
    if let Some(t) = node_type {
        labels.insert(NODE_TYPE_LABEL.to_string(), t.to_string());
    }
    labels
}
