//! PostgreSQL rows to events, column by column: a value plain SQL wrote that the relay cannot
//! read makes the row a dead letter with a last error that says what is wrong.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgRow, PgValueFormat, PgValueRef};
use sqlx::{TypeInfo, ValueRef};
use uuid::Uuid;

use crate::error::Error;
use crate::store::undecodable::{self, Columns, Decoded, Reader};
use crate::{JsonPayload, OutboxEvent};

/// The row as an event, with placeholders where a column does not decode (operator listings).
pub(crate) fn event_from_row(r: &PgRow) -> Result<OutboxEvent, Error> {
    Ok(decode_row(r)?.event)
}

/// One row, column by column: what decoded and what did not (see [`undecodable`]).
pub(super) fn decode_row(r: &PgRow) -> Result<Decoded, Error> {
    let mut c = Reader::new(r);
    let columns = Columns {
        id: c.get::<Uuid>("id")?,
        seq: c.get("seq")?,
        aggregate_type: c.get("aggregate_type")?,
        aggregate_id: c.get("aggregate_id")?,
        event_type: c.get("event_type")?,
        payload: c.with("payload", |v| pg_json("payload", v))?,
        payload_bytes: c.get("payload_bytes")?,
        content_type: c.get("content_type")?,
        headers: {
            let v = c.get::<serde_json::Value>("headers")?;
            v.and_then(|v| c.ok(undecodable::headers(v)))
        },
        attempts: c.get("attempts")?,
        attempts_unavailable: c.get("attempts_unavailable")?,
        available_at: c
            .with("available_at", |v| pg_time("available_at", v))?
            .flatten(),
        created_at: c
            .with("created_at", |v| pg_time("created_at", v))?
            .flatten(),
        processed_at: c.with("processed_at", |v| pg_time("processed_at", v))?,
        dead_at: c.with("dead_at", |v| pg_time("dead_at", v))?,
        locked_by: c.get("locked_by")?,
        locked_until: c.with("locked_until", |v| pg_time("locked_until", v))?,
        last_error: c.get("last_error")?,
    };
    Ok(c.finish(columns))
}

/// A `jsonb` (or `json`) column as its text, exactly as the server sends it: never parsed
/// into numbers, so no digit is lost (see [`JsonPayload`]).
pub(crate) fn pg_json(col: &str, v: PgValueRef<'_>) -> Result<JsonPayload, String> {
    if v.is_null() {
        return Err(format!("{col} is NULL"));
    }
    let info = v.type_info();
    let jsonb = match info.name() {
        "JSONB" => true,
        "JSON" => false,
        other => return Err(format!("{col} is {other}, not JSONB")),
    };
    let binary = v.format() == PgValueFormat::Binary;
    let bytes = v.as_bytes().map_err(|e| format!("{col}: {e}"))?;
    let text = match (binary && jsonb, bytes.split_first()) {
        (false, _) => bytes,
        (true, Some((1, text))) => text,
        (true, Some((version, _))) => {
            return Err(format!("{col}: jsonb format version {version}, not 1"))
        }
        (true, None) => return Err(format!("{col}: empty jsonb")),
    };
    let text = std::str::from_utf8(text).map_err(|e| format!("{col} is not UTF-8: {e}"))?;
    JsonPayload::from_text(text).map_err(|e| format!("{col} is not JSON: {e}"))
}

/// A `timestamptz` (`None`: NULL), or what is wrong with it. sqlx's own decoding panics on
/// `infinity`, `-infinity` and times past chrono's range (PostgreSQL's reaches further), so
/// the binary value is read here: microseconds since 2000-01-01, `i64::MAX`/`MIN` for the
/// infinities.
fn pg_time(col: &str, v: PgValueRef<'_>) -> Result<Option<DateTime<Utc>>, String> {
    if v.is_null() {
        return Ok(None);
    }
    let at = match v.format() {
        PgValueFormat::Text => <DateTime<Utc> as sqlx::Decode<sqlx::Postgres>>::decode(v)
            .map_err(|e| format!("{col}: {e}"))?,
        PgValueFormat::Binary => {
            let us = <i64 as sqlx::Decode<sqlx::Postgres>>::decode(v)
                .map_err(|e| format!("{col}: {e}"))?;
            match us {
                i64::MAX => return Err(format!("{col} is infinity")),
                i64::MIN => return Err(format!("{col} is -infinity")),
                us => DateTime::from_timestamp(946_684_800, 0)
                    .and_then(|epoch| epoch.checked_add_signed(chrono::TimeDelta::microseconds(us)))
                    .ok_or_else(|| format!("{col} is out of range ({us} µs from 2000-01-01)"))?,
            }
        }
    };
    Ok(Some(at))
}
