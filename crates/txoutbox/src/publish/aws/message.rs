//! A message as SQS and SNS take it: a text body, at most ten string attributes, the FIFO
//! ids, and its size against the limit.

use std::collections::{BTreeMap, HashMap};

use crate::publish::cloudevents::CloudEvents;
use crate::publish::{Message, PublishError};

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
/// Longest message group id the services accept.
const MAX_GROUP_ID: usize = 128;

/// One message ready for a batch entry.
#[derive(Debug, Clone)]
pub struct Prepared {
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

impl super::batch::Entry for Prepared {
    fn key(&self) -> Option<&str> {
        self.group_id.as_deref()
    }
    fn size(&self) -> usize {
        self.size
    }
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
    super::key_or_digest(aggregate_id, ok)
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
    let essence = crate::publish::message::media_essence(content_type);
    crate::publish::message::is_json_content_type(&essence)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;
    use crate::publish::aws::DEFAULT_MAX_MESSAGE_BYTES;

    pub(in crate::publish::aws) fn message(headers: &[(&str, &str)]) -> Message {
        let mut m = crate::publish::forward::tests::message();
        m.headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        m
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
        let u = crate::publish::url::parse("sqs://q?cloudevents=true").unwrap();
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
        let u = crate::publish::url::parse("sqs://q?cloudevents=true").unwrap();
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
}
