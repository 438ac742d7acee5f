//! CloudEvents 1.0 attributes for the publishers that can emit them (`cloudevents=true`).
//!
//! Each protocol binding maps the same attributes onto its own carrier in *binary content
//! mode* (the payload stays the body): HTTP headers `ce-id`, `ce-type`, ...; MQTT 5 user
//! properties `id`, `type`, ...; Redis stream fields `ce_id`, `ce_type`, ...; Kafka record
//! headers `ce_id`, `ce_type`, ...; NATS headers `ce-id`, ...; AMQP headers `cloudEvents:id`,
//! .... `datacontenttype` is the message's content type (`application/json` for a JSON
//! payload); each binding sends it in its own content-type field. A carrier without headers
//! (a Kinesis record) takes the event in *structured content mode* instead: one JSON object
//! in the CloudEvents JSON format.

use super::url::PublisherUrl;
use super::{ConfigError, Message};

/// The URL parameters read here; every publisher that supports CloudEvents accepts them.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "kafka",
        feature = "sqs",
        feature = "sns",
        feature = "kinesis"
    )),
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

/// The extension attribute that carries the aggregate type in structured mode.
pub const AGGREGATE_TYPE_EXTENSION: &str = "aggregatetype";
/// The extension attribute that carries, as a JSON object of name to value, the event's
/// headers whose names are no CloudEvents attribute names, in structured mode.
pub const HEADERS_EXTENSION: &str = "outboxheaders";

/// Is `name` a CloudEvents attribute name: lowercase ASCII letters and digits?
#[cfg(feature = "kinesis")]
fn is_attribute_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl CloudEvents {
    /// `m` as one JSON object in the CloudEvents JSON format (structured content mode,
    /// `application/cloudevents+json`), followed by a line feed: the context attributes, the
    /// aggregate type as the extension `aggregatetype`, each of the event's headers whose name
    /// is an attribute name no other attribute has (such as `traceparent`) as an extension of
    /// its own and the others in `outboxheaders` (a JSON object as a string), then `data`,
    /// the JSON payload digit for digit, or `data_base64`, the bytes of any other body.
    #[cfg(feature = "kinesis")]
    pub(crate) fn structured(&self, m: &Message) -> Vec<u8> {
        use std::collections::BTreeMap;
        #[derive(serde::Serialize)]
        struct Event<'a> {
            #[serde(flatten)]
            attributes: BTreeMap<&'a str, String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            data: Option<Box<serde_json::value::RawValue>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            data_base64: Option<String>,
        }
        let mut attributes: BTreeMap<&str, String> = self.attributes(m).into_iter().collect();
        attributes.insert(AGGREGATE_TYPE_EXTENSION, m.aggregate_type.clone());
        let mut rest = BTreeMap::new();
        for (name, value) in &m.headers {
            let taken = attributes.contains_key(name.as_str())
                || matches!(
                    name.as_str(),
                    "data" | "data_base64" | "dataschema" | HEADERS_EXTENSION
                );
            if is_attribute_name(name) && !taken {
                attributes.insert(name, value.clone());
            } else {
                rest.insert(name.as_str(), value.as_str());
            }
        }
        if !rest.is_empty() {
            let json = serde_json::to_string(&rest).unwrap_or_default();
            attributes.insert(HEADERS_EXTENSION, json);
        }
        let (data, data_base64) = super::simple::json_or_base64(m);
        let event = Event {
            attributes,
            data,
            data_base64,
        };
        let mut out = serde_json::to_vec(&event).unwrap_or_default();
        out.push(b'\n');
        out
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

    #[cfg(feature = "kinesis")]
    #[test]
    fn structured_mode() {
        let mut m = crate::publish::forward::tests::message();
        m.headers.insert("traceparent".into(), "00-t-01".into());
        m.headers.insert("x-tenant".into(), "7".into());
        m.headers.insert("id".into(), "shadow".into());
        m.body = br#"{"n": 12345678901234567.89}"#.to_vec();
        let ce = CloudEvents { source: "s".into() };
        let line = ce.structured(&m);
        assert_eq!(line.last(), Some(&b'\n'));
        let text = std::str::from_utf8(&line).unwrap();
        assert!(
            text.contains(r#""data":{"n":12345678901234567.89}"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["id"], m.id.to_string());
        assert_eq!(v["subject"], m.aggregate_id);
        assert_eq!(v["aggregatetype"], m.aggregate_type);
        assert_eq!(v["traceparent"], "00-t-01");
        let rest: std::collections::BTreeMap<String, String> =
            serde_json::from_str(v["outboxheaders"].as_str().unwrap()).unwrap();
        assert_eq!(rest["x-tenant"], "7");
        assert_eq!(rest["id"], "shadow");
        m.body = vec![0xff, 0x00];
        m.content_type = "application/x-protobuf".into();
        let v: serde_json::Value = serde_json::from_slice(&ce.structured(&m)).unwrap();
        assert_eq!(v["data_base64"], "/wA=");
        assert_eq!(v["datacontenttype"], "application/x-protobuf");
        assert!(v.get("data").is_none());
    }
}
