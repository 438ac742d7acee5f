//! `http://` and `https://` — webhooks, signed per the Standard Webhooks convention.
//!
//! ```text
//! https://hooks.example.com/outbox?token=abc&timeout=10s&secret_file=/run/secrets/webhook
//! ```
//!
//! The URL is the endpoint, minus the parameters txoutbox reads itself: `timeout` (per request,
//! default `10s`), `secret_file` (a file holding the signing secret), `secret_encoding` (below),
//! `unavailable_status`
//! (below), `cloudevents` and `ce_source`, and for `https://` the TLS parameters `tls_ca` (trust this CA instead of the
//! built-in web roots), `tls_cert` and `tls_key` (a client certificate, for mutual TLS). Every
//! other query parameter stays on the endpoint.
//!
//! Each event is one `POST` of the body as it is, its `content-type` the event's content type
//! (`application/json` for a JSON payload, e.g. `application/x-protobuf` for bytes), with the
//! `outbox-*` contract headers, the user headers, and the Standard Webhooks headers
//! `webhook-id` (the event id: the same on every retry, for the receiver's dedup),
//! `webhook-timestamp` (unix seconds) and `webhook-signature`
//! (`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`). The secret comes from
//! `secret_file` or else the environment variable `TXOUTBOX_WEBHOOK_SECRET`. As the convention
//! (and its official libraries) has it, a secret is base64, with or without the `whsec_` prefix:
//! the same secret string verifies on the receiver. `secret_encoding=raw` takes the text itself
//! as the key instead (for receivers that use a plain-text key); without a secret nothing is
//! signed. With
//! `cloudevents=true` the request also carries the CloudEvents HTTP binary-mode headers
//! `ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`, `ce-time`.
//!
//! An event is delivered when the endpoint answers 2xx. 408, 429 and 5xx are transient (with
//! `Retry-After` kept on the error). 401, 403 and 404 are *unavailable*: they say that nobody
//! can take the event right now (an expired credential, a route missing during a deploy), not
//! that it can never be delivered, so they are retried without using up `max_attempts` and an
//! outage does not turn every event into a dead letter. `unavailable_status` chooses which 4xx
//! answers are taken so: a comma-separated list of 4xx codes (default `401,403,404`), or `none`
//! (every 4xx permanent). Other answers (4xx such as 400, 413 or 422, and 3xx: redirects are
//! not followed) are permanent. A failed connection is *unavailable*; a request that got no answer within
//! `timeout` is transient. All requests share one client and its pool of keep-alive
//! connections; requests overlap, so only the relay's ordered mode (one event of an aggregate
//! in flight at a time) keeps an aggregate's order.

use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use sha2::Sha256;

use super::cloudevents::CloudEvents;
use super::tls::TlsFiles;
use super::url::PublisherUrl;
use super::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher};

/// Parameters txoutbox takes off the endpoint URL.
const PARAMS: &[&str] = &[
    "timeout",
    "secret_file",
    "secret_encoding",
    "unavailable_status",
    "cloudevents",
    "ce_source",
    "tls_ca",
    "tls_cert",
    "tls_key",
];
/// Where the signing secret comes from when `secret_file` is not given.
pub const SECRET_ENV: &str = "TXOUTBOX_WEBHOOK_SECRET";
/// Prefix of a base64-encoded secret (Standard Webhooks).
const SECRET_PREFIX: &str = "whsec_";
/// 4xx answers that mean "nobody can take this right now" unless the URL says otherwise.
const UNAVAILABLE_STATUS: &[u16] = &[401, 403, 404];
/// Longest part of an error response body quoted in an error message.
const BODY_EXCERPT: usize = 200;
/// Headers a user header may not set.
const RESERVED: &[&str] = &[
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "host",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

/// POSTs every event to one endpoint.
pub struct HttpPublisher {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    /// The endpoint as safe to print: no password and no query (it may hold a token).
    shown: String,
    secret: Option<Vec<u8>>,
    cloudevents: Option<CloudEvents>,
    timeout: Duration,
    /// 4xx answers that are *unavailable* rather than permanent.
    unavailable_status: Vec<u16>,
}

impl std::fmt::Debug for HttpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPublisher")
            .field("endpoint", &self.shown)
            .field("signed", &self.secret.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpPublisher {
    /// Check the URL, read the secret and build the client (no request is made).
    pub fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        let u = url.url();
        if u.host_str().unwrap_or_default().is_empty() {
            return Err(ConfigError::BadUrl {
                url: url.redacted(),
                reason: "needs a host, e.g. https://hooks.example.com/outbox".into(),
            }
            .into());
        }
        let timeout = url.duration_param("timeout", Duration::from_secs(10))?;
        let unavailable_status = match url.param("unavailable_status") {
            None => UNAVAILABLE_STATUS.to_vec(),
            Some(v) => parse_status_list(v).map_err(|reason| ConfigError::BadParam {
                name: "unavailable_status".into(),
                reason,
            })?,
        };
        let encoding = match url.param("secret_encoding") {
            None => SecretEncoding::Base64,
            Some(v) => SecretEncoding::parse(v).ok_or_else(|| ConfigError::BadParam {
                name: "secret_encoding".into(),
                reason: format!("{v:?} is not base64 or raw"),
            })?,
        };
        let secret =
            match url.param("secret_file") {
                Some(path) => Some(read_secret_file(path, encoding)?),
                None => match std::env::var(SECRET_ENV) {
                    Ok(s) => Some(decode_secret(&s, encoding).map_err(|reason| {
                        ConfigError::BadParam {
                            name: SECRET_ENV.into(),
                            reason,
                        }
                    })?),
                    Err(_) if url.param("secret_encoding").is_some() => {
                        return Err(ConfigError::BadParam {
                            name: "secret_encoding".into(),
                            reason: format!(
                                "given, but there is no secret (secret_file or {SECRET_ENV})"
                            ),
                        }
                        .into())
                    }
                    Err(_) => None,
                },
            };
        let cloudevents = CloudEvents::from_url(url)?;
        let endpoint = endpoint(u);
        let mut shown = endpoint.clone();
        shown.set_query(None);
        let shown = crate::redact::redact_url(shown.as_str());
        if secret.is_none() {
            tracing::warn!(endpoint = %shown, "no webhook secret ({SECRET_ENV} or secret_file): requests are not signed");
        }
        let tls = TlsFiles::from_url(url, url.scheme() == "https", "https://")?;
        let builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("txoutbox/", env!("CARGO_PKG_VERSION")))
            // Always ours, also for `http://`: reqwest is built without a crypto provider of
            // its own and would otherwise look for the process's default.
            .tls_backend_preconfigured(tls_config(tls.as_ref())?);
        let client = builder.build().map_err(|e| {
            PublishError::unavailable("cannot build the HTTP client").with_source(e)
        })?;
        Ok(Self {
            client,
            endpoint,
            shown,
            secret,
            cloudevents,
            timeout,
            unavailable_status,
        })
    }

    /// The request headers of one event, or a permanent error if one cannot be sent.
    fn headers(&self, m: &Message, timestamp: i64) -> Result<HeaderMap, PublishError> {
        let mut map = HeaderMap::new();
        let mut put = |name: &str, value: &str| -> Result<(), PublishError> {
            let bad = |what: &str| {
                PublishError::permanent(format!(
                    "event {}: header {name:?}: {what} cannot be sent in HTTP",
                    m.id
                ))
            };
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("the name"))?;
            let v = HeaderValue::from_str(value).map_err(|_| bad("the value"))?;
            map.insert(n, v);
            Ok(())
        };
        put(CONTENT_TYPE.as_str(), &m.content_type)?;
        let id = m.id.to_string();
        put("webhook-id", &id)?;
        put("webhook-timestamp", &timestamp.to_string())?;
        if let Some(secret) = &self.secret {
            put("webhook-signature", &sign(secret, &id, timestamp, &m.body))?;
        }
        let contract = m.contract_headers();
        for (name, value) in &contract {
            put(name, value)?;
        }
        let mut ce_names = Vec::new();
        if let Some(ce) = &self.cloudevents {
            for (name, value) in ce.attributes(m) {
                // `datacontenttype` travels as `content-type` (the message's), set above.
                if name != "datacontenttype" {
                    let name = format!("ce-{name}");
                    put(&name, &value)?;
                    ce_names.push(name);
                }
            }
        }
        for (name, value) in &m.headers {
            let reserved = RESERVED.iter().any(|r| name.eq_ignore_ascii_case(r))
                || contract.iter().any(|(c, _)| name.eq_ignore_ascii_case(c))
                || ce_names.iter().any(|c| name.eq_ignore_ascii_case(c));
            if reserved {
                tracing::debug!(event = %m.id, header = %name, "user header shadows a reserved header; dropped");
                continue;
            }
            put(name, value)?;
        }
        Ok(map)
    }
}

/// The client's TLS, with ring: the roots are `tls_ca`'s certificates if given, else the
/// Mozilla roots built in (webpki-roots); `tls_cert` + `tls_key` become the client identity.
fn tls_config(tls: Option<&TlsFiles>) -> Result<rustls::ClientConfig, ConnectError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    // The errors name the parameter, never the content.
    let bad = |name: &str, what: &str| ConfigError::BadParam {
        name: name.into(),
        reason: format!("not a usable {what}"),
    };
    let mut roots = rustls::RootCertStore::empty();
    match tls.and_then(|t| t.ca.as_deref()) {
        Some(ca) => {
            let certs = CertificateDer::pem_slice_iter(ca)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad("tls_ca", "PEM certificate bundle"))?;
            if certs.is_empty() {
                return Err(bad("tls_ca", "PEM certificate bundle (no certificate in it)").into());
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|_| bad("tls_ca", "PEM certificate bundle"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    // ring, named here: the process may hold more than one rustls provider, and then none is
    // the default.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            PublishError::unavailable("cannot set up the HTTP client's TLS").with_source(e)
        })?
        .with_root_certificates(roots);
    let mut config = match tls.and_then(|t| t.client.as_ref()) {
        Some((cert, key)) => {
            let pair = "PEM certificate and key (tls_cert, tls_key)";
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad("tls_cert", pair))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| bad("tls_key", pair))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|_| bad("tls_cert", pair))?
        }
        None => builder.with_no_client_auth(),
    };
    // HTTP/1.1 only (reqwest is built without HTTP/2), as reqwest asks for it itself.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The URL without txoutbox's own parameters (the others keep their order).
fn endpoint(u: &url::Url) -> url::Url {
    let kept: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| !PARAMS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut out = u.clone();
    out.set_query(None);
    if !kept.is_empty() {
        out.query_pairs_mut().extend_pairs(kept);
    }
    out
}

fn read_secret_file(path: &str, encoding: SecretEncoding) -> Result<Vec<u8>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::BadParam {
        name: "secret_file".into(),
        reason: format!("cannot read {path:?}: {e}"),
    })?;
    decode_secret(&text, encoding).map_err(|reason| ConfigError::BadParam {
        name: "secret_file".into(),
        reason: format!("{path:?}: {reason}"),
    })
}

/// How the text of a webhook secret becomes the HMAC key (`secret_encoding=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecretEncoding {
    /// Standard Webhooks: base64, with or without the `whsec_` prefix (the default; what the
    /// convention's libraries do with the same string).
    #[default]
    Base64,
    /// The text itself is the key (`secret_encoding=raw`).
    Raw,
}

impl SecretEncoding {
    fn parse(v: &str) -> Option<Self> {
        match v {
            "base64" => Some(Self::Base64),
            "raw" => Some(Self::Raw),
            _ => None,
        }
    }
}

/// The key bytes of a secret (surrounding whitespace, such as a file's trailing newline, is
/// not part of it). The secret is never quoted in errors.
pub fn decode_secret(text: &str, encoding: SecretEncoding) -> Result<Vec<u8>, String> {
    let text = text.trim();
    let key = match encoding {
        SecretEncoding::Raw => text.as_bytes().to_vec(),
        SecretEncoding::Base64 => {
            let b64 = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| {
                    format!(
                        "the secret is not base64 (Standard Webhooks secrets are base64, with or \
                         without {SECRET_PREFIX}); to use the text itself as the key, add \
                         secret_encoding=raw to the URL"
                    )
                })?
        }
    };
    if key.is_empty() {
        return Err("the secret is empty".into());
    }
    Ok(key)
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!("v1,{sig}")
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .ok()
}

/// `none`, or a comma-separated list of 4xx status codes.
fn parse_status_list(v: &str) -> Result<Vec<u16>, String> {
    if v.trim() == "none" {
        return Ok(Vec::new());
    }
    v.split(',')
        .map(|code| match code.trim().parse::<u16>() {
            Ok(c) if (400..500).contains(&c) => Ok(c),
            _ => Err(format!(
                "{v:?}: expected a comma-separated list of 4xx status codes (e.g. 401,403,404), \
                 or `none`"
            )),
        })
        .collect()
}

/// What the relay should do with this answer.
async fn settle(
    id: uuid::Uuid,
    shown: &str,
    unavailable_status: &[u16],
    resp: reqwest::Response,
) -> Result<(), PublishError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let after = retry_after(resp.headers());
    let excerpt = body_excerpt(resp).await;
    let what = format!("event {id}: {shown} answered {status}{excerpt}");
    let code = status.as_u16();
    let err = if code == 408 || code == 429 || status.is_server_error() {
        PublishError::transient(what)
    } else if unavailable_status.contains(&code) {
        PublishError::unavailable(format!(
            "{what} (nobody takes the event right now: retried without counting towards \
             max_attempts; set unavailable_status to change this)"
        ))
    } else if status.is_redirection() {
        PublishError::permanent(format!(
            "{what} (redirects are not followed: use the final URL)"
        ))
    } else if status.is_client_error() {
        PublishError::permanent(what)
    } else {
        PublishError::transient(what)
    };
    Err(match after {
        Some(d) => err.with_retry_after(d),
        None => err,
    })
}

/// `: <start of the body>` for error messages, or nothing.
async fn body_excerpt(mut resp: reqwest::Response) -> String {
    let mut buf = Vec::new();
    while buf.len() < BODY_EXCERPT {
        match resp.chunk().await {
            Ok(Some(c)) => buf.extend_from_slice(&c),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&buf[..buf.len().min(BODY_EXCERPT)]);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Did the TLS layer fail? rustls reports its errors (a fatal alert from the server, a bad
/// certificate) as `io::Error`s of kind `InvalidData` under reqwest's error.
fn tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::InvalidData {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// A failed request (no answer): unavailable if we could not connect or the TLS session
/// failed, else transient.
fn request_error(
    id: uuid::Uuid,
    shown: &str,
    timeout: Duration,
    e: reqwest::Error,
) -> PublishError {
    // `without_url`: the URL may hold a password or a token.
    let e = e.without_url();
    if e.is_connect() {
        PublishError::unavailable(format!("event {id}: cannot connect to {shown}")).with_source(e)
    } else if tls_failure(&e) {
        // E.g. the server refused our client certificate after the handshake (TLS 1.3 says so
        // with the first read): every request fails alike, so do not spend attempts on it.
        PublishError::unavailable(format!("event {id}: TLS session with {shown} failed"))
            .with_source(e)
    } else if e.is_timeout() {
        PublishError::transient(format!(
            "event {id}: no answer from {shown} within {timeout:?}"
        ))
        .with_source(e)
    } else {
        PublishError::transient(format!("event {id}: request to {shown} failed")).with_source(e)
    }
}

#[async_trait::async_trait]
impl Publisher for HttpPublisher {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn destination(&self, _message: &Message) -> Option<String> {
        // Scheme, host and port only: webhook URLs often carry their token in the path
        // (Slack, Discord), and the destination goes to the trace backend.
        let u = &self.endpoint;
        let host = u.host_str().unwrap_or_default();
        Some(match u.port() {
            Some(port) => format!("{}://{host}:{port}", u.scheme()),
            None => format!("{}://{host}", u.scheme()),
        })
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let headers = self.headers(message, chrono::Utc::now().timestamp())?;
        let request = self
            .client
            .post(self.endpoint.clone())
            .headers(headers)
            .body(message.body.clone());
        let (id, shown, timeout) = (message.id, self.shown.clone(), self.timeout);
        let unavailable_status = self.unavailable_status.clone();
        // Start the request now; the ack waits for its answer.
        let task = tokio::spawn(async move {
            match request.send().await {
                Ok(resp) => settle(id, &shown, &unavailable_status, resp).await,
                Err(e) => Err(request_error(id, &shown, timeout, e)),
            }
        });
        Ok(Box::pin(async move {
            task.await.unwrap_or_else(|e| {
                Err(
                    PublishError::transient(format!("event {id}: request task failed"))
                        .with_source(e),
                )
            })
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
