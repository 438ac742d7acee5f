//! Publishers: where the relay sends events.
//!
//! One trait, [`Publisher`], with a two-phase contract borrowed from async-nats: [`Publisher::send`]
//! hands a message to the broker client (in the order the relay calls it) and returns an
//! [`Ack`], a future that resolves when the **broker itself** has acknowledged the message
//! (JetStream PubAck, AMQP publisher confirm, ...). "Sent" and "acknowledged" are different
//! things in the type, so the relay can keep a window of messages in flight while sending them
//! in `seq` order.
//!
//! Publishers are picked from a URL at run time ([`connect`]); a scheme whose cargo feature
//! is compiled out is a clear [`PublishError`], not a panic.

#[cfg(any(feature = "sqs", feature = "sns", feature = "kinesis"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqs", feature = "sns", feature = "kinesis")))
)]
pub mod aws;
mod deferred;
mod faulty;
mod forward;
mod message;
pub mod route;
mod simple;
mod template;
#[cfg(any(
    feature = "redis",
    feature = "mqtt",
    feature = "http",
    feature = "nats",
    feature = "amqp",
    feature = "kafka"
))]
mod tls;
pub(crate) mod url;

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub mod amqp;
#[cfg(any(
    feature = "redis",
    feature = "mqtt",
    feature = "http",
    feature = "nats",
    feature = "amqp",
    feature = "kafka",
    feature = "sqs",
    feature = "sns",
    feature = "kinesis"
))]
pub mod cloudevents;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
#[cfg(feature = "mqtt")]
#[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
pub mod mqtt;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "kinesis")]
#[cfg_attr(docsrs, doc(cfg(feature = "kinesis")))]
pub use aws::kinesis;
#[cfg(feature = "sns")]
#[cfg_attr(docsrs, doc(cfg(feature = "sns")))]
pub use aws::sns;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub use aws::sqs;

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;

pub use deferred::Deferred;
pub use faulty::FaultyPublisher;
pub use forward::Forward;
pub use message::Message;
pub use route::{Matcher, Route, Router};
pub use simple::{FilePublisher, NullPublisher, StdoutPublisher};
pub use template::{Template, TemplateError};

/// A future that resolves once the broker has acknowledged (or refused) one message.
pub type Ack = BoxFuture<'static, Result<(), PublishError>>;

/// An [`Ack`] that is already settled: for publishers whose `send` is the acknowledgement.
pub fn ready_ack(result: Result<(), PublishError>) -> Ack {
    Box::pin(futures::future::ready(result))
}

/// Something that delivers events to a broker.
#[async_trait::async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Short name for logs and metrics, e.g. `nats`.
    fn kind(&self) -> &'static str;

    /// The kind of the publisher that takes `message` (for the publish span's
    /// `messaging.system`): [`kind`](Self::kind), except for a publisher that picks one of
    /// several per message ([`Router`]).
    fn kind_for(&self, message: &Message) -> &'static str {
        let _ = message;
        self.kind()
    }

    /// Does the broker keep the order of one key's messages even when one of them fails and
    /// is retried (e.g. Kafka's idempotent producer)? Then the relay may pipeline an
    /// aggregate's events; otherwise it waits for each acknowledgement before sending the
    /// aggregate's next event. A message the broker refuses for good does not stop those sent
    /// behind it, so with `hold` on a dead letter the relay waits for each acknowledgement
    /// whatever this says.
    fn keeps_key_order(&self) -> bool {
        false
    }

    /// Where `message` goes (subject, topic, stream, exchange, endpoint), for the publish
    /// span's `messaging.destination.name`; `None` if the publisher has no such name.
    fn destination(&self, message: &Message) -> Option<String> {
        let _ = message;
        None
    }

    /// Hand one message to the broker. Messages handed over by consecutive calls on one
    /// publisher reach the broker in that order. The returned [`Ack`] resolves when the broker
    /// has confirmed the message; an error from `send` itself means the message was not sent.
    async fn send(&self, message: &Message) -> Result<Ack, PublishError>;

    /// Is the broker reachable? Used for readiness and to wait out an outage.
    async fn check(&self) -> Result<(), PublishError> {
        Ok(())
    }

    /// Does the broker that would take `message` answer? [`check`](Self::check), except for
    /// a publisher that picks one of several per message ([`Router`]): only that one. The
    /// relay asks it to learn when events that failed for an outage may go again.
    async fn check_for(&self, message: &Message) -> Result<(), PublishError> {
        let _ = message;
        self.check().await
    }

    /// Flush and close. Called once, on shutdown, by the publisher's owner: whoever made it
    /// (the caller), never whoever it was lent to. A [`Relay`](crate::relay::Relay) does not
    /// close the publisher it was given; its owner closes it once the relay has stopped
    /// ([`Relay::publisher`](crate::relay::Relay::publisher)), and a publisher shared by
    /// several relays once every one has stopped. A wrapper ([`Forward`], and so `Box` and
    /// `Arc`) closes the publisher it wraps.
    async fn close(&self) -> Result<(), PublishError> {
        Ok(())
    }
}

/// What the relay should do after a failed publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Try again later with backoff; counts towards `max_attempts`.
    Transient,
    /// The broker (or the connection to it) is unavailable. Retried with backoff, but never
    /// dead-letters an event by itself: an outage must not turn every event into a dead letter.
    Unavailable,
    /// This message can never be delivered as it is (too large, invalid destination):
    /// dead-letter it at once.
    Permanent,
}

/// A failed publish, with a kind that tells the relay what to do next.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PublishError {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    /// How long the broker asked us to wait before trying again (HTTP `Retry-After`).
    retry_after: Option<Duration>,
}

impl PublishError {
    /// A failure of `kind`, with no source and no retry-after hint.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            retry_after: None,
        }
    }
    /// Retry with backoff; counts towards `max_attempts` ([`ErrorKind::Transient`]).
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, message)
    }
    /// The broker cannot be reached: retry with backoff, never dead-letter for it
    /// ([`ErrorKind::Unavailable`]).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    /// Can never succeed as it is: dead-letter now ([`ErrorKind::Permanent`]).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }
    /// Attach the underlying error (kept as `source()`).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
    /// What the relay does next: retry, retry without counting the attempt, or dead-letter.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// Record how long the broker asked us to wait before the next attempt.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
    /// How long the broker asked us to wait before the next attempt, if it said so. The relay
    /// honours it, capped at the longest backoff, where it is longer than its own delay.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
    /// Is the kind [`ErrorKind::Permanent`] (the event is dead-lettered at once)?
    pub fn is_permanent(&self) -> bool {
        self.kind == ErrorKind::Permanent
    }
    /// The message followed by its sources, `: `-separated (for `last_error` and logs).
    pub fn chain(&self) -> String {
        let mut out = self.message.clone();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            let s = e.to_string();
            if !out.contains(&s) {
                out.push_str(": ");
                out.push_str(&s);
            }
            next = e.source();
        }
        out
    }
}

/// A publisher URL could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL does not parse, or lacks what its scheme needs (e.g. a host).
    #[error("publisher URL {url:?} is not a valid URL: {reason}")]
    BadUrl {
        /// The URL with its secrets redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No publisher has this scheme.
    #[error("publisher scheme `{scheme}` is not supported (expected one of: nats, tls, amqp, amqps, redis, rediss, mqtt, mqtts, kafka, kafkas, http, https, sqs, sns, kinesis, stdout, file, null)")]
    UnknownScheme {
        /// The URL's scheme, as given.
        scheme: String,
    },
    /// The scheme's publisher was compiled out of this build.
    #[error("publisher scheme `{scheme}` needs the cargo feature `{feature}`, which this build does not include")]
    FeatureNotEnabled {
        /// The URL's scheme.
        scheme: String,
        /// The cargo feature of txoutbox that adds it (e.g. `kafka`).
        feature: &'static str,
    },
    /// A query parameter has a value this publisher cannot use.
    #[error("publisher URL parameter `{name}`: {reason}")]
    BadParam {
        /// The parameter's name.
        name: String,
        /// What is wrong with its value, and what is accepted.
        reason: String,
    },
    /// A query parameter this publisher does not know (a typo must not be ignored).
    #[error("publisher URL has unknown parameter `{name}` (known: {known})")]
    UnknownParam {
        /// The parameter's name, as given.
        name: String,
        /// The parameters this scheme accepts, comma-separated (`none` if it takes none).
        known: String,
    },
    /// A destination template in the URL does not parse.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// Open the publisher named by `url` (`nats://`, `amqp://`, `redis://`, `mqtt://`, `kafka://`,
/// `https://`, their TLS forms, `sqs://`, `sns://`, `kinesis://`, `stdout:`, `file:PATH`,
/// `null:`).
///
/// Connection problems are reported as a [`PublishError`]; a malformed URL as a
/// [`ConfigError`]. Neither message contains the URL's password.
pub async fn connect(url: &str) -> Result<Box<dyn Publisher>, ConnectError> {
    // A topic or stream ARN holds colons that would read as a port after `//`:
    // `sns://arn:...` is taken as `sns:arn:...`, and so for `kinesis://arn:...`.
    let trimmed = url.trim();
    let arn = ["sns", "kinesis"].into_iter().find_map(|scheme| {
        let rest = trimmed.strip_prefix(scheme)?.strip_prefix("://arn:")?;
        Some(format!("{scheme}:arn:{rest}"))
    });
    let parsed = url::parse(arn.as_deref().unwrap_or(trimmed))?;
    match parsed.scheme() {
        "stdout" => Ok(Box::new(StdoutPublisher::from_url(&parsed)?)),
        "file" => Ok(Box::new(FilePublisher::from_url(&parsed).await?)),
        "null" => Ok(Box::new(NullPublisher::from_url(&parsed)?)),
        #[cfg(feature = "nats")]
        "nats" | "tls" => Ok(Box::new(nats::NatsPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "nats"))]
        s @ ("nats" | "tls") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "nats",
        }
        .into()),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => Ok(Box::new(amqp::AmqpPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "amqp"))]
        s @ ("amqp" | "amqps") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "amqp",
        }
        .into()),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Box::new(redis::RedisPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "redis"))]
        s @ ("redis" | "rediss") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "redis",
        }
        .into()),
        #[cfg(feature = "mqtt")]
        "mqtt" | "mqtts" => Ok(Box::new(mqtt::MqttPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "mqtt"))]
        s @ ("mqtt" | "mqtts") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "mqtt",
        }
        .into()),
        #[cfg(feature = "kafka")]
        "kafka" | "kafkas" => Ok(Box::new(kafka::KafkaPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "kafka"))]
        s @ ("kafka" | "kafkas") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "kafka",
        }
        .into()),
        #[cfg(feature = "sqs")]
        "sqs" => Ok(Box::new(sqs::SqsPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "sqs"))]
        "sqs" => Err(ConfigError::FeatureNotEnabled {
            scheme: "sqs".into(),
            feature: "sqs",
        }
        .into()),
        #[cfg(feature = "sns")]
        "sns" => Ok(Box::new(sns::SnsPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "sns"))]
        "sns" => Err(ConfigError::FeatureNotEnabled {
            scheme: "sns".into(),
            feature: "sns",
        }
        .into()),
        #[cfg(feature = "kinesis")]
        "kinesis" => Ok(Box::new(kinesis::KinesisPublisher::connect(&parsed).await?)),
        #[cfg(not(feature = "kinesis"))]
        "kinesis" => Err(ConfigError::FeatureNotEnabled {
            scheme: "kinesis".into(),
            feature: "kinesis",
        }
        .into()),
        #[cfg(feature = "http")]
        "http" | "https" => Ok(Box::new(http::HttpPublisher::connect(&parsed)?)),
        #[cfg(not(feature = "http"))]
        s @ ("http" | "https") => Err(ConfigError::FeatureNotEnabled {
            scheme: s.into(),
            feature: "http",
        }
        .into()),
        other => Err(ConfigError::UnknownScheme {
            scheme: other.to_string(),
        }
        .into()),
    }
}

/// Why [`connect`] failed: the URL itself, or reaching the broker.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL is unusable; retrying will not help.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker could not be reached or refused the connection.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Permanent => "permanent",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheme whose publisher is compiled out names its feature; an ARN after `//` is read
    /// as the ARN, not as a host and port.
    #[tokio::test]
    async fn schemes_compiled_out_name_their_feature() {
        #[cfg(not(feature = "kinesis"))]
        for url in [
            "kinesis://orders",
            "kinesis://arn:aws:kinesis:eu-west-1:1:stream/o",
        ] {
            match connect(url).await {
                Err(ConnectError::Config(ConfigError::FeatureNotEnabled { feature, .. })) => {
                    assert_eq!(feature, "kinesis")
                }
                Err(e) => panic!("{url}: {e}"),
                Ok(_) => panic!("{url}: connected"),
            }
        }
        #[cfg(feature = "kinesis")]
        match connect("kinesis://arn:aws:kinesis:eu-west-1:1:nostream/o").await {
            Err(ConnectError::Config(ConfigError::BadUrl { reason, .. })) => {
                assert!(reason.contains("names no stream"), "{reason}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected"),
        }
        match connect("nosuch://x").await {
            Err(ConnectError::Config(ConfigError::UnknownScheme { scheme })) => {
                assert_eq!(scheme, "nosuch")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected"),
        }
    }
}
