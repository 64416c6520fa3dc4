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
    pub path: String,
    pub taken_at: Timestamp,
    pub size_bytes: u64,
    pub sha256: String,
    /// `schedule` (the leader's) or `manual` (`katcall backup create`).
    pub trigger: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One entry of the capped event log (RFC 001 §9.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub timestamp: Timestamp,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub reason: String,
    pub involved_object: ObjectReference,
    pub message: String,
}
