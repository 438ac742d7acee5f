//! One error type for every handler. Clients get a status and a short message; database and
//! other internal errors are logged here and answered with a generic 500, never echoed. A
//! failing admin query of an outbox's database is logged by its [`Outage`]: once when queries
//! start failing and once when they answer again, not at every call of a polling dashboard.

use std::sync::Mutex;
use std::time::Duration;

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
    /// 409: the call conflicts with one under way (a replay); the message says so.
    Conflict(String),
    /// 503: not available yet (no reading taken yet); the message says so.
    Unavailable(String),
    /// 500: logged, not shown.
    Internal(anyhow::Error),
    /// 500: a query of the outbox's database failed; logged by its [`Outage`] (once per
    /// outage), not shown.
    QueryFailed,
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
            AppError::Conflict(m) => (StatusCode::CONFLICT, m),
            AppError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
            AppError::Internal(e) => {
                let e = txoutbox::redact::redact_secrets(&format!("{e:#}"));
                tracing::error!(error = %e, "admin API request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; see the relay's log".to_string(),
                )
            }
            AppError::QueryFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the database query failed; see the relay's log and GET /api/v1/readiness"
                    .to_string(),
            ),
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

/// The admin side's queries of one outbox's database (the API's listings and changes, the
/// sampler's readings), or another such kind of them: an outage starts at the first failure
/// after an answer (or ever) and ends at the next answer. Logged once at each end, not per
/// failure: a dashboard polling a database that is down would log an error every poll.
/// Meanwhile [`Outage::down`] says since when and why, for readiness and the status.
#[derive(Debug)]
pub struct Outage {
    /// What fails, as the log names it: "admin queries of the database".
    what: &'static str,
    down: Mutex<Option<Down>>,
}

/// An outage under way.
#[derive(Debug, Clone, PartialEq)]
pub struct Down {
    /// The first failure.
    pub since: chrono::DateTime<chrono::Utc>,
    /// The latest failure's error, secrets redacted.
    pub error: String,
    pub failures: u64,
}

impl Outage {
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            down: Mutex::new(None),
        }
    }

    /// A query failed with `error` (secrets are redacted here). Logs an ERROR when this
    /// starts an outage (and returns `true`); later failures of the same outage only count.
    pub fn failed(&self, error: &str) -> bool {
        let error = txoutbox::redact::redact_secrets(error);
        let Ok(mut down) = self.down.lock() else {
            return false;
        };
        if let Some(d) = down.as_mut() {
            d.failures += 1;
            d.error = error;
            return false;
        }
        tracing::error!(
            error = %error,
            "{} failing (logged once; a line says when they answer again)",
            self.what
        );
        *down = Some(Down {
            since: chrono::Utc::now(),
            error,
            failures: 1,
        });
        true
    }

    /// A query answered: ends an outage under way (logged at INFO, with how long it lasted
    /// and how many queries failed), which is returned.
    pub fn answered(&self) -> Option<Down> {
        let ended = self.down.lock().ok()?.take()?;
        let lasted = (chrono::Utc::now() - ended.since)
            .to_std()
            .unwrap_or_default();
        tracing::info!(
            failures = ended.failures,
            down_for = %txoutbox::relay::format_duration(Duration::from_secs(lasted.as_secs())),
            "{} answer again",
            self.what
        );
        Some(ended)
    }

    /// The outage under way, if any.
    pub fn down(&self) -> Option<Down> {
        self.down.lock().ok().and_then(|d| d.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Arc;

    /// Log lines written while `f` runs, at INFO and above.
    fn logged(f: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines().map(String::from).collect()
    }

    /// A dashboard polling through an outage: one ERROR when it starts, one INFO when it ends,
    /// whatever the number of failed calls; the next outage is logged again.
    #[test]
    fn an_outage_is_logged_once_at_each_end() {
        let o = Outage::new("admin queries of the database");
        let lines = logged(|| {
            assert!(o.answered().is_none(), "no outage to end");
            assert!(o.failed("connection refused (postgres://u:hunter2@db:5432/x)"));
            for _ in 0..20 {
                assert!(!o.failed("pool timed out"));
            }
            let down = o.down().unwrap();
            assert_eq!(down.failures, 21);
            assert_eq!(down.error, "pool timed out");
            let ended = o.answered().unwrap();
            assert_eq!(ended.failures, 21);
            assert!(o.down().is_none());
            assert!(o.answered().is_none(), "ended once");
            assert!(o.failed("connection refused"), "a new outage");
        });
        let errors: Vec<_> = lines.iter().filter(|l| l.contains("ERROR")).collect();
        let infos: Vec<_> = lines.iter().filter(|l| l.contains(" INFO ")).collect();
        assert_eq!(errors.len(), 2, "{lines:#?}");
        assert!(
            errors[0].contains("admin queries of the database failing")
                && errors[0].contains("connection refused")
                && !errors[0].contains("hunter2"),
            "{lines:#?}"
        );
        assert_eq!(infos.len(), 1, "{lines:#?}");
        assert!(
            infos[0].contains("answer again") && infos[0].contains("failures=21"),
            "{lines:#?}"
        );
    }
}
