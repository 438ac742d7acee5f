//! What a list shows of a payload: its start and its length, so that a page of events (the
//! dashboard polls one every few seconds) stays small whatever the rows hold. The whole payload
//! is one request away (`GET /api/v1/events/{id}`, `events show`, `dlq show`).

use base64::Engine as _;
use serde_json::{json, Value};
use txoutbox::{JsonPayload, OutboxEvent};

/// How many bytes of a payload's text a list carries.
pub const LIST_PREVIEW_BYTES: usize = 256;

/// The start of a payload, as text, and how long the whole is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The JSON text, or `base64 ...` of the bytes, cut to at most the limit (on a character
    /// boundary).
    pub text: String,
    /// The payload's length in bytes (of the JSON text, or of the bytes).
    pub length: usize,
    /// Whether `text` is only the start.
    pub truncated: bool,
}

/// At most `max` bytes of `e`'s payload as text.
pub fn preview(e: &OutboxEvent, max: usize) -> Preview {
    // The text in full would be `full` bytes long; only what the preview can show is made.
    let (whole, length, full) = match &e.payload_bytes {
        Some(bytes) => {
            // 4 base64 characters per 3 bytes: encode no more than the preview shows.
            let shown = max.div_ceil(4).saturating_mul(3).min(bytes.len());
            let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes[..shown]);
            let full = bytes.len().div_ceil(3).saturating_mul(4);
            (std::borrow::Cow::Owned(b64), bytes.len(), full)
        }
        None => {
            let text = e.payload.as_str();
            (std::borrow::Cow::Borrowed(text), text.len(), text.len())
        }
    };
    let cut = floor_char_boundary(&whole, max);
    let truncated = cut < full;
    Preview {
        text: whole[..cut].to_string(),
        length,
        truncated,
    }
}

/// The largest index <= `max` that is a character boundary of `s`.
fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// An event as a list shows it: every field but the payload, which is
/// `payload_preview` (at most [`LIST_PREVIEW_BYTES`]), `payload_length` and
/// `payload_truncated`.
pub fn listed(mut e: OutboxEvent) -> Value {
    let p = preview(&e, LIST_PREVIEW_BYTES);
    e.payload = JsonPayload::null();
    e.payload_bytes = None;
    // Without its payload the event holds no number serde_json cannot represent.
    let mut v = serde_json::to_value(&e).unwrap_or_else(|_| json!({ "id": e.id }));
    if let Some(o) = v.as_object_mut() {
        o.remove("payload");
        o.insert("payload_preview".into(), p.text.into());
        o.insert("payload_length".into(), p.length.into());
        o.insert("payload_truncated".into(), p.truncated.into());
    }
    v
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn event(payload: &str, bytes: Option<Vec<u8>>) -> OutboxEvent {
        let e = txoutbox::NewEvent::from_payload(
            "order",
            "1",
            "created",
            JsonPayload::from_text(payload).unwrap(),
        );
        let now = chrono::Utc::now();
        OutboxEvent {
            id: e.id(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            event_type: "created".into(),
            payload: e.payload().clone(),
            payload_bytes: bytes,
            content_type: None,
            headers: Default::default(),
            attempts: 0,
            attempts_unavailable: 0,
            available_at: now,
            created_at: now,
            processed_at: None,
            dead_at: None,
            locked_by: None,
            locked_until: None,
            last_error: None,
        }
    }

    #[test]
    fn short_payloads_are_shown_whole() {
        let p = preview(&event(r#"{"a": 1e400}"#, None), 256);
        assert_eq!(p.text, r#"{"a": 1e400}"#);
        assert_eq!((p.length, p.truncated), (12, false));
    }

    #[test]
    fn long_payloads_are_cut_on_a_character_boundary() {
        let text = format!("\"{}\"", "é".repeat(1000));
        let p = preview(&event(&text, None), 256);
        assert!(p.text.len() <= 256 && p.truncated);
        assert_eq!(p.length, text.len());
        assert!(text.starts_with(&p.text));
    }

    #[test]
    fn bytes_are_previewed_as_base64() {
        let p = preview(&event("null", Some(vec![0xff; 10_000])), 256);
        assert!(p.text.len() <= 256 && p.truncated);
        assert_eq!(p.length, 10_000);
        let p = preview(&event("null", Some(vec![1, 2, 3])), 256);
        assert_eq!((p.text.as_str(), p.truncated), ("AQID", false));
        let p = preview(&event("null", Some(vec![1, 2, 3, 4])), usize::MAX);
        assert_eq!((p.text.as_str(), p.truncated), ("AQIDBA==", false));
        let p = preview(&event("null", Some(vec![1, 2, 3, 4])), 4);
        assert_eq!((p.text.as_str(), p.truncated), ("AQID", true));
    }

    #[test]
    fn a_listed_event_carries_the_preview_not_the_payload() {
        let big = format!(r#"{{"blob": "{}", "n": 1e400}}"#, "x".repeat(2_000_000));
        let v = listed(event(&big, None));
        assert!(v.get("payload").is_none() && v.get("payload_base64").is_none());
        assert_eq!(v["payload_length"], big.len());
        assert_eq!(v["payload_truncated"], true);
        assert!(serde_json::to_vec(&v).unwrap().len() < 2_000);
    }
}
