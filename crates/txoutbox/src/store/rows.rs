//! The rows every store reads alike (the counts of `txoutbox status`, the columns of a new
//! event), and those that the text-row stores (SQLite, MySQL: times as integer milliseconds,
//! ids and JSON as text) read and write alike: new events, the columns of events (their
//! decoder, which copes with bad rows, is `undecodable::decode_text_row`), relays, failures.

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::Counts;
use crate::error::Error;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use {
    super::{Failure, RelayInfo},
    crate::NewEvent,
};

/// The row of a counts query: pending, leased, dead, processed, then the age of the oldest
/// pending event in seconds (NULL when there is none).
pub(crate) fn counts<'r, R: Row>(r: &'r R) -> Result<Counts, Error>
where
    usize: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Option<f64>: Decode<'r, R::Database> + Type<R::Database>,
{
    let g = Error::Database;
    Ok(Counts {
        pending: r.try_get(0).map_err(g)?,
        leased: r.try_get(1).map_err(g)?,
        dead: r.try_get(2).map_err(g)?,
        processed: r.try_get(3).map_err(g)?,
        oldest_pending_age_secs: r.try_get(4).map_err(g)?,
    })
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// A time stored as integer milliseconds since the Unix epoch.
pub(crate) fn ts(ms: i64) -> Result<DateTime<Utc>, Error> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
        Error::Database(sqlx::Error::Decode(
            format!("timestamp out of range: {ms} ms").into(),
        ))
    })
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// The columns `undecodable::decode_text_row` reads, for the select lists of the text-row stores.
pub(crate) const COLUMNS: &str =
    "id, seq, aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type, \
     headers, attempts, attempts_unavailable, available_at, created_at, processed_at, dead_at, \
     locked_by, locked_until, last_error";

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// A row of a relays listing (`relay_id`, `mode`, `started_at`, `heartbeat_at` and `alive`,
/// an integer truth value), owning `partitions`.
pub(crate) fn relay<'r, R: Row>(r: &'r R, partitions: Vec<i32>) -> Result<RelayInfo, Error>
where
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let g = Error::Database;
    Ok(RelayInfo {
        relay_id: r.try_get("relay_id").map_err(g)?,
        mode: r.try_get("mode").map_err(g)?,
        started_at: ts(r.try_get("started_at").map_err(g)?)?,
        heartbeat_at: ts(r.try_get("heartbeat_at").map_err(g)?)?,
        alive: r.try_get::<i64, _>("alive").map_err(g)? != 0,
        partitions,
    })
}

/// The columns an insert of new JSON events fills, in the order of `text_values`: those of
/// schema 4, so that a writer upgraded before `migrate` ran still writes JSON events.
pub(crate) const INSERT_COLUMNS: &str =
    "id, aggregate_type, aggregate_id, event_type, payload, headers";

/// The columns an insert fills when one of its events has bytes (schema 5).
pub(crate) const INSERT_COLUMNS_BYTES: &str =
    "id, aggregate_type, aggregate_id, event_type, payload, headers, payload_bytes, content_type";

/// Does any of `events` carry bytes (so the insert needs schema 5's columns)?
pub(crate) fn any_bytes(events: &[crate::NewEvent]) -> bool {
    events.iter().any(|e| e.payload_bytes.is_some())
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// A new event's values as text, in the order of the insert's columns: id, aggregate type,
/// aggregate id, event type, payload, headers, then the bytes as hex (the insert unhexes them)
/// and their content type, both NULL for a JSON event.
pub(crate) fn text_values(e: &NewEvent) -> Result<[Option<String>; 8], serde_json::Error> {
    Ok([
        Some(e.id.hyphenated().to_string()),
        Some(e.aggregate_type.clone()),
        Some(e.aggregate_id.clone()),
        Some(e.event_type.clone()),
        Some(e.payload.as_str().to_string()),
        Some(serde_json::to_string(&e.headers)?),
        e.payload_bytes.as_deref().map(hex),
        e.content_type.clone(),
    ])
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// New events as one JSON array of [`text_values`] arrays (their first `columns` values), for
/// a single insert statement (no limit on bound parameters).
pub(crate) fn text_values_json(
    events: &[NewEvent],
    columns: usize,
) -> Result<String, serde_json::Error> {
    let rows = events
        .iter()
        .map(|e| text_values(e).map(|v| serde_json::json!(v[..columns])))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(serde_json::Value::Array(rows).to_string())
}

/// A settle's failures as one JSON array of `[id, last error, delay in ms, dead (0 or 1),
/// broker unavailable (0 or 1)]`, for a single statement that backs them all off.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn failures_json(failed: &[Failure]) -> String {
    let rows = failed.iter().map(|f| {
        serde_json::json!([
            f.id.hyphenated().to_string(),
            f.error,
            super::operator::millis(f.retry_in),
            i32::from(f.dead),
            i32::from(f.unavailable),
        ])
    });
    serde_json::Value::Array(rows.collect()).to_string()
}
