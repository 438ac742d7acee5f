//! Bearer-token checks. Mutating calls always need the token; reads need it only when the
//! listener is bound to a non-loopback address. Tokens are compared in constant time.

use std::net::SocketAddr;

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use super::error::AppError;

/// Who may do what on the admin listener.
#[derive(Clone, Default)]
pub struct Auth {
    token: Option<String>,
    reads_need_token: bool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("reads_need_token", &self.reads_need_token)
            .finish()
    }
}

impl Auth {
    /// Refuses a non-loopback address without a token, and an empty token.
    pub fn new(token: Option<String>, addr: SocketAddr) -> Result<Self, String> {
        let token = match token {
            Some(t) if t.trim().is_empty() => {
                return Err("--admin-token (TXOUTBOX_ADMIN_TOKEN) must not be empty".into())
            }
            t => t,
        };
        let loopback = addr.ip().is_loopback();
        if !loopback && token.is_none() {
            return Err(format!(
                "--admin-addr {addr} is not a loopback address: set --admin-token \
                 (TXOUTBOX_ADMIN_TOKEN) or bind to 127.0.0.1"
            ));
        }
        Ok(Self {
            token,
            reads_need_token: !loopback,
        })
    }

    /// Retry, discard: the token is required.
    pub fn mutate(&self, headers: &HeaderMap) -> Result<(), AppError> {
        match &self.token {
            None => Err(AppError::Forbidden(
                "changes are disabled: start the relay with TXOUTBOX_ADMIN_TOKEN set".into(),
            )),
            Some(t) => check(t, headers),
        }
    }

    /// Listing and inspecting events (payloads): open on loopback, token elsewhere.
    pub fn read(&self, headers: &HeaderMap) -> Result<(), AppError> {
        match (&self.token, self.reads_need_token) {
            (Some(t), true) => check(t, headers),
            _ => Ok(()),
        }
    }
}

fn check(token: &str, headers: &HeaderMap) -> Result<(), AppError> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    let ok: bool = given.as_bytes().ct_eq(token.as_bytes()).into();
    if ok {
        Ok(())
    } else {
        Err(AppError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn non_loopback_needs_a_token() {
        let public: SocketAddr = "0.0.0.0:8720".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:8720".parse().unwrap();
        assert!(Auth::new(None, public).unwrap_err().contains("admin-token"));
        assert!(Auth::new(Some(" ".into()), local).is_err());
        let a = Auth::new(Some("s3cret".into()), public).unwrap();
        assert!(a.read(&HeaderMap::new()).is_err());
        assert!(a.read(&headers("Bearer s3cret")).is_ok());
        let a = Auth::new(Some("s3cret".into()), local).unwrap();
        assert!(a.read(&HeaderMap::new()).is_ok());
        assert!(a.mutate(&headers("Bearer s3cre")).is_err());
        assert!(a.mutate(&headers("Bearer s3cret")).is_ok());
        assert!(Auth::new(None, local)
            .unwrap()
            .mutate(&headers("Bearer x"))
            .is_err());
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
