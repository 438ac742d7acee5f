//! `nats://` — NATS JetStream.
//!
//! ```text
//! nats://[user:password@]host:4222?stream=OUTBOX&subject=outbox.{aggregate_type}.{event_type}
//! ```
//!
//! Parameters: `stream` (default `OUTBOX`), `subject` (a [`Template`], default
//! `outbox.{aggregate_type}.{event_type}`), `create_stream` (default `true`: create the stream
//! when it is missing, with the subjects `<literal prefix of the template>.>`, file storage and a
//! two-minute duplicate window), `ack_timeout` (default `10s`), `connect_timeout` (default
//! `5s`). A user name without a password is sent as a token.
//!
//! TLS: `tls://host:4222` or `nats://host:4222?tls=true` (any `tls_*` parameter implies it),
//! with `tls_ca`, `tls_cert` and `tls_key` (see the `tls` module): the server's certificate
//! is verified against `tls_ca` (without it: the system roots), and the client certificate
//! is sent when the server asks for one (`verify: true` in its `tls {}` block).
//!
//! Every message carries `Nats-Msg-Id` = event id, so JetStream drops a re-sent event within
//! the stream's duplicate window, plus the `outbox-*` contract headers, `content-type` (the
//! event's content type: `application/json` for a JSON payload, e.g. `application/x-protobuf`
//! for bytes, which are sent as they are) and the user headers.
//! All messages go through one client connection, which keeps them in call order.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue};

use super::cloudevents::CloudEvents;
use super::message::CONTENT_TYPE_HEADER;
use super::tls::TlsFiles;
use super::url::{percent_decode, PublisherUrl};
use super::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher, Template};

const PARAMS: &[&str] = &[
    "stream",
    "subject",
    "create_stream",
    "ack_timeout",
    "connect_timeout",
    "cloudevents",
    "ce_source",
    "tls",
    "tls_ca",
    "tls_cert",
    "tls_key",
];
const DEFAULT_STREAM: &str = "OUTBOX";
const DEFAULT_SUBJECT: &str = "outbox.{aggregate_type}.{event_type}";
/// Longest subject we publish to. The server allows more, but a subject this long is a bug.
pub const MAX_SUBJECT_LEN: usize = 1024;
/// Duplicate window of a stream we create: how long JetStream remembers a `Nats-Msg-Id`.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// JetStream's own message-id header.
const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Publishes to a NATS JetStream stream and waits for the PubAck of every message.
pub struct NatsPublisher {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    /// Shared with every acknowledgement's future (for its error message), not copied.
    stream: Arc<str>,
    subject: Template,
    ack_timeout: Duration,
    /// The stream to (re)create when it is missing, if `create_stream` is on.
    stream_config: Option<jetstream::stream::Config>,
    redacted_url: String,
    /// `cloudevents=true`: CloudEvents NATS binding headers (`ce-id`, `ce-type`, ...).
    cloudevents: Option<CloudEvents>,
}

impl std::fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("url", &self.redacted_url)
            .field("stream", &self.stream)
            .field("subject", &self.subject.as_str())
            .finish_non_exhaustive()
    }
}

/// What the URL asks for, before any network traffic. (No `Debug`: it holds secrets.)
struct Settings {
    server: String,
    user: Option<String>,
    password: Option<String>,
    stream: String,
    subject: Template,
    create_stream: bool,
    ack_timeout: Duration,
    connect_timeout: Duration,
    cloudevents: Option<CloudEvents>,
    tls: Option<TlsFiles>,
}

impl Settings {
    fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        url.only_params(PARAMS)?;
        let stream = url.param("stream").unwrap_or(DEFAULT_STREAM).to_string();
        validate_stream_name(&stream).map_err(|reason| ConfigError::BadParam {
            name: "stream".into(),
            reason,
        })?;
        let subject = Template::parse(url.param("subject").unwrap_or(DEFAULT_SUBJECT))?;
        let create_stream = url.bool_param("create_stream", true)?;
        if create_stream {
            // Fail at start-up, not at the first publish, if we could not create the stream.
            stream_subjects(subject.as_str()).map_err(|reason| ConfigError::BadParam {
                name: "subject".into(),
                reason,
            })?;
        }
        let ack_timeout = url.duration_param("ack_timeout", Duration::from_secs(10))?;
        let connect_timeout = url.duration_param("connect_timeout", Duration::from_secs(5))?;
        let cloudevents = CloudEvents::from_url(url)?;
        let tls_on = url.scheme() == "tls"
            || url.bool_param("tls", false)?
            || super::tls::PARAMS.iter().any(|p| url.param(p).is_some());
        let tls = TlsFiles::from_url(url, tls_on, "tls://")?;

        let u = url.url();
        let host = u.host_str().ok_or_else(|| ConfigError::BadUrl {
            url: redacted(url),
            reason: "nats:// needs a host, e.g. nats://127.0.0.1:4222".into(),
        })?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let server = format!("nats://{host}:{}", u.port().unwrap_or(4222));
        let user = (!u.username().is_empty()).then(|| percent_decode(u.username()));
        let password = u.password().map(percent_decode);
        Ok(Self {
            server,
            user,
            password,
            stream,
            subject,
            create_stream,
            ack_timeout,
            connect_timeout,
            cloudevents,
            tls,
        })
    }
}

/// The URL as safe to print: no password, and no token (a user name without a password).
fn redacted(url: &PublisherUrl) -> String {
    let u = url.url();
    if u.password().is_none() && !u.username().is_empty() {
        let mut u = u.clone();
        let _ = u.set_username("***");
        return u.to_string();
    }
    url.redacted()
}

/// A client of `settings`' server, connected as the publisher connects (credentials, TLS,
/// time-outs).
async fn connect_client(
    settings: &Settings,
    redacted_url: &str,
) -> Result<async_nats::Client, PublishError> {
    let mut options = async_nats::ConnectOptions::new()
        .name("txoutbox")
        .connection_timeout(settings.connect_timeout)
        .request_timeout(Some(settings.ack_timeout))
        // Reconnect forever after the first connection; the relay waits out outages.
        .max_reconnects(None);
    match (&settings.user, &settings.password) {
        (Some(user), Some(password)) => {
            options = options.user_and_password(user.clone(), password.clone());
        }
        (Some(token), None) => options = options.token(token.clone()),
        _ => {}
    }
    if let Some(tls) = &settings.tls {
        options = options.require_tls(true);
        if let Some(ca) = &tls.ca_path {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &tls.client_paths {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
    }
    let cannot = |e: &dyn std::fmt::Display| {
        PublishError::unavailable(format!("NATS at {redacted_url}: cannot connect: {e}"))
    };
    // The address handed to the client holds no credentials, so no error text can leak them.
    let connect = options.connect(settings.server.as_str());
    match tokio::time::timeout(settings.connect_timeout * 2, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(cannot(&e)),
        Err(_) => Err(cannot(&format!(
            "timed out after {:?}",
            settings.connect_timeout * 2
        ))),
    }
}

/// What [`watch`] gives a watcher of a publisher.
#[derive(Debug)]
pub struct Watch {
    /// A plain client of the publisher's server, connected as the publisher connects.
    pub client: async_nats::Client,
    /// The subjects its messages go to (those of the stream it would create; `>` if its
    /// subject template has no literal first token).
    pub subjects: Vec<String>,
    /// The stream it publishes to (`stream`, default `OUTBOX`).
    pub stream: String,
}

/// For a watcher of what a publisher sends (the benchmark's latency at the broker, and its
/// drains, which empty the stream before each run): a plain client of the server of the
/// `nats://` or `tls://` publisher URL `url`, connected as that publisher connects
/// (credentials, TLS), with the subjects and the stream its messages go to.
pub async fn watch(url: &str) -> Result<Watch, ConnectError> {
    let url = super::url::parse(url)?;
    let settings = Settings::from_url(&url)?;
    let client = connect_client(&settings, &redacted(&url)).await?;
    let subjects =
        stream_subjects(settings.subject.as_str()).unwrap_or_else(|_| vec![">".to_string()]);
    Ok(Watch {
        client,
        subjects,
        stream: settings.stream,
    })
}

impl NatsPublisher {
    /// Connect, and create the stream if asked to and missing.
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let settings = Settings::from_url(url)?;
        let redacted_url = redacted(url);
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            PublishError::unavailable(format!("NATS at {redacted_url}: {what}: {e}"))
        };
        let client = connect_client(&settings, &redacted_url).await?;

        let jetstream = jetstream::ContextBuilder::new()
            .timeout(settings.ack_timeout)
            .build(client.clone());

        let stream_config = if settings.create_stream {
            let subjects = stream_subjects(settings.subject.as_str()).map_err(|reason| {
                ConfigError::BadParam {
                    name: "subject".into(),
                    reason,
                }
            })?;
            Some(jetstream::stream::Config {
                name: settings.stream.clone(),
                subjects,
                storage: jetstream::stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
        } else {
            None
        };
        ensure_stream(&jetstream, &settings.stream, stream_config.as_ref())
            .await
            .map_err(|e| unavailable("stream", &e))?;

        tracing::info!(
            url = %redacted_url,
            stream = %settings.stream,
            subject = %settings.subject.as_str(),
            max_payload = client.server_info().max_payload,
            "connected to NATS JetStream"
        );
        Ok(Self {
            client,
            jetstream,
            stream: Arc::from(settings.stream),
            subject: settings.subject,
            ack_timeout: settings.ack_timeout,
            stream_config,
            redacted_url,
            cloudevents: settings.cloudevents,
        })
    }

    /// The underlying client (e.g. for tests and diagnostics).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    fn unavailable_if_disconnected(&self, message: String) -> PublishError {
        if self.client.connection_state() == State::Connected {
            PublishError::transient(message)
        } else {
            PublishError::unavailable(format!("{message} (not connected to NATS)"))
        }
    }
}

#[async_trait::async_trait]
impl Publisher for NatsPublisher {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn destination(&self, message: &Message) -> Option<String> {
        Some(self.subject.render(message))
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let subject = self.subject.render(message);
        validate_subject(&subject).map_err(|reason| {
            PublishError::permanent(format!(
                "event {}: invalid NATS subject {subject:?}: {reason}",
                message.id
            ))
        })?;
        let max_payload = self.client.max_payload();
        if message.body.len() > max_payload {
            return Err(PublishError::permanent(format!(
                "event {}: body of {} bytes is larger than the server's max_payload of {max_payload} bytes",
                message.id,
                message.body.len()
            )));
        }
        let mut headers = headers(message)?;
        if let Some(ce) = &self.cloudevents {
            // The NATS protocol binding, binary mode: `ce-` headers; `datacontenttype` is the
            // `content-type` header every message has.
            for (name, value) in ce.attributes(message) {
                if name == "datacontenttype" {
                    continue;
                }
                let name = format!("ce-{name}");
                let value = HeaderValue::from_str(&value).map_err(|_| {
                    PublishError::permanent(format!(
                        "event {}: CloudEvents attribute {name} cannot be carried by NATS",
                        message.id
                    ))
                })?;
                headers.insert(name.as_str(), value);
            }
        }

        // Found by txoutbox-chaos: while reconnecting, async-nats buffers a publish and sends
        // it after the reconnect, possibly seconds later, when this relay has already given
        // the event up (ack timeout) and its lease may be held by another relay: a send
        // outside the lease, and a duplicate. So do not hand it over while disconnected.
        if self.client.connection_state() != State::Connected {
            return Err(PublishError::unavailable(format!(
                "event {}: not connected to NATS at {} (reconnecting); not sent",
                message.id, self.redacted_url
            )));
        }
        let ack = self
            .jetstream
            .publish_with_headers(subject, headers, message.body.clone().into())
            .await
            .map_err(|e| {
                // Rendered again for the message: no copy of it on the way that succeeds.
                let subject = self.subject.render(message);
                let what = format!("event {}: publishing to {subject:?}", message.id);
                match e.kind() {
                    PublishErrorKind::MaxPayloadExceeded => {
                        PublishError::permanent(format!("{what}: {e}"))
                    }
                    PublishErrorKind::TimedOut => PublishError::unavailable(format!(
                        "{what}: the client's outgoing buffer stayed full (NATS unreachable?)"
                    )),
                    _ => self.unavailable_if_disconnected(what),
                }
                .with_source(e)
            })?;

        let client = self.client.clone();
        let id = message.id;
        let stream = self.stream.clone();
        let ack_timeout = self.ack_timeout;
        // Counted from the send, not from the first poll: an ack awaited late (behind others)
        // must not get a fresh `ack_timeout` of its own.
        let deadline = tokio::time::Instant::now() + ack_timeout;
        Ok(Box::pin(async move {
            let res = tokio::time::timeout_at(deadline, ack).await;
            let connected = client.connection_state() == State::Connected;
            match res {
                Ok(Ok(_ack)) => Ok(()), // `duplicate: true` is a success too
                Ok(Err(e)) => Err(map_ack_error(id, &stream, e, connected)),
                Err(_) => Err(timeout_error(id, &stream, ack_timeout, connected)),
            }
        }))
    }

    async fn check(&self) -> Result<(), PublishError> {
        self.flush().await?;
        // A stream deleted under us makes every publish fail with "no responders":
        // re-create it (if we may), so waiting out the outage ends.
        ensure_stream(&self.jetstream, &self.stream, self.stream_config.as_ref())
            .await
            .map_err(|e| PublishError::unavailable(format!("NATS at {}: {e}", self.redacted_url)))
    }

    async fn close(&self) -> Result<(), PublishError> {
        self.flush().await
    }
}

impl NatsPublisher {
    async fn flush(&self) -> Result<(), PublishError> {
        match tokio::time::timeout(self.ack_timeout, self.client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PublishError::unavailable(format!(
                "NATS at {}: flush failed",
                self.redacted_url
            ))
            .with_source(e)),
            Err(_) => Err(PublishError::unavailable(format!(
                "NATS at {}: no answer within {:?} (state: {})",
                self.redacted_url,
                self.ack_timeout,
                self.client.connection_state()
            ))),
        }
    }
}

/// Make sure the stream exists: create it from `config` if given, else just look it up.
async fn ensure_stream(
    jetstream: &jetstream::Context,
    name: &str,
    config: Option<&jetstream::stream::Config>,
) -> Result<(), String> {
    match config {
        Some(config) => jetstream
            .get_or_create_stream(config.clone())
            .await
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "cannot get or create stream {name} (subjects {:?}): {e}",
                    config.subjects
                )
            }),
        None => jetstream
            .get_stream(name)
            .await
            .map(|_| ())
            .map_err(|e| format!("stream {name} is not usable (create_stream=false): {e}")),
    }
}

fn timeout_error(id: uuid::Uuid, stream: &str, after: Duration, connected: bool) -> PublishError {
    let msg = format!("event {id}: no PubAck from stream {stream} within {after:?}");
    if connected {
        PublishError::transient(msg)
    } else {
        PublishError::unavailable(format!("{msg} (not connected to NATS)"))
    }
}

/// Sort a failed PubAck into what the relay should do.
fn map_ack_error(
    id: uuid::Uuid,
    stream: &str,
    e: jetstream::context::PublishError,
    connected: bool,
) -> PublishError {
    let what = format!("event {id}: stream {stream} refused the message");
    let err = match e.kind() {
        PublishErrorKind::TimedOut => {
            return timeout_error(id, stream, Duration::ZERO, connected).with_source(e)
        }
        PublishErrorKind::StreamNotFound => PublishError::unavailable(format!(
            "event {id}: no JetStream stream answers for the subject (stream {stream} missing or not listening)"
        )),
        PublishErrorKind::BrokenPipe => {
            PublishError::unavailable(format!("event {id}: connection to NATS lost before the PubAck"))
        }
        PublishErrorKind::MaxPayloadExceeded => PublishError::permanent(what),
        PublishErrorKind::Other => {
            // JetStream API errors come as the source; some are about the message itself.
            let code = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<jetstream::Error>())
                .map(|j| j.error_code());
            match code {
                Some(c)
                    if c == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
                        || c == jetstream::ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM =>
                {
                    PublishError::permanent(what)
                }
                _ => PublishError::transient(what),
            }
        }
        _ => PublishError::transient(what),
    };
    err.with_source(e)
}

/// `Nats-Msg-Id`, the contract headers, then the user's headers (which cannot override the
/// first two kinds).
fn headers(m: &Message) -> Result<HeaderMap, PublishError> {
    let mut map = HeaderMap::new();
    map.insert(MSG_ID_HEADER, m.id.to_string().as_str());
    let contract = m.contract_headers();
    for (name, value) in &contract {
        let value = HeaderValue::from_str(value).map_err(|_| {
            PublishError::permanent(format!(
                "event {}: header {name}: value cannot be carried by NATS (contains CR or LF)",
                m.id
            ))
        })?;
        map.insert(*name, value);
    }
    let content_type = HeaderValue::from_str(&m.content_type).map_err(|_| {
        PublishError::permanent(format!(
            "event {}: content type {:?} cannot be carried by NATS (contains CR or LF)",
            m.id, m.content_type
        ))
    })?;
    map.insert(CONTENT_TYPE_HEADER, content_type);
    for (name, value) in &m.headers {
        let reserved = name.eq_ignore_ascii_case(MSG_ID_HEADER)
            || name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER)
            || contract.iter().any(|(c, _)| name.eq_ignore_ascii_case(c));
        if reserved {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a reserved header; dropped");
            continue;
        }
        let bad = |what: &str| {
            PublishError::permanent(format!(
                "event {}: header {name:?}: {what} cannot be carried by NATS",
                m.id
            ))
        };
        if name.is_empty() {
            return Err(bad("an empty name"));
        }
        let hname = HeaderName::from_str(name)
            .map_err(|_| bad("the name (only printable ASCII without ':')"))?;
        let hvalue =
            HeaderValue::from_str(value).map_err(|_| bad("the value (contains CR or LF)"))?;
        map.append(hname, hvalue);
    }
    Ok(map)
}

/// Is `subject` something we may publish to? Not empty, no empty tokens, no whitespace or
/// control characters, no wildcards, not longer than [`MAX_SUBJECT_LEN`].
pub fn validate_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is empty".into());
    }
    if subject.len() > MAX_SUBJECT_LEN {
        return Err(format!(
            "is {} bytes long, more than {MAX_SUBJECT_LEN}",
            subject.len()
        ));
    }
    if let Some(c) = subject
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "contains whitespace or a control character ({c:?})"
        ));
    }
    if subject.contains(['*', '>']) {
        return Err("contains a wildcard (`*` or `>`)".into());
    }
    if subject.split('.').any(str::is_empty) {
        return Err("has an empty token (leading, trailing or doubled `.`)".into());
    }
    Ok(())
}

/// The subjects of a stream created for `template`: its leading literal tokens plus `>`
/// (`outbox.{aggregate_type}.{event_type}` -> `outbox.>`), or the template itself if it has no
/// placeholder.
pub fn stream_subjects(template: &str) -> Result<Vec<String>, String> {
    let Some(brace) = template.find('{') else {
        validate_subject(template)?;
        return Ok(vec![template.to_string()]);
    };
    let literal = &template[..brace];
    let Some(dot) = literal.rfind('.') else {
        return Err(format!(
            "template {template:?} has no literal first token, so no stream subject can be derived; \
             create the stream yourself and set create_stream=false"
        ));
    };
    let prefix = &literal[..dot];
    validate_subject(prefix)
        .map_err(|r| format!("literal prefix {prefix:?} of the template {r}"))?;
    Ok(vec![format!("{prefix}.>")])
}

/// JetStream stream names: not empty, no whitespace, `.`, `*`, `>`, path separators.
fn validate_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("stream name is empty".into());
    }
    if name.len() > 255 {
        return Err("stream name is longer than 255 bytes".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!("stream name {name:?} contains {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
