//! An outbox row of an Insert message, column by column, from the types' binary send formats.
//! A value that does not decode is noted with its column (the row becomes a dead letter, as a
//! claimed row that does not decode does), never a stop of the stream.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::pgoutput::{pg_time, DecodeError, Relation, Value};
use super::WalEvent;
use crate::store::undecodable;
use crate::{JsonPayload, OutboxEvent};

const UUID: u32 = 2950;
const INT8: u32 = 20;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const TIMESTAMPTZ: u32 = 1184;
const BYTEA: u32 = 17;

/// The columns the relay reads, with the type each must have. Those from [`ADDED_BY_5`] on
/// came with migration 5: rows inserted before it reach the stream (from a slot's backlog)
/// with a relation that lacks them, and read them as NULL.
pub(super) const COLUMNS: [(&str, u32); 18] = [
    ("id", UUID),
    ("seq", INT8),
    ("aggregate_type", TEXT),
    ("aggregate_id", TEXT),
    ("event_type", TEXT),
    ("payload", JSONB),
    ("headers", JSONB),
    ("attempts", INT4),
    ("attempts_unavailable", INT4),
    ("available_at", TIMESTAMPTZ),
    ("created_at", TIMESTAMPTZ),
    ("processed_at", TIMESTAMPTZ),
    ("dead_at", TIMESTAMPTZ),
    ("locked_by", TEXT),
    ("locked_until", TIMESTAMPTZ),
    ("last_error", TEXT),
    ("payload_bytes", BYTEA),
    ("content_type", TEXT),
];

/// The first of [`COLUMNS`] that migration 5 added (`payload_bytes`, `content_type`).
const ADDED_BY_5: usize = 16;

/// Where each of [`COLUMNS`] is in the relation's tuples, and its type there.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    at: [Option<(usize, u32)>; COLUMNS.len()],
    width: usize,
}

impl Layout {
    pub fn of(rel: &Relation) -> Self {
        let by_name: HashMap<&str, (usize, u32)> = rel
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_str(), (i, c.type_oid)))
            .collect();
        Self {
            at: COLUMNS.map(|(name, _)| by_name.get(name).copied()),
            width: rel.columns.len(),
        }
    }

    pub fn read(&self, values: &[Value<'_>]) -> Result<WalEvent, DecodeError> {
        if values.len() != self.width {
            return Err(DecodeError(format!(
                "an Insert has {} values, its Relation {} columns",
                values.len(),
                self.width
            )));
        }
        let mut r = Reader {
            layout: self,
            values,
            problems: Vec::new(),
        };
        let id = r.get(0, uuid);
        let seq = r.get(1, int8);
        let aggregate_type = r.get(2, text);
        let aggregate_id = r.get(3, text);
        let event_type = r.get(4, text);
        let payload = r.get(5, jsonb_payload);
        let headers = r
            .get(6, jsonb)
            .and_then(|h| match h.map(undecodable::headers) {
                Some(Ok(h)) => Some(Some(h)),
                Some(Err(e)) => {
                    r.problems.push(e);
                    None
                }
                None => Some(None),
            });
        let attempts = r.get(7, int4);
        let attempts_unavailable = r.get(8, int4);
        let available_at = r.get(9, timestamptz);
        let created_at = r.get(10, timestamptz);
        let processed_at = r.get(11, timestamptz);
        let dead_at = r.get(12, timestamptz);
        let locked_by = r.get(13, text);
        let locked_until = r.get(14, timestamptz);
        let last_error = r.get(15, text);
        let payload_bytes = r.get(16, bytea);
        let content_type = r.get(17, text);
        // NOT NULL columns without a default the relay could stand in for.
        let nulls = [
            matches!(id, Some(None)),
            matches!(seq, Some(None)),
            matches!(aggregate_type, Some(None)),
            matches!(aggregate_id, Some(None)),
            matches!(event_type, Some(None)),
        ];
        for (i, _) in nulls.iter().enumerate().filter(|(_, &null)| null) {
            r.problems.push(format!("{} is NULL", COLUMNS[i].0));
        }
        let event = OutboxEvent {
            id: id.flatten().unwrap_or_default(),
            seq: seq.flatten().unwrap_or_default(),
            aggregate_type: aggregate_type.flatten().unwrap_or_default(),
            aggregate_id: aggregate_id.flatten().unwrap_or_default(),
            event_type: event_type.flatten().unwrap_or_default(),
            payload: payload.flatten().unwrap_or_default(),
            payload_bytes: payload_bytes.flatten(),
            content_type: content_type.flatten(),
            headers: headers.flatten().unwrap_or_default(),
            attempts: attempts.flatten().unwrap_or_default(),
            attempts_unavailable: attempts_unavailable.flatten().unwrap_or_default(),
            available_at: available_at.flatten().unwrap_or_default(),
            created_at: created_at.flatten().unwrap_or_default(),
            processed_at: processed_at.flatten(),
            dead_at: dead_at.flatten(),
            locked_by: locked_by.flatten(),
            locked_until: locked_until.flatten(),
            last_error: last_error.flatten(),
        };
        Ok(WalEvent {
            event,
            problems: r.problems,
            tableless: false,
        })
    }
}

struct Reader<'a, 'v> {
    layout: &'a Layout,
    values: &'a [Value<'v>],
    problems: Vec<String>,
}

impl Reader<'_, '_> {
    /// Column `i` of [`COLUMNS`]: `Some(None)` for NULL, `None` if it is missing or does not
    /// decode (noted).
    fn get<T>(&mut self, i: usize, f: fn(&[u8]) -> Result<T, String>) -> Option<Option<T>> {
        let (name, want) = COLUMNS[i];
        let Some((at, oid)) = self.layout.at[i] else {
            if i >= ADDED_BY_5 {
                return Some(None);
            }
            self.problems
                .push(format!("the table has no column {name}"));
            return None;
        };
        if oid != want {
            self.problems
                .push(format!("{name} has type OID {oid}, not {want}"));
            return None;
        }
        let bytes = match self.values[at] {
            Value::Null => return Some(None),
            Value::Binary(b) => b,
            Value::Text(_) | Value::Unchanged => {
                self.problems
                    .push(format!("{name} did not come in binary format"));
                return None;
            }
        };
        match f(bytes) {
            Ok(v) => Some(Some(v)),
            Err(e) => {
                self.problems.push(format!("{name}: {e}"));
                None
            }
        }
    }
}

fn fixed<const N: usize>(b: &[u8]) -> Result<[u8; N], String> {
    b.try_into()
        .map_err(|_| format!("{} bytes, not {N}", b.len()))
}

fn uuid(b: &[u8]) -> Result<Uuid, String> {
    Ok(Uuid::from_bytes(fixed(b)?))
}

fn int8(b: &[u8]) -> Result<i64, String> {
    Ok(i64::from_be_bytes(fixed(b)?))
}

fn int4(b: &[u8]) -> Result<i32, String> {
    Ok(i32::from_be_bytes(fixed(b)?))
}

/// bytea's binary format: the bytes themselves.
fn bytea(b: &[u8]) -> Result<Vec<u8>, String> {
    Ok(b.to_vec())
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|e| e.to_string())
}

/// jsonb's binary format: a version byte (1), then the JSON text.
fn jsonb(b: &[u8]) -> Result<serde_json::Value, String> {
    match b.split_first() {
        Some((1, json)) => serde_json::from_slice(json).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("jsonb format version {v}, not 1")),
        None => Err("empty jsonb".into()),
    }
}

/// The payload's jsonb as its text, never parsed into numbers (see [`JsonPayload`]).
fn jsonb_payload(b: &[u8]) -> Result<JsonPayload, String> {
    match b.split_first() {
        Some((1, json)) => {
            let text = std::str::from_utf8(json).map_err(|e| e.to_string())?;
            JsonPayload::from_text(text).map_err(|e| e.to_string())
        }
        Some((v, _)) => Err(format!("jsonb format version {v}, not 1")),
        None => Err("empty jsonb".into()),
    }
}

fn timestamptz(b: &[u8]) -> Result<DateTime<Utc>, String> {
    match i64::from_be_bytes(fixed(b)?) {
        i64::MAX => Err("infinity".into()),
        i64::MIN => Err("-infinity".into()),
        us => pg_time(us).map_err(|e| e.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::wal::pgoutput::Column;

    fn relation(cols: &[(&str, u32)]) -> Relation {
        Relation {
            oid: 1,
            schema: "public".into(),
            name: "outbox_events".into(),
            columns: cols
                .iter()
                .map(|&(name, type_oid)| Column {
                    name: name.into(),
                    type_oid,
                    key: name == "id",
                })
                .collect(),
        }
    }

    /// A valid row's values in the binary format, for the columns `cols` in their order.
    fn row_values(cols: &[(&str, u32)], id: Uuid) -> Vec<Vec<u8>> {
        cols.iter()
            .map(|&(name, _)| match name {
                "id" => id.as_bytes().to_vec(),
                "seq" => 42i64.to_be_bytes().to_vec(),
                "aggregate_type" => b"order".to_vec(),
                "aggregate_id" => b"o-1".to_vec(),
                "event_type" => b"placed".to_vec(),
                "payload" => b"\x01{\"total\": 3}".to_vec(),
                "headers" => b"\x01{\"k\": \"v\"}".to_vec(),
                "attempts" | "attempts_unavailable" | "partition_key" => {
                    0i32.to_be_bytes().to_vec()
                }
                "available_at" | "created_at" => 86_400_000_000i64.to_be_bytes().to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// Empty values are NULL.
    fn tuple(values: &[Vec<u8>]) -> Vec<Value<'_>> {
        values
            .iter()
            .map(|v| {
                if v.is_empty() {
                    Value::Null
                } else {
                    Value::Binary(v)
                }
            })
            .collect()
    }

    #[test]
    fn a_row_decodes_by_column_name_whatever_the_column_order() {
        let mut cols: Vec<(&str, u32)> = COLUMNS.to_vec();
        cols.reverse();
        cols.insert(3, ("partition_key", INT4));
        let layout = Layout::of(&relation(&cols));
        let id = Uuid::now_v7();
        let values = row_values(&cols, id);
        let e = layout.read(&tuple(&values)).expect("the tuple fits");
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        assert_eq!(e.event.id, id);
        assert_eq!(e.event.seq, 42);
        assert_eq!(e.event.aggregate_id, "o-1");
        assert_eq!(e.event.payload, serde_json::json!({"total": 3}));
        assert_eq!(e.event.headers.get("k").map(String::as_str), Some("v"));
        assert_eq!(e.event.created_at.to_rfc3339(), "2000-01-02T00:00:00+00:00");
        assert_eq!(e.event.processed_at, None);
    }

    /// A slot's backlog from before migration 5 comes with the old relation: the columns it
    /// added read as NULL (a JSON event), not as a problem that would dead-letter the row.
    #[test]
    fn a_row_from_before_migration_5_decodes_without_its_columns() {
        let cols = &COLUMNS[..ADDED_BY_5];
        let layout = Layout::of(&relation(cols));
        let id = Uuid::now_v7();
        let values = row_values(cols, id);
        let e = layout.read(&tuple(&values)).expect("the tuple fits");
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        assert_eq!(e.event.id, id);
        assert_eq!((e.event.payload_bytes, e.event.content_type), (None, None));
        // Without an older column the row is still a problem.
        let layout = Layout::of(&relation(&COLUMNS[1..]));
        let values = row_values(&COLUMNS[1..], id);
        let e = layout.read(&tuple(&values)).expect("the tuple fits");
        assert_eq!(e.problems, ["the table has no column id"]);
    }

    #[test]
    fn bad_values_are_noted_by_column_and_the_rest_still_decodes() {
        let layout = Layout::of(&relation(&COLUMNS));
        let mut values: Vec<Value<'_>> = vec![Value::Null; COLUMNS.len()];
        values[0] = Value::Binary(b"short");
        values[4] = Value::Binary(b"placed");
        values[5] = Value::Binary(b"\x02{}");
        values[6] = Value::Binary(b"\x01[1]");
        values[10] = Value::Binary(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        let e = layout.read(&values).expect("the tuple fits");
        let all = e.problems.join("; ");
        for want in [
            "id: 5 bytes, not 16",
            "payload: jsonb format version 2",
            "headers is a JSON array",
            "created_at: infinity",
            "aggregate_type is NULL",
        ] {
            assert!(all.contains(want), "{want:?} not in {all:?}");
        }
        assert_eq!(e.event.event_type, "placed");
        assert!(
            layout.read(&values[1..]).is_err(),
            "a tuple of the wrong width"
        );
    }
}
