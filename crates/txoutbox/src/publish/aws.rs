//! What the `sqs` and `sns` publishers share: the SDK configuration (region, endpoint,
//! credentials from the standard chain, HTTPS through rustls with ring), message attributes
//! within the services' limit of 10, the message group id, error classification, and the
//! sender task that sends up to 10 messages a call and settles each one's [`Ack`] from its own
//! entry in the answer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use tokio::sync::{mpsc, oneshot};

use super::cloudevents::CloudEvents;
use super::url::PublisherUrl;
use super::{Ack, ConfigError, ErrorKind, Message, PublishError};

/// The URL parameters both publishers take (the CloudEvents ones included).
pub(crate) const PARAMS: &[&str] = &[
    "region",
    "endpoint",
    "timeout",
    "max_message_bytes",
    "cloudevents",
    "ce_source",
];
/// The CloudEvents parameters are among [`PARAMS`] (the test `params_include_cloudevents`).
const _: &[&str] = super::cloudevents::PARAMS;
/// Entries in one `SendMessageBatch` or `PublishBatch` call.
pub const MAX_BATCH: usize = 10;
/// Message attributes one SQS message or SNS notification may carry.
pub const MAX_ATTRIBUTES: usize = 10;
/// The attribute that carries, as a JSON object, the headers that do not fit in (or cannot
/// be) attributes of their own.
pub const OVERFLOW_ATTRIBUTE: &str = "outbox-headers";
/// The attribute that carries the body's content type (`application/json` for a JSON payload,
/// e.g. `application/x-protobuf` for bytes); every message has it.
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content-type";
/// The attribute that says the body was sent base64-encoded: its value is
/// [`BASE64_ENCODING`]. Message bodies are text, so a body that is not textual (by its
/// content type) or not text the services take goes as base64; consumers decode it when the
/// attribute is there.
pub const ENCODING_ATTRIBUTE: &str = "content-transfer-encoding";
/// The value of [`ENCODING_ATTRIBUTE`]: standard base64 with padding.
pub const BASE64_ENCODING: &str = "base64";
/// The largest message by default: SNS's limit and SQS's long-standing one (256 KiB), body and
/// attributes together.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// SQS's current limit, the largest `max_message_bytes` accepted.
pub const LIMIT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Longest message group id the services accept.
const MAX_GROUP_ID: usize = 128;

/// The settings of the URL that both publishers share.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub timeout: Duration,
    pub max_message_bytes: usize,
    pub cloudevents: Option<CloudEvents>,
}

impl Common {
    pub(crate) fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        let region = url.param("region").map(str::to_string);
        if let Some(r) = &region {
            if r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                return Err(ConfigError::BadParam {
                    name: "region".into(),
                    reason: format!("{r:?} is not a region name such as eu-west-1"),
                });
            }
        }
        let endpoint = match url.param("endpoint") {
            None => None,
            Some(e) => {
                let parsed = url::Url::parse(e).map_err(|err| ConfigError::BadParam {
                    name: "endpoint".into(),
                    reason: format!("{e:?}: {err}"),
                })?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                    return Err(ConfigError::BadParam {
                        name: "endpoint".into(),
                        reason: format!("{e:?}: expected http://host:port or https://host"),
                    });
                }
                Some(e.trim_end_matches('/').to_string())
            }
        };
        let timeout = url.duration_param("timeout", Duration::from_secs(10))?;
        let max_message_bytes = url.parse_param("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)?;
        if !(1024..=LIMIT_MAX_MESSAGE_BYTES).contains(&max_message_bytes) {
            return Err(ConfigError::BadParam {
                name: "max_message_bytes".into(),
                reason: format!("{max_message_bytes}: must be 1024 to {LIMIT_MAX_MESSAGE_BYTES}"),
            });
        }
        Ok(Self {
            region,
            endpoint,
            timeout,
            max_message_bytes,
            cloudevents: CloudEvents::from_url(url)?,
        })
    }

    /// The SDK configuration: credentials and (unless given) the region from the standard
    /// chain (environment, shared config and credentials files, web identity, ECS and EC2
    /// instance metadata), HTTPS through rustls with ring, no retries by the SDK (the relay
    /// retries with its own backoff), every call bounded by `timeout`.
    pub(crate) async fn sdk_config(
        &self,
        fallback_region: Option<String>,
    ) -> Result<aws_config::SdkConfig, ConfigError> {
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.timeout)
            .operation_timeout(self.timeout)
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::v2026_01_12())
            .http_client(http)
            .timeout_config(timeouts)
            .retry_config(aws_config::retry::RetryConfig::disabled());
        if let Some(r) = self.region.clone().or(fallback_region) {
            loader = loader.region(aws_config::Region::new(r));
        }
        if let Some(e) = &self.endpoint {
            loader = loader.endpoint_url(e);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(ConfigError::BadParam {
                name: "region".into(),
                reason: "no AWS region: give region=... in the URL, or set AWS_REGION".into(),
            });
        }
        Ok(config)
    }
}

/// One message ready for a batch entry.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// The event's id, for error messages.
    pub event: uuid::Uuid,
    pub body: String,
    /// String attributes, at most [`MAX_ATTRIBUTES`].
    pub attributes: Vec<(String, String)>,
    /// FIFO destinations: the message group (from the aggregate id) and dedup id (the event id).
    pub group_id: Option<String>,
    pub dedup_id: Option<String>,
    /// What the services count against the size limit: body, attribute names, types and values.
    pub size: usize,
}

/// Is `name` a valid message attribute name (SQS's and SNS's rule): 1 to 256 of ASCII
/// letters, digits, `_`, `-` and `.`; not starting with `AWS.` or `Amazon.` (any case), not
/// starting or ending with `.`, no `..`.
pub fn is_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
}

/// The message attributes of `m`, in this order: the CloudEvents attributes (`ce-id`,
/// `ce-type`, ...) when `ce` is set, `content-type` (the body's content type: CloudEvents'
/// `datacontenttype`), `content-transfer-encoding: base64` when `base64` (the body was
/// encoded), the `outbox-*` contract headers, then the user headers (one named like an earlier
/// attribute is dropped). When there are more than [`MAX_ATTRIBUTES`], the first nine stay
/// attributes and the rest go into one more, [`OVERFLOW_ATTRIBUTE`], a JSON object of name to
/// value; so does any header whose name is no valid attribute name or whose value is empty
/// (neither service takes those as attributes). The content type and encoding always fit.
pub(crate) fn attributes(
    m: &Message,
    ce: Option<&CloudEvents>,
    base64: bool,
) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = Vec::new();
    if let Some(ce) = ce {
        all.extend(
            ce.attributes(m)
                .into_iter()
                .filter(|(name, _)| *name != "datacontenttype")
                .map(|(name, value)| (format!("ce-{name}"), value)),
        );
    }
    all.push((CONTENT_TYPE_ATTRIBUTE.to_string(), m.content_type.clone()));
    if base64 {
        all.push((ENCODING_ATTRIBUTE.to_string(), BASE64_ENCODING.to_string()));
    }
    all.extend(
        m.contract_headers()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value)),
    );
    for (name, value) in &m.headers {
        let reserved = name == OVERFLOW_ATTRIBUTE
            || name.eq_ignore_ascii_case(ENCODING_ATTRIBUTE)
            || all.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        if reserved {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a contract or CloudEvents attribute; dropped");
            continue;
        }
        all.push((name.clone(), value.clone()));
    }
    let (fit, mut rest): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(name, value)| is_attribute_name(name) && !value.is_empty());
    let mut out = fit;
    if out.len() + usize::from(!rest.is_empty()) > MAX_ATTRIBUTES {
        rest.splice(0..0, out.drain(MAX_ATTRIBUTES - 1..));
    }
    if !rest.is_empty() {
        let map: BTreeMap<String, String> = rest.into_iter().collect();
        out.push((
            OVERFLOW_ATTRIBUTE.to_string(),
            serde_json::to_string(&map).unwrap_or_default(),
        ));
    }
    out
}

/// The message group id of an aggregate id: the id itself when the services take it (1 to
/// 128 printable ASCII characters, no space), else `sha256-` and the hex SHA-256 of the id,
/// which is stable, so one aggregate keeps one group.
pub fn group_id(aggregate_id: &str) -> String {
    let ok = !aggregate_id.is_empty()
        && aggregate_id.len() <= MAX_GROUP_ID
        && aggregate_id.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        return aggregate_id.to_string();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(aggregate_id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256-{hex}")
}

/// The message body as the services take it (text), and whether it is base64: the body as it
/// is when its content type is textual (JSON, `text/*`, XML) and it is text the services
/// accept (UTF-8 with only the characters SQS allows), else its standard base64.
fn body_text(m: &Message) -> (String, bool) {
    if is_textual(&m.content_type) {
        if let Ok(text) = std::str::from_utf8(&m.body) {
            if text.chars().all(is_allowed_char) {
                return (text.to_string(), false);
            }
        }
    }
    use base64::Engine as _;
    (
        base64::engine::general_purpose::STANDARD.encode(&m.body),
        true,
    )
}

/// Is `content_type` text: JSON (also `+json`), `text/*`, XML (also `+xml`)?
fn is_textual(content_type: &str) -> bool {
    let essence = super::message::media_essence(content_type);
    super::message::is_json_content_type(&essence)
        || essence.starts_with("text/")
        || essence == "application/xml"
        || (essence.contains('/') && essence.ends_with("+xml"))
}

/// A character an SQS message body may hold (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
/// #x10000-#x10FFFF`); SNS takes the same.
fn is_allowed_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// `m` as a batch entry: attributes, FIFO ids, and its size checked against `max_bytes`
/// (too large is permanent).
pub(crate) fn prepare(
    m: &Message,
    ce: Option<&CloudEvents>,
    fifo: bool,
    max_bytes: usize,
    what: &str,
) -> Result<Prepared, PublishError> {
    let (body, base64) = body_text(m);
    if body.is_empty() {
        return Err(PublishError::permanent(format!(
            "event {}: {what}: the body is empty (the service needs at least one character)",
            m.id
        )));
    }
    let attributes = attributes(m, ce, base64);
    let size = body.len()
        + attributes
            .iter()
            .map(|(n, v)| n.len() + "String".len() + v.len())
            .sum::<usize>();
    if size > max_bytes {
        return Err(PublishError::permanent(format!(
            "event {}: {what}: the message is {size} bytes with its attributes, over the limit of {max_bytes} (max_message_bytes)",
            m.id
        )));
    }
    Ok(Prepared {
        event: m.id,
        body,
        attributes,
        group_id: fifo.then(|| group_id(&m.aggregate_id)),
        dedup_id: fifo.then(|| m.id.to_string()),
        size,
    })
}

/// The attributes as the SDK's map, built by `make` (one SDK type per service).
pub(crate) fn attribute_map<V>(
    p: &Prepared,
    make: impl Fn(&str) -> Option<V>,
) -> Option<HashMap<String, V>> {
    let map: HashMap<String, V> = p
        .attributes
        .iter()
        .filter_map(|(n, v)| make(v).map(|v| (n.clone(), v)))
        .collect();
    (!map.is_empty()).then_some(map)
}

/// Error codes (of a call or of one batch entry) that mean the service is throttling us.
fn is_throttling(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "Throttled"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "KmsThrottled"
            | "KMSThrottling"
            | "KMSThrottlingException"
            | "SlowDown"
    ) || code.ends_with("OverLimit")
        || code == "AWS.SimpleQueueService.RequestThrottled"
}

/// Codes of one batch entry that no retry of the same message will fix.
fn is_permanent_entry(code: &str) -> bool {
    matches!(
        code,
        "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidParameter"
            | "InvalidParameterException"
            | "ParameterValueInvalid"
            | "InvalidMessageContents"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "MessageTooLong"
            | "ValidationError"
            | "ValidationException"
            | "AWS.SimpleQueueService.InvalidMessageContents"
    )
}

/// Codes of a whole call that say the destination, the credentials or the permissions are
/// wrong: the operator's to fix, never the message's fault, so never dead-lettered.
fn is_setup_error(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied"
            | "AccessDeniedException"
            | "AuthorizationError"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "SignatureDoesNotMatch"
            | "IncompleteSignature"
            | "MissingAuthenticationToken"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "InvalidSecurity"
            | "InvalidAddress"
            | "QueueDoesNotExist"
            | "AWS.SimpleQueueService.NonExistentQueue"
            | "NotFound"
            | "NotFoundException"
            | "KMSAccessDenied"
            | "KMSDisabled"
            | "KMSNotFound"
            | "KMSInvalidState"
            | "OptInRequired"
            | "InvalidAction"
    )
}

/// One failed batch entry: permanent for a message the service refuses as it is, transient
/// otherwise (throttling, a failure on the service's side).
pub(crate) fn entry_error(
    what: &str,
    code: &str,
    message: Option<&str>,
    sender_fault: bool,
) -> PublishError {
    let text = format!(
        "{what}: refused ({code}{}): {}",
        if sender_fault {
            ""
        } else {
            ", the service's fault"
        },
        message.unwrap_or("no message")
    );
    if is_throttling(code) {
        PublishError::transient(format!("{text} (throttled)"))
    } else if is_permanent_entry(code) {
        PublishError::permanent(text)
    } else if is_setup_error(code) {
        PublishError::unavailable(text)
    } else {
        PublishError::transient(text)
    }
}

/// A failed call: no answer (unreachable, timed out, cut off) is *unavailable*; so are
/// refused credentials or permissions and a missing queue or topic, and a failure on the
/// service's side (5xx); throttling is *transient*; a refused request otherwise is
/// *permanent* only when the code says the input is invalid, else *transient*. The text is
/// one line ([`describe`]), never the credentials.
pub(crate) fn call_error<E>(
    what: &str,
    e: &SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> PublishError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let text = format!("{what}: {}", describe(e));
    match e {
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or("");
            let status = ctx.raw().status().as_u16();
            if is_throttling(code) || status == 429 {
                PublishError::transient(format!("{text} (throttled)"))
            } else if is_setup_error(code) || status == 401 || status == 403 || status >= 500 {
                PublishError::unavailable(text)
            } else if is_permanent_entry(code) {
                PublishError::permanent(text)
            } else {
                PublishError::transient(text)
            }
        }
        SdkError::ConstructionFailure(_) => PublishError::transient(text),
        // Dispatch failures (no connection, no credentials), timeouts, broken answers.
        _ => PublishError::unavailable(text),
    }
}

/// A failed call in one line: the service's code and message (`QueueDoesNotExist: The
/// specified queue does not exist. (HTTP 400)`); missing credentials as what to set; anything
/// else as its chain of messages. Never the SDK's debug dump of the request and response.
pub(crate) fn describe<E>(e: &SdkError<E, aws_smithy_runtime_api::http::Response>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if let SdkError::ServiceError(ctx) = e {
        let status = ctx.raw().status().as_u16();
        let err = ctx.err();
        return match (err.code(), err.message()) {
            (Some(code), Some(message)) => format!("{code}: {message} (HTTP {status})"),
            (Some(text), None) | (None, Some(text)) => format!("{text} (HTTP {status})"),
            (None, None) => format!("HTTP {status}"),
        };
    }
    let chain = messages(e);
    if matches!(e, SdkError::DispatchFailure(_)) && chain.contains("loading credentials") {
        return NO_CREDENTIALS.to_string();
    }
    chain
}

/// What a call without credentials says (the SDK's own text names only the last source it
/// tried, EC2 instance metadata, which reads as an outage of that).
const NO_CREDENTIALS: &str = "no AWS credentials: none of the standard sources had any; set \
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or \
    AWS_PROFILE naming a profile of ~/.aws/credentials or ~/.aws/config, or run with a role \
    (web identity, ECS task role, EC2 instance profile)";

/// An error and its sources, by their messages (each once), joined with `: `.
fn messages(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// Sends one batch of up to [`MAX_BATCH`] entries; the answer has one result per entry, in
/// order, or one error for the whole call.
#[async_trait::async_trait]
pub(crate) trait SendBatch: Send + Sync + 'static {
    async fn send_batch(
        &self,
        entries: &[Prepared],
    ) -> Result<Vec<Result<(), PublishError>>, PublishError>;
}

struct Pending {
    prepared: Prepared,
    /// The message group, and the event's seq, for the FIFO order rules.
    group: Option<String>,
    seq: i64,
    /// The how-manieth message handed over.
    index: u64,
    done: oneshot::Sender<Result<(), PublishError>>,
}

enum Command {
    Send(Box<Pending>),
    Flush(oneshot::Sender<()>),
}

/// A group whose message failed: its later messages that were handed over before the failure
/// was reported fail too, with the same kind, so that none of them reaches the queue ahead of
/// the failed one's retry (the relay pipelines a FIFO destination's aggregates).
struct Failed {
    seq: i64,
    until_index: u64,
    kind: ErrorKind,
}

/// The sender: `send` queues a message; one task sends the queue in calls of up to
/// [`MAX_BATCH`] entries (and at most `max_bytes` in all), one call at a time, so that what
/// queues up during a call goes in the next. For a FIFO destination a call carries at most
/// one message of each group, and a failed message fails its group's messages queued behind
/// it (see [`Failed`]), so one aggregate's messages reach the queue in the order sent.
pub(crate) struct Sender {
    tx: mpsc::UnboundedSender<Command>,
    handed: Arc<AtomicU64>,
}

impl Sender {
    pub(crate) fn spawn(backend: impl SendBatch, fifo: bool, max_bytes: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let handed = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(backend, rx, fifo, max_bytes, handed.clone()));
        Self { tx, handed }
    }

    pub(crate) fn send(&self, m: &Message, prepared: Prepared) -> Result<Ack, PublishError> {
        let (done, rx) = oneshot::channel();
        let pending = Pending {
            group: prepared.group_id.clone(),
            prepared,
            seq: m.seq,
            index: self.handed.fetch_add(1, Ordering::SeqCst),
            done,
        };
        self.tx
            .send(Command::Send(Box::new(pending)))
            .map_err(|_| PublishError::unavailable("the sender task has stopped"))?;
        Ok(Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(PublishError::unavailable(
                    "the sender task stopped before the service answered",
                ))
            })
        }))
    }

    /// Wait until everything handed over so far has its answer.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

fn copy_error(e: &PublishError) -> PublishError {
    PublishError::new(e.kind(), e.chain())
}

async fn run(
    backend: impl SendBatch,
    mut rx: mpsc::UnboundedReceiver<Command>,
    fifo: bool,
    max_bytes: usize,
    handed: Arc<AtomicU64>,
) {
    let mut queue: VecDeque<Box<Pending>> = VecDeque::new();
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut failed: HashMap<String, Failed> = HashMap::new();
    let mut open = true;
    loop {
        if queue.is_empty() {
            for f in flushes.drain(..) {
                let _ = f.send(());
            }
            if !open {
                return;
            }
            match rx.recv().await {
                Some(Command::Send(p)) => queue.push_back(p),
                Some(Command::Flush(f)) => {
                    flushes.push(f);
                    continue;
                }
                None => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Command::Send(p)) => queue.push_back(p),
                Ok(Command::Flush(f)) => flushes.push(f),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Pick the batch, front to back.
        let mut batch: Vec<Box<Pending>> = Vec::new();
        let mut bytes = 0;
        let mut rest = VecDeque::with_capacity(queue.len());
        let mut taken_groups: Vec<String> = Vec::new();
        while let Some(p) = queue.pop_front() {
            if let Some(g) = &p.group {
                if let Some(f) = failed.get(g) {
                    if p.index >= f.until_index {
                        failed.remove(g);
                    } else if p.seq > f.seq {
                        let e = PublishError::new(
                            f.kind,
                            format!(
                                "not sent: an earlier message of group {g:?} (seq {}) failed, and this one must not overtake it",
                                f.seq
                            ),
                        );
                        let _ = p.done.send(Err(e));
                        continue;
                    }
                }
            }
            if batch.len() == MAX_BATCH || bytes + p.prepared.size > max_bytes {
                // Full: this one and all behind it wait for the next call.
                rest.push_back(p);
                rest.extend(queue.drain(..));
                break;
            }
            // A FIFO group already in this call waits for the next.
            if fifo
                && p.group
                    .as_ref()
                    .is_some_and(|g| taken_groups.iter().any(|t| t == g))
            {
                rest.push_back(p);
                continue;
            }
            bytes += p.prepared.size;
            if let Some(g) = &p.group {
                taken_groups.push(g.clone());
            }
            batch.push(p);
        }
        queue = rest;
        if batch.is_empty() {
            continue;
        }
        let entries: Vec<Prepared> = batch.iter().map(|p| p.prepared.clone()).collect();
        let results = match backend.send_batch(&entries).await {
            Ok(results) => results.into_iter().map(Some).collect::<Vec<_>>(),
            // One entry can make the whole call invalid: each alone then, so that only the
            // guilty one is dead-lettered.
            Err(e) if e.is_permanent() && entries.len() > 1 => {
                let mut results = Vec::with_capacity(entries.len());
                for entry in &entries {
                    results.push(Some(
                        match backend.send_batch(std::slice::from_ref(entry)).await {
                            Ok(mut r) if r.len() == 1 => r.remove(0),
                            Ok(_) => Err(PublishError::transient(
                                "the service's answer did not mention this message",
                            )),
                            Err(e) => Err(e),
                        },
                    ));
                }
                results
            }
            Err(e) => batch
                .iter()
                .map(|_| Some(Err(copy_error(&e))))
                .collect::<Vec<_>>(),
        };
        let until_index = handed.load(Ordering::SeqCst);
        for (p, result) in batch
            .into_iter()
            .zip(results.into_iter().chain(std::iter::repeat_with(|| None)))
        {
            let result = result.unwrap_or_else(|| {
                Err(PublishError::transient(
                    "the service's answer did not mention this message",
                ))
            });
            if let (Err(e), Some(g), true) = (&result, &p.group, fifo) {
                if !e.is_permanent() {
                    failed.entry(g.clone()).or_insert(Failed {
                        seq: p.seq,
                        until_index,
                        kind: e.kind(),
                    });
                }
            }
            let _ = p.done.send(result);
        }
    }
}

/// One failed entry of a batch call (its id is its index in `entries`): the id, and its error
/// naming the event.
pub(crate) fn failed_entry(
    entries: &[Prepared],
    what: &str,
    id: &str,
    code: &str,
    message: Option<&str>,
    sender_fault: bool,
) -> (String, PublishError) {
    let event = id
        .parse::<usize>()
        .ok()
        .and_then(|i| entries.get(i))
        .map(|p| p.event.to_string())
        .unwrap_or_default();
    (
        id.to_string(),
        entry_error(
            &format!("event {event}: {what}"),
            code,
            message,
            sender_fault,
        ),
    )
}

/// The results of a batch call, one per entry in order, from the ids (`0`..`n`) of the
/// successful and the failed entries; an entry named by neither is an error.
pub(crate) fn settle(
    n: usize,
    successful: impl IntoIterator<Item = String>,
    failed: impl IntoIterator<Item = (String, PublishError)>,
) -> Vec<Result<(), PublishError>> {
    let mut out: Vec<Option<Result<(), PublishError>>> = (0..n).map(|_| None).collect();
    for id in successful {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Some(Ok(()));
        }
    }
    for (id, e) in failed {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Some(Err(e));
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(PublishError::transient(
                    "the service's answer did not mention this message",
                ))
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A service's refusal is its code and message; a call without credentials says what to
    /// set; nothing is a debug dump.
    #[cfg(feature = "sqs")]
    #[test]
    fn call_errors_are_one_line() {
        use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError;
        use aws_smithy_runtime_api::client::result::ConnectorError;
        use aws_smithy_runtime_api::http::{Response, StatusCode};
        use aws_smithy_types::body::SdkBody;
        use aws_smithy_types::error::ErrorMetadata;
        let raw = || {
            Response::new(
                StatusCode::try_from(400).unwrap(),
                SdkBody::from("<ErrorResponse/>"),
            )
        };
        let meta = ErrorMetadata::builder()
            .code("AWS.SimpleQueueService.NonExistentQueue")
            .message("The specified queue does not exist.")
            .build();
        let e = SdkError::service_error(GetQueueUrlError::generic(meta), raw());
        assert_eq!(
            describe(&e),
            "AWS.SimpleQueueService.NonExistentQueue: The specified queue does not exist. \
             (HTTP 400)"
        );
        let e = call_error("SQS: find queue \"q\"", &e);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "a missing queue: {e}");
        let e = SdkError::<GetQueueUrlError, Response>::service_error(
            GetQueueUrlError::generic(ErrorMetadata::builder().build()),
            raw(),
        );
        assert_eq!(describe(&e), "HTTP 400");
        let loading: Box<dyn std::error::Error + Send + Sync> =
            "an error occurred while loading credentials: failed to load IMDS session token".into();
        let e = SdkError::<GetQueueUrlError, Response>::dispatch_failure(ConnectorError::other(
            loading, None,
        ));
        let text = describe(&e);
        assert!(text.starts_with("no AWS credentials"), "{text}");
        assert!(
            text.contains("AWS_ACCESS_KEY_ID") && !text.contains("IMDS"),
            "{text}"
        );
        let refused: Box<dyn std::error::Error + Send + Sync> = "connection refused".into();
        let e =
            SdkError::<GetQueueUrlError, Response>::dispatch_failure(ConnectorError::io(refused));
        let text = describe(&e);
        assert!(text.contains("connection refused"), "{text}");
        assert!(!text.contains('{'), "{text}");
    }

    fn message(headers: &[(&str, &str)]) -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            attempt: 1,
        }
    }

    #[test]
    fn params_include_cloudevents() {
        for p in super::super::cloudevents::PARAMS {
            assert!(PARAMS.contains(p), "{p}");
        }
    }

    #[test]
    fn attribute_names() {
        for ok in [
            "outbox-event-id",
            "traceparent",
            "a.b_c-1",
            &"a".repeat(256),
        ] {
            assert!(is_attribute_name(ok), "{ok}");
        }
        for bad in [
            "",
            "AWS.x",
            "amazon.y",
            ".a",
            "a.",
            "a..b",
            "a b",
            "ä",
            &"a".repeat(257),
        ] {
            assert!(!is_attribute_name(bad), "{bad}");
        }
    }

    #[test]
    fn ten_attributes_at_most_the_rest_in_one() {
        // content-type, 5 contract headers and 3 user headers: all attributes of their own.
        let m = message(&[("a", "1"), ("b", "2"), ("traceparent", "t")]);
        let a = attributes(&m, None, false);
        assert_eq!(a.len(), 9);
        assert!(a.iter().all(|(n, _)| n != OVERFLOW_ATTRIBUTE));
        // 6 + 4 = 10: still all of their own.
        let m = message(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]);
        assert_eq!(attributes(&m, None, false).len(), 10);
        // 6 + 5: nine, and the other two in outbox-headers.
        let m = message(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")]);
        let a = attributes(&m, None, false);
        assert_eq!(a.len(), 10);
        assert_eq!(a[9].0, OVERFLOW_ATTRIBUTE);
        let rest: BTreeMap<String, String> = serde_json::from_str(&a[9].1).unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!(rest["d"], "4");
        assert_eq!(rest["e"], "5");
        // Invalid names and empty values go there too, and a header may not pose as it.
        let m = message(&[("bad name", "x"), ("empty", ""), (OVERFLOW_ATTRIBUTE, "{}")]);
        let a = attributes(&m, None, false);
        assert_eq!(a.len(), 7);
        let rest: BTreeMap<String, String> = serde_json::from_str(&a[6].1).unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!(rest["bad name"], "x");
        assert_eq!(rest["empty"], "");
    }

    #[test]
    fn cloudevents_first() {
        let u = super::super::url::parse("sqs://q?cloudevents=true").unwrap();
        let ce = CloudEvents::from_url(&u).unwrap().unwrap();
        let a = attributes(&message(&[("traceparent", "t")]), Some(&ce), false);
        assert_eq!(a.len(), 10);
        let names: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            &names[..9],
            &[
                "ce-specversion",
                "ce-id",
                "ce-source",
                "ce-type",
                "ce-subject",
                "ce-time",
                "content-type",
                "outbox-event-id",
                "outbox-event-type"
            ]
        );
        let rest: BTreeMap<String, String> = serde_json::from_str(&a[9].1).unwrap();
        assert_eq!(rest["outbox-aggregate-id"], "42");
        assert_eq!(rest["traceparent"], "t");
        assert!(!rest.contains_key("ce-datacontenttype"));
    }

    #[test]
    fn content_type_once_and_first_of_the_contract() {
        let mut m = message(&[("Content-Type", "text/plain"), ("a", "1")]);
        m.content_type = "application/x-protobuf".into();
        let a = attributes(&m, None, true);
        let names: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                CONTENT_TYPE_ATTRIBUTE,
                ENCODING_ATTRIBUTE,
                "outbox-event-id",
                "outbox-event-type",
                "outbox-aggregate-type",
                "outbox-aggregate-id",
                "outbox-created-at",
                "a"
            ]
        );
        assert_eq!(a[0].1, "application/x-protobuf");
        assert_eq!(a[1].1, BASE64_ENCODING);
        // With CloudEvents and many headers, content type and encoding still fit.
        let u = super::super::url::parse("sqs://q?cloudevents=true").unwrap();
        let ce = CloudEvents::from_url(&u).unwrap().unwrap();
        let a = attributes(&m, Some(&ce), true);
        assert_eq!(a.len(), 10);
        assert_eq!(
            a[6],
            (CONTENT_TYPE_ATTRIBUTE.into(), m.content_type.clone())
        );
        assert_eq!(a[7], (ENCODING_ATTRIBUTE.into(), BASE64_ENCODING.into()));
        assert_eq!(
            a.iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                .count(),
            1
        );
    }

    #[test]
    fn byte_bodies_go_as_base64() {
        use base64::Engine as _;
        let mut m = message(&[]);
        let p = prepare(&m, None, false, DEFAULT_MAX_MESSAGE_BYTES, "q").unwrap();
        assert_eq!(p.body, "{}");
        assert!(p.attributes.iter().all(|(n, _)| n != ENCODING_ATTRIBUTE));
        assert!(p
            .attributes
            .contains(&(CONTENT_TYPE_ATTRIBUTE.into(), "application/json".into())));

        let body = vec![0x08, 0x96, 0x01, 0x00, 0xff, 0x80];
        m.body = body.clone();
        m.content_type = "application/x-protobuf".into();
        let p = prepare(&m, None, false, DEFAULT_MAX_MESSAGE_BYTES, "q").unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(&p.body)
                .unwrap(),
            body
        );
        assert!(p
            .attributes
            .contains(&(ENCODING_ATTRIBUTE.into(), BASE64_ENCODING.into())));
        assert!(p
            .attributes
            .contains(&(CONTENT_TYPE_ATTRIBUTE.into(), m.content_type.clone())));
        // The size counted is the encoded one.
        assert!(p.size >= p.body.len() && p.body.len() > body.len());

        // Bytes that happen to be text still go as base64: it depends on the content type.
        m.body = b"abc".to_vec();
        assert_eq!(body_text(&m), ("YWJj".to_string(), true));
        // Text goes as it is, unless it holds what the services refuse.
        m.content_type = "text/plain; charset=utf-8".into();
        assert_eq!(body_text(&m), ("abc".to_string(), false));
        m.body = b"a\x01b".to_vec();
        assert!(body_text(&m).1);
        m.body = vec![0xff];
        assert!(body_text(&m).1);
        m.content_type = "application/cloudevents+json".into();
        m.body = br#"{"a":"\u00e9"}"#.to_vec();
        assert!(!body_text(&m).1);
    }

    #[test]
    fn group_ids() {
        assert_eq!(group_id("order-42"), "order-42");
        let long = "x".repeat(200);
        for odd in ["a b", "ä", "", long.as_str()] {
            let g = group_id(odd);
            assert!(g.starts_with("sha256-") && g.len() == 71, "{g}");
            assert_eq!(g, group_id(odd), "stable");
        }
    }

    #[test]
    fn too_large_is_permanent() {
        let mut m = message(&[]);
        m.body = vec![b'x'; DEFAULT_MAX_MESSAGE_BYTES];
        let e = prepare(&m, None, false, DEFAULT_MAX_MESSAGE_BYTES, "q").unwrap_err();
        assert!(e.is_permanent(), "{e}");
        let p = prepare(&message(&[]), None, true, DEFAULT_MAX_MESSAGE_BYTES, "q").unwrap();
        assert_eq!(p.group_id.as_deref(), Some("42"));
        assert_eq!(p.dedup_id, Some(uuid::Uuid::nil().to_string()));
    }

    #[test]
    fn entry_errors() {
        assert_eq!(
            entry_error("x", "ThrottlingException", None, true).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "InvalidParameterValue", None, true).kind(),
            ErrorKind::Permanent
        );
        assert_eq!(
            entry_error("x", "InternalError", None, false).kind(),
            ErrorKind::Transient
        );
        assert_eq!(
            entry_error("x", "KMSAccessDenied", None, true).kind(),
            ErrorKind::Unavailable
        );
    }

    /// A backend that fails the entries whose body is `fail` and records what it was sent.
    struct Scripted(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

    #[async_trait::async_trait]
    impl SendBatch for Scripted {
        async fn send_batch(
            &self,
            entries: &[Prepared],
        ) -> Result<Vec<Result<(), PublishError>>, PublishError> {
            self.0
                .lock()
                .unwrap()
                .push(entries.iter().map(|e| e.body.clone()).collect());
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(entries
                .iter()
                .map(|e| {
                    if e.body.starts_with("fail") {
                        Err(PublishError::transient("scripted"))
                    } else {
                        Ok(())
                    }
                })
                .collect())
        }
    }

    /// Refuses a whole call that holds a body `bad`, as a service refuses an invalid request.
    struct WholeCall(Arc<std::sync::Mutex<usize>>);

    #[async_trait::async_trait]
    impl SendBatch for WholeCall {
        async fn send_batch(
            &self,
            entries: &[Prepared],
        ) -> Result<Vec<Result<(), PublishError>>, PublishError> {
            *self.0.lock().unwrap() += 1;
            if entries.iter().any(|e| e.body == "bad") {
                return Err(PublishError::permanent("InvalidParameterValue"));
            }
            Ok(entries.iter().map(|_| Ok(())).collect())
        }
    }

    /// A call refused as a whole for good is sent again entry by entry: only the guilty
    /// entry fails.
    #[tokio::test]
    async fn a_call_refused_for_good_is_split() {
        let calls = Arc::new(std::sync::Mutex::new(0));
        let s = Sender::spawn(WholeCall(calls.clone()), false, DEFAULT_MAX_MESSAGE_BYTES);
        let mut acks = Vec::new();
        for body in ["a", "bad", "c"] {
            let (m, p) = entry(body, "g", 1);
            acks.push(s.send(&m, p).unwrap());
        }
        let mut results = Vec::new();
        for a in acks {
            results.push(a.await.map_err(|e| e.kind()));
        }
        assert_eq!(results[1], Err(ErrorKind::Permanent));
        assert_eq!(results[0], Ok(()));
        assert_eq!(results[2], Ok(()));
        assert!(*calls.lock().unwrap() >= 2);
    }

    fn entry(body: &str, group: &str, seq: i64) -> (Message, Prepared) {
        let mut m = message(&[]);
        m.seq = seq;
        m.aggregate_id = group.into();
        m.body = body.as_bytes().to_vec();
        let p = prepare(&m, None, true, DEFAULT_MAX_MESSAGE_BYTES, "q").unwrap();
        (m, p)
    }

    /// A FIFO call carries one message per group; a failed message fails the messages of its
    /// group handed over before the failure was known, and only those.
    #[tokio::test]
    async fn fifo_batches_keep_each_group_in_order() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Sender::spawn(Scripted(calls.clone()), true, DEFAULT_MAX_MESSAGE_BYTES);
        let mut acks = Vec::new();
        for (body, group, seq) in [
            ("a1", "a", 1),
            ("b1", "b", 2),
            ("a2", "a", 3),
            ("fail-b2", "b", 4),
            ("a3", "a", 5),
            ("b3", "b", 6),
        ] {
            let (m, p) = entry(body, group, seq);
            acks.push((body, s.send(&m, p).unwrap()));
        }
        let mut results = BTreeMap::new();
        for (body, a) in acks {
            results.insert(body, a.await.map_err(|e| e.kind()));
        }
        assert_eq!(results["a1"], Ok(()));
        assert_eq!(results["a3"], Ok(()));
        assert_eq!(results["fail-b2"], Err(ErrorKind::Transient));
        assert_eq!(
            results["b3"],
            Err(ErrorKind::Transient),
            "must not overtake b2"
        );
        let calls = calls.lock().unwrap().clone();
        for call in &calls {
            let mut groups: Vec<char> = call
                .iter()
                .map(|b| b.trim_start_matches("fail-").chars().next().unwrap_or(' '))
                .collect();
            groups.sort_unstable();
            groups.dedup();
            assert_eq!(groups.len(), call.len(), "one per group in {call:?}");
        }
        assert!(
            !calls.iter().flatten().any(|b| b == "b3"),
            "b3 was never sent"
        );
        // The retry (handed over after the failure was reported) goes through, and so does
        // what follows it.
        let (m, p) = entry("b2", "b", 4);
        s.send(&m, p).unwrap().await.unwrap();
        let (m, p) = entry("b3", "b", 6);
        s.send(&m, p).unwrap().await.unwrap();
        s.flush().await;
    }
}
