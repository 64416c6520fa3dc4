//! The service layer: the API's operations on cluster state, typed and free of HTTP.
//!
//! Handlers in [`crate::http`] translate requests into calls here and results into
//! responses; everything that reads or writes the store lives here (reads) or in the
//! leader's desired-state writes (`kat_leader::{workloads, namespaces, node_admin}`). A
//! second front end (the agent's own API, a dashboard) calls the same [`Service`].
//!
//! Every operation validates completely before it writes, and writes in one transaction, so
//! a refused request leaves the store as it was.

mod backups;
mod events;
mod ingress;
mod instances;
mod join;
mod namespaces;
mod node_records;
mod nodes;
mod token_revocations;
mod tokens;
mod workloads;

pub use join::node_labels;
pub use token_revocations::{TokenLife, TokenRevocations};

use std::sync::Arc;

use kat_api::bundle::BundleLimits;
use kat_api::cluster::ClusterConfiguration;
use kat_api::wire::ErrorCode;
use kat_leader::desired::namespaces::NamespaceError;
use kat_leader::desired::node_admin::NodeAdminError;
use kat_leader::desired::workloads::WorkloadError;
use kat_leader::events::EventLog;
use kat_leader::Clock;
use kat_store::{StateStore, StoreError};

pub use backups::BackupTarget;
pub use join::{Admission, JoinTokenOptions, MAX_TOKEN_ADDRESSES};
pub use node_records::NodeLimits;
pub use nodes::node_object;
pub use workloads::MAX_PINNED_PER_NODE;

/// What the API's operations share: the store and the cluster's settings.
pub struct Service {
    pub store: Arc<dyn StateStore>,
    pub events: EventLog,
    pub clock: Clock,
    pub cluster: ClusterConfiguration,
    pub bundle_limits: BundleLimits,
    /// Set on nodes that hold the CA's key: they admit nodes (`join`, join tokens).
    pub admission: Option<Admission>,
    /// This node's API endpoint (`https://IP:PORT`), to tell whether it leads; `None` serves
    /// the leader's routes unconditionally (a store with a single API in front, in tests).
    pub api_endpoint: Option<String>,
    /// What each node may send through the leader, and how often (`node_records`).
    pub node_limits: node_records::NodeLimits,
    /// Set on control-plane nodes: their etcd member, for `katcall backup create`.
    pub backups: Option<BackupTarget>,
    /// Set on a detached node's local API: every workload applied there is pinned to it
    /// (`nodeSelector: {kat.dws.rip/nodeName: NODE}`, RFC 001 §4.9).
    pub pin_to_node: Option<String>,
    /// Held from counting a node's pinned workloads to writing one more: the cap
    /// (MAX_PINNED_PER_NODE) holds under parallel submissions. Only the leader's API (or a
    /// detached node's own) writes them, so one process-wide lock is enough.
    pub pinned_writes: tokio::sync::Mutex<()>,
    /// Ends what a scoped token opened when the token is deleted, on every API server.
    pub revocations: TokenRevocations,
    /// Where resolving a `source.git` branch may connect (`kat-agent --allow-fetch-from`).
    pub outbound: kat_git::OutboundPolicy,
}

impl Service {
    pub fn new(
        store: Arc<dyn StateStore>,
        events: EventLog,
        clock: Clock,
        cluster: ClusterConfiguration,
    ) -> Self {
        Service {
            revocations: TokenRevocations::new(store.clone()),
            store,
            events,
            clock,
            cluster,
            bundle_limits: BundleLimits::default(),
            admission: None,
            api_endpoint: None,
            node_limits: Default::default(),
            backups: None,
            pin_to_node: None,
            pinned_writes: tokio::sync::Mutex::new(()),
            outbound: Default::default(),
        }
    }
}

/// Why an operation failed: a wire error code and a message that says what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    /// With [`ErrorCode::NotLeader`]: the leader's API endpoint.
    pub leader: Option<String>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            leader: None,
        }
    }

    /// A node route asked of a node that does not lead: say where the leader is.
    pub fn not_leader(leader: Option<String>) -> Self {
        let message = match &leader {
            Some(l) => format!("this node does not lead the cluster; the leader's API is {l}"),
            None => "this node does not lead the cluster and no leader is known yet; retry shortly"
                .to_string(),
        };
        Error {
            code: ErrorCode::NotLeader,
            message,
            leader,
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        tracing::warn!(error = %e, "store error in an API operation");
        if let StoreError::Value { .. } = e {
            return Error::new(ErrorCode::Internal, e.to_string());
        }
        Error::new(
            ErrorCode::Unavailable,
            format!("the cluster store is unavailable: {e}; retry shortly"),
        )
    }
}

impl From<WorkloadError> for Error {
    fn from(e: WorkloadError) -> Self {
        let code = match &e {
            WorkloadError::NotFound(..) | WorkloadError::NamespaceNotFound(..) => {
                ErrorCode::NotFound
            }
            WorkloadError::NoPreviousGeneration { .. }
            | WorkloadError::Conflict(..)
            | WorkloadError::IngressTaken { .. } => ErrorCode::Conflict,
            WorkloadError::CorruptArchive { .. } => ErrorCode::Internal,
            WorkloadError::Store(s) => return store_message(s),
        };
        Error::new(code, e.to_string())
    }
}

impl From<NamespaceError> for Error {
    fn from(e: NamespaceError) -> Self {
        let code = match &e {
            NamespaceError::InvalidName { .. } => ErrorCode::BadRequest,
            NamespaceError::Exists(_)
            | NamespaceError::NotEmpty(..)
            | NamespaceError::System(_) => ErrorCode::Conflict,
            NamespaceError::NotFound(_) => ErrorCode::NotFound,
            NamespaceError::Store(s) => return store_message(s),
        };
        Error::new(code, e.to_string())
    }
}

impl From<NodeAdminError> for Error {
    fn from(e: NodeAdminError) -> Self {
        let code = match &e {
            NodeAdminError::NotFound(_) => ErrorCode::NotFound,
            NodeAdminError::Corrupt(..) => ErrorCode::Internal,
            NodeAdminError::SystemLabel(_) => ErrorCode::BadRequest,
            NodeAdminError::Store(s) => return store_message(s),
        };
        Error::new(code, e.to_string())
    }
}

/// Store errors are not `Clone`; a wrapped one answers with its message.
fn store_message(e: &StoreError) -> Error {
    Error::from(StoreError::InvalidRequest(e.to_string()))
}
