//! `redis://` — Redis Streams (`XADD`).
//!
//! ```text
//! redis://[user:password@]127.0.0.1:6379[/db]?stream=outbox.{aggregate_type}&maxlen=100000
//! ```
//!
//! Parameters: `stream` (a [`Template`] for the stream key, default `outbox.{aggregate_type}`),
//! `maxlen` (trim each stream to about this many entries: `XADD ... MAXLEN ~ N`; default: no
//! trimming), `connect_timeout` (default `5s`), `ack_timeout` (how long to wait for the reply to
//! one `XADD`, default `10s`), `cloudevents` and `ce_source` (see below).
//!
//! TLS: `rediss://host:6380`, with `tls_ca` (the CA to verify the server with; default: the
//! system's roots), `tls_cert` and `tls_key` (a client certificate, for `tls-auth-clients yes`).
//!
//! Each event becomes one stream entry with the fields `id` (the event id), `payload` (the
//! body, as it is: JSON or the bytes the event was written with), the `outbox-*` contract
//! headers, `content-type` (the event's content type: `application/json` for a JSON payload,
//! e.g. `application/x-protobuf` for bytes) and the user headers (a user header named like one
//! of those is dropped). With `cloudevents=true` the entry also carries the CloudEvents
//! attributes as `ce_specversion`, `ce_id`, `ce_source`, `ce_type`, `ce_subject`, `ce_time`
//! and `ce_datacontenttype` (the same content type).
//!
//! The [`Ack`] resolves with the reply to the `XADD` (the new entry id), so an event counts as
//! delivered once Redis has appended it (to memory: durability is the server's `appendfsync`
//! setting). Redis has no dedup of its own: a re-sent event is a second entry with the same
//! `id` field, which consumers must skip.
//!
//! All commands go through one multiplexed connection, in call order, pipelined (the next
//! `XADD` is written before the previous reply arrives). A broken connection is re-opened on
//! the next `send`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use redis::aio::MultiplexedConnection;
use tokio::sync::Mutex;

use super::cloudevents::{self, CloudEvents};
use super::tls::TlsFiles;
use super::url::PublisherUrl;
use super::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher, Template};

const PARAMS: &[&str] = &[
    "stream",
    "maxlen",
    "connect_timeout",
    "ack_timeout",
    "cloudevents",
    "ce_source",
    "tls_ca",
    "tls_cert",
    "tls_key",
];
const DEFAULT_STREAM: &str = "outbox.{aggregate_type}";
/// The entry field that holds the event id, for consumers' dedup.
pub const ID_FIELD: &str = "id";
/// The entry field that holds the body.
pub const PAYLOAD_FIELD: &str = "payload";
/// The entry field that holds the body's content type.
pub const CONTENT_TYPE_FIELD: &str = super::message::CONTENT_TYPE_HEADER;

/// Appends every event to a Redis stream and waits for the reply of each `XADD`.
pub struct RedisPublisher {
    client: redis::Client,
    config: redis::AsyncConnectionConfig,
    stream: Template,
    maxlen: Option<u64>,
    ack_timeout: Duration,
    cloudevents: Option<CloudEvents>,
    redacted_url: String,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("url", &self.redacted_url)
            .field("stream", &self.stream.as_str())
            .field("maxlen", &self.maxlen)
            .finish_non_exhaustive()
    }
}

/// The connection, and whether a command on it failed in a way that means it is dead.
struct Link {
    connection: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

struct Settings {
    stream: Template,
    maxlen: Option<u64>,
    connect_timeout: Duration,
    ack_timeout: Duration,
    cloudevents: Option<CloudEvents>,
    tls: Option<TlsFiles>,
}

impl Settings {
    fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        debug_assert!(cloudevents::PARAMS.iter().all(|p| PARAMS.contains(p)));
        url.only_params(PARAMS)?;
        let stream = Template::parse(url.param("stream").unwrap_or(DEFAULT_STREAM))?;
        let maxlen = match url.param("maxlen") {
            None => None,
            Some(_) => {
                let n: u64 = url.parse_param("maxlen", 0)?;
                if n == 0 {
                    return Err(ConfigError::BadParam {
                        name: "maxlen".into(),
                        reason: "must be at least 1 (leave it out to keep every entry)".into(),
                    });
                }
                Some(n)
            }
        };
        if url.url().host_str().unwrap_or_default().is_empty() {
            return Err(ConfigError::BadUrl {
                url: url.redacted(),
                reason: "redis:// needs a host, e.g. redis://127.0.0.1:6379".into(),
            });
        }
        let tls = TlsFiles::from_url(url, url.scheme() == "rediss", "rediss://")?;
        Ok(Self {
            stream,
            maxlen,
            connect_timeout: url.duration_param("connect_timeout", Duration::from_secs(5))?,
            ack_timeout: url.duration_param("ack_timeout", Duration::from_secs(10))?,
            cloudevents: CloudEvents::from_url(url)?,
            tls,
        })
    }
}

impl RedisPublisher {
    /// Check the URL and open the connection.
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let redacted_url = url.redacted();
        // The redis crate reads host, port, user, password and `/db` from the URL; our own
        // parameters are not for it.
        // `rediss://` makes it a TLS connection.
        let opened = match &settings.tls {
            Some(tls) if tls.ca.is_some() || tls.client.is_some() => redis::Client::build_with_tls(
                url.base().as_str(),
                redis::TlsCertificates {
                    client_tls: tls
                        .client
                        .as_ref()
                        .map(|(cert, key)| redis::ClientTlsConfig {
                            client_cert: cert.clone(),
                            client_key: key.clone(),
                        }),
                    root_cert: tls.ca.clone(),
                },
            ),
            _ => redis::Client::open(url.base().as_str()),
        };
        let client = opened.map_err(|e| ConfigError::BadUrl {
            url: redacted_url.clone(),
            // Its parse errors never quote the URL (nor a certificate or key).
            reason: e.to_string(),
        })?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(settings.connect_timeout)
            .set_response_timeout(settings.ack_timeout);
        let publisher = Self {
            client,
            config,
            stream: settings.stream,
            maxlen: settings.maxlen,
            ack_timeout: settings.ack_timeout,
            cloudevents: settings.cloudevents,
            redacted_url,
            link: Mutex::new(None),
        };
        let link = publisher.open_link().await?;
        tracing::info!(url = %publisher.redacted_url, stream = %publisher.stream.as_str(), "connected to Redis");
        *publisher.link.lock().await = Some(link);
        Ok(publisher)
    }

    async fn open_link(&self) -> Result<Link, PublishError> {
        // Both limits are also set in `config`; this one covers the handshake (AUTH, SELECT).
        let limit = self.config_connect_limit();
        let connecting = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config);
        match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(connection)) => Ok(Link {
                connection,
                broken: Arc::new(AtomicBool::new(false)),
            }),
            Ok(Err(e)) => Err(PublishError::unavailable(format!(
                "Redis at {}: cannot connect: {}",
                self.redacted_url,
                describe(&e)
            ))),
            Err(_) => Err(PublishError::unavailable(format!(
                "Redis at {}: cannot connect: timed out after {limit:?}",
                self.redacted_url
            ))),
        }
    }

    fn config_connect_limit(&self) -> Duration {
        self.ack_timeout.max(Duration::from_secs(1)) + Duration::from_secs(1)
    }

    /// A live connection: the current one, or a new one if it broke.
    async fn connection(
        &self,
        slot: &mut Option<Link>,
    ) -> Result<(MultiplexedConnection, Arc<AtomicBool>), PublishError> {
        if let Some(link) = slot.as_ref() {
            if !link.broken.load(Ordering::Acquire) {
                return Ok((link.connection.clone(), link.broken.clone()));
            }
            tracing::info!(url = %self.redacted_url, "Redis connection lost; reconnecting");
            *slot = None;
        }
        let link = self.open_link().await?;
        let out = (link.connection.clone(), link.broken.clone());
        *slot = Some(link);
        Ok(out)
    }

    fn xadd(&self, stream: &str, m: &Message) -> redis::Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream);
        if let Some(n) = self.maxlen {
            cmd.arg("MAXLEN").arg("~").arg(n);
        }
        cmd.arg("*");
        for (name, value) in fields(m, self.cloudevents.as_ref()) {
            cmd.arg(name).arg(value);
        }
        cmd
    }
}

/// The entry's fields in order: `id`, `payload` (the body's bytes), contract headers,
/// `content-type`, CloudEvents attributes, then the user headers that do not clash with any of
/// those.
fn fields(m: &Message, ce: Option<&CloudEvents>) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = vec![
        (ID_FIELD.into(), m.id.to_string().into_bytes()),
        (PAYLOAD_FIELD.into(), m.body.clone()),
    ];
    for (name, value) in m.contract_headers() {
        out.push((name.into(), value.into_bytes()));
    }
    out.push((
        CONTENT_TYPE_FIELD.into(),
        m.content_type.clone().into_bytes(),
    ));
    if let Some(ce) = ce {
        for (name, value) in ce.attributes(m) {
            out.push((format!("ce_{name}"), value.into_bytes()));
        }
    }
    let reserved = out.len();
    for (name, value) in &m.headers {
        if out[..reserved]
            .iter()
            .any(|(r, _)| r.eq_ignore_ascii_case(name))
        {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a reserved field; dropped");
            continue;
        }
        out.push((name.clone(), value.clone().into_bytes()));
    }
    out
}

/// A redis error as text. (They never contain the URL or the password.)
fn describe(e: &redis::RedisError) -> String {
    e.to_string()
}

/// Sort a failed `XADD` into what the relay should do.
fn classify(id: uuid::Uuid, stream: &str, e: &redis::RedisError) -> PublishError {
    let what = format!("event {id}: XADD to stream {stream:?}: {}", describe(e));
    if e.code() == Some("WRONGTYPE") {
        return PublishError::permanent(format!("{what} (the key exists and is not a stream)"));
    }
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
    {
        return PublishError::unavailable(what);
    }
    match e.code() {
        // The server is up but cannot take writes right now.
        Some("OOM" | "LOADING" | "BUSY" | "MASTERDOWN" | "READONLY" | "TRYAGAIN" | "NOAUTH") => {
            PublishError::unavailable(what)
        }
        _ => PublishError::transient(what),
    }
}

#[async_trait::async_trait]
impl Publisher for RedisPublisher {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn destination(&self, message: &Message) -> Option<String> {
        Some(self.stream.render(message))
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let stream = self.stream.render(message);
        if stream.is_empty() {
            return Err(PublishError::permanent(format!(
                "event {}: stream template {:?} renders an empty key",
                message.id,
                self.stream.as_str()
            )));
        }
        let cmd = self.xadd(&stream, message);
        // Hold the lock while the command is queued, so that concurrent sends keep call order.
        let mut slot = self.link.lock().await;
        let (mut connection, broken) = self.connection(&mut slot).await?;
        let mut reply = async move { connection.send_packed_command(&cmd).await }.boxed();
        // The first poll queues the command on the connection (in call order, as `send` is
        // awaited before the next one); the rest of the future waits for the reply.
        let first = futures::poll!(&mut reply);
        drop(slot);
        let id = message.id;
        let done = move |res: redis::RedisResult<redis::Value>| match res {
            Ok(redis::Value::ServerError(e)) => {
                let e: redis::RedisError = e.into();
                Err(classify(id, &stream, &e))
            }
            Ok(_entry_id) => Ok(()),
            Err(e) => {
                let err = classify(id, &stream, &e);
                if err.kind() == super::ErrorKind::Unavailable {
                    broken.store(true, Ordering::Release);
                }
                Err(err)
            }
        };
        Ok(match first {
            Poll::Ready(res) => super::ready_ack(done(res)),
            Poll::Pending => Box::pin(async move { done(reply.await) }),
        })
    }

    async fn check(&self) -> Result<(), PublishError> {
        let (mut connection, broken) = {
            let mut slot = self.link.lock().await;
            self.connection(&mut slot).await?
        };
        let pong: redis::RedisResult<String> =
            redis::cmd("PING").query_async(&mut connection).await;
        pong.map(|_| ()).map_err(|e| {
            broken.store(true, Ordering::Release);
            PublishError::unavailable(format!(
                "Redis at {}: PING failed: {}",
                self.redacted_url,
                describe(&e)
            ))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn msg() -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: [
                ("traceparent".to_string(), "00-abc-01".to_string()),
                ("id".to_string(), "forged".to_string()),
            ]
            .into_iter()
            .collect(),
            created_at: chrono::Utc::now(),
            attempt: 1,
        }
    }

    #[test]
    fn settings_from_url() {
        let u = super::super::url::parse("redis://h?stream=s.{event_type}&maxlen=10").unwrap();
        let s = Settings::from_url(&u).unwrap();
        assert_eq!(s.stream.as_str(), "s.{event_type}");
        assert_eq!(s.maxlen, Some(10));
        let s = Settings::from_url(&super::super::url::parse("redis://h").unwrap()).unwrap();
        assert_eq!(s.stream.as_str(), DEFAULT_STREAM);
        assert_eq!(s.maxlen, None);
        assert!(s.cloudevents.is_none());
        for bad in [
            "redis://h?strem=x",
            "redis://h?maxlen=0",
            "redis://h?maxlen=-1",
            "redis://h?stream={nope}",
            "redis://h?ack_timeout=soon",
            "redis://h?ce_source=x",
        ] {
            let u = super::super::url::parse(bad).unwrap();
            assert!(Settings::from_url(&u).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn fields_carry_the_contract() {
        let f = fields(&msg(), None);
        let get = |n: &str| {
            f.iter()
                .filter(|(k, _)| k == n)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(get("id"), [uuid::Uuid::nil().to_string()]);
        assert_eq!(get("payload"), ["{}"]);
        assert_eq!(get("outbox-event-type"), ["created"]);
        assert_eq!(get("traceparent"), ["00-abc-01"]);
        assert!(get("ce_id").is_empty());
        let ce =
            CloudEvents::from_url(&super::super::url::parse("redis://h?cloudevents=1").unwrap())
                .unwrap();
        let f = fields(&msg(), ce.as_ref());
        assert!(f.iter().any(|(k, v)| k == "ce_specversion" && v == b"1.0"));
    }

    #[test]
    fn byte_bodies_are_written_as_they_are() {
        let mut m = msg();
        let body = vec![0x08, 0x96, 0x01, 0x00, 0xff, 0x80];
        m.body = body.clone();
        m.content_type = "application/x-protobuf".into();
        m.headers.insert("Content-Type".into(), "text/plain".into());
        let ce =
            CloudEvents::from_url(&super::super::url::parse("redis://h?cloudevents=1").unwrap())
                .unwrap();
        let f = fields(&m, ce.as_ref());
        let get = |n: &str| {
            f.iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(get(PAYLOAD_FIELD), [body]);
        assert_eq!(
            get(CONTENT_TYPE_FIELD),
            [b"application/x-protobuf".to_vec()]
        );
        assert_eq!(
            get("ce_datacontenttype"),
            [b"application/x-protobuf".to_vec()]
        );
        let f = fields(&msg(), None);
        assert!(f
            .iter()
            .any(|(k, v)| k == CONTENT_TYPE_FIELD && v == b"application/json"));
    }
}
