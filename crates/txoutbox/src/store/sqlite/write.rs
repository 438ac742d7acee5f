//! The write path and the inbox on SQLite, in the caller's own transaction.

use sqlx::{Executor, Sqlite};
use uuid::Uuid;

use super::schema::{table, NOW_MS};
use crate::error::{db_error, Error};
use crate::{NewEvent, OutboxTable};

const COLS: &str = "id, aggregate_type, aggregate_id, event_type, payload, headers";

/// One event: a plain insert. Several: one statement over a JSON array of rows (no limit on
/// bound parameters), inserted in array order, so `seq` follows the slice.
pub(crate) async fn insert<'e, E>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error>
where
    E: Executor<'e, Database = Sqlite>,
{
    let q = table(t);
    if let [e] = events {
        sqlx::query(&format!(
            "INSERT INTO {q} ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        ))
        .bind(e.id.hyphenated().to_string())
        .bind(&e.aggregate_type)
        .bind(&e.aggregate_id)
        .bind(&e.event_type)
        .bind(serde_json::to_string(&e.payload)?)
        .bind(serde_json::to_string(&e.headers)?)
        .execute(executor)
        .await
        .map_err(|err| db_error(t, err))?;
        return Ok(());
    }
    let rows = events
        .iter()
        .map(|e| {
            Ok(serde_json::json!([
                e.id.hyphenated().to_string(),
                e.aggregate_type,
                e.aggregate_id,
                e.event_type,
                serde_json::to_string(&e.payload)?,
                serde_json::to_string(&e.headers)?,
            ]))
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    sqlx::query(&format!(
        "INSERT INTO {q} ({COLS})
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
                json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
         FROM json_each(?1) ORDER BY key"
    ))
    .bind(serde_json::Value::Array(rows).to_string())
    .execute(executor)
    .await
    .map_err(|err| db_error(t, err))?;
    Ok(())
}

pub(crate) async fn create_inbox<'e, E>(_t: &OutboxTable, executor: E) -> Result<(), Error>
where
    E: Executor<'e, Database = Sqlite>,
{
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS processed_events (event_id TEXT PRIMARY KEY, \
         processed_at INTEGER NOT NULL DEFAULT ({NOW_MS}))"
    ))
    .execute(executor)
    .await
    .map_err(Error::Database)?;
    Ok(())
}

/// SQLite serialises writers: a second consumer of the same id waits for the first one's
/// transaction (busy timeout) and then sees the row.
pub(crate) async fn mark_processed<'e, E>(
    t: &OutboxTable,
    executor: E,
    id: Uuid,
) -> Result<bool, Error>
where
    E: Executor<'e, Database = Sqlite>,
{
    let done = sqlx::query(
        "INSERT INTO processed_events (event_id) VALUES (?1) ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(id.hyphenated().to_string())
    .execute(executor)
    .await
    .map_err(|e| db_error(t, e))?;
    Ok(done.rows_affected() == 1)
}
