//! API errors: every failure is `{"error": code, "message": …}` with the code's status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kat_api::wire::ErrorBody;

/// The service layer's error, answered over HTTP.
pub type ApiError = crate::service::Error;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: self.code,
            message: self.message,
            leader: self.leader,
        };
        (status, axum::Json(body)).into_response()
    }
}
