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

    pub fn id(&self) -> Uuid {
        self.id
    }
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
    pub fn payload(&self) -> &serde_json::Value {
        &self.payload
    }
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }
}

/// An event as stored in the outbox table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub seq: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub headers: BTreeMap<String, String>,
    /// Failed delivery attempts so far.
    pub attempts: i32,
    /// Of those, how many failed because the broker was unavailable (not counted towards
    /// `max_attempts`).
    pub attempts_unavailable: i32,
    pub available_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub processed_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
    pub locked_by: Option<String>,
    pub locked_until: Option<DateTime<Utc>>,
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
    Pending,
    Leased,
    Published,
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
