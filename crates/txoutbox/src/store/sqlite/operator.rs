//! The operator surface on SQLite (see [`crate::store::operator`]): the shared text-keyed
//! queries, and the purge in bounded batches.

use std::time::Duration;

use super::schema::{table, NOW_MS};
use super::{event_from_row, SqliteStore, COLUMNS};
use crate::error::Error;
use crate::store::operator::{millis, text_operator};
use crate::store::RelayInfo;

text_operator!(SqliteStore, {
    async fn check_schema(&self) -> Result<(), Error> {
        SqliteStore::check_schema(self).await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        SqliteStore::relays(self).await
    }

    /// SQLite has no `DELETE ... LIMIT` by default: the rows of one batch are picked by a
    /// sub-select.
    async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error> {
        let q = table(&self.table);
        let done = sqlx::query(&format!(
            "DELETE FROM {q} WHERE seq IN (SELECT seq FROM {q} \
             WHERE processed_at IS NOT NULL AND processed_at < {NOW_MS} - ?1 \
             ORDER BY processed_at LIMIT ?2)"
        ))
        .bind(millis(older_than))
        .bind(batch.max(1))
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }
});
