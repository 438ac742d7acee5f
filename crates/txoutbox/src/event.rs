//! Events: [`NewEvent`] is what a writer enqueues, [`OutboxEvent`] what the relay reads back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

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
    pub(crate) payload: serde_json::Value,
    pub(crate) headers: BTreeMap<String, String>,
}

impl NewEvent {
    /// A new event whose payload is `payload` serialised as JSON. The id is a fresh
    /// time-ordered UUID (v7), so the primary-key index stays append-only.
    pub fn new<P: Serialize + ?Sized>(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &P,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::from_json(
            aggregate_type,
            aggregate_id,
            event_type,
            serde_json::to_value(payload)?,
        ))
    }

    /// A new event from an already built JSON value.
    pub fn from_json(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            headers: BTreeMap::new(),
        }
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
    /// The payload, sent to the broker as JSON bytes.
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
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
    /// The payload as written.
    pub payload: serde_json::Value,
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
