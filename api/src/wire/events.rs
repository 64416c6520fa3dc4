//! Events and backups as the API lists them.

use super::*;

/// A backup: an etcd snapshot a node wrote to its `backupPath` (`katcall get backups`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The file's name, `kat-{cluster}-{node}-{YYYYMMDDTHHMMSS.mmm}Z.db`.
    pub name: String,
    /// The node whose disk holds it.
    pub node: String,
    /// The file's full path on that node.
    pub path: String,
    /// When the snapshot was taken.
    pub taken_at: Timestamp,
    /// The file's size, in bytes.
    pub size_bytes: u64,
    /// The SHA-256 of the file (hex).
    pub sha256: String,
    /// `schedule` (the leader's) or `manual` (`katcall backup create`).
    pub trigger: String,
}

/// How much an event matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventType {
    /// A change that went as expected.
    Normal,
    /// Something that went wrong or needs attention.
    Warning,
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// Its kind (`Workload`, `Node`, `Cluster`).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its namespace, for a namespaced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its uid, when the writer knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One entry of the capped event log (RFC 001 §9.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// When it happened.
    pub timestamp: Timestamp,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// A short machine-readable cause (`InstanceReplaced`).
    pub reason: String,
    /// The object it is about.
    pub involved_object: ObjectReference,
    /// What happened, for people.
    pub message: String,
}
