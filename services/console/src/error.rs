//! Console errors as HTTP replies: `{"error": {"kind", "message"}}` with a status that says
//! the same. A fabric refusal keeps its stable kind and code.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use switchboard_proto::ErrorReply;

/// Why a console request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No session (or it ended).
    #[error("sign in first")]
    SignIn,
    /// The session's person lacks the access the request needs.
    #[error("{0}")]
    Forbidden(String),
    /// A state-changing request without the session's CSRF token, with a form content type,
    /// or from another site.
    #[error("{0}")]
    Csrf(&'static str),
    /// A `Host` the console does not answer (DNS rebinding).
    #[error("this console does not answer for host `{0}`")]
    MisdirectedHost(String),
    /// A malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// Too many live streams.
    #[error("too many live streams are open; close a tab")]
    Busy,
    /// The fabric refused or failed (its kind and code pass through).
    #[error("{}", .0.error.message)]
    Fabric(ErrorReply),
}

impl From<switchboard_client::ClientError> for ApiError {
    fn from(err: switchboard_client::ClientError) -> Self {
        match err {
            switchboard_client::ClientError::Service(reply) => Self::Fabric(reply),
            other => Self::Fabric(ErrorReply::new(
                switchboard_proto::ErrorKind::Unavailable,
                other.to_string(),
            )),
        }
    }
}

impl From<switchboard_request::request::RequestFailure> for ApiError {
    fn from(err: switchboard_request::request::RequestFailure) -> Self {
        switchboard_client::ClientError::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind) = match &self {
            Self::SignIn => (StatusCode::UNAUTHORIZED, "sign_in".to_owned()),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "not_allowed".to_owned()),
            Self::Csrf(_) => (StatusCode::FORBIDDEN, "csrf".to_owned()),
            Self::MisdirectedHost(_) => (StatusCode::MISDIRECTED_REQUEST, "bad_host".to_owned()),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request".to_owned()),
            Self::Busy => (StatusCode::TOO_MANY_REQUESTS, "busy".to_owned()),
            Self::Fabric(reply) => (
                StatusCode::from_u16(reply.error.code).unwrap_or(StatusCode::BAD_GATEWAY),
                reply.kind().to_string(),
            ),
        };
        let body = serde_json::json!({"error": {"kind": kind, "message": self.to_string()}});
        (status, Json(body)).into_response()
    }
}
