//! `amqp://` and `amqps://` — RabbitMQ (AMQP 0-9-1) with publisher confirms.
//!
//! ```text
//! amqp://guest:guest@127.0.0.1:5672/%2f?exchange=outbox&routing_key={event_type}
//! ```
//!
//! Parameters: `exchange` (default `outbox`; empty means the default exchange), `routing_key`
//! (a [`Template`], default `{event_type}`), `exchange_type` (default `topic`), `declare`
//! (default `true`: declare the exchange durable; `amq.*` and the default exchange are never
//! declared), `confirm_timeout` (default `10s`), `connect_timeout` (default `10s`),
//! `bind_queue` (declare this durable queue and bind it with `bind_key`, default `#`),
//! `unroutable` (below), `cloudevents` and `ce_source`.
//!
//! TLS: `amqps://host:5671/...` with `tls_ca` (a CA to verify the broker with, trusted besides
//! the system's roots), `tls_cert` and `tls_key` (a client certificate chain and its key, PEM:
//! PKCS#8 `BEGIN PRIVATE KEY`, PKCS#1 `BEGIN RSA PRIVATE KEY` or SEC1 `BEGIN EC PRIVATE KEY`).
//! The pair is checked when the publisher is made — the key must be one rustls can sign with
//! and belong to the first certificate — so a bad one is a configuration error naming the
//! parameter, not a connection that fails on every attempt.
//!
//! One connection with one channel in confirm mode, behind a mutex: messages are published in
//! call order, and the [`Ack`] waits for the broker's confirm. Every message is persistent and
//! `mandatory`, so a message no queue is bound for comes back as an error instead of vanishing.
//!
//! Such an unroutable message, and one sent to an exchange that does not exist (RabbitMQ
//! closes the channel with `404 NOT_FOUND`), fails as *unavailable* by default: nobody can take
//! it right now (a consumer's queue not yet declared, a deploy in progress), so it is retried
//! without using up `max_attempts` and an outage does not turn events into dead letters.
//! `unroutable=permanent` dead-letters such a message at once instead, `unroutable=transient`
//! after `max_attempts`. A message too large
//! for the broker, or a routing key or header AMQP cannot carry, is permanent; a nack or a
//! missing confirm is transient; a lost connection is unavailable.
//! lapin does not reconnect by itself: a closed channel is reopened (and a dead connection
//! re-established) on the next `send`.

mod properties;
mod returns;
mod settings;

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::AMQPErrorKind;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::Mutex;

use properties::{judge_confirmation, map_confirm_error, properties, unroutable};
use settings::Settings;

use super::tls::TlsFiles;
use super::url::PublisherUrl;
use super::{
    Ack, ConfigError, ConnectError, ErrorKind, Message, PublishError, Publisher, Template,
};

/// AMQP short strings (exchange, routing key, message id, type, header names) hold at most
/// this many bytes.
pub const MAX_SHORTSTR: usize = 255;
const PRECONDITION_FAILED: u16 = 406;
const NOT_FOUND: u16 = 404;

/// Publishes to a RabbitMQ exchange and waits for the publisher confirm of every message.
pub struct AmqpPublisher {
    settings: Settings,
    redacted_url: String,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("url", &self.redacted_url)
            .field("exchange", &self.settings.exchange)
            .field("routing_key", &self.settings.routing_key.as_str())
            .finish_non_exhaustive()
    }
}

/// One connection and its (only) publishing channel.
struct Link {
    connection: Connection,
    channel: Channel,
    /// Confirms and returns of this channel (see `returns`).
    returns: Arc<returns::Returns>,
}

impl AmqpPublisher {
    /// Connect, open a confirming channel and declare the exchange (if asked to).
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let publisher = Self {
            settings,
            redacted_url: url.redacted(),
            link: Mutex::new(None),
        };
        let link = publisher.open_link().await?;
        tracing::info!(
            url = %publisher.redacted_url,
            exchange = %publisher.settings.exchange,
            routing_key = %publisher.settings.routing_key.as_str(),
            "connected to AMQP broker"
        );
        *publisher.link.lock().await = Some(link);
        Ok(publisher)
    }

    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> PublishError {
        // lapin's errors never hold the URI, so `e` is safe to print.
        PublishError::unavailable(format!("AMQP broker at {}: {what}: {e}", self.redacted_url))
    }

    async fn open_link(&self) -> Result<Link, PublishError> {
        let s = &self.settings;
        let properties =
            ConnectionProperties::default().with_connection_name(LongString::from("txoutbox"));
        let tls = lapin::tcp::OwnedTLSConfig {
            // `PKCS8` is lapin's name for a PEM chain and key; the key may be any of the three
            // PEM forms (rustls-pki-types reads it).
            identity: s
                .tls_identity
                .as_ref()
                .map(|id| lapin::tcp::OwnedIdentity::PKCS8 {
                    pem: id.cert_pem.clone(),
                    key: id.key_pem.clone(),
                }),
            cert_chain: s.tls_ca.clone(),
        };
        // The Tokio runtime this runs on: lapin's I/O thread registers the socket with its
        // reactor.
        let runtime =
            lapin::runtime::default_runtime().map_err(|e| self.unavailable("cannot connect", e))?;
        let connecting = Connection::connect_with_config(&s.uri, properties, tls, runtime);
        let connection = match tokio::time::timeout(s.connect_timeout, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.unavailable("cannot connect", e)),
            Err(_) => {
                return Err(self.unavailable(
                    "cannot connect",
                    format!("timed out after {:?}", s.connect_timeout),
                ))
            }
        };
        match self.open_channel(&connection).await {
            Ok(channel) => Ok(Link {
                connection,
                channel,
                returns: Arc::new(returns::Returns::new()),
            }),
            Err(e) => {
                close_in_background(connection);
                Err(e)
            }
        }
    }

    async fn open_channel(&self, connection: &Connection) -> Result<Channel, PublishError> {
        let s = &self.settings;
        let open = async {
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| self.unavailable("cannot open a channel", e))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| self.unavailable("cannot enable publisher confirms", e))?;
            if s.declares() {
                let options = ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .exchange_declare(
                        s.exchange.as_str().into(),
                        s.exchange_kind.clone(),
                        options,
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| {
                        self.unavailable(
                            &format!(
                                "cannot declare exchange {:?} (durable, type {:?})",
                                s.exchange, s.exchange_kind
                            ),
                            e,
                        )
                    })?;
            }
            if let Some((queue, key)) = &s.bind_queue {
                let declared = channel
                    .queue_declare(
                        queue.as_str().into(),
                        lapin::options::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await;
                let bound = match declared {
                    Ok(_) => {
                        channel
                            .queue_bind(
                                queue.as_str().into(),
                                s.exchange.as_str().into(),
                                key.as_str().into(),
                                lapin::options::QueueBindOptions::default(),
                                FieldTable::default(),
                            )
                            .await
                    }
                    Err(e) => Err(e),
                };
                bound.map_err(|e| {
                    self.unavailable(
                        &format!(
                            "cannot declare and bind queue {queue:?} to {:?}",
                            s.exchange
                        ),
                        e,
                    )
                })?;
            }
            Ok::<_, PublishError>(channel)
        };
        match tokio::time::timeout(s.connect_timeout, open).await {
            Ok(res) => res,
            Err(_) => Err(self.unavailable(
                "opening the channel",
                format!("timed out after {:?}", s.connect_timeout),
            )),
        }
    }

    /// A usable link in `slot`: the current one, one with a fresh channel, or a new
    /// connection.
    async fn ensure_link<'a>(&self, slot: &'a mut Option<Link>) -> Result<&'a Link, PublishError> {
        if let Some(link) = slot.take() {
            let connection_ok = link.connection.status().connected();
            if connection_ok && link.channel.status().connected() {
                return Ok(slot.insert(link));
            }
            if connection_ok {
                tracing::info!(url = %self.redacted_url, "AMQP channel closed; opening a new one");
                if let Ok(channel) = self.open_channel(&link.connection).await {
                    return Ok(slot.insert(Link {
                        connection: link.connection,
                        channel,
                        returns: Arc::new(returns::Returns::new()),
                    }));
                }
            }
            tracing::info!(url = %self.redacted_url, "AMQP connection lost; reconnecting");
            close_in_background(link.connection);
        }
        let link = self.open_link().await?;
        Ok(slot.insert(link))
    }
}

/// Close a connection we no longer use without waiting on a possibly dead socket.
fn close_in_background(connection: Connection) {
    if connection.status().connected() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                connection.close(200, "txoutbox: reconnecting".into()),
            )
            .await;
        });
    }
}

/// What we need to know about a message to judge its confirm.
struct Sent {
    id: uuid::Uuid,
    body_len: usize,
    exchange: String,
    routing_key: String,
    /// The kind of error when no queue takes it.
    unroutable: ErrorKind,
}

#[async_trait::async_trait]
impl Publisher for AmqpPublisher {
    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn destination(&self, _message: &Message) -> Option<String> {
        // The semantic conventions name the exchange (the default one is `amq.default`).
        Some(match self.settings.exchange.as_str() {
            "" => "amq.default".to_string(),
            name => name.to_string(),
        })
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let routing_key = self.settings.routing_key.render(message);
        let properties = properties(message, &routing_key, self.settings.cloudevents.as_ref())?;
        let sent = Sent {
            id: message.id,
            body_len: message.body.len(),
            exchange: self.settings.exchange.clone(),
            routing_key,
            unroutable: self.settings.unroutable,
        };
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };

        let mut slot = self.link.lock().await;
        let link = self.ensure_link(&mut slot).await?;
        let publish = link.channel.basic_publish(
            sent.exchange.as_str().into(),
            sent.routing_key.as_str().into(),
            options,
            &message.body,
            properties,
        );
        let confirm = match tokio::time::timeout(self.settings.confirm_timeout, publish).await {
            Ok(Ok(confirm)) => confirm,
            Ok(Err(e)) => {
                if let Some(link) = slot.take() {
                    close_in_background(link.connection);
                }
                return Err(self
                    .unavailable(&format!("event {}: publishing failed", sent.id), &e)
                    .with_source(e));
            }
            Err(_) => {
                if let Some(link) = slot.take() {
                    close_in_background(link.connection);
                }
                return Err(self.unavailable(
                    &format!("event {}: publishing", sent.id),
                    format!("not written within {:?}", self.settings.confirm_timeout),
                ));
            }
        };
        let status = link.connection.status().clone();
        let returns = link.returns.clone();
        let index = returns.register();
        drop(slot);

        // Resolve the confirm on a task of its own, so that every confirm is seen promptly
        // whatever order the relay polls acks in (judging one needs the others, see `returns`).
        let timeout = self.settings.confirm_timeout;
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let returns = returns.clone();
            tokio::spawn(async move {
                let result = tokio::time::timeout(timeout, confirm).await;
                if let Ok(Ok(Confirmation::Ack(Some(r)) | Confirmation::Nack(Some(r)))) = &result {
                    returns.record(
                        r.delivery
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|s| s.to_string()),
                        r.reply_code,
                        r.reply_text.to_string(),
                    );
                }
                // Every message published until now may share this confirm's frame.
                let through = returns.published_through();
                returns.seen(index);
                let _ = tx.send((result, through));
            });
        }
        Ok(Box::pin(async move {
            let Ok((result, through)) = rx.await else {
                return Err(PublishError::unavailable(format!(
                    "event {}: the confirm was lost (runtime shutting down)",
                    sent.id
                )));
            };
            // Bounded: every confirm task ends within `timeout` of its publish.
            let _ = tokio::time::timeout(timeout, returns.wait_through(through)).await;
            if let Some((code, text)) = returns.take(&sent.id.to_string()) {
                return Err(unroutable(&sent, code, &text));
            }
            match result {
                Ok(Ok(confirmation)) => judge_confirmation(&sent, confirmation),
                Ok(Err(e)) => Err(map_confirm_error(&sent, e)),
                Err(_) if !status.connected() => Err(PublishError::unavailable(format!(
                    "event {}: no publisher confirm within {timeout:?} (connection to the broker lost)",
                    sent.id
                ))),
                Err(_) => Err(PublishError::transient(format!(
                    "event {}: no publisher confirm within {timeout:?}",
                    sent.id
                ))),
            }
        }))
    }

    async fn check(&self) -> Result<(), PublishError> {
        let mut slot = self.link.lock().await;
        self.ensure_link(&mut slot).await.map(|_| ())
    }

    async fn close(&self) -> Result<(), PublishError> {
        let Some(link) = self.link.lock().await.take() else {
            return Ok(());
        };
        let timeout = self.settings.confirm_timeout;
        let _ = tokio::time::timeout(timeout, link.channel.wait_for_confirms()).await;
        match tokio::time::timeout(
            timeout,
            link.connection.close(200, "txoutbox: shutdown".into()),
        )
        .await
        {
            Ok(Ok(())) | Err(_) => Ok(()),
            Ok(Err(e)) if !link.connection.status().connected() => {
                tracing::debug!(error = %e, "closing an AMQP connection that was already gone");
                Ok(())
            }
            Ok(Err(e)) => Err(self
                .unavailable("closing the connection", &e)
                .with_source(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::properties::is_too_large;
    use super::settings::{validate_exchange_name, ClientIdentity};
    use super::*;

    fn msg() -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "order.created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: Default::default(),
            created_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            attempt: 1,
        }
    }

    fn settings(url: &str) -> Result<Settings, ConfigError> {
        Settings::from_url(&super::super::url::parse(url).unwrap())
    }

    #[test]
    fn settings_from_url() {
        let s = settings("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(s.exchange, "outbox");
        assert_eq!(s.routing_key.as_str(), "{event_type}");
        assert_eq!(s.exchange_kind, ExchangeKind::Topic);
        assert!(s.declares());
        assert_eq!(s.confirm_timeout, Duration::from_secs(10));
        assert_eq!(s.uri, "amqp://guest:guest@127.0.0.1:5672/%2f");
        assert_eq!(s.unroutable, ErrorKind::Unavailable);
        let s = settings("amqp://h?unroutable=permanent").unwrap();
        assert_eq!(s.unroutable, ErrorKind::Permanent);

        let s = settings(
            "amqps://h/vh?exchange=amq.topic&routing_key=x.{aggregate_type}&exchange_type=direct&confirm_timeout=500ms",
        )
        .unwrap();
        assert_eq!(s.exchange_kind, ExchangeKind::Direct);
        assert!(!s.declares(), "amq.* is never declared");
        assert_eq!(s.confirm_timeout, Duration::from_millis(500));
        assert_eq!(s.uri, "amqps://h/vh");
        assert!(!settings("amqp://h?exchange=").unwrap().declares());

        for bad in [
            "amqp://h?exchang=x",
            "amqp://h?exchange=has space",
            "amqp://h?routing_key={nope}",
            "amqp://h?exchange_type=",
            "amqp://h?declare=sometimes",
            "amqp://h?confirm_timeout=0",
            "amqp://h?unroutable=never",
        ] {
            assert!(settings(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn cloudevents_are_amqp_binding_headers() {
        let url =
            super::super::url::parse("amqp://h/%2f?cloudevents=true&ce_source=/orders").unwrap();
        let s = Settings::from_url(&url).unwrap();
        let m = msg();
        let p = properties(&m, "k", s.cloudevents.as_ref()).unwrap();
        let h = p.headers().as_ref().unwrap();
        let get = |k: &str| match h.inner().get(k) {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            _ => None,
        };
        assert_eq!(get("cloudEvents:id"), Some(m.id.to_string()));
        assert_eq!(get("cloudEvents:type").as_deref(), Some("order.created"));
        assert_eq!(get("cloudEvents:source").as_deref(), Some("/orders"));
        assert_eq!(get("cloudEvents:subject").as_deref(), Some("42"));
        assert_eq!(get("cloudEvents:specversion").as_deref(), Some("1.0"));
        assert!(get("cloudEvents:time").is_some());
        let plain = properties(&m, "k", None).unwrap();
        let plain = plain.headers().as_ref().unwrap();
        assert!(plain
            .inner()
            .keys()
            .all(|k| !k.as_str().starts_with("cloudEvents:")));
    }

    #[test]
    fn properties_follow_the_contract() {
        let mut m = msg();
        m.headers.insert("traceparent".into(), "00-x-01".into());
        m.headers
            .insert("outbox-event-type".into(), "forged".into());
        let p = properties(&m, "order.created", None).unwrap();
        assert_eq!(p.delivery_mode(), &Some(2));
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str()),
            Some(m.id.to_string().as_str())
        );
        assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("order.created"));
        assert_eq!(p.timestamp(), &Some(1_700_000_000));
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/json")
        );
        let h = p.headers().as_ref().unwrap();
        let get = |k: &str| match h.inner().get(k) {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            _ => None,
        };
        assert_eq!(get("traceparent").as_deref(), Some("00-x-01"));
        assert_eq!(get("outbox-event-type").as_deref(), Some("order.created"));
        assert_eq!(get("outbox-aggregate-id").as_deref(), Some("42"));

        assert!(properties(&m, &"k".repeat(256), None)
            .unwrap_err()
            .is_permanent());
        assert!(properties(&m, &"k".repeat(255), None).is_ok());
        let mut long = msg();
        long.headers.insert("h".repeat(300), "v".into());
        assert!(properties(&long, "k", None).unwrap_err().is_permanent());
        let mut long = msg();
        long.event_type = "t".repeat(300);
        assert!(properties(&long, "k", None).unwrap_err().is_permanent());
    }

    #[test]
    fn byte_messages_carry_their_content_type() {
        let mut m = msg();
        m.body = vec![0x00, 0xff, 0x80, 0x0a];
        m.content_type = "application/x-protobuf".into();
        let p = properties(&m, "k", None).unwrap();
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/x-protobuf")
        );
        // CloudEvents binary mode: `datacontenttype` is the `content_type` property, not a header.
        let url = super::super::url::parse("amqp://h/%2f?cloudevents=true").unwrap();
        let s = Settings::from_url(&url).unwrap();
        let p = properties(&m, "k", s.cloudevents.as_ref()).unwrap();
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some("application/x-protobuf")
        );
        let h = p.headers().as_ref().unwrap();
        assert!(!h.inner().contains_key("cloudEvents:datacontenttype"));
        assert!(h.inner().contains_key("cloudEvents:type"));

        m.content_type = "x".repeat(256);
        assert!(properties(&m, "k", None).unwrap_err().is_permanent());
    }

    #[test]
    fn size_errors_blame_the_right_message() {
        let text =
            "PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728";
        assert!(is_too_large(text, 134_217_729));
        assert!(!is_too_large(text, 10), "a message sent after the big one");
        assert!(is_too_large("PRECONDITION_FAILED - over max size 100", 101));
        assert!(!is_too_large(
            "PRECONDITION_FAILED - inequivalent arg 'type'",
            10
        ));
    }

    #[test]
    fn client_identities_are_checked_up_front() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let check = |cert: &str, key: &str| {
            ClientIdentity::check(cert.as_bytes().to_vec(), key.as_bytes().to_vec())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        check(&cert.pem(), &key.serialize_pem()).unwrap();

        let other = rcgen::KeyPair::generate().unwrap();
        let e = check(&cert.pem(), &other.serialize_pem()).unwrap_err();
        assert!(
            e.contains("tls_key") && e.contains("not the private key"),
            "{e}"
        );
        let secret =
            "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END EC PRIVATE KEY-----\n";
        let e = check(&cert.pem(), secret).unwrap_err();
        assert!(e.contains("tls_key") && !e.contains("c2VjcmV0"), "{e}");
        let e = check(&cert.pem(), "-----BEGIN CERTIFICATE-----\n").unwrap_err();
        assert!(e.contains("tls_key"), "{e}");
        let e = check(
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            &key.serialize_pem(),
        )
        .unwrap_err();
        assert!(
            e.contains("tls_cert") && e.contains("does not parse"),
            "{e}"
        );
        let e = check("no pem here", &key.serialize_pem()).unwrap_err();
        assert!(e.contains("tls_cert"), "{e}");
    }

    #[test]
    fn exchange_names() {
        assert!(validate_exchange_name("outbox").is_ok());
        assert!(validate_exchange_name("").is_ok());
        assert!(validate_exchange_name("a.b-c_d:e").is_ok());
        assert!(validate_exchange_name("a b").is_err());
        assert!(validate_exchange_name(&"x".repeat(256)).is_err());
    }
}
