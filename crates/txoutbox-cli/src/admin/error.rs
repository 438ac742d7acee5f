//! One error type for every handler. Clients get a status and a short message; database and
//! other internal errors are logged here and answered with a generic 500, never echoed.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub enum AppError {
    /// 400: a bad filter, body or id; the message says what is wrong.
    BadRequest(String),
    /// 401: missing or wrong bearer token.
    Unauthorized,
    /// 403: mutations are disabled (no token configured).
    Forbidden(String),
    /// 404
    NotFound(String),
    /// 503: not available yet (no reading taken yet); the message says so.
    Unavailable(String),
    /// 500: logged, not shown.
    Internal(anyhow::Error),
}

impl From<txoutbox::Error> for AppError {
    fn from(e: txoutbox::Error) -> Self {
        AppError::Internal(e.into())
    }
}

impl From<txoutbox::store::FilterError> for AppError {
    fn from(e: txoutbox::store::FilterError) -> Self {
        AppError::BadRequest(e.to_string())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            AppError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            AppError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer $TXOUTBOX_ADMIN_TOKEN)"
                    .to_string(),
            ),
            AppError::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            AppError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            AppError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
            AppError::Internal(e) => {
                let e = txoutbox::publish::redact_secrets(&format!("{e:#}"));
                tracing::error!(error = %e, "admin API request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; see the relay's log".to_string(),
                )
            }
        };
        let mut res = (status, Json(serde_json::json!({ "error": message }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        res
    }
}
