//! The write path and the inbox of the text-row stores, in the caller's own transaction:
//! statements `insert_one`, `insert_many` (and their `_bytes` forms), `inbox_create` and
//! `inbox_mark` of the database's [`TextFiles`](super::TextFiles), filled by its `names`.

use sqlx::Executor;
use uuid::Uuid;

use super::db::Bind;
use super::TextBackend;
use crate::error::{db_error, Error};
use crate::store::rows::{any_bytes, text_values, text_values_json};
use crate::{NewEvent, OutboxTable};

/// One event: a plain insert. Several: one statement over one JSON array of rows (no limit on
/// bound parameters), inserted in array order, so `seq` follows the slice.
pub(crate) async fn insert<'e, DB, E>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error>
where
    DB: TextBackend,
    E: Executor<'e, Database = DB>,
{
    let f = DB::names(t);
    let files = &DB::FILES;
    // JSON events alone name schema 4's columns only (see `INSERT_COLUMNS`).
    let bytes = any_bytes(events);
    let columns = if bytes { 8 } else { 6 };
    let (sql, binds) = if let [e] = events {
        let sql = f.fill(if bytes {
            files.insert_one_bytes
        } else {
            files.insert_one
        });
        let values = text_values(e)?.into_iter().take(columns);
        (sql, values.map(Bind::MaybeText).collect())
    } else {
        let sql = f.fill(if bytes {
            files.insert_many_bytes
        } else {
            files.insert_many
        });
        (sql, vec![Bind::Text(text_values_json(events, columns)?)])
    };
    DB::execute(executor, &sql, binds)
        .await
        .map_err(|e| db_error(t, e))?;
    Ok(())
}

/// The inbox table, for consumers that do not run the migrations.
pub(crate) async fn create_inbox<'e, DB, E>(t: &OutboxTable, executor: E) -> Result<(), Error>
where
    DB: TextBackend,
    E: Executor<'e, Database = DB>,
{
    let sql = DB::names(t).fill(DB::FILES.inbox_create);
    DB::execute(executor, &sql, Vec::new())
        .await
        .map_err(Error::Database)?;
    Ok(())
}

/// `true` the first time `id` is seen: an insert on the primary key that does nothing on a
/// repeat (a concurrent consumer of the same id waits for the first one's transaction, then
/// sees the row).
pub(crate) async fn mark_processed<'e, DB, E>(
    t: &OutboxTable,
    executor: E,
    id: Uuid,
) -> Result<bool, Error>
where
    DB: TextBackend,
    E: Executor<'e, Database = DB>,
{
    let sql = DB::names(t).fill(DB::FILES.inbox_mark);
    let id = vec![Bind::Text(id.hyphenated().to_string())];
    let done = DB::execute(executor, &sql, id).await;
    Ok(done.map_err(|e| db_error(t, e))? == 1)
}
