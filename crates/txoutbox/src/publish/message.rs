use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::OutboxEvent;

/// One event as a publisher sees it: body bytes plus the metadata of the message contract.
///
/// Every publisher maps these fields onto its broker: the event id onto the broker's own
/// dedup field (`Nats-Msg-Id`, AMQP `message_id`, a Kafka header), the rest onto headers.
#[derive(Debug, Clone)]
pub struct Message {
    /// The event's id: the broker's dedup id.
    pub id: Uuid,
    /// The event's position in the outbox's insert order.
    pub seq: i64,
    /// The kind of entity the event is about.
    pub aggregate_type: String,
    /// Which entity of that type.
    pub aggregate_id: String,
    /// What happened.
    pub event_type: String,
    /// The payload as JSON bytes: the message body.
    pub body: Vec<u8>,
    /// User headers (e.g. `traceparent`).
    pub headers: BTreeMap<String, String>,
    /// When the event was enqueued (the database's clock).
    pub created_at: DateTime<Utc>,
    /// Which delivery attempt this is, starting at 1.
    pub attempt: i32,
}

impl Message {
    /// The message for `event`'s next delivery attempt. A payload that does not serialise gives an
    /// empty body.
    pub fn from_event(event: &OutboxEvent) -> Self {
        Self {
            id: event.id,
            seq: event.seq,
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: event.aggregate_id.clone(),
            event_type: event.event_type.clone(),
            body: serde_json::to_vec(&event.payload).unwrap_or_default(),
            headers: event.headers.clone(),
            created_at: event.created_at,
            attempt: event.attempts + 1,
        }
    }

    /// The standard metadata headers every publisher sets besides the user's own, in the
    /// CloudEvents-like `outbox-*` namespace.
    pub fn contract_headers(&self) -> [(&'static str, String); 5] {
        [
            ("outbox-event-id", self.id.to_string()),
            ("outbox-event-type", self.event_type.clone()),
            ("outbox-aggregate-type", self.aggregate_type.clone()),
            ("outbox-aggregate-id", self.aggregate_id.clone()),
            (
                "outbox-created-at",
                self.created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
        ]
    }
}
