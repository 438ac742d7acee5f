//! `mqtt://` — MQTT 5 at QoS 1.
//!
//! ```text
//! mqtt[s]://[user:password@]127.0.0.1:1883?topic=outbox/{aggregate_type}/{event_type}&qos=1
//! ```
//!
//! Parameters: `topic` (a [`Template`], default `outbox/{aggregate_type}/{event_type}`), `qos`
//! (only `1`: QoS 0 has no acknowledgement, QoS 2 is not supported), `client_id` (default
//! `txoutbox-<random>`), `connect_timeout` (default `5s`), `ack_timeout` (default `10s`),
//! `cloudevents`, `ce_source` and `no_subscribers` (below).
//!
//! TLS: `mqtts://host:8883` (8883 is the default port), with `tls_ca` (default: the system's
//! CA bundle), `tls_cert` and `tls_key` (a client certificate, for `require_certificate true`).
//!
//! Each event is one PUBLISH of the body as it is at QoS 1 with the event's content type as the
//! MQTT 5 content type (`application/json` for a JSON payload, e.g. `application/x-protobuf`
//! for bytes; the payload format indicator stays unset: the body is bytes) and user properties: the `outbox-*` contract headers, the user headers
//! and, with `cloudevents=true`, the CloudEvents attributes `specversion`, `id`, `source`, `type`,
//! `subject`, `time` (MQTT binding, binary mode). An event is delivered when the broker's PUBACK
//! arrives with a success code. MQTT has no dedup of its own: consumers skip repeats by the
//! `outbox-event-id` property.
//!
//! A PUBACK with `NoMatchingSubscribers` (MQTT 5 reason code 16, which Mosquitto sends when no
//! subscription matches the topic) means nobody took the event: by default that is
//! *unavailable* (retried without using up `max_attempts`, as a consumer that is down or not yet
//! deployed must not turn events into dead letters). `no_subscribers=permanent` dead-letters
//! such an event at once, `no_subscribers=transient` after `max_attempts`;
//! `no_subscribers=delivered` counts it as delivered (for topics where
//! nobody listening is fine). Refusals that can never succeed (`TopicNameInvalid`,
//! `PayloadFormatInvalid`, `NotAuthorized`) are permanent; other refusals are transient.
//!
//! One connection: publishes go out in call order. When the connection drops, every
//! unacknowledged message fails as *unavailable* (and is not re-sent by the client: the relay
//! sends it again), and the client reconnects in the background.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use rumqttc::Outgoing;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::cloudevents::CloudEvents;
use super::tls::TlsFiles;
use super::url::PublisherUrl;
use super::{
    Ack, ConfigError, ConnectError, ErrorKind, Message, PublishError, Publisher, Template,
};

const PARAMS: &[&str] = &[
    "topic",
    "qos",
    "client_id",
    "connect_timeout",
    "ack_timeout",
    "cloudevents",
    "ce_source",
    "no_subscribers",
    "tls_ca",
    "tls_cert",
    "tls_key",
];
const DEFAULT_TOPIC: &str = "outbox/{aggregate_type}/{event_type}";
/// Longest topic MQTT can carry.
pub const MAX_TOPIC_LEN: usize = 65_535;
/// Requests the client buffers before `send` reports the client as busy.
const CLIENT_CAPACITY: usize = 4096;

/// The PUBACK's reason code, or why none will come.
type Reply = oneshot::Sender<Result<PubAckReason, PublishError>>;

/// Publishes at QoS 1 and waits for the PUBACK of every message.
pub struct MqttPublisher {
    client: AsyncClient,
    topic: Template,
    ack_timeout: Duration,
    cloudevents: Option<CloudEvents>,
    /// What a PUBACK with `NoMatchingSubscribers` means: an error of this kind, or (`None`)
    /// delivered.
    no_subscribers: Option<ErrorKind>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    redacted_url: String,
}

impl std::fmt::Debug for MqttPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttPublisher")
            .field("url", &self.redacted_url)
            .field("topic", &self.topic.as_str())
            .finish_non_exhaustive()
    }
}

/// The link between `send` and the event loop task.
struct Shared {
    connected: AtomicBool,
    pending: Mutex<Pending>,
}

/// Acks waiting for their message to be written (in call order), then for the PUBACK.
#[derive(Default)]
struct Pending {
    unwritten: VecDeque<Reply>,
    by_pkid: HashMap<u16, Reply>,
}

struct Settings {
    options: MqttOptions,
    topic: Template,
    connect_timeout: Duration,
    ack_timeout: Duration,
    cloudevents: Option<CloudEvents>,
    no_subscribers: Option<ErrorKind>,
}

impl Settings {
    fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        url.only_params(PARAMS)?;
        match url.param("qos").unwrap_or("1") {
            "1" => {}
            "0" => {
                return Err(ConfigError::BadParam {
                    name: "qos".into(),
                    reason:
                        "qos=0 is refused: QoS 0 has no acknowledgement, so txoutbox could not \
                             know that an event was delivered; use qos=1"
                            .into(),
                })
            }
            other => {
                return Err(ConfigError::BadParam {
                    name: "qos".into(),
                    reason: format!("{other:?} is not supported; use qos=1"),
                })
            }
        }
        let topic = Template::parse(url.param("topic").unwrap_or(DEFAULT_TOPIC))?;
        let connect_timeout = url.duration_param("connect_timeout", Duration::from_secs(5))?;
        let ack_timeout = url.duration_param("ack_timeout", Duration::from_secs(10))?;
        let no_subscribers = url.choice_param(
            "no_subscribers",
            &[
                ("unavailable", Some(ErrorKind::Unavailable)),
                ("transient", Some(ErrorKind::Transient)),
                ("permanent", Some(ErrorKind::Permanent)),
                ("delivered", None),
            ],
            Some(ErrorKind::Unavailable),
        )?;
        let u = url.url();
        let host = u.host_str().unwrap_or_default();
        if host.is_empty() {
            return Err(ConfigError::BadUrl {
                url: url.redacted(),
                reason: "mqtt:// needs a host, e.g. mqtt://127.0.0.1:1883".into(),
            });
        }
        let client_id = match url.param("client_id") {
            Some(id) if !id.is_empty() => id.to_string(),
            Some(_) => {
                return Err(ConfigError::BadParam {
                    name: "client_id".into(),
                    reason: "must not be empty".into(),
                })
            }
            None => format!("txoutbox-{}", uuid::Uuid::new_v4().simple()),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let tls = TlsFiles::from_url(url, url.scheme() == "mqtts", "mqtts://")?;
        let default_port = if tls.is_some() { 8883 } else { 1883 };
        let mut options = MqttOptions::new(client_id, host, u.port().unwrap_or(default_port));
        options
            .set_clean_start(true)
            .set_keep_alive(Duration::from_secs(30))
            .set_connection_timeout(connect_timeout.as_secs().max(1));
        if let Some(tls) = tls {
            options.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Simple {
                    ca: tls.ca_or_system()?,
                    alpn: None,
                    client_auth: tls.client,
                },
            ));
        }
        if !u.username().is_empty() || u.password().is_some() {
            let decode = |s: &str| {
                url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            };
            options.set_credentials(
                decode(u.username()),
                decode(u.password().unwrap_or_default()),
            );
        }
        Ok(Self {
            options,
            topic,
            connect_timeout,
            ack_timeout,
            cloudevents: CloudEvents::from_url(url)?,
            no_subscribers,
        })
    }
}

impl MqttPublisher {
    /// Connect (waiting for the CONNACK) and start the event loop task.
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let redacted_url = url.redacted();
        let (client, mut eventloop) = AsyncClient::new(settings.options, CLIENT_CAPACITY);
        let handshake = async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
        };
        match tokio::time::timeout(settings.connect_timeout, handshake).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // rumqttc's errors name neither the host nor the credentials.
                return Err(PublishError::unavailable(format!(
                    "MQTT broker at {redacted_url}: cannot connect: {e}"
                ))
                .into());
            }
            Err(_) => {
                return Err(PublishError::unavailable(format!(
                    "MQTT broker at {redacted_url}: cannot connect: timed out after {:?}",
                    settings.connect_timeout
                ))
                .into())
            }
        }
        let shared = Arc::new(Shared {
            connected: AtomicBool::new(true),
            pending: Mutex::new(Pending::default()),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(run(
            eventloop,
            shared.clone(),
            cancel.clone(),
            redacted_url.clone(),
        ));
        tracing::info!(url = %redacted_url, topic = %settings.topic.as_str(), "connected to MQTT broker");
        Ok(Self {
            client,
            topic: settings.topic,
            ack_timeout: settings.ack_timeout,
            cloudevents: settings.cloudevents,
            no_subscribers: settings.no_subscribers,
            shared,
            cancel,
            redacted_url,
        })
    }
}

/// The MQTT 5 properties of one message: its content type, and as user properties the
/// contract headers, the CloudEvents attributes (with `cloudevents`) and the user headers.
fn properties(m: &Message, cloudevents: Option<&CloudEvents>) -> PublishProperties {
    let mut props: Vec<(String, String)> = m
        .contract_headers()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    if let Some(ce) = cloudevents {
        for (name, value) in ce.attributes(m) {
            // `datacontenttype` is the MQTT content type (the message's, below).
            if name != "datacontenttype" {
                props.push((name.to_string(), value));
            }
        }
    }
    let reserved = props.len();
    for (name, value) in &m.headers {
        if props[..reserved]
            .iter()
            .any(|(r, _)| r.eq_ignore_ascii_case(name))
        {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a reserved property; dropped");
            continue;
        }
        props.push((name.clone(), value.clone()));
    }
    PublishProperties {
        content_type: Some(m.content_type.clone()),
        user_properties: props,
        ..Default::default()
    }
}

impl Drop for MqttPublisher {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Is `topic` something we may publish to? Not empty, no wildcards (`+`, `#`), no NUL, at most
/// [`MAX_TOPIC_LEN`] bytes.
pub fn validate_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("is empty".into());
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "is {} bytes long, more than {MAX_TOPIC_LEN}",
            topic.len()
        ));
    }
    if topic.contains(['+', '#']) {
        return Err("contains a wildcard (`+` or `#`)".into());
    }
    if topic.contains('\0') {
        return Err("contains a NUL character".into());
    }
    Ok(())
}

/// What a PUBACK's reason code means; `no_subscribers` as set by the URL.
fn puback_result(
    reason: PubAckReason,
    no_subscribers: Option<ErrorKind>,
) -> Result<(), PublishError> {
    use PubAckReason::*;
    match reason {
        Success => Ok(()),
        NoMatchingSubscribers => match no_subscribers {
            None => Ok(()),
            Some(kind) => Err(PublishError::new(
                kind,
                "the broker took the message but no subscription matches its topic \
                 (NoMatchingSubscribers): nobody received it",
            )),
        },
        NotAuthorized | TopicNameInvalid | PayloadFormatInvalid => Err(PublishError::permanent(
            format!("the broker refused the message: {reason:?}"),
        )),
        other => Err(PublishError::transient(format!(
            "the broker refused the message: {other:?}"
        ))),
    }
}

/// Drive the connection: match written publishes to their acks, settle acks on PUBACK, and
/// on a connection error fail everything outstanding and reconnect.
async fn run(
    mut eventloop: EventLoop,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    url: String,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => break,
            e = eventloop.poll() => e,
        };
        match handle(event, &mut eventloop, &shared, &url) {
            Step::Go => {}
            Step::Connected => backoff = Duration::from_millis(100),
            Step::Failed => {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Step::Stop => break,
        }
    }
}

enum Step {
    Go,
    Connected,
    Failed,
    Stop,
}

fn handle(
    event: Result<Event, ConnectionError>,
    eventloop: &mut EventLoop,
    shared: &Shared,
    url: &str,
) -> Step {
    let Ok(mut pending) = shared.pending.lock() else {
        return Step::Stop;
    };
    match event {
        Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
            if let Some(reply) = pending.unwritten.pop_front() {
                pending.by_pkid.insert(pkid, reply);
            }
            Step::Go
        }
        Ok(Event::Incoming(Packet::PubAck(ack))) => {
            if let Some(reply) = pending.by_pkid.remove(&ack.pkid) {
                let _ = reply.send(Ok(ack.reason));
            }
            Step::Go
        }
        Ok(Event::Incoming(Packet::ConnAck(_))) => {
            shared.connected.store(true, Ordering::Release);
            tracing::info!(url = %url, "reconnected to MQTT broker");
            Step::Connected
        }
        Ok(_) => Step::Go,
        Err(e) => {
            if shared.connected.swap(false, Ordering::AcqRel) {
                tracing::warn!(url = %url, error = %e, "MQTT connection lost");
            }
            fail_all(eventloop, &mut pending, url, &e);
            Step::Failed
        }
    }
}

/// Fail every outstanding ack and drop the client's copies of their messages, so that the
/// relay (not the client) re-sends them and written/unwritten stay in step.
fn fail_all(eventloop: &mut EventLoop, pending: &mut Pending, url: &str, e: &ConnectionError) {
    // Requests still in the client's channel move to `pending` here; none may be sent later.
    eventloop.clean();
    eventloop.pending.clear();
    let err = || PublishError::unavailable(format!("MQTT broker at {url}: connection lost: {e}"));
    for reply in pending.unwritten.drain(..) {
        let _ = reply.send(Err(err()));
    }
    for (_, reply) in pending.by_pkid.drain() {
        let _ = reply.send(Err(err()));
    }
}

#[async_trait::async_trait]
impl Publisher for MqttPublisher {
    fn kind(&self) -> &'static str {
        "mqtt"
    }

    fn destination(&self, message: &Message) -> Option<String> {
        Some(self.topic.render(message))
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let topic = self.topic.render(message);
        validate_topic(&topic).map_err(|reason| {
            PublishError::permanent(format!("event {}: topic {topic:?} {reason}", message.id))
        })?;
        if !self.shared.connected.load(Ordering::Acquire) {
            return Err(PublishError::unavailable(format!(
                "MQTT broker at {}: not connected",
                self.redacted_url
            )));
        }
        let props = properties(message, self.cloudevents.as_ref());
        let (tx, rx) = oneshot::channel();
        {
            // Queue the ack and the message together, so the n-th written publish is the n-th
            // queued ack.
            let mut pending = self
                .shared
                .pending
                .lock()
                .map_err(|_| PublishError::unavailable("MQTT event loop failed"))?;
            self.client
                .try_publish_with_properties(
                    topic,
                    QoS::AtLeastOnce,
                    false,
                    message.body.clone(),
                    props,
                )
                .map_err(|e| {
                    PublishError::transient(format!(
                        "event {}: the MQTT client cannot take the message: {e}",
                        message.id
                    ))
                })?;
            pending.unwritten.push_back(tx);
        }
        let (id, timeout, no_subscribers) = (message.id, self.ack_timeout, self.no_subscribers);
        Ok(Box::pin(async move {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(res)) => res
                    .and_then(|reason| puback_result(reason, no_subscribers))
                    .map_err(|e| PublishError::new(e.kind(), format!("event {id}: {e}"))),
                Ok(Err(_)) => Err(PublishError::unavailable(format!(
                    "event {id}: the MQTT event loop stopped before the PUBACK"
                ))),
                Err(_) => Err(PublishError::transient(format!(
                    "event {id}: no PUBACK within {timeout:?}"
                ))),
            }
        }))
    }

    async fn check(&self) -> Result<(), PublishError> {
        if self.shared.connected.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(PublishError::unavailable(format!(
                "MQTT broker at {}: not connected",
                self.redacted_url
            )))
        }
    }

    async fn close(&self) -> Result<(), PublishError> {
        let _ = self.client.disconnect().await;
        self.cancel.cancel();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_validated() {
        assert!(validate_topic("outbox/order/created").is_ok());
        for bad in ["", "a/+/b", "a/#", "a\0b"] {
            assert!(validate_topic(bad).is_err(), "{bad:?}");
        }
        assert!(validate_topic(&"a".repeat(MAX_TOPIC_LEN)).is_ok());
        assert!(validate_topic(&"a".repeat(MAX_TOPIC_LEN + 1)).is_err());
    }

    #[test]
    fn settings_from_url() {
        let u = super::super::url::parse("mqtt://h?qos=0").unwrap();
        let e = Settings::from_url(&u).err().unwrap().to_string();
        assert!(e.contains("qos=0") && e.contains("acknowledgement"), "{e}");
        for bad in [
            "mqtt://h?qos=2",
            "mqtt://h?topic={x}",
            "mqtt://h?nope=1",
            "mqtt://h?no_subscribers=ok",
        ] {
            let u = super::super::url::parse(bad).unwrap();
            assert!(Settings::from_url(&u).is_err(), "{bad}");
        }
        let u = super::super::url::parse("mqtt://h").unwrap();
        let s = Settings::from_url(&u).unwrap();
        assert_eq!(s.topic.as_str(), DEFAULT_TOPIC);
        assert_eq!(s.no_subscribers, Some(ErrorKind::Unavailable));
        let u = super::super::url::parse("mqtt://h?no_subscribers=delivered").unwrap();
        assert_eq!(Settings::from_url(&u).unwrap().no_subscribers, None);
    }

    #[test]
    fn properties_carry_the_content_type() {
        let mut m = Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "created".into(),
            body: vec![0x00, 0xff, 0x80],
            content_type: "application/x-protobuf".into(),
            headers: [("traceparent".to_string(), "00-x-01".to_string())].into(),
            created_at: chrono::Utc::now(),
            attempt: 1,
        };
        let u = super::super::url::parse("mqtt://h?cloudevents=true").unwrap();
        let ce = Settings::from_url(&u).unwrap().cloudevents;
        let p = properties(&m, ce.as_ref());
        assert_eq!(p.content_type.as_deref(), Some("application/x-protobuf"));
        assert_eq!(p.payload_format_indicator, None, "the body is bytes");
        let names: Vec<_> = p.user_properties.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"type") && names.contains(&"traceparent"),
            "{names:?}"
        );
        assert!(!names.contains(&"datacontenttype"), "{names:?}");
        m.content_type = "application/json".into();
        let p = properties(&m, None);
        assert_eq!(p.content_type.as_deref(), Some("application/json"));
    }

    #[test]
    fn puback_codes() {
        let default = Some(ErrorKind::Unavailable);
        assert!(puback_result(PubAckReason::Success, default).is_ok());
        let e = puback_result(PubAckReason::NoMatchingSubscribers, default).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains("NoMatchingSubscribers"), "{e}");
        let permanent = Some(ErrorKind::Permanent);
        assert!(
            puback_result(PubAckReason::NoMatchingSubscribers, permanent)
                .unwrap_err()
                .is_permanent()
        );
        assert!(puback_result(PubAckReason::NoMatchingSubscribers, None).is_ok());
        assert!(puback_result(PubAckReason::TopicNameInvalid, default)
            .unwrap_err()
            .is_permanent());
        assert!(!puback_result(PubAckReason::QuotaExceeded, default)
            .unwrap_err()
            .is_permanent());
    }
}
