//! `kafka://` and `kafkas://` — Apache Kafka (and compatible brokers), through librdkafka.
//!
//! ```text
//! kafka://[user:password@]127.0.0.1:9092?topic=outbox.{aggregate_type}&compression=lz4
//! kafkas://broker:9093?tls_ca=/etc/kafka/ca.pem&tls_cert=/etc/kafka/client.pem&tls_key=/etc/kafka/client.key
//! ```
//!
//! Our parameters: `topic` (a [`Template`], default `outbox.{aggregate_type}`), `create_topic`
//! (default `false`: create missing topics through the admin API — at connect time for a
//! template without placeholders, otherwise on the first send to each new topic),
//! `partitions` (of a topic we create, default `3`), `replication` (of a topic we create,
//! default `1`), `connect_timeout` (for topic creation, `check` and the TLS check at connect
//! time, default `5s`).
//!
//! Every other parameter is a librdkafka producer setting, with `_` standing for `.`:
//! `message_timeout_ms=5000` sets `message.timeout.ms`, `bootstrap_servers=h1:9092,h2:9092`
//! adds brokers; `compression=lz4` is short for `compression.codec=lz4`. An unknown setting or
//! a bad value stops start-up. txoutbox sets `message.timeout.ms=30000` (how long a message
//! may wait for its delivery report; override it like any other setting) and always
//! `enable.idempotence=true`, `enable.gapless.guarantee=true` and `acks=all`, which the URL
//! cannot change. A user name and
//! password in the URL become `sasl.username` / `sasl.password`, with `security.protocol`
//! `SASL_PLAINTEXT` (`SASL_SSL` over TLS) and `sasl.mechanism` `PLAIN` unless set otherwise.
//!
//! TLS: `kafkas://host:9093` or `kafka://host:9093?tls=true` sets `security.protocol=SSL`,
//! and the shared `tls_ca`, `tls_cert` and `tls_key` parameters (see the `tls` module) become
//! `ssl.ca.location`, `ssl.certificate.location` and `ssl.key.location`; `tls_*` on a plain
//! URL is an error. librdkafka does TLS with OpenSSL (it cannot use rustls): the broker's
//! certificate and host name are verified against `tls_ca`, else OpenSSL's default roots
//! (the system's). Since librdkafka retries a failed handshake quietly, `connect` checks the
//! handshake once (up to `connect_timeout`) and fails at once on a TLS error such as an
//! unknown CA or a missing client certificate; a broker that is merely down does not stop
//! start-up, as without TLS.
//!
//! Each event is one record: key = aggregate id, value = the body (as it is: JSON or the bytes
//! the event was written with), headers = the `outbox-*` contract headers, `content-type` (the
//! event's content type: `application/json` for a JSON payload, e.g. `application/x-protobuf`
//! for bytes) and the user headers (a user header named like one of these is dropped). With
//! `cloudevents=true` (and `ce_source`, see the `cloudevents` module) the record also carries
//! the CloudEvents Kafka protocol binding's binary-mode headers: `ce_specversion`, `ce_id`,
//! `ce_source`, `ce_type`, `ce_subject`, `ce_time`; `datacontenttype` is the `content-type`
//! header. [`Publisher::send`] enqueues the record in the producer; the [`Ack`] resolves
//! with its delivery report, i.e. when all in-sync replicas have it. The idempotent producer
//! keeps each partition's order even with several requests in flight and retries, so one
//! key's events stay in order while the relay pipelines them
//! ([`Publisher::keeps_key_order`]). Kafka has no dedup across producer sessions: consumers
//! skip records whose `outbox-event-id` they have already handled.
//!
//! With the gapless guarantee, a failure that could let a later message of a partition be
//! delivered past a failed earlier one is a *fatal* error instead: the later messages fail
//! too. A producer that failed fatally produces nothing more; the next `send` or `check`
//! replaces it with a new one built from the same settings (see `producer`), and until that
//! succeeds both fail as *unavailable*, naming librdkafka's reason, so readiness says so.
//!
//! Errors: a record too large for the producer or broker, an invalid topic name (checked
//! before sending: `[a-zA-Z0-9._-]{1,249}`, not `.` or `..`) or an invalid record is
//! *permanent*; a missing topic (with `create_topic` off), a delivery timeout, an unreachable
//! broker or a failed TLS handshake is *unavailable*; anything else is *transient*. A timed-out
//! delivery names the last TLS or authentication failure, if there was one.

mod context;
mod producer;
mod settings;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};

use self::context::BrokerErrors;
use self::producer::Producers;
use self::settings::Settings;
use super::cloudevents::CloudEvents;
use super::message::CONTENT_TYPE_HEADER;
use super::url::PublisherUrl;
use super::{Ack, ConnectError, ErrorKind, Message, PublishError, Publisher, Template};

const DEFAULT_TOPIC: &str = "outbox.{aggregate_type}";
/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;
/// Settings the delivery guarantee rests on: always set, never taken from the URL. With
/// `enable.gapless.guarantee`, a failure that could leave a gap in a partition's series (a
/// later message delivered while an earlier one failed) is a fatal error instead: the later
/// messages fail too, and the producer is rebuilt (see `producer`).
const FIXED: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("enable.gapless.guarantee", "true"),
    ("acks", "all"),
];
/// How long `send` waits for room when the producer's local queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(10);

/// Produces every event to a Kafka topic and waits for its delivery report.
pub struct KafkaPublisher {
    /// The producer, rebuilt after a fatal error.
    producers: Producers,
    /// Set when `create_topic` is on.
    admin: Option<AdminClient<BrokerErrors>>,
    /// librdkafka's client-level errors, shared with the producer and the admin client.
    errors: BrokerErrors,
    /// Topics that exist (created by us or found to exist), when `create_topic` is on.
    known_topics: Mutex<HashSet<String>>,
    topic: Template,
    /// `cloudevents=true`: the CloudEvents Kafka binding's headers.
    cloudevents: Option<CloudEvents>,
    partitions: i32,
    replication: i32,
    connect_timeout: Duration,
    tls: bool,
    redacted_url: String,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("url", &self.redacted_url)
            .field("topic", &self.topic.as_str())
            .field("create_topic", &self.admin.is_some())
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The topic name of a template without placeholders. (A template that parsed holds a `{`
/// only as part of a placeholder.)
fn literal(t: &Template) -> Option<&str> {
    (!t.as_str().contains('{')).then(|| t.as_str())
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, and not `.` or `..`.
pub fn validate_topic(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "topic name is {} bytes long (at most {MAX_TOPIC_LEN})",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("`.` and `..` are not topic names".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic name holds {c:?} (only ASCII letters, digits, `.`, `_` and `-`)"
        ));
    }
    Ok(())
}

/// The record headers: contract headers, `content-type`, the CloudEvents Kafka binding's
/// headers in binary mode when `ce` is set (`ce_specversion`, `ce_id`, ...; `datacontenttype`
/// is the `content-type` header), then user headers that do not clash with any of them.
fn headers(m: &Message, ce: Option<&CloudEvents>) -> OwnedHeaders {
    let mut ours: Vec<(String, String)> = m
        .contract_headers()
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    ours.push((CONTENT_TYPE_HEADER.to_string(), m.content_type.clone()));
    if let Some(ce) = ce {
        ours.extend(
            ce.attributes(m)
                .into_iter()
                .filter(|(name, _)| *name != "datacontenttype")
                .map(|(name, value)| (format!("ce_{name}"), value)),
        );
    }
    let mut out = OwnedHeaders::new_with_capacity(ours.len() + m.headers.len());
    for (name, value) in &ours {
        out = out.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    for (name, value) in &m.headers {
        if ours.iter().any(|(c, _)| c.eq_ignore_ascii_case(name)) {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a contract or CloudEvents header; dropped");
            continue;
        }
        out = out.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    out
}

/// Why a metadata request failed.
enum MetadataError {
    /// A TLS or authentication failure (librdkafka's words).
    Refused(String),
    Failed(PublishError),
}

/// `e`, naming the last TLS or authentication failure if there was one and `e` is not
/// about the message itself (a timed-out delivery says only "Message timed out").
fn explain(errors: &BrokerErrors, e: PublishError) -> PublishError {
    match errors.last_refusal() {
        Some(reason) if e.kind() != ErrorKind::Permanent => PublishError::new(
            e.kind(),
            format!("{e} (the last broker connection failed: {reason})"),
        ),
        _ => e,
    }
}

/// Sort a failed produce (or topic creation) into what the relay should do.
fn classify(what: String, e: &KafkaError) -> PublishError {
    use RDKafkaErrorCode as C;
    let text = format!("{what}: {e}");
    let code = match e {
        KafkaError::Canceled => {
            return PublishError::unavailable(format!("{text} (the producer was shut down)"))
        }
        other => other.rdkafka_error_code(),
    };
    match code {
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::InvalidRecord) => {
            PublishError::permanent(text)
        }
        Some(C::InvalidTopic) => PublishError::permanent(format!("{text} (invalid topic name)")),
        Some(C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition) => {
            PublishError::unavailable(format!(
                "{text} (the topic does not exist: create it, or set create_topic=true)"
            ))
        }
        Some(
            C::MessageTimedOut
            | C::AllBrokersDown
            | C::BrokerTransportFailure
            | C::Resolve
            | C::BrokerNotAvailable
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::RequestTimedOut
            | C::NetworkException
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::KafkaStorageError
            | C::SSL
            | C::Authentication
            | C::SaslAuthenticationFailed
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::Fatal
            | C::GaplessGuarantee
            | C::PurgeQueue
            | C::PurgeInflight,
        ) => PublishError::unavailable(text),
        _ => PublishError::transient(text),
    }
}

impl KafkaPublisher {
    /// Check the URL, create the producer (it connects in the background), check the TLS
    /// handshake (over TLS), and create the topic if asked to and the template has no
    /// placeholders.
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let redacted_url = url.redacted();
        let errors = BrokerErrors::new(settings.secrets.clone());
        let mut producer_config = settings.base.clone();
        for (key, value) in FIXED {
            producer_config.set(*key, *value);
        }
        let producers = Producers::new(producer_config, errors.clone(), redacted_url.clone())
            .map_err(|e| settings.config_error(e, &redacted_url))?;
        let admin = if settings.create_topic {
            Some(
                settings
                    .base
                    .create_with_context::<_, AdminClient<BrokerErrors>>(errors.clone())
                    .map_err(|e| settings.config_error(e, &redacted_url))?,
            )
        } else {
            None
        };
        let publisher = Self {
            producers,
            admin,
            errors,
            known_topics: Mutex::new(HashSet::new()),
            topic: settings.topic,
            cloudevents: settings.cloudevents,
            partitions: settings.partitions,
            replication: settings.replication,
            connect_timeout: settings.connect_timeout,
            tls: settings.tls,
            redacted_url,
        };
        if publisher.tls {
            publisher.check_tls().await?;
        }
        if let (Some(_), Some(topic)) = (&publisher.admin, literal(&publisher.topic)) {
            publisher.ensure_topic(topic).await?;
        }
        tracing::info!(url = %publisher.redacted_url, topic = %publisher.topic.as_str(), tls = publisher.tls, "Kafka producer ready");
        Ok(publisher)
    }

    /// Over TLS, fail at once on a handshake that fails (wrong CA, client certificate missing
    /// or refused): librdkafka would retry it quietly until every delivery times out. A broker
    /// that does not answer within `connect_timeout` does not stop start-up, as without TLS.
    async fn check_tls(&self) -> Result<(), PublishError> {
        match self.fetch_metadata(true).await {
            Ok(_) => Ok(()),
            Err(MetadataError::Refused(reason)) => Err(PublishError::unavailable(format!(
                "Kafka at {}: cannot connect: {reason}",
                self.redacted_url
            ))),
            Err(MetadataError::Failed(e)) => {
                tracing::warn!(url = %self.redacted_url, error = %e.chain(), "Kafka: no broker answered yet; the producer keeps trying");
                Ok(())
            }
        }
    }

    /// Ask any broker for the cluster's metadata (the number of brokers), giving up on the
    /// first TLS or authentication failure reported meanwhile (or already, with
    /// `include_earlier`) or after `connect_timeout`. librdkafka's call blocks a thread, so it
    /// is asked in short slices: one given up on (a refusal) then holds a thread only briefly,
    /// not until `connect_timeout`, which would also hold up the runtime's shutdown.
    async fn fetch_metadata(&self, include_earlier: bool) -> Result<usize, MetadataError> {
        const SLICE: Duration = Duration::from_millis(250);
        let what = || format!("Kafka at {}: fetch metadata", self.redacted_url);
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let refusal = self.errors.refusal(include_earlier);
        tokio::pin!(refusal);
        loop {
            // A producer that failed fatally is replaced here too, so readiness recovers
            // without waiting for the next event.
            let producer = self.producers.current().map_err(MetadataError::Failed)?;
            let slice = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(SLICE);
            let fetch = tokio::task::spawn_blocking(move || {
                producer
                    .client()
                    .fetch_metadata(None, slice)
                    .map(|metadata| metadata.brokers().len())
            });
            let fetched = tokio::select! {
                fetched = fetch => fetched,
                reason = &mut refusal => return Err(MetadataError::Refused(reason)),
            };
            let failed = match fetched {
                Ok(Ok(brokers)) if brokers > 0 => {
                    self.errors.forget();
                    return Ok(brokers);
                }
                Ok(Ok(_)) => PublishError::unavailable(format!("{}: it lists no brokers", what())),
                // Whatever librdkafka says (a timeout, no broker up), the cluster cannot be
                // reached: unavailable.
                Ok(Err(e)) => self.explain(PublishError::unavailable(format!("{}: {e}", what()))),
                Err(e) => PublishError::unavailable(format!("{}: {e}", what())),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(MetadataError::Failed(failed));
            }
            // A fast failure (no broker up yet): do not spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Name the last TLS or authentication failure in an error that may stem from it.
    fn explain(&self, e: PublishError) -> PublishError {
        explain(&self.errors, e)
    }

    /// Create `topic` unless we know it exists (only with `create_topic`).
    async fn ensure_topic(&self, topic: &str) -> Result<(), PublishError> {
        let Some(admin) = &self.admin else {
            return Ok(());
        };
        if self.is_known(topic) {
            return Ok(());
        }
        let what = || format!("Kafka at {}: create topic {topic:?}", self.redacted_url);
        let new = NewTopic::new(
            topic,
            self.partitions,
            TopicReplication::Fixed(self.replication),
        );
        let options = AdminOptions::new()
            .request_timeout(Some(self.connect_timeout))
            .operation_timeout(Some(self.connect_timeout));
        let limit = self.connect_timeout * 2;
        let results = match tokio::time::timeout(limit, admin.create_topics([&new], &options)).await
        {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => return Err(self.explain(classify(what(), &e))),
            Err(_) => {
                return Err(self.explain(PublishError::unavailable(format!(
                    "{}: timed out after {limit:?}",
                    what()
                ))))
            }
        };
        for result in results {
            match result {
                Ok(_) => tracing::info!(topic, partitions = self.partitions, "created Kafka topic"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(classify(what(), &KafkaError::AdminOp(code))),
            }
        }
        if let Ok(mut known) = self.known_topics.lock() {
            known.insert(topic.to_string());
        }
        Ok(())
    }

    fn is_known(&self, topic: &str) -> bool {
        self.known_topics
            .lock()
            .map(|k| k.contains(topic))
            .unwrap_or(false)
    }
}

#[async_trait::async_trait]
impl Publisher for KafkaPublisher {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn keeps_key_order(&self) -> bool {
        // Idempotent producer: per-partition order holds with up to 5 requests in flight and
        // across retries, and one key always maps to one partition.
        true
    }

    fn destination(&self, message: &Message) -> Option<String> {
        Some(self.topic.render(message))
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let id = message.id;
        let topic = self.topic.render(message);
        validate_topic(&topic).map_err(|reason| {
            PublishError::permanent(format!(
                "event {id}: topic {topic:?} (from template {:?}): {reason}",
                self.topic.as_str()
            ))
        })?;
        self.ensure_topic(&topic).await?;
        let what = move |topic: &str| format!("event {id}: produce to Kafka topic {topic:?}");
        let started = tokio::time::Instant::now();
        let mut replaced = false;
        let delivery = loop {
            let record = FutureRecord::to(&topic)
                .key(&message.aggregate_id)
                .payload(&message.body)
                .headers(headers(message, self.cloudevents.as_ref()));
            // A producer that failed fatally can send nothing more: use a new one.
            let producer = self.producers.current().map_err(|e| self.explain(e))?;
            // Enqueue only: the producer's own thread sends, in enqueue order per partition.
            match producer.send_result(record).map_err(|(e, _)| e) {
                Ok(delivery) => break delivery,
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                    if started.elapsed() < QUEUE_FULL_WAIT =>
                {
                    // The local queue drains as the broker acknowledges; wait for room.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // It failed fatally just now: once more, on the producer that replaces it.
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal)) if !replaced => {
                    replaced = true;
                }
                Err(e) => return Err(self.explain(classify(what(&topic), &e))),
            }
        };
        let errors = self.errors.clone();
        Ok(Box::pin(async move {
            match delivery.await {
                Ok(Ok(_delivery)) => {
                    errors.forget();
                    Ok(())
                }
                Ok(Err((e, _message))) => Err(explain(&errors, classify(what(&topic), &e))),
                Err(_canceled) => Err(classify(what(&topic), &KafkaError::Canceled)),
            }
        }))
    }

    async fn check(&self) -> Result<(), PublishError> {
        match self.fetch_metadata(false).await {
            Ok(_) => Ok(()),
            Err(MetadataError::Refused(reason)) => Err(PublishError::unavailable(format!(
                "Kafka at {}: {reason}",
                self.redacted_url
            ))),
            Err(MetadataError::Failed(e)) => Err(e),
        }
    }

    async fn close(&self) -> Result<(), PublishError> {
        let producer = self.producers.in_use();
        let limit = self.connect_timeout;
        match tokio::task::spawn_blocking(move || producer.flush(limit)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.explain(classify(
                format!("Kafka at {}: flush on close", self.redacted_url),
                &e,
            ))),
            Err(e) => Err(PublishError::unavailable(format!(
                "Kafka at {}: flush on close: {e}",
                self.redacted_url
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
