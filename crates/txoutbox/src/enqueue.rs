//! The write path: put events into the outbox inside the caller's transaction.

use sqlx::Executor;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::{db_error, Error};
use crate::{NewEvent, OutboxTable};

/// A handle on one outbox table for writers. Cheap to clone; holds no connection.
///
/// Pass your own transaction as the executor: the events commit or roll back with your
/// business rows. This is the seed's `CreateOrder`, in Rust:
///
/// ```no_run
/// use txoutbox::{NewEvent, Outbox};
///
/// async fn create_order(pool: &sqlx::PgPool, outbox: &Outbox, id: &str, customer: &str, total: f64)
///     -> Result<(), Box<dyn std::error::Error>> {
///     let mut tx = pool.begin().await?;
///     sqlx::query("INSERT INTO orders (id, customer_id, total, created_at) VALUES ($1, $2, $3, now())")
///         .bind(id).bind(customer).bind(total)
///         .execute(&mut *tx).await?;
///     let payload = serde_json::json!({"order_id": id, "customer_id": customer, "total": total});
///     outbox.enqueue(&mut *tx, &NewEvent::new("order", id, "order.created", &payload)?).await?;
///     tx.commit().await?; // no publish call in business code: the relay does that
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Outbox {
    table: OutboxTable,
    insert_one: String,
    insert_many: String,
    wakeup: Option<crate::store::wakeup::Wakeup>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new(OutboxTable::default())
    }
}

impl Outbox {
    pub fn new(table: OutboxTable) -> Self {
        let t = table.qualified();
        Self {
            insert_one: format!(
                "INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            // One statement for many events; WITH ORDINALITY keeps `seq` in slice order.
            insert_many: format!(
                "INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, payload, headers) \
                 SELECT id, aggregate_type, aggregate_id, event_type, payload, headers \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[]) \
                   WITH ORDINALITY AS e(id, aggregate_type, aggregate_id, event_type, payload, headers, n) \
                 ORDER BY n"
            ),
            table,
            wakeup: None,
        }
    }

    /// Wake the relay of this process at once after each enqueue (MySQL, which has no
    /// LISTEN/NOTIFY; give it the store's `wakeup()`). It fires before your commit: the relay
    /// then polls fast (every 10 ms, backing off) until it sees the events.
    pub fn with_wakeup(mut self, wakeup: crate::store::wakeup::Wakeup) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    fn woke(&self) {
        if let Some(w) = &self.wakeup {
            w.fire();
        }
    }

    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// Write one event in `executor` (your transaction, on any supported database). Returns
    /// its id.
    pub async fn enqueue<'e, E>(&self, executor: E, event: &NewEvent) -> Result<Uuid, Error>
    where
        E: Executor<'e>,
        E::Database: Backend,
    {
        #[cfg(feature = "otel")]
        if let Some(traced) = crate::otel::with_current_context(std::slice::from_ref(event)) {
            <E::Database as Backend>::insert(self, executor, &traced).await?;
            self.woke();
            return Ok(event.id);
        }
        <E::Database as Backend>::insert(self, executor, std::slice::from_ref(event)).await?;
        self.woke();
        Ok(event.id)
    }

    /// Write many events in one statement, in slice order (their `seq` follows it).
    pub async fn enqueue_many<'e, E>(
        &self,
        executor: E,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error>
    where
        E: Executor<'e>,
        E::Database: Backend,
    {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "otel")]
        let traced = crate::otel::with_current_context(events);
        #[cfg(feature = "otel")]
        let events = traced.as_deref().unwrap_or(events);
        <E::Database as Backend>::insert(self, executor, events).await?;
        self.woke();
        Ok(events.iter().map(|e| e.id).collect())
    }
}

/// The PostgreSQL insert: one row, or many through `unnest` in one statement.
#[cfg(feature = "postgres")]
pub(crate) async fn insert_pg<'e, E: sqlx::PgExecutor<'e>>(
    outbox: &Outbox,
    executor: E,
    events: &[NewEvent],
) -> Result<(), Error> {
    if let [event] = events {
        sqlx::query(&outbox.insert_one)
            .bind(event.id)
            .bind(&event.aggregate_type)
            .bind(&event.aggregate_id)
            .bind(&event.event_type)
            .bind(&event.payload)
            .bind(sqlx::types::Json(&event.headers))
            .execute(executor)
            .await
            .map_err(|e| db_error(&outbox.table, e))?;
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
    sqlx::query(&outbox.insert_many)
        .bind(&ids)
        .bind(&at)
        .bind(&ai)
        .bind(&et)
        .bind(&pl)
        .bind(&hd)
        .execute(executor)
        .await
        .map_err(|e| db_error(&outbox.table, e))?;
    Ok(())
}
