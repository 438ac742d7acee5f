//! The write path and the inbox on SQLite, in the caller's own transaction.

use sqlx::{Executor, Sqlite};
use uuid::Uuid;

use super::schema::{table, NOW_MS};
use crate::error::{db_error, Error};
use crate::store::rows::{insert_text, INSERT_COLUMNS};
use crate::{NewEvent, OutboxTable};

/// One event: a plain insert. Several: one statement over a JSON array of rows (`json_each`),
/// inserted in array order, so `seq` follows the slice.
pub(crate) async fn insert<'e, E>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error>
where
    E: Executor<'e, Database = Sqlite>,
{
    let q = table(t);
    let one = format!("INSERT INTO {q} ({INSERT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    let many = format!(
        "INSERT INTO {q} ({INSERT_COLUMNS})
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
                json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
         FROM json_each(?1) ORDER BY key"
    );
    insert_text(t, executor, events, &one, &many).await
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
