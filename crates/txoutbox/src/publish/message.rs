use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::OutboxEvent;

/// The header (field, attribute) that carries [`Message::content_type`] on brokers without a
/// content-type field of their own: NATS, Kafka, Redis Streams, SQS and SNS.
// Unused when no broker that needs it is compiled in.
// (SQS and SNS name their attribute `aws::CONTENT_TYPE_ATTRIBUTE`.)
#[cfg_attr(
    not(any(feature = "nats", feature = "kafka", feature = "redis")),
    allow(dead_code)
)]
pub(crate) const CONTENT_TYPE_HEADER: &str = "content-type";

/// Is `content_type` JSON: `application/json` or a `+json` type, parameters (`; charset=...`)
/// and case aside?
pub(crate) fn is_json_content_type(content_type: &str) -> bool {
    let essence = media_essence(content_type);
    essence == "application/json" || (essence.contains('/') && essence.ends_with("+json"))
}

/// A content type without its parameters, trimmed and lowercased (`text/plain; charset=utf-8`
/// -> `text/plain`).
pub(crate) fn media_essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

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
    /// The message body: the event's bytes as written ([`NewEvent::bytes`](crate::NewEvent::bytes)),
    /// or its JSON payload serialised.
    pub body: Vec<u8>,
    /// The body's content type: the event's own for bytes, `application/json` for JSON. Every
    /// publisher sends it in its broker's content-type field.
    pub content_type: String,
    /// User headers (e.g. `traceparent`).
    pub headers: BTreeMap<String, String>,
    /// When the event was enqueued (the database's clock).
    pub created_at: DateTime<Utc>,
    /// Which delivery attempt this is, starting at 1.
    pub attempt: i32,
}

impl Message {
    /// The message for `event`'s next delivery attempt.
    pub fn from_event(event: &OutboxEvent) -> Self {
        Self {
            id: event.id,
            seq: event.seq,
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: event.aggregate_id.clone(),
            event_type: event.event_type.clone(),
            body: event.body(),
            content_type: event.content_type().to_string(),
            headers: event.headers.clone(),
            created_at: event.created_at,
            attempt: event.attempts + 1,
        }
    }

    /// Is the body JSON (by its content type)?
    pub fn is_json(&self) -> bool {
        is_json_content_type(&self.content_type)
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

#[cfg(test)]
mod tests {
    use super::is_json_content_type as json;

    #[test]
    fn json_content_types() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/cloudevents+json",
            "application/vnd.api+json",
        ] {
            assert!(json(yes), "{yes}");
        }
        for no in [
            "application/x-protobuf",
            "text/plain",
            "application/jsonl",
            "+json",
            "",
        ] {
            assert!(!json(no), "{no}");
        }
    }
}
