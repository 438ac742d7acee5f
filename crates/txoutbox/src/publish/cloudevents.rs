//! CloudEvents 1.0 attributes for the publishers that can emit them (`cloudevents=true`).
//!
//! Each protocol binding maps the same attributes onto its own carrier in *binary content
//! mode* (the payload stays the body): HTTP headers `ce-id`, `ce-type`, ...; MQTT 5 user
//! properties `id`, `type`, ...; Redis stream fields `ce_id`, `ce_type`, ...; Kafka record
//! headers `ce_id`, `ce_type`, ...; NATS headers `ce-id`, ...; AMQP headers `cloudEvents:id`,
//! .... `datacontenttype` is the message's content type (`application/json` for a JSON
//! payload); each binding sends it in its own content-type field.

use super::url::PublisherUrl;
use super::{ConfigError, Message};

/// The URL parameters read here; every publisher that supports CloudEvents accepts them.
#[cfg_attr(
    not(any(feature = "redis", feature = "kafka", feature = "sqs", feature = "sns")),
    allow(dead_code)
)]
pub(crate) const PARAMS: &[&str] = &["cloudevents", "ce_source"];
/// `source` when `ce_source` is not given.
pub const DEFAULT_SOURCE: &str = "txoutbox";
/// The CloudEvents version emitted.
pub const SPEC_VERSION: &str = "1.0";
/// `datacontenttype` of an event with a JSON payload. Events written as bytes carry their own
/// content type: the attributes take it from [`Message::content_type`].
pub const DATA_CONTENT_TYPE: &str = crate::event::JSON_CONTENT_TYPE;

/// CloudEvents settings of one publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloudEvents {
    source: String,
}

impl CloudEvents {
    /// `Some` when the URL has `cloudevents=true`; `ce_source` without it is refused.
    pub(crate) fn from_url(url: &PublisherUrl) -> Result<Option<Self>, ConfigError> {
        let on = url.bool_param("cloudevents", false)?;
        let source = url.param("ce_source");
        match (on, source) {
            (false, None) => Ok(None),
            (false, Some(_)) => Err(ConfigError::BadParam {
                name: "ce_source".into(),
                reason: "only used with cloudevents=true".into(),
            }),
            (true, Some("")) => Err(ConfigError::BadParam {
                name: "ce_source".into(),
                reason: "must not be empty (CloudEvents requires a source)".into(),
            }),
            (true, source) => Ok(Some(Self {
                source: source.unwrap_or(DEFAULT_SOURCE).to_string(),
            })),
        }
    }

    /// The context attributes of `m`, by their CloudEvents names (without any binding
    /// prefix): `specversion`, `id`, `source`, `type`, `subject` (the aggregate id), `time`
    /// and `datacontenttype` (the message's content type).
    pub(crate) fn attributes(&self, m: &Message) -> [(&'static str, String); 7] {
        [
            ("specversion", SPEC_VERSION.to_string()),
            ("id", m.id.to_string()),
            ("source", self.source.clone()),
            ("type", m.event_type.clone()),
            ("subject", m.aggregate_id.clone()),
            (
                "time",
                m.created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
            ("datacontenttype", m.content_type.clone()),
        ]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn from_url() {
        let u = super::super::url::parse("redis://h?cloudevents=true").unwrap();
        let ce = CloudEvents::from_url(&u).unwrap().unwrap();
        assert_eq!(ce.source, DEFAULT_SOURCE);
        let u = super::super::url::parse("redis://h?cloudevents=1&ce_source=/orders").unwrap();
        assert_eq!(
            CloudEvents::from_url(&u).unwrap().unwrap().source,
            "/orders"
        );
        let u = super::super::url::parse("redis://h").unwrap();
        assert_eq!(CloudEvents::from_url(&u).unwrap(), None);
        for bad in [
            "redis://h?ce_source=x",
            "redis://h?cloudevents=true&ce_source=",
            "redis://h?cloudevents=maybe",
        ] {
            let u = super::super::url::parse(bad).unwrap();
            assert!(CloudEvents::from_url(&u).is_err(), "{bad}");
        }
    }

    #[test]
    fn attributes() {
        let m = Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "order.created".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            headers: Default::default(),
            created_at: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            attempt: 1,
        };
        let ce = CloudEvents { source: "s".into() };
        let a: std::collections::BTreeMap<_, _> = ce.attributes(&m).into_iter().collect();
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["id"], uuid::Uuid::nil().to_string());
        assert_eq!(a["type"], "order.created");
        assert_eq!(a["subject"], "42");
        assert_eq!(a["time"], "1970-01-01T00:00:00.000000Z");
        assert_eq!(a["source"], "s");
        assert_eq!(a["datacontenttype"], DATA_CONTENT_TYPE);
        let bytes = Message {
            body: vec![0x00, 0xff],
            content_type: "application/x-protobuf".into(),
            ..m
        };
        let a: std::collections::BTreeMap<_, _> = ce.attributes(&bytes).into_iter().collect();
        assert_eq!(a["datacontenttype"], "application/x-protobuf");
    }
}
