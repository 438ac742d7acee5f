//! Events: [`NewEvent`] is what a writer enqueues, [`OutboxEvent`] what the relay reads back.
//!
//! A payload is JSON (the `payload` column, as the seed writes it) or bytes with their content
//! type ([`NewEvent::bytes`]: the `payload_bytes` and `content_type` columns, with `payload`
//! the JSON `null`): Protobuf, Avro, anything the broker should carry as it is.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::payload::JsonPayload;

/// An event to write into the outbox inside the caller's transaction.
///
/// ```
/// use txoutbox::NewEvent;
/// let event = NewEvent::new("order", "42", "order.created", &serde_json::json!({"total": 99.5}))?
///     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(event.event_type(), "order.created");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub(crate) id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: JsonPayload,
    pub(crate) payload_bytes: Option<Vec<u8>>,
    pub(crate) content_type: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
}

/// The content type of a JSON payload, and of every event without bytes.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// A content type that cannot go on the wire as a header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("content type {0:?} is not valid: use 1 to 255 printable ASCII characters, without spaces at either end, e.g. application/x-protobuf")]
pub struct InvalidContentType(pub String);

/// Is `content_type` usable (1 to 255 printable ASCII characters, spaces allowed inside)? It
/// goes into HTTP, AMQP, MQTT and Kafka headers as it is.
pub fn check_content_type(content_type: &str) -> Result<(), InvalidContentType> {
    let ok = (1..=255).contains(&content_type.len())
        && content_type.bytes().all(|b| (0x20..0x7f).contains(&b))
        && content_type.trim() == content_type;
    if ok {
        Ok(())
    } else {
        Err(InvalidContentType(content_type.to_string()))
    }
}

impl NewEvent {
    /// A new event whose payload is `payload` serialised as JSON (straight to text, with no
    /// `serde_json::Value` in between). The id is a fresh time-ordered UUID (v7), so the
    /// primary-key index stays append-only.
    pub fn new<P: Serialize + ?Sized>(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &P,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::from_payload(
            aggregate_type,
            aggregate_id,
            event_type,
            JsonPayload::serialize(payload)?,
        ))
    }

    /// A new event from an already built JSON value.
    pub fn from_json(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self::from_payload(aggregate_type, aggregate_id, event_type, payload.into())
    }

    /// A new event whose payload is JSON text, kept exactly as written (digits a parser would
    /// round included): [`JsonPayload::from_text`].
    ///
    /// ```
    /// use txoutbox::{JsonPayload, NewEvent};
    /// let payload = JsonPayload::from_text(r#"{"amount": 12345678901234567.89}"#)?;
    /// let event = NewEvent::from_payload("order", "42", "order.paid", payload);
    /// assert_eq!(event.payload().as_str(), r#"{"amount": 12345678901234567.89}"#);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn from_payload(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: JsonPayload,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            payload_bytes: None,
            content_type: None,
            headers: BTreeMap::new(),
        }
    }

    /// A new event whose payload is `data`, sent to the broker as it is, with `content_type`
    /// (e.g. `application/x-protobuf`) in the broker's content-type field. Stored in the
    /// `payload_bytes` and `content_type` columns, with `payload` the JSON `null`.
    ///
    /// ```
    /// use txoutbox::NewEvent;
    /// let event = NewEvent::bytes("order", "42", "order.created", vec![0x08, 0x2a], "application/x-protobuf")?;
    /// assert_eq!(event.payload_bytes(), Some(&[0x08, 0x2a][..]));
    /// # Ok::<(), txoutbox::event::InvalidContentType>(())
    /// ```
    pub fn bytes(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        data: impl Into<Vec<u8>>,
        content_type: impl Into<String>,
    ) -> Result<Self, InvalidContentType> {
        let content_type = content_type.into();
        check_content_type(&content_type)?;
        let mut event = Self::from_payload(
            aggregate_type,
            aggregate_id,
            event_type,
            JsonPayload::null(),
        );
        event.payload_bytes = Some(data.into());
        event.content_type = Some(content_type);
        Ok(event)
    }

    /// Use this id instead of a generated one (e.g. an id the caller already exposed).
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = id;
        self
    }

    /// Add a message header (sent to the broker with the event).
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// The event's id: a time-ordered UUID (v7) unless set with [`NewEvent::with_id`]; publishers
    /// send it as the broker's dedup id.
    pub fn id(&self) -> Uuid {
        self.id
    }
    /// The kind of entity the event is about (e.g. `order`); with `aggregate_id` it names the
    /// aggregate whose events ordered mode keeps in order.
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }
    /// Which entity of that type (e.g. the order's id); in ordered mode the events of one
    /// aggregate are published in the order they were inserted.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }
    /// What happened (e.g. `order.created`); usable in destination templates and filters.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
    /// The JSON payload, sent to the broker as its text (`null` for an event of bytes).
    pub fn payload(&self) -> &JsonPayload {
        &self.payload
    }
    /// The payload of an event made by [`NewEvent::bytes`].
    pub fn payload_bytes(&self) -> Option<&[u8]> {
        self.payload_bytes.as_deref()
    }
    /// The content type the broker gets: the one given to [`NewEvent::bytes`], else
    /// `application/json`.
    pub fn content_type(&self) -> &str {
        self.content_type.as_deref().unwrap_or(JSON_CONTENT_TYPE)
    }
    /// The message headers set with [`NewEvent::header`], sorted by key.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }
}

/// An event as stored in the outbox table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxEvent {
    /// The event's id, the broker's dedup id.
    pub id: Uuid,
    /// Position in the table's insert order (assigned by the database, increasing); claims and
    /// operator pages go by it.
    pub seq: i64,
    /// The kind of entity the event is about.
    pub aggregate_type: String,
    /// Which entity of that type; with `aggregate_type` it decides the partition (ordered mode).
    pub aggregate_id: String,
    /// What happened.
    pub event_type: String,
    /// The JSON payload as the database holds it, as text (`null` for an event of bytes): sent
    /// to the broker byte for byte, never re-parsed.
    pub payload: JsonPayload,
    /// The payload of an event of bytes ([`NewEvent::bytes`]); `None` for a JSON event. Shown
    /// in JSON as `payload_base64` (standard alphabet, padded).
    #[serde(
        rename = "payload_base64",
        serialize_with = "base64_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub payload_bytes: Option<Vec<u8>>,
    /// The content type of `payload_bytes`; `None` for a JSON event (`application/json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Message headers, sorted by key (non-string JSON values kept as their JSON text).
    pub headers: BTreeMap<String, String>,
    /// Failed delivery attempts so far.
    pub attempts: i32,
    /// Of those, how many failed because the broker was unavailable (not counted towards
    /// `max_attempts`).
    pub attempts_unavailable: i32,
    /// Not claimable before this instant (backoff after a failure; the insert time otherwise).
    pub available_at: DateTime<Utc>,
    /// When the row was inserted (the database's clock).
    pub created_at: DateTime<Utc>,
    /// When it was published; `None` until then. With `Retention::Delete` a published row is
    /// deleted instead, so this is never seen set.
    pub processed_at: Option<DateTime<Utc>>,
    /// When it was dead-lettered; `None` unless it is a dead letter.
    pub dead_at: Option<DateTime<Utc>>,
    /// The relay holding the row lease (kept after the lease runs out, until the row is settled,
    /// released or claimed again); `None` otherwise. PostgreSQL's ordered claims lease no rows and
    /// leave it `None`.
    pub locked_by: Option<String>,
    /// The row lease's end; the event is leased while this is in the future.
    pub locked_until: Option<DateTime<Utc>>,
    /// The last failure's error chain (secrets redacted), or why the row could not be decoded;
    /// `None` if it never failed.
    pub last_error: Option<String>,
}

impl OutboxEvent {
    /// The body the broker gets: the bytes, or the JSON payload's text as stored.
    pub fn body(&self) -> Vec<u8> {
        match &self.payload_bytes {
            Some(bytes) => bytes.clone(),
            None => self.payload.as_bytes().to_vec(),
        }
    }

    /// The payload's size in bytes (`payload` and `payload_bytes`): what the relay's byte
    /// budgets count.
    pub fn payload_len(&self) -> usize {
        self.payload.as_bytes().len() + self.payload_bytes.as_ref().map_or(0, Vec::len)
    }

    /// The body's content type: the stored one, else `application/json`.
    pub fn content_type(&self) -> &str {
        self.content_type.as_deref().unwrap_or(JSON_CONTENT_TYPE)
    }

    /// Where the event is in its life: pending, leased, published or dead.
    pub fn state(&self, now: DateTime<Utc>) -> EventState {
        if self.processed_at.is_some() {
            EventState::Published
        } else if self.dead_at.is_some() {
            EventState::Dead
        } else if self.locked_until.is_some_and(|t| t > now) {
            EventState::Leased
        } else {
            EventState::Pending
        }
    }
}

/// The event state machine: pending -> leased -> published | dead (see `docs/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Waiting to be claimed (possibly backing off until `available_at`).
    Pending,
    /// Claimed by a relay whose row lease has not run out.
    Leased,
    /// Acknowledged by the broker (`processed_at` set).
    Published,
    /// Dead-lettered (`dead_at` set): out of attempts or failed permanently; waits for an
    /// operator to retry or discard it.
    Dead,
}

/// `payload_bytes` in JSON: base64 text (standard alphabet, padded).
fn base64_bytes<S: serde::Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine as _;
    match bytes {
        Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
        None => s.serialize_none(),
    }
}

/// Headers stored as a JSON object; non-string values are kept as their JSON text.
pub(crate) fn headers_from_json(v: serde_json::Value) -> BTreeMap<String, String> {
    match v {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}
