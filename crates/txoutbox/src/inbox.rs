//! The consumer side: deduplicate deliveries by event id in the consumer's own transaction.

use sqlx::Executor;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::Error;
use crate::OutboxTable;

/// Records processed event ids in `processed_events` (created by the migrations in the outbox's
/// schema, or by [`Inbox::create_table`] in a consumer's own database).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn handle(pool: &sqlx::PgPool, event_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = txoutbox::Inbox::default();
/// let mut tx = pool.begin().await?;
/// if inbox.mark_processed(&mut *tx, event_id).await? {
///     // first time: apply the event's effects in the same transaction
/// } // else: a redelivery, already applied; skip
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    table: OutboxTable,
}

impl Inbox {
    /// The inbox of the schema of `table` (`<schema>.processed_events`).
    pub fn new(table: OutboxTable) -> Self {
        Self { table }
    }

    /// Create `processed_events` if it does not exist (for consumers that do not run the
    /// outbox migrations).
    pub async fn create_table<'e, E>(&self, executor: E) -> Result<(), Error>
    where
        E: Executor<'e>,
        E::Database: Backend,
    {
        <E::Database as Backend>::create_inbox(&self.table, executor).await
    }

    /// Record `event_id` as processed. `true`: it is new, process the event. `false`: it was
    /// processed before, skip it. One statement; a concurrent consumer with the same id waits
    /// on the primary key until this transaction ends, so exactly one of them sees `true`.
    pub async fn mark_processed<'e, E>(&self, executor: E, event_id: Uuid) -> Result<bool, Error>
    where
        E: Executor<'e>,
        E::Database: Backend,
    {
        <E::Database as Backend>::mark_processed(&self.table, executor, event_id).await
    }
}
