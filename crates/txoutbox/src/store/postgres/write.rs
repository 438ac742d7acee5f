//! The write path and the inbox on PostgreSQL, in the caller's own transaction.

use sqlx::PgExecutor;
use uuid::Uuid;

use super::queries::names;
use crate::error::{db_error, Error};
use crate::store::sql::sql_file;
use crate::{NewEvent, OutboxTable};

/// One event: a plain insert. Several: one statement through `unnest`, `WITH ORDINALITY`
/// keeping `seq` in slice order.
pub(crate) async fn insert<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error> {
    // JSON events alone name schema 4's columns only, so a writer upgraded before `migrate`
    // ran still writes them (see `rows::INSERT_COLUMNS`).
    let bytes = crate::store::rows::any_bytes(events);
    if let [event] = events {
        let sql = if bytes {
            sql_file!("postgres", "insert_one_bytes")
        } else {
            sql_file!("postgres", "insert_one")
        };
        let sql = names(t).fill(sql);
        let query = sqlx::query(&sql)
            .bind(event.id)
            .bind(&event.aggregate_type)
            .bind(&event.aggregate_id)
            .bind(&event.event_type)
            .bind(sqlx::types::Json(&event.payload))
            .bind(sqlx::types::Json(&event.headers));
        let query = if bytes {
            query
                .bind(event.payload_bytes.as_deref())
                .bind(event.content_type.as_deref())
        } else {
            query
        };
        query.execute(executor).await.map_err(|e| db_error(t, e))?;
        return Ok(());
    }
    let n = events.len();
    let (mut ids, mut at, mut ai, mut et, mut pl, mut hd, mut pb, mut ct) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for e in events {
        ids.push(e.id);
        at.push(e.aggregate_type.as_str());
        ai.push(e.aggregate_id.as_str());
        et.push(e.event_type.as_str());
        pl.push(sqlx::types::Json(&e.payload));
        hd.push(sqlx::types::Json(&e.headers));
        pb.push(e.payload_bytes.as_deref());
        ct.push(e.content_type.as_deref());
    }
    let sql = if bytes {
        sql_file!("postgres", "insert_many_bytes")
    } else {
        sql_file!("postgres", "insert_many")
    };
    let sql = names(t).fill(sql);
    let query = sqlx::query(&sql)
        .bind(&ids)
        .bind(&at)
        .bind(&ai)
        .bind(&et)
        .bind(&pl)
        .bind(&hd);
    let query = if bytes {
        query.bind(&pb).bind(&ct)
    } else {
        query
    };
    query.execute(executor).await.map_err(|e| db_error(t, e))?;
    Ok(())
}

/// Tableless events: one statement through the function migration 6 installs
/// (`<table>_emit_event`), which emits each as a transactional logical message.
pub(crate) async fn emit<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error> {
    let f = names(t);
    let result = if let [e] = events {
        sqlx::query(&f.fill(sql_file!("postgres", "emit_one")))
            .bind(e.id)
            .bind(&e.aggregate_type)
            .bind(&e.aggregate_id)
            .bind(&e.event_type)
            .bind(sqlx::types::Json(&e.payload))
            .bind(e.payload_bytes.as_deref())
            .bind(e.content_type.as_deref())
            .bind(sqlx::types::Json(&e.headers))
            .execute(executor)
            .await
    } else {
        let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
        let at: Vec<&str> = events.iter().map(|e| e.aggregate_type.as_str()).collect();
        let ai: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
        let et: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        let pl: Vec<_> = events
            .iter()
            .map(|e| sqlx::types::Json(&e.payload))
            .collect();
        let pb: Vec<Option<&[u8]>> = events.iter().map(|e| e.payload_bytes.as_deref()).collect();
        let ct: Vec<Option<&str>> = events.iter().map(|e| e.content_type.as_deref()).collect();
        let hd: Vec<_> = events
            .iter()
            .map(|e| sqlx::types::Json(&e.headers))
            .collect();
        sqlx::query(&f.fill(sql_file!("postgres", "emit_many")))
            .bind(&ids)
            .bind(&at)
            .bind(&ai)
            .bind(&et)
            .bind(&pl)
            .bind(&pb)
            .bind(&ct)
            .bind(&hd)
            .execute(executor)
            .await
    };
    match result {
        Ok(_) => Ok(()),
        // undefined_function: the schema predates migration 6.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42883") => {
            Err(Error::SchemaTooOld {
                table: t.display(),
                found: 5,
                expected: crate::SCHEMA_VERSION,
            })
        }
        Err(e) => Err(db_error(t, e)),
    }
}

/// `processed_events` in the table's schema, for consumers that do not run the migrations.
pub(crate) async fn create_inbox<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
) -> Result<(), Error> {
    sqlx::query(&names(t).fill(sql_file!("postgres", "inbox_create")))
        .execute(executor)
        .await
        .map_err(Error::Database)?;
    Ok(())
}

/// `true` the first time `event_id` is seen (a primary-key insert that does nothing on a
/// repeat).
pub(crate) async fn mark_processed<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
    event_id: Uuid,
) -> Result<bool, Error> {
    let done = sqlx::query(&names(t).fill(sql_file!("postgres", "inbox_mark")))
        .bind(event_id)
        .execute(executor)
        .await
        .map_err(|e| db_error(t, e))?;
    Ok(done.rows_affected() == 1)
}
