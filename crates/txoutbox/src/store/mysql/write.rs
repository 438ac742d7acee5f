//! The write path and the inbox on MySQL / MariaDB, in the caller's own transaction.

use sqlx::{Executor, MySql};
use uuid::Uuid;

use super::schema::{plain, table};
use crate::error::{db_error, Error};
use crate::store::rows::{insert_text, INSERT_COLUMNS};
use crate::{NewEvent, OutboxTable};

/// One event: a plain insert. Several: one statement over a JSON array of rows (`JSON_TABLE`),
/// inserted in array order, so `seq` follows the slice.
pub(crate) async fn insert<'e, E>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error>
where
    E: Executor<'e, Database = MySql>,
{
    let q = table(t);
    let one = format!("INSERT INTO {q} ({INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)");
    let many = format!(
        "INSERT INTO {q} ({INSERT_COLUMNS})
         SELECT j.id, j.aggregate_type, j.aggregate_id, j.event_type, j.payload, j.headers
         FROM JSON_TABLE(?, '$[*]' COLUMNS (
             n FOR ORDINALITY,
             id CHAR(36) PATH '$[0]',
             aggregate_type VARCHAR(255) PATH '$[1]',
             aggregate_id VARCHAR(255) PATH '$[2]',
             event_type VARCHAR(255) PATH '$[3]',
             payload LONGTEXT PATH '$[4]',
             headers LONGTEXT PATH '$[5]'
         )) AS j
         ORDER BY j.n"
    );
    insert_text(t, executor, events, &one, &many).await
}

pub(crate) async fn create_inbox<'e, E>(t: &OutboxTable, executor: E) -> Result<(), Error>
where
    E: Executor<'e, Database = MySql>,
{
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {} (event_id CHAR(36) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
         processed_at BIGINT NOT NULL DEFAULT ({})) ENGINE = InnoDB",
        plain(t, "processed_events"),
        super::schema::NOW_MS
    ))
    .execute(executor)
    .await
    .map_err(Error::Database)?;
    Ok(())
}

/// `INSERT IGNORE` on the primary key: a concurrent consumer of the same id waits on the
/// first one's row lock, then sees the row.
pub(crate) async fn mark_processed<'e, E>(
    t: &OutboxTable,
    executor: E,
    id: Uuid,
) -> Result<bool, Error>
where
    E: Executor<'e, Database = MySql>,
{
    let done = sqlx::query(&format!(
        "INSERT IGNORE INTO {} (event_id) VALUES (?)",
        plain(t, "processed_events")
    ))
    .bind(id.hyphenated().to_string())
    .execute(executor)
    .await
    .map_err(|e| db_error(t, e))?;
    Ok(done.rows_affected() == 1)
}
