//! The write path and the inbox on MySQL / MariaDB, in the caller's own transaction.

use sqlx::{Executor, MySql};
use uuid::Uuid;

use super::queries::names;
use crate::error::{db_error, Error};
use crate::store::rows::insert_text;
use crate::store::sql::sql_file;
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
    let f = names(t);
    let one = f.fill(sql_file!("mysql", "insert_one"));
    let many = f.fill(sql_file!("mysql", "insert_many"));
    insert_text(t, executor, events, &one, &many).await
}

pub(crate) async fn create_inbox<'e, E>(t: &OutboxTable, executor: E) -> Result<(), Error>
where
    E: Executor<'e, Database = MySql>,
{
    sqlx::query(&names(t).fill(sql_file!("mysql", "inbox_create")))
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
    let done = sqlx::query(&names(t).fill(sql_file!("mysql", "inbox_mark")))
    .bind(id.hyphenated().to_string())
    .execute(executor)
    .await
    .map_err(|e| db_error(t, e))?;
    Ok(done.rows_affected() == 1)
}
