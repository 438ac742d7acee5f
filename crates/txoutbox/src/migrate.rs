//! Embedded, numbered migrations per database (`migrations/<database>/*.sql`), applied in
//! order and recorded in a `txoutbox_migrations` table. Running them again is a no-op. The
//! runner is `store::migrations`, once for every database; each database
//! (`store::<db>::schema`) says how to lock, run and record.

use sqlx::Pool;

use crate::backend::Backend;
use crate::error::Error;
use crate::OutboxTable;

pub use crate::store::migrations::{MigrateReport, SCHEMA_VERSION};

/// Create or upgrade the outbox schema for `table` on any supported database. Safe to run
/// concurrently (migrators are serialised: an advisory lock on PostgreSQL, a write
/// transaction on SQLite) and repeatedly (applied versions are skipped).
pub async fn migrate<DB: Backend>(
    pool: &Pool<DB>,
    table: &OutboxTable,
) -> Result<MigrateReport, Error> {
    DB::migrate(pool, table).await
}

/// Check that `table` exists at the version this build needs, with an error that says to run
/// `txoutbox migrate` when it does not.
pub async fn check_schema<DB: Backend>(pool: &Pool<DB>, table: &OutboxTable) -> Result<(), Error> {
    DB::check_schema(pool, table).await
}
