//! `kafka://` — Apache Kafka (and compatible brokers), through librdkafka.
//!
//! ```text
//! kafka://[user:password@]127.0.0.1:9092?topic=outbox.{aggregate_type}&compression=lz4
//! ```
//!
//! Our parameters: `topic` (a [`Template`], default `outbox.{aggregate_type}`), `create_topic`
//! (default `false`: create missing topics through the admin API — at connect time for a
//! template without placeholders, otherwise on the first send to each new topic),
//! `partitions` (of a topic we create, default `3`), `replication` (of a topic we create,
//! default `1`), `connect_timeout` (for topic creation and `check`, default `5s`).
//!
//! Every other parameter is a librdkafka producer setting, with `_` standing for `.`:
//! `message_timeout_ms=5000` sets `message.timeout.ms`, `bootstrap_servers=h1:9092,h2:9092`
//! adds brokers; `compression=lz4` is short for `compression.codec=lz4`. An unknown setting or
//! a bad value stops start-up. txoutbox sets `message.timeout.ms=30000` (how long a message
//! may wait for its delivery report; override it like any other setting) and always
//! `enable.idempotence=true` and `acks=all`, which the URL cannot change. A user name and
//! password in the URL become `sasl.username` / `sasl.password`, with `security.protocol`
//! `SASL_PLAINTEXT` and `sasl.mechanism` `PLAIN` unless set otherwise.
//!
//! Each event is one record: key = aggregate id, value = the body, headers = the `outbox-*`
//! contract headers and the user headers (a user header named like a contract header is
//! dropped). [`Publisher::send`] enqueues the record in the producer; the [`Ack`] resolves
//! with its delivery report, i.e. when all in-sync replicas have it. The idempotent producer
//! keeps each partition's order even with several requests in flight and retries, so one
//! key's events stay in order while the relay pipelines them
//! ([`Publisher::keeps_key_order`]). Kafka has no dedup across producer sessions: consumers
//! skip records whose `outbox-event-id` they have already handled.
//!
//! Errors: a record too large for the producer or broker, an invalid topic name (checked
//! before sending: `[a-zA-Z0-9._-]{1,249}`, not `.` or `..`) or an invalid record is
//! *permanent*; a missing topic (with `create_topic` off), a delivery timeout or an
//! unreachable broker is *unavailable*; anything else is *transient*.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::url::{percent_decode, PublisherUrl};
use super::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher, Template};

/// The URL parameters txoutbox reads itself; every other one goes to librdkafka.
const OWN_PARAMS: &[&str] = &[
    "topic",
    "create_topic",
    "partitions",
    "replication",
    "connect_timeout",
];
const DEFAULT_TOPIC: &str = "outbox.{aggregate_type}";
/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;
/// Short names for common librdkafka settings.
const ALIASES: &[(&str, &str)] = &[("compression", "compression.codec")];
/// Settings the delivery guarantee rests on: always set, never taken from the URL.
const FIXED: &[(&str, &str)] = &[("enable.idempotence", "true"), ("acks", "all")];
/// librdkafka names of the fixed settings (with aliases), refused as URL parameters.
const PROTECTED: &[&str] = &["enable.idempotence", "acks", "request.required.acks"];
/// Our defaults for librdkafka settings; URL parameters override them.
const DEFAULTS: &[(&str, &str)] = &[("message.timeout.ms", "30000"), ("client.id", "txoutbox")];
/// How long `send` waits for room when the producer's local queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(10);

/// Produces every event to a Kafka topic and waits for its delivery report.
pub struct KafkaPublisher {
    producer: FutureProducer,
    /// Set when `create_topic` is on.
    admin: Option<AdminClient<DefaultClientContext>>,
    /// Topics that exist (created by us or found to exist), when `create_topic` is on.
    known_topics: Mutex<HashSet<String>>,
    topic: Template,
    partitions: i32,
    replication: i32,
    connect_timeout: Duration,
    redacted_url: String,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("url", &self.redacted_url)
            .field("topic", &self.topic.as_str())
            .field("create_topic", &self.admin.is_some())
            .finish_non_exhaustive()
    }
}

/// What the URL asks for. (No `Debug`: the client config holds secrets.)
struct Settings {
    topic: Template,
    create_topic: bool,
    partitions: i32,
    replication: i32,
    connect_timeout: Duration,
    /// Brokers, credentials and pass-through settings; not yet the fixed ones.
    base: ClientConfig,
    /// librdkafka key -> the URL parameter it came from, for error messages.
    origins: Vec<(String, String)>,
    /// Values that must not appear in any message.
    secrets: Vec<String>,
}

impl Settings {
    fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        let topic = Template::parse(url.param("topic").unwrap_or(DEFAULT_TOPIC))?;
        if let Some(literal) = literal(&topic) {
            validate_topic(literal).map_err(|reason| ConfigError::BadParam {
                name: "topic".into(),
                reason: format!("{literal:?}: {reason}"),
            })?;
        }
        let create_topic = url.bool_param("create_topic", false)?;
        let partitions = positive(url, "partitions", 3)?;
        let replication = positive(url, "replication", 1)?;
        let connect_timeout = url.duration_param("connect_timeout", Duration::from_secs(5))?;

        let u = url.url();
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h,
            _ => {
                return Err(ConfigError::BadUrl {
                    url: url.redacted(),
                    reason: "kafka:// needs a host, e.g. kafka://127.0.0.1:9092".into(),
                })
            }
        };
        let mut base = ClientConfig::new();
        let mut origins = Vec::new();
        let mut secrets = Vec::new();
        for (key, value) in DEFAULTS {
            base.set(*key, *value);
        }
        base.set(
            "bootstrap.servers",
            format!("{host}:{}", u.port().unwrap_or(9092)),
        );
        if !u.username().is_empty() {
            base.set("sasl.username", percent_decode(u.username()));
            base.set("security.protocol", "SASL_PLAINTEXT");
            base.set("sasl.mechanism", "PLAIN");
        }
        if let Some(password) = u.password() {
            let password = percent_decode(password);
            secrets.push(password.clone());
            base.set("sasl.password", password);
        }
        for (name, value) in u.query_pairs() {
            if OWN_PARAMS.contains(&name.as_ref()) {
                continue;
            }
            if matches!(name.as_ref(), "tls_ca" | "tls_cert" | "tls_key") {
                return Err(ConfigError::BadParam {
                    name: name.into_owned(),
                    reason: "TLS to Kafka is not supported yet: this build's librdkafka has no \
                             SSL (rdkafka's `ssl` feature is off)"
                        .into(),
                });
            }
            let key = librdkafka_key(&name);
            if PROTECTED.contains(&key.as_str()) {
                return Err(ConfigError::BadParam {
                    name: name.into_owned(),
                    reason: "txoutbox always uses the idempotent producer with acks=all".into(),
                });
            }
            if key.contains("password") || key.contains("secret") {
                secrets.push(value.to_string());
            }
            base.set(key.clone(), value.into_owned());
            origins.push((key, name.into_owned()));
        }
        Ok(Self {
            topic,
            create_topic,
            partitions,
            replication,
            connect_timeout,
            base,
            origins,
            secrets,
        })
    }

    /// A librdkafka error about our config, as a [`ConfigError`] without secrets in it.
    fn config_error(&self, e: KafkaError, redacted_url: &str) -> ConfigError {
        let clean = |s: &str| {
            let mut s = s.to_string();
            for secret in self.secrets.iter().filter(|s| !s.is_empty()) {
                s = s.replace(secret.as_str(), "***");
            }
            s
        };
        match e {
            KafkaError::ClientConfig(_, desc, key, _value) => {
                let name = self
                    .origins
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map_or_else(|| key.clone(), |(_, n)| n.clone());
                ConfigError::BadParam {
                    name,
                    reason: format!("librdkafka setting `{key}`: {}", clean(&desc)),
                }
            }
            other => ConfigError::BadUrl {
                url: redacted_url.to_string(),
                reason: clean(&other.to_string()),
            },
        }
    }
}

/// `compression` -> `compression.codec`, `message_timeout_ms` -> `message.timeout.ms`.
fn librdkafka_key(param: &str) -> String {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == param)
        .map_or_else(|| param.replace('_', "."), |(_, key)| (*key).to_string())
}

fn positive(url: &PublisherUrl, name: &str, default: i32) -> Result<i32, ConfigError> {
    let n: i32 = url.parse_param(name, default)?;
    if n < 1 {
        return Err(ConfigError::BadParam {
            name: name.into(),
            reason: format!("must be at least 1, got {n}"),
        });
    }
    Ok(n)
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

/// The record headers: contract headers, then user headers that do not clash with them.
fn headers(m: &Message) -> OwnedHeaders {
    let contract = m.contract_headers();
    let mut out = OwnedHeaders::new_with_capacity(contract.len() + m.headers.len());
    for (name, value) in &contract {
        out = out.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    for (name, value) in &m.headers {
        if contract.iter().any(|(c, _)| c.eq_ignore_ascii_case(name)) {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a contract header; dropped");
            continue;
        }
        out = out.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    out
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
            | C::Authentication
            | C::SaslAuthenticationFailed
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::Fatal
            | C::PurgeQueue
            | C::PurgeInflight,
        ) => PublishError::unavailable(text),
        _ => PublishError::transient(text),
    }
}

impl KafkaPublisher {
    /// Check the URL, create the producer (it connects in the background), and create the
    /// topic if asked to and the template has no placeholders.
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let redacted_url = url.redacted();
        let mut producer_config = settings.base.clone();
        for (key, value) in FIXED {
            producer_config.set(*key, *value);
        }
        let producer: FutureProducer = producer_config
            .create()
            .map_err(|e| settings.config_error(e, &redacted_url))?;
        let admin = if settings.create_topic {
            Some(
                settings
                    .base
                    .create::<AdminClient<DefaultClientContext>>()
                    .map_err(|e| settings.config_error(e, &redacted_url))?,
            )
        } else {
            None
        };
        let publisher = Self {
            producer,
            admin,
            known_topics: Mutex::new(HashSet::new()),
            topic: settings.topic,
            partitions: settings.partitions,
            replication: settings.replication,
            connect_timeout: settings.connect_timeout,
            redacted_url,
        };
        if let (Some(_), Some(topic)) = (&publisher.admin, literal(&publisher.topic)) {
            publisher.ensure_topic(topic).await?;
        }
        tracing::info!(url = %publisher.redacted_url, topic = %publisher.topic.as_str(), "Kafka producer ready");
        Ok(publisher)
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
            Ok(Err(e)) => return Err(classify(what(), &e)),
            Err(_) => {
                return Err(PublishError::unavailable(format!(
                    "{}: timed out after {limit:?}",
                    what()
                )))
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
        let delivery = loop {
            let record = FutureRecord::to(&topic)
                .key(&message.aggregate_id)
                .payload(&message.body)
                .headers(headers(message));
            // Enqueue only: the producer's own thread sends, in enqueue order per partition.
            match self.producer.send_result(record).map_err(|(e, _)| e) {
                Ok(delivery) => break delivery,
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                    if started.elapsed() < QUEUE_FULL_WAIT =>
                {
                    // The local queue drains as the broker acknowledges; wait for room.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(classify(what(&topic), &e)),
            }
        };
        Ok(Box::pin(async move {
            match delivery.await {
                Ok(Ok(_delivery)) => Ok(()),
                Ok(Err((e, _message))) => Err(classify(what(&topic), &e)),
                Err(_canceled) => Err(classify(what(&topic), &KafkaError::Canceled)),
            }
        }))
    }

    async fn check(&self) -> Result<(), PublishError> {
        let producer = self.producer.clone();
        let limit = self.connect_timeout;
        let fetched = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, limit)
                .map(|metadata| metadata.brokers().len())
        })
        .await;
        match fetched {
            Ok(Ok(brokers)) if brokers > 0 => Ok(()),
            Ok(Ok(_)) => Err(PublishError::unavailable(format!(
                "Kafka at {}: metadata lists no brokers",
                self.redacted_url
            ))),
            Ok(Err(e)) => Err(classify(
                format!("Kafka at {}: fetch metadata", self.redacted_url),
                &e,
            )),
            Err(e) => Err(PublishError::unavailable(format!(
                "Kafka at {}: fetch metadata: {e}",
                self.redacted_url
            ))),
        }
    }

    async fn close(&self) -> Result<(), PublishError> {
        let producer = self.producer.clone();
        let limit = self.connect_timeout;
        match tokio::task::spawn_blocking(move || producer.flush(limit)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(classify(
                format!("Kafka at {}: flush on close", self.redacted_url),
                &e,
            )),
            Err(e) => Err(PublishError::unavailable(format!(
                "Kafka at {}: flush on close: {e}",
                self.redacted_url
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(url: &str) -> Result<Settings, ConfigError> {
        Settings::from_url(&super::super::url::parse(url).unwrap())
    }

    #[test]
    fn settings_from_url() {
        let s =
            settings("kafka://h:9093?topic=t.{event_type}&compression=lz4&linger_ms=5").unwrap();
        assert_eq!(s.topic.as_str(), "t.{event_type}");
        assert!(!s.create_topic);
        assert_eq!((s.partitions, s.replication), (3, 1));
        assert_eq!(s.base.get("bootstrap.servers"), Some("h:9093"));
        assert_eq!(s.base.get("compression.codec"), Some("lz4"));
        assert_eq!(s.base.get("linger.ms"), Some("5"));
        assert_eq!(s.base.get("message.timeout.ms"), Some("30000"));
        let s = settings("kafka://u:p%40ss@h?create_topic=true&partitions=6").unwrap();
        assert_eq!(s.base.get("bootstrap.servers"), Some("h:9092"));
        assert_eq!(s.base.get("sasl.password"), Some("p@ss"));
        assert_eq!(s.secrets, ["p@ss"]);
        assert_eq!(s.partitions, 6);
        for bad in [
            "kafka://h?topic={nope}",
            "kafka://h?topic=a%20b",
            "kafka://h?topic=..",
            "kafka://h?partitions=0",
            "kafka://h?replication=x",
            "kafka://h?create_topic=maybe",
            "kafka://h?acks=1",
            "kafka://h?enable_idempotence=false",
            "kafka://h?connect_timeout=soon",
        ] {
            assert!(settings(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn topic_names() {
        assert!(validate_topic("outbox.order_v1-x").is_ok());
        assert!(validate_topic(&"a".repeat(MAX_TOPIC_LEN)).is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a b",
            "a/b",
            "ä",
            &"a".repeat(MAX_TOPIC_LEN + 1),
        ] {
            assert!(validate_topic(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn errors_are_classified() {
        let e = |code| classify("x".into(), &KafkaError::MessageProduction(code)).kind();
        use super::super::ErrorKind as K;
        assert_eq!(e(RDKafkaErrorCode::MessageSizeTooLarge), K::Permanent);
        assert_eq!(e(RDKafkaErrorCode::InvalidTopic), K::Permanent);
        assert_eq!(e(RDKafkaErrorCode::MessageTimedOut), K::Unavailable);
        assert_eq!(e(RDKafkaErrorCode::UnknownTopicOrPartition), K::Unavailable);
        assert_eq!(e(RDKafkaErrorCode::OutOfOrderSequenceNumber), K::Transient);
    }
}
