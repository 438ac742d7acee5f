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
    kind: &'static str,
    url: String,
    inner: Arc<OnceLock<Box<dyn Publisher>>>,
    /// Why it is not connected yet (the last attempt's error).
    why: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Deferred {
    /// Keep connecting to `url`, whose first attempt failed with `first`. A URL that does not
    /// parse is the caller's to refuse first ([`connect`] says so with
    /// [`ConnectError::Config`]).
    pub fn connect_in_background(url: &str, first: &PublishError) -> Self {
        let shown = super::redact_url(url);
        let inner: Arc<OnceLock<Box<dyn Publisher>>> = Arc::default();
        let why = Arc::new(Mutex::new(super::redact_secrets(&first.chain())));
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
                            let e = super::redact_secrets(&e.chain());
                            tracing::debug!(publisher = %shown, error = %e, "broker still not reachable");
                            if let Ok(mut w) = why.lock() {
                                *w = e;
                            }
                        }
                        Err(ConnectError::Config(e)) => {
                            tracing::error!(publisher = %shown, error = %e, "publisher URL refused; not connecting");
                            if let Ok(mut w) = why.lock() {
                                *w = super::redact_secrets(&e.to_string());
                            }
                            return;
                        }
                    }
                }
            })
        };
        Self {
            kind: kind_of(url),
            url: shown,
            inner,
            why,
            task,
        }
    }

    /// Is it connected yet?
    pub fn is_connected(&self) -> bool {
        self.inner.get().is_some()
    }

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
        _ => "deferred",
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait::async_trait]
impl Publisher for Deferred {
    fn kind(&self) -> &'static str {
        self.inner.get().map_or(self.kind, |p| p.kind())
    }
    fn kind_for(&self, message: &Message) -> &'static str {
        self.inner.get().map_or(self.kind, |p| p.kind_for(message))
    }
    /// Not before it is connected: an aggregate's events wait for each acknowledgement.
    fn keeps_key_order(&self) -> bool {
        self.inner.get().is_some_and(|p| p.keeps_key_order())
    }
    fn destination(&self, message: &Message) -> Option<String> {
        self.inner.get().and_then(|p| p.destination(message))
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        match self.inner.get() {
            Some(p) => p.send(message).await,
            None => Err(self.not_yet()),
        }
    }
    async fn check(&self) -> Result<(), PublishError> {
        match self.inner.get() {
            Some(p) => p.check().await,
            None => Err(self.not_yet()),
        }
    }
    async fn check_for(&self, message: &Message) -> Result<(), PublishError> {
        match self.inner.get() {
            Some(p) => p.check_for(message).await,
            None => Err(self.not_yet()),
        }
    }
    async fn close(&self) -> Result<(), PublishError> {
        self.task.abort();
        match self.inner.get() {
            Some(p) => p.close().await,
            None => Ok(()),
        }
    }
}
