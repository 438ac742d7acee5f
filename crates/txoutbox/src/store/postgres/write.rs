//! The write path and the inbox on PostgreSQL, in the caller's own transaction.

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::{db_error, Error};
use crate::{NewEvent, OutboxTable};

const COLS: &str = "id, aggregate_type, aggregate_id, event_type, payload, headers";

/// One event: a plain insert. Several: one statement through `unnest`, `WITH ORDINALITY`
/// keeping `seq` in slice order.
pub(crate) async fn insert<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error> {
    let q = t.qualified();
    if let [event] = events {
        sqlx::query(&format!(
            "INSERT INTO {q} ({COLS}) VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(event.id)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .bind(&event.event_type)
        .bind(&event.payload)
        .bind(sqlx::types::Json(&event.headers))
        .execute(executor)
        .await
        .map_err(|e| db_error(t, e))?;
        return Ok(());
    }
    let n = events.len();
    let (mut ids, mut at, mut ai, mut et, mut pl, mut hd) = (
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
    }
    sqlx::query(&format!(
        "INSERT INTO {q} ({COLS}) SELECT {COLS} \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[]) \
           WITH ORDINALITY AS e({COLS}, n) \
         ORDER BY n"
    ))
    .bind(&ids)
    .bind(&at)
    .bind(&ai)
    .bind(&et)
    .bind(&pl)
    .bind(&hd)
    .execute(executor)
    .await
    .map_err(|e| db_error(t, e))?;
    Ok(())
}

/// `processed_events` in the table's schema, for consumers that do not run the migrations.
pub(crate) async fn create_inbox<'e, E: PgExecutor<'e>>(
    t: &OutboxTable,
    executor: E,
) -> Result<(), Error> {
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {} (event_id uuid PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())",
        t.processed_events()
    ))
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
    let done = sqlx::query(&format!(
        "INSERT INTO {} (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING",
        t.processed_events()
    ))
    .bind(event_id)
    .execute(executor)
    .await
    .map_err(|e| db_error(t, e))?;
    Ok(done.rows_affected() == 1)
}
