//! The operator surface on MySQL / MariaDB (see [`crate::store::operator`]): the shared
//! text-keyed queries, and the purge in bounded batches.

use std::time::Duration;

use super::schema::{table, NOW_MS};
use super::{event_from_row, MySqlStore, COLUMNS};
use crate::error::Error;
use crate::store::operator::{millis, text_operator};
use crate::store::RelayInfo;

text_operator!(MySqlStore, {
    async fn check_schema(&self) -> Result<(), Error> {
        MySqlStore::check_schema(self).await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        MySqlStore::relays(self).await
    }

    /// `DELETE ... ORDER BY processed_at LIMIT`: one statement, its locks bounded by the batch.
    async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error> {
        let done = sqlx::query(&format!(
            "DELETE FROM {} WHERE processed_at IS NOT NULL AND processed_at < {NOW_MS} - ? \
             ORDER BY processed_at LIMIT ?",
            table(&self.table)
        ))
        .bind(millis(older_than))
        .bind(batch.max(1))
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }
});
