//! [`JsonPayload`]: a JSON payload kept as its text, exactly as the database gave it back.
//!
//! A payload is never parsed into numbers on its way from the table (or the WAL) to the
//! broker: `{"amount": 12345678901234567.89}`, a 30-digit id or `1e400` (valid `jsonb`) reach
//! the consumer with every digit, where a `serde_json::Value` would have rounded them through
//! `f64` or refused them. The text is checked to be JSON once, when it is read, and then
//! carried as it is.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A JSON value as text: what the database holds in the `payload` column (PostgreSQL's `jsonb`
/// text, MySQL's and SQLite's stored text), sent to the broker byte for byte.
///
/// ```
/// use txoutbox::JsonPayload;
/// let p = JsonPayload::from_text(r#"{"amount": 12345678901234567.89}"#)?;
/// assert_eq!(p.as_str(), r#"{"amount": 12345678901234567.89}"#);
/// assert_eq!(p, serde_json::json!({"amount": 12345678901234567.89_f64}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone)]
pub struct JsonPayload(Box<RawValue>);

impl JsonPayload {
    /// The payload of `text`, which must be one JSON value (surrounding white space is
    /// dropped; inside, the text is kept as it is).
    pub fn from_text(text: &str) -> Result<Self, serde_json::Error> {
        let raw: Box<RawValue> = serde_json::from_str(text)?;
        Ok(Self(raw))
    }

    /// [`JsonPayload::from_text`] of owned text: no copy when the text is already one JSON
    /// value with no white space around it.
    pub fn from_string(text: String) -> Result<Self, serde_json::Error> {
        if text.trim() == text {
            RawValue::from_string(text).map(Self)
        } else {
            Self::from_text(&text)
        }
    }

    /// `value` serialised as JSON. Numbers that serde_json keeps (64- and 128-bit integers,
    /// `f64`) are written in full; a value a parser can represent only approximately should be
    /// given as text ([`JsonPayload::from_text`]).
    pub fn serialize<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// The JSON `null` (the `payload` of an event of bytes).
    pub fn null() -> Self {
        Self(Box::default())
    }

    /// The JSON text, exactly as held.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The JSON text as bytes: the message body of a JSON event.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.get().as_bytes()
    }

    /// Is this the JSON `null`?
    pub fn is_null(&self) -> bool {
        self.as_str() == "null"
    }

    /// The payload parsed into a [`serde_json::Value`], for code that looks inside it. Numbers
    /// beyond `f64` come out rounded (or as an error): the payload itself stays exact.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.as_str())
    }

    /// The raw value, e.g. to embed in a larger JSON document without re-parsing it.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }
}

impl Default for JsonPayload {
    fn default() -> Self {
        Self::null()
    }
}

impl fmt::Debug for JsonPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonPayload({})", self.as_str())
    }
}

impl fmt::Display for JsonPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Equal when the texts are equal (the same JSON written with other spacing or key order is
/// a different payload on the wire).
impl PartialEq for JsonPayload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for JsonPayload {}

/// Equal when the payload parses to `other` (for tests and code that compare with `json!`).
impl PartialEq<serde_json::Value> for JsonPayload {
    fn eq(&self, other: &serde_json::Value) -> bool {
        self.to_value().is_ok_and(|v| &v == other)
    }
}

impl PartialEq<JsonPayload> for serde_json::Value {
    fn eq(&self, other: &JsonPayload) -> bool {
        other == self
    }
}

impl From<serde_json::Value> for JsonPayload {
    fn from(value: serde_json::Value) -> Self {
        // A Value always serialises.
        Self::serialize(&value).unwrap_or_default()
    }
}

impl From<&serde_json::Value> for JsonPayload {
    fn from(value: &serde_json::Value) -> Self {
        Self::serialize(value).unwrap_or_default()
    }
}

impl Serialize for JsonPayload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for JsonPayload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(Self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn text_is_kept_digit_for_digit() {
        for text in [
            r#"{"amount": 12345678901234567.89}"#,
            r#"{"id": 123456789012345678901234567890}"#,
            r#"{"big": 1e400}"#,
            r#"{"d": 0.1000000000000000000000000000001}"#,
            r#"[1, 2.50, -0.0, "é\u00e9"]"#,
            "null",
        ] {
            let p = JsonPayload::from_text(text).unwrap();
            assert_eq!(p.as_str(), text);
            assert_eq!(serde_json::to_string(&p).unwrap(), text);
        }
    }

    #[test]
    fn not_json_is_refused() {
        for text in ["", "{", "{\"a\":1} x", "nul"] {
            assert!(JsonPayload::from_text(text).is_err(), "{text}");
            assert!(
                JsonPayload::from_string(text.to_string()).is_err(),
                "{text}"
            );
        }
    }

    #[test]
    fn white_space_around_is_dropped() {
        let p = JsonPayload::from_string("  {\"a\": 1}\n".to_string()).unwrap();
        assert_eq!(p.as_str(), "{\"a\": 1}");
    }

    #[test]
    fn compares_with_values_and_embeds_raw() {
        let p = JsonPayload::from_text(r#"{"a": [1, 2]}"#).unwrap();
        assert_eq!(p, serde_json::json!({"a": [1, 2]}));
        assert!(JsonPayload::null().is_null());
        let doc = serde_json::json!({"data": serde_json::to_value(&p).unwrap()});
        assert_eq!(doc["data"]["a"][1], 2);
    }
}
