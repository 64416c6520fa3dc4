//! API errors: every failure is `{"error": code, "message": …}` with the code's status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kat_api::wire::{ErrorBody, ErrorCode};
use kat_store::StoreError;

use crate::namespaces::NamespaceError;
use crate::node_admin::NodeAdminError;
use crate::workloads::WorkloadError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: self.code,
            message: self.message,
        };
        (status, axum::Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::warn!(error = %e, "store error in API request");
        ApiError::new(
            ErrorCode::Unavailable,
            format!("the cluster store is unavailable: {e}; retry shortly"),
        )
    }
}

impl From<WorkloadError> for ApiError {
    fn from(e: WorkloadError) -> Self {
        let code = match &e {
            WorkloadError::NotFound(..) | WorkloadError::NamespaceNotFound(..) => {
                ErrorCode::NotFound
            }
            WorkloadError::NoPreviousGeneration { .. } | WorkloadError::Conflict(..) => {
                ErrorCode::Conflict
            }
            WorkloadError::CorruptArchive { .. } => ErrorCode::Internal,
            WorkloadError::Store(s) => return ApiError::from(s.clone_message()),
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<NamespaceError> for ApiError {
    fn from(e: NamespaceError) -> Self {
        let code = match &e {
            NamespaceError::InvalidName { .. } => ErrorCode::BadRequest,
            NamespaceError::Exists(_)
            | NamespaceError::NotEmpty(..)
            | NamespaceError::System(_) => ErrorCode::Conflict,
            NamespaceError::NotFound(_) => ErrorCode::NotFound,
            NamespaceError::Store(s) => return ApiError::from(s.clone_message()),
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<NodeAdminError> for ApiError {
    fn from(e: NodeAdminError) -> Self {
        let code = match &e {
            NodeAdminError::NotFound(_) => ErrorCode::NotFound,
            NodeAdminError::Corrupt(..) => ErrorCode::Internal,
            NodeAdminError::Store(s) => return ApiError::from(s.clone_message()),
        };
        ApiError::new(code, e.to_string())
    }
}

/// Store errors are not `Clone`; keep their message for the API's answer.
trait CloneMessage {
    fn clone_message(&self) -> StoreError;
}

impl CloneMessage for StoreError {
    fn clone_message(&self) -> StoreError {
        StoreError::InvalidRequest(self.to_string())
    }
}
