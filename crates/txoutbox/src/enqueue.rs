//! The write path: put events into the outbox inside the caller's transaction.

use sqlx::Executor;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::Error;
use crate::{NewEvent, OutboxTable};

/// A handle on one outbox table for writers. Cheap to clone; holds no connection.
///
/// Pass your own transaction as the executor: the events commit or roll back with your
/// business rows. This is the seed's `CreateOrder`, in Rust:
///
/// ```no_run
/// use txoutbox::{NewEvent, Outbox};
///
/// # #[cfg(feature = "postgres")]
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
    wakeup: Option<crate::store::wakeup::Wakeup>,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new(OutboxTable::default())
    }
}

impl Outbox {
    /// A writer for the outbox in `table`. Nothing is checked here: a missing table shows up as
    /// [`Error::NotMigrated`] on the first enqueue.
    pub fn new(table: OutboxTable) -> Self {
        Self {
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

    /// The schema and table this writer inserts into.
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
        self.write(executor, std::slice::from_ref(event)).await?;
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
        self.write(executor, events).await?;
        Ok(events.iter().map(|e| e.id).collect())
    }

    /// Write one tableless event in `executor` (your transaction; PostgreSQL): a
    /// transactional logical message (`pg_logical_emit_message(true, ...)`) instead of a row.
    /// It commits or rolls back with your transaction and writes no row, index entry or dead
    /// tuple; only the WAL source (`--source wal`) delivers it, in commit order among the
    /// table's events. Returns its id.
    ///
    /// What it gives up: there is no row to fall back to, so events that a lost replication
    /// slot had not confirmed are lost with it (the relay reports such a gap, loudly). Plain
    /// SQL writes the same content with the functions migration 6 installs
    /// (`SELECT outbox_emit('order', '42', 'order.created', '{"total": 3}')`; see
    /// `docs/wal.md`, "Tableless events").
    ///
    /// ```no_run
    /// # async fn f(pool: &sqlx::PgPool, outbox: &txoutbox::Outbox) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// let event = txoutbox::NewEvent::new("order", "42", "order.created", &serde_json::json!({"total": 3}))?;
    /// outbox.emit(&mut *tx, &event).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn emit<'e, E>(&self, executor: E, event: &NewEvent) -> Result<Uuid, Error>
    where
        E: sqlx::PgExecutor<'e>,
    {
        self.emit_all(executor, std::slice::from_ref(event)).await?;
        Ok(event.id)
    }

    /// Write many tableless events in one statement, in slice order (see
    /// [`Outbox::emit`]).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn emit_many<'e, E>(
        &self,
        executor: E,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error>
    where
        E: sqlx::PgExecutor<'e>,
    {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.emit_all(executor, events).await?;
        Ok(events.iter().map(|e| e.id).collect())
    }

    #[cfg(feature = "postgres")]
    async fn emit_all<'e, E>(&self, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: sqlx::PgExecutor<'e>,
    {
        #[cfg(feature = "otel")]
        let traced = crate::otel::with_current_context(events);
        #[cfg(feature = "otel")]
        let events = traced.as_deref().unwrap_or(events);
        crate::store::postgres::write::emit(&self.table, executor, events).await
    }

    /// The database's insert, with the writer's trace context in the events (`otel`), then
    /// the wake-up.
    async fn write<'e, E>(&self, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: Executor<'e>,
        E::Database: Backend,
    {
        #[cfg(feature = "otel")]
        let traced = crate::otel::with_current_context(events);
        #[cfg(feature = "otel")]
        let events = traced.as_deref().unwrap_or(events);
        <E::Database as Backend>::insert(&self.table, executor, events).await?;
        self.woke();
        Ok(())
    }
}
