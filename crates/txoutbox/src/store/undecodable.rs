//! Rows the relay cannot decode: plain SQL can write a row whose id is not a UUID (SQLite,
//! MySQL), whose timestamp is out of range or `infinity` (PostgreSQL), whose headers are not
//! a JSON object, and so on. Such a row must not fail a whole claim, let alone stop the relay:
//! each store decodes every row on its own ([`Reader`]), dead-letters the rows that do not
//! decode, fenced like any settle, with a last error that says what is wrong ("undecodable
//! row: id 'abc' is not a UUID"), and hands out the rest. Operator listings show such rows
//! with placeholders where a column did not decode.

use std::collections::BTreeMap;
use std::fmt::Display;

use chrono::{DateTime, Utc};
use sqlx::{Column, ColumnIndex, Decode, Row, Type, TypeInfo, ValueRef};
use uuid::Uuid;

use crate::error::Error;
use crate::metrics as m;
use crate::store::{too_large, Ordering};
use crate::{JsonPayload, OutboxEvent};

/// The prefix of the last error of a row dead-lettered because it did not decode.
pub(crate) const PREFIX: &str = "undecodable row: ";

/// A row, decoded: the event (with placeholders where a column did not decode) and what did
/// not decode.
#[derive(Debug, Clone)]
pub(crate) struct Decoded {
    pub event: OutboxEvent,
    /// One entry per column that did not decode, naming it.
    pub problems: Vec<String>,
    /// Whether the event type decoded (`event.event_type` is then the stored value, not a
    /// placeholder).
    event_type_read: bool,
    /// Whether both parts of the aggregate decoded.
    aggregate_read: bool,
    /// Why the event is refused whole, read or not: its payload is larger than the claim's
    /// [`ClaimBytes::event`](crate::store::ClaimBytes::event) (the claim did not read it).
    pub too_large: Option<String>,
}

impl Decoded {
    /// The row read as `c`, with `problems` (one per column that did not decode): the event,
    /// with placeholders where a column did not decode.
    fn from_columns(problems: Vec<String>, c: Columns) -> Decoded {
        // Flags, not copies of the strings: only a row that is dead-lettered asks for them.
        let aggregate_read = c.aggregate_type.is_some() && c.aggregate_id.is_some();
        let event_type_read = c.event_type.is_some();
        let event = OutboxEvent {
            id: c.id.unwrap_or_default(),
            seq: c.seq.unwrap_or_default(),
            aggregate_type: c.aggregate_type.unwrap_or_default(),
            aggregate_id: c.aggregate_id.unwrap_or_default(),
            event_type: c.event_type.unwrap_or_default(),
            payload: c.payload.unwrap_or_default(),
            payload_bytes: c.payload_bytes.flatten(),
            content_type: c.content_type.flatten(),
            headers: c.headers.unwrap_or_default(),
            attempts: c.attempts.unwrap_or_default(),
            attempts_unavailable: c.attempts_unavailable.unwrap_or_default(),
            available_at: c.available_at.unwrap_or_default(),
            created_at: c.created_at.unwrap_or_default(),
            processed_at: c.processed_at.flatten(),
            dead_at: c.dead_at.flatten(),
            locked_by: c.locked_by.flatten(),
            locked_until: c.locked_until.flatten(),
            last_error: c.last_error.flatten(),
        };
        Decoded {
            event,
            problems,
            event_type_read,
            aggregate_read,
            too_large: None,
        }
    }

    /// The event type as stored, when it decoded (a label of the dead-letter metric).
    pub fn event_type(&self) -> Option<&str> {
        self.event_type_read
            .then_some(self.event.event_type.as_str())
    }

    /// The aggregate as stored, when both parts decoded.
    pub fn aggregate(&self) -> Option<(&str, &str)> {
        self.aggregate_read.then_some((
            self.event.aggregate_type.as_str(),
            self.event.aggregate_id.as_str(),
        ))
    }

    /// The last error to dead-letter it with, if it did not decode or is refused.
    pub fn last_error(&self) -> Option<String> {
        if let Some(e) = &self.too_large {
            return Some(e.clone());
        }
        (!self.problems.is_empty()).then(|| format!("{PREFIX}{}", self.problems.join("; ")))
    }

    /// Whether the claim dead-letters this row rather than hand it out.
    pub fn is_bad(&self) -> bool {
        self.too_large.is_some() || !self.problems.is_empty()
    }

    /// Refuse the event if its payload (`size` bytes, as the claim measured it) is over
    /// `limit`: such a row comes without its payload, so what did not decode for that is moot.
    pub fn refuse_over(&mut self, size: Option<i64>, limit: u64) {
        let Some(size) = size.and_then(|s| u64::try_from(s).ok()) else {
            return;
        };
        if size > limit {
            self.problems.clear();
            self.too_large = Some(too_large(size, limit));
        }
    }
}

/// Reads the columns of one row, noting each that does not decode instead of stopping at the
/// first.
pub(crate) struct Reader<'r, R> {
    row: &'r R,
    problems: Vec<String>,
    /// Where the next column asked for probably is: just after the last one. The statements
    /// select the columns in the order the decoders ask for them, so a column is found by one
    /// comparison of its name; a lookup by name (hashed, in sqlx's rows) was a tenth of the
    /// relay's time in a drain.
    next: usize,
}

impl<'r, R: Row> Reader<'r, R>
where
    &'static str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
{
    pub fn new(row: &'r R) -> Self {
        Self {
            row,
            problems: Vec::new(),
            next: 0,
        }
    }

    /// The raw value of `col`: at the position after the last column read if it is there,
    /// else looked up by name.
    fn raw(
        &mut self,
        col: &'static str,
    ) -> Result<<R::Database as sqlx::Database>::ValueRef<'r>, Error> {
        let at = match self.row.columns().get(self.next) {
            Some(c) if c.name() == col => self.next,
            _ => col.index(self.row).map_err(Error::Database)?,
        };
        self.next = at + 1;
        self.row.try_get_raw(at).map_err(Error::Database)
    }

    /// The column's value, or `None` if it does not decode (noted, with its type when that
    /// is what is wrong). A column missing from the row is a bug, not a bad row: an error.
    pub fn get<T>(&mut self, col: &'static str) -> Result<Option<T>, Error>
    where
        T: Decode<'r, R::Database> + Type<R::Database>,
    {
        let value = self.raw(col)?;
        if !value.is_null() {
            let ty = value.type_info();
            if !ty.is_null() && !T::compatible(&ty) {
                let problem = format!("{col} is {}, not {}", ty.name(), T::type_info().name());
                self.problems.push(problem);
                return Ok(None);
            }
        }
        Ok(self.check(col, T::decode(value)))
    }

    /// The column's value through `f`, which says what is wrong with it; `None` if it does
    /// not decode.
    #[cfg(feature = "postgres")]
    pub fn with<T>(
        &mut self,
        col: &'static str,
        f: impl FnOnce(<R::Database as sqlx::Database>::ValueRef<'r>) -> Result<T, String>,
    ) -> Result<Option<T>, Error> {
        let value = self.raw(col)?;
        Ok(match f(value) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problems.push(e);
                None
            }
        })
    }

    /// `v`, or `None` with its error noted against `col`.
    pub fn check<T, E: Display>(&mut self, col: &str, v: Result<T, E>) -> Option<T> {
        match v {
            Ok(v) => Some(v),
            Err(e) => {
                self.problems.push(format!("{col}: {e}"));
                None
            }
        }
    }

    /// `v`, or `None` with its error (which names the column) noted as it is.
    pub fn ok<T>(&mut self, v: Result<T, String>) -> Option<T> {
        match v {
            Ok(v) => Some(v),
            Err(e) => {
                self.problems.push(e);
                None
            }
        }
    }

    /// Integer milliseconds since the Unix epoch (SQLite, MySQL) as a time.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub fn millis(&mut self, col: &'static str) -> Result<Option<DateTime<Utc>>, Error>
    where
        i64: Decode<'r, R::Database> + Type<R::Database>,
    {
        let ms = self.get::<i64>(col)?;
        Ok(ms.and_then(|ms| self.ok(millis_time(col, ms))))
    }

    /// A nullable [`Self::millis`]; `None` if it does not decode.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub fn opt_millis(&mut self, col: &'static str) -> Result<Option<Option<DateTime<Utc>>>, Error>
    where
        i64: Decode<'r, R::Database> + Type<R::Database>,
    {
        Ok(match self.get::<Option<i64>>(col)? {
            Some(Some(ms)) => self.ok(millis_time(col, ms)).map(Some),
            Some(None) => Some(None),
            None => None,
        })
    }

    /// JSON stored as text (SQLite, MySQL): the value, and the text when it is not JSON.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub fn json_text(
        &mut self,
        col: &'static str,
    ) -> Result<(Option<serde_json::Value>, Option<String>), Error>
    where
        String: Decode<'r, R::Database> + Type<R::Database>,
    {
        let Some(text) = self.get::<String>(col)? else {
            return Ok((None, None));
        };
        match serde_json::from_str(&text) {
            Ok(v) => Ok((Some(v), None)),
            Err(e) => {
                self.problems.push(format!("{col} is not JSON: {e}"));
                Ok((None, Some(text)))
            }
        }
    }

    /// A JSON payload stored as text (SQLite, MySQL), kept as that text; text that is not JSON
    /// is noted and shown to operators as a JSON string.
    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub fn json_payload(&mut self, col: &'static str) -> Result<Option<JsonPayload>, Error>
    where
        String: Decode<'r, R::Database> + Type<R::Database>,
    {
        let Some(text) = self.get::<String>(col)? else {
            return Ok(None);
        };
        match JsonPayload::from_text(&text) {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                self.problems.push(format!("{col} is not JSON: {e}"));
                Ok(JsonPayload::serialize(&text).ok())
            }
        }
    }

    /// The decoded row: the event, with placeholders where a column did not decode.
    pub fn finish(self, c: Columns) -> Decoded {
        Decoded::from_columns(self.problems, c)
    }
}

/// The columns of an event row as read: `None` where a column did not decode (and, for the
/// nullable ones, `Some(None)` where it is NULL).
#[derive(Debug, Default)]
pub(crate) struct Columns {
    pub id: Option<Uuid>,
    pub seq: Option<i64>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub event_type: Option<String>,
    pub payload: Option<JsonPayload>,
    pub payload_bytes: Option<Option<Vec<u8>>>,
    pub content_type: Option<Option<String>>,
    pub headers: Option<BTreeMap<String, String>>,
    pub attempts: Option<i32>,
    pub attempts_unavailable: Option<i32>,
    pub available_at: Option<DateTime<Utc>>,
    pub created_at: Option<DateTime<Utc>>,
    pub processed_at: Option<Option<DateTime<Utc>>>,
    pub dead_at: Option<Option<DateTime<Utc>>>,
    pub locked_by: Option<Option<String>>,
    pub locked_until: Option<Option<DateTime<Utc>>>,
    pub last_error: Option<Option<String>>,
}

/// An id stored as text that is not a UUID: the problem, quoting (the start of) it.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn parse_id(text: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text).map_err(|_| {
        let shown: String = text.chars().take(64).collect::<String>();
        let more = if text.chars().count() > 64 { "..." } else { "" };
        format!("id '{}{more}' is not a UUID", shown.escape_debug())
    })
}

/// Integer milliseconds since the Unix epoch (SQLite, MySQL) as a time.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn millis_time(col: &str, ms: i64) -> Result<DateTime<Utc>, String> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| format!("{col} {ms} ms is out of range"))
}

/// Headers as stored: a JSON object (non-string values kept as their JSON text).
pub(crate) fn headers(v: serde_json::Value) -> Result<BTreeMap<String, String>, String> {
    let kind = match &v {
        serde_json::Value::Object(_) => return Ok(crate::event::headers_from_json(v)),
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
    };
    Err(format!("headers is a JSON {kind}, not an object"))
}

/// A claim's rows, sorted: the events to hand out, the rows to dead-letter, the events to
/// give back unattempted.
pub(crate) type Split = (Vec<OutboxEvent>, Vec<Decoded>, Vec<OutboxEvent>);

/// Split a claim's rows (in any order: a statement need not sort them) into the events to hand
/// out, in seq order, and the rows to dead-letter. With
/// [`Ordering::OrderedHold`] a dead letter holds its aggregate back, so an event of the claim
/// that comes after an undecodable row of its aggregate (or of an aggregate that did not
/// decode) is held too: the third list, to give back unattempted.
pub(crate) fn split(mut rows: Vec<Decoded>, ordering: Ordering) -> Split {
    rows.sort_unstable_by_key(|d| d.event.seq);
    let (mut events, mut bad, mut held) = (Vec::new(), Vec::new(), Vec::new());
    for d in rows {
        if d.is_bad() {
            tracing::warn!(seq = d.event.seq, error = %d.last_error().unwrap_or_default(),
                "dead-lettering a row that does not decode or is too large to send");
            bad.push(d);
            continue;
        }
        let behind_bad = ordering == Ordering::OrderedHold
            && bad.iter().any(|b: &Decoded| {
                b.event.seq < d.event.seq
                    && match b.aggregate() {
                        Some((t, i)) => t == d.event.aggregate_type && i == d.event.aggregate_id,
                        None => true,
                    }
            });
        if behind_bad {
            held.push(d.event);
        } else {
            events.push(d.event);
        }
    }
    (events, bad, held)
}

/// The rows to dead-letter as one JSON array of `[seq, last error]` pairs, for a single
/// statement that buries them all.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn bad_rows_json(bad: &[Decoded]) -> String {
    let pairs = bad
        .iter()
        .map(|b| serde_json::json!([b.event.seq, b.last_error()]));
    serde_json::Value::Array(pairs.collect()).to_string()
}

/// Count rows dead-lettered because they did not decode.
pub(crate) fn count_dead(bad: &[Decoded], labels: &crate::metrics::MetricLabels) {
    for b in bad {
        let event_type = b.event_type().unwrap_or_default().to_owned();
        ::metrics::counter!(m::DEAD_LETTERED_TOTAL, labels.and("event_type", event_type))
            .increment(1);
    }
}

/// A row of a store that keeps ids and JSON as text and times as integer milliseconds
/// (SQLite, MySQL), decoded column by column.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn decode_text_row<'r, R: Row>(r: &'r R) -> Result<Decoded, Error>
where
    &'static str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database>,
    Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
{
    let mut c = Reader::new(r);
    let id = c.get::<String>("id")?;
    let id = id.and_then(|s| c.ok(parse_id(&s)));
    let (seq, aggregate_type) = (c.get("seq")?, c.get("aggregate_type")?);
    let (aggregate_id, event_type) = (c.get("aggregate_id")?, c.get("event_type")?);
    let payload = c.json_payload("payload")?;
    let (headers_json, _) = c.json_text("headers")?;
    let headers = headers_json.and_then(|v| c.ok(headers(v)));
    let int32 =
        |c: &mut Reader<'r, R>, col: &'static str| -> Result<Option<i32>, Error> {
            let v = c.get::<i64>(col)?;
            Ok(v.and_then(|v| {
                c.ok(i32::try_from(v).map_err(|_| format!("{col} {v} is out of range")))
            }))
        };
    let columns = Columns {
        id,
        seq,
        aggregate_type,
        aggregate_id,
        event_type,
        payload,
        payload_bytes: c.get("payload_bytes")?,
        content_type: c.get("content_type")?,
        headers,
        attempts: int32(&mut c, "attempts")?,
        attempts_unavailable: int32(&mut c, "attempts_unavailable")?,
        available_at: c.millis("available_at")?,
        created_at: c.millis("created_at")?,
        processed_at: c.opt_millis("processed_at")?,
        dead_at: c.opt_millis("dead_at")?,
        locked_by: c.get("locked_by")?,
        locked_until: c.opt_millis("locked_until")?,
        last_error: c.get("last_error")?,
    };
    Ok(c.finish(columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded row of `aggregate` (`None`: its aggregate did not decode) with a problem
    /// when `bad`.
    fn row(seq: i64, aggregate: Option<&str>, bad: bool) -> Decoded {
        let columns = Columns {
            seq: Some(seq),
            aggregate_type: aggregate.map(|_| "order".to_owned()),
            aggregate_id: aggregate.map(str::to_owned),
            event_type: Some("order.created".to_owned()),
            ..Columns::default()
        };
        let mut d = Decoded::from_columns(Vec::new(), columns);
        if bad {
            d.problems.push("headers is not a JSON object".to_owned());
        }
        d
    }

    fn seqs(events: &[OutboxEvent]) -> Vec<i64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn events_come_out_in_seq_order_whatever_order_the_rows_came_in() {
        let rows = vec![
            row(3, Some("a"), false),
            row(1, Some("b"), false),
            row(4, Some("a"), true),
            row(2, Some("a"), false),
        ];
        let (events, bad, held) = split(rows, Ordering::Ordered);
        assert_eq!(seqs(&events), [1, 2, 3]);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].event.seq, 4);
        assert!(held.is_empty());
    }

    #[test]
    fn with_hold_a_dead_letter_holds_back_its_aggregates_later_events_only() {
        let rows = vec![
            row(4, Some("b"), false),
            row(3, Some("a"), false),
            row(2, Some("a"), true),
            row(1, Some("a"), false),
        ];
        let (events, bad, held) = split(rows, Ordering::OrderedHold);
        assert_eq!(seqs(&events), [1, 4]);
        assert_eq!(bad[0].aggregate(), Some(("order", "a")));
        assert_eq!(seqs(&held), [3]);
    }

    #[test]
    fn a_row_whose_aggregate_did_not_decode_holds_back_everything_after_it() {
        let rows = vec![
            row(2, None, true),
            row(3, Some("b"), false),
            row(1, Some("c"), false),
        ];
        let (events, bad, held) = split(rows, Ordering::OrderedHold);
        assert_eq!(seqs(&events), [1]);
        assert_eq!(bad[0].aggregate(), None);
        assert_eq!(bad[0].event_type(), Some("order.created"));
        assert_eq!(seqs(&held), [3]);
    }
}
