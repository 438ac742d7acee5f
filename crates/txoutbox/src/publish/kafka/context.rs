//! The librdkafka client context: where librdkafka reports client-level errors (a broker that
//! cannot be reached, a failed TLS handshake). It logs them and keeps the last TLS or
//! authentication failure, so that a delivery that times out can say why, and `connect` can
//! stop on a TLS misconfiguration at once instead of waiting out its timeouts (librdkafka
//! itself keeps retrying such a broker quietly).

use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::Notify;

/// Shared by the producer, the admin client and the publisher.
#[derive(Clone)]
pub(super) struct BrokerErrors {
    inner: Arc<Inner>,
}

struct Inner {
    /// The last TLS or authentication failure, already cleaned of secrets.
    refused: Mutex<Option<String>>,
    /// Woken on every such failure.
    refused_now: Notify,
    /// Values that must not appear in any message (librdkafka does not quote them, but a
    /// setting's value could end up in an error text).
    secrets: Vec<String>,
}

impl BrokerErrors {
    pub fn new(secrets: Vec<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                refused: Mutex::new(None),
                refused_now: Notify::new(),
                secrets,
            }),
        }
    }

    /// `s` with every secret replaced by `***`.
    pub fn clean(&self, s: &str) -> String {
        let mut s = s.to_string();
        for secret in self.inner.secrets.iter().filter(|s| !s.is_empty()) {
            s = s.replace(secret.as_str(), "***");
        }
        s
    }

    /// The last TLS or authentication failure, if any since the last [`Self::forget`].
    pub fn last_refusal(&self) -> Option<String> {
        self.inner.refused.lock().ok().and_then(|r| r.clone())
    }

    /// A delivery went through: whatever failed before is over.
    pub fn forget(&self) {
        if let Ok(mut r) = self.inner.refused.lock() {
            r.take();
        }
    }

    /// Resolves with a TLS or authentication failure: the next one, or (with
    /// `include_earlier`) one already recorded.
    pub async fn refusal(&self, include_earlier: bool) -> String {
        loop {
            let notified = self.inner.refused_now.notified();
            tokio::pin!(notified);
            // Registered before looking, so a failure between the look and the wait counts.
            notified.as_mut().enable();
            if include_earlier {
                if let Some(r) = self.last_refusal() {
                    return r;
                }
            }
            notified.await;
            if let Some(r) = self.last_refusal() {
                return r;
            }
        }
    }

    fn record_refusal(&self, reason: String) {
        if let Ok(mut r) = self.inner.refused.lock() {
            *r = Some(reason);
        }
        self.inner.refused_now.notify_waiters();
    }
}

/// Did the broker connection fail in TLS (handshake, certificate) or authentication? These
/// do not heal by retrying, unlike a broker that is down.
fn is_refusal(error: &KafkaError, reason: &str) -> bool {
    use RDKafkaErrorCode as C;
    let reason = reason.to_ascii_lowercase();
    matches!(
        error.rdkafka_error_code(),
        Some(C::SSL | C::Authentication | C::SaslAuthenticationFailed)
    ) || ["certificate", "handshake", " alert "]
        .iter()
        .any(|w| reason.contains(w))
}

impl ClientContext for BrokerErrors {
    fn error(&self, error: KafkaError, reason: &str) {
        let reason = self.clean(reason);
        if is_refusal(&error, &reason) {
            tracing::warn!(%reason, "Kafka broker connection refused (TLS or authentication)");
            self.record_refusal(reason);
        } else {
            let error = self.clean(&error.to_string());
            tracing::warn!(%error, %reason, "Kafka client error");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_tls_failure_without_secrets() {
        let e = BrokerErrors::new(vec!["pw-1".into()]);
        e.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert_eq!(e.last_refusal(), None);
        e.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://h:9093/bootstrap: SSL handshake failed: certificate verify failed (pw-1)",
        );
        let r = e.last_refusal().unwrap();
        assert!(
            r.contains("certificate verify failed") && !r.contains("pw-1"),
            "{r}"
        );
        e.forget();
        assert_eq!(e.last_refusal(), None);
        // A TLS 1.3 alert after the handshake arrives as a transport error.
        e.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "ssl://h:9093/1: SSL transport error: tlsv13 alert certificate required",
        );
        assert!(e.last_refusal().is_some());
    }
}
