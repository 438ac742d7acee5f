//! A publisher whose broker did not answer when it was opened: it connects in the background,
//! with backoff, until the broker does. Until then every `send` and `check` fails as
//! *unavailable*, naming why, so a relay keeps running (its other routes deliver, readiness
//! says what is down) instead of refusing to start; once connected it is the real publisher.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::{connect, Ack, ConnectError, Message, PublishError, Publisher};
use crate::retry::Backoff;

/// Waits between two connection attempts.
const RECONNECT: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(30),
    jitter: true,
};

/// A publisher being connected in the background (see the module docs).
pub struct Deferred {
    /// What answers until it is connected.
    pending: NotConnected,
    inner: Arc<OnceLock<Box<dyn Publisher>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a [`Deferred`] is until it is connected: its kind from the URL's scheme, no
/// destination, and every `send` and `check` failing as *unavailable*, naming why. Nor does it
/// keep key order: an aggregate's events wait for each acknowledgement.
struct NotConnected {
    kind: &'static str,
    url: String,
    /// Why it is not connected yet (the last attempt's error).
    why: Arc<Mutex<String>>,
}

impl Deferred {
    /// Keep connecting to `url`, whose first attempt failed with `first`. A URL that does not
    /// parse is the caller's to refuse first ([`connect`] says so with
    /// [`ConnectError::Config`]).
    pub fn connect_in_background(url: &str, first: &PublishError) -> Self {
        let shown = crate::redact::redact_url(url);
        let inner: Arc<OnceLock<Box<dyn Publisher>>> = Arc::default();
        let why = Arc::new(Mutex::new(crate::redact::redact_secrets(&first.chain())));
        let task = {
            let (url, shown, inner, why) =
                (url.to_string(), shown.clone(), inner.clone(), why.clone());
            crate::relay::spawn_here(async move {
                let mut attempt = 0u32;
                loop {
                    attempt = attempt.saturating_add(1);
                    let wait = RECONNECT.delay(attempt, &mut rand::thread_rng());
                    tokio::time::sleep(wait).await;
                    match connect(&url).await {
                        Ok(p) => {
                            tracing::info!(publisher = %shown, "broker answers: connected");
                            let _ = inner.set(p);
                            return;
                        }
                        Err(ConnectError::Publish(e)) => {
                            let e = crate::redact::redact_secrets(&e.chain());
                            tracing::debug!(publisher = %shown, error = %e, "broker still not reachable");
                            if let Ok(mut w) = why.lock() {
                                *w = e;
                            }
                        }
                        Err(ConnectError::Config(e)) => {
                            tracing::error!(publisher = %shown, error = %e, "publisher URL refused; not connecting");
                            if let Ok(mut w) = why.lock() {
                                *w = crate::redact::redact_secrets(&e.to_string());
                            }
                            return;
                        }
                    }
                }
            })
        };
        Self {
            pending: NotConnected {
                kind: kind_of(url),
                url: shown,
                why,
            },
            inner,
            task,
        }
    }

    /// Is it connected yet?
    pub fn is_connected(&self) -> bool {
        self.inner.get().is_some()
    }
}

impl NotConnected {
    fn not_yet(&self) -> PublishError {
        let why = self.why.lock().map(|w| w.clone()).unwrap_or_default();
        PublishError::unavailable(format!(
            "not connected to {} yet (retrying): {why}",
            self.url
        ))
    }
}

/// The publisher kind a URL's scheme names (for logs and metrics before it is connected).
fn kind_of(url: &str) -> &'static str {
    let scheme = url.split(':').next().unwrap_or_default();
    match scheme.to_ascii_lowercase().as_str() {
        "nats" | "tls" => "nats",
        "amqp" | "amqps" => "amqp",
        "redis" | "rediss" => "redis",
        "mqtt" | "mqtts" => "mqtt",
        "kafka" | "kafkas" => "kafka",
        "http" | "https" => "http",
        "sqs" => "sqs",
        "sns" => "sns",
        "kinesis" => "kinesis",
        _ => "deferred",
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait::async_trait]
impl Publisher for NotConnected {
    fn kind(&self) -> &'static str {
        self.kind
    }
    async fn send(&self, _message: &Message) -> Result<Ack, PublishError> {
        Err(self.not_yet())
    }
    async fn check(&self) -> Result<(), PublishError> {
        Err(self.not_yet())
    }
}

/// The connected publisher once there is one, else `NotConnected` (unavailable).
#[async_trait::async_trait]
impl super::Forward for Deferred {
    type Inner = dyn Publisher;

    fn inner(&self) -> &dyn Publisher {
        match self.inner.get() {
            Some(p) => &**p,
            None => &self.pending,
        }
    }

    /// Stop connecting; close the publisher if it is connected.
    async fn close(&self) -> Result<(), PublishError> {
        self.task.abort();
        super::Forward::inner(self).close().await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::publish::forward::tests::{forwards_everything, message, Probe};
    use crate::publish::ErrorKind;

    /// Not connected: its kind from the URL, no key order, no destination, and unavailable;
    /// connected: the publisher's answer to every method.
    #[tokio::test]
    async fn forwards_once_connected() {
        let d = Deferred::connect_in_background(
            "kafka://127.0.0.1:1?topic=t",
            &PublishError::unavailable("refused"),
        );
        let m = message();
        assert_eq!(d.kind(), "kafka");
        assert_eq!(d.kind_for(&m), "kafka");
        assert!(!d.keeps_key_order());
        assert_eq!(d.destination(&m), None);
        let e = d.send(&m).await.err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.chain().contains("refused"), "{}", e.chain());
        assert_eq!(
            d.check_for(&m).await.unwrap_err().kind(),
            ErrorKind::Unavailable
        );

        let probe = Arc::new(Probe::default());
        assert!(d.inner.set(Box::new(probe.clone())).is_ok());
        assert!(d.is_connected());
        forwards_everything(&d, &probe).await;
    }
}
