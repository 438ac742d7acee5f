//! The MySQL 8 / MariaDB 10.6+ store.
//!
//! - Claim: one short transaction (`READ COMMITTED`): pick in `seq` order with the same "no
//!   earlier blocking event of the aggregate" rule and the same partitions as PostgreSQL,
//!   lock the picked rows (`FOR UPDATE SKIP LOCKED`), lease them under the claim's token,
//!   read them back, COMMIT. No transaction stays open while publishing.
//! - Settle and release set-based (`JSON_TABLE`, `IN` lists), fenced by the claim token.
//! - Per-aggregate order and scale-out as on PostgreSQL: partitions of a CRC32 hash of the
//!   aggregate, leased to relays through the `_partitions` and `_relays` tables.
//! - Wake-ups: MySQL has no LISTEN/NOTIFY. Writers of the same process wake the relay through
//!   a [`Wakeup`] (`Outbox::with_wakeup`); otherwise adaptive polling: 10 ms after work was
//!   found or a wake-up came, doubling up to the poll interval while idle.
//! - Timestamps are integer milliseconds since the Unix epoch, ids hyphenated UUID text.

mod claim;
mod partitions;
mod queries;
pub(crate) mod schema;
pub(crate) mod write;

use std::future::Future;
use std::sync::OnceLock;

use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::{Connection, MySql, Row, Transaction};
use uuid::Uuid;

pub use crate::store::wakeup::Wakeup;

use self::queries::Queries;
use self::schema::NOW_MS;
use super::partitions::{count_once, InTransaction, Sharing};
use super::sql::{marks, with_list, Fill};
use super::text::{text_files, TextBackend, TextFiles, TextQueries, TextStore};
use super::{Claim, ClaimParams, DeregisterParams, Membership, RebalanceParams, Retention};
use crate::error::{db_error, Error};
use crate::OutboxTable;

/// The outbox on MySQL or MariaDB. See the module docs.
pub type MySqlStore = TextStore<MySql>;

/// A transaction in which each statement sees what committed before it, and that takes no
/// gap locks (writers inserting new events never wait for it).
async fn begin_read_committed<'c>(
    conn: &'c mut MySqlConnection,
    t: &OutboxTable,
) -> Result<Transaction<'c, MySql>, Error> {
    let err = |e| db_error(t, e);
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    conn.begin().await.map_err(err)
}

impl MySqlStore {
    async fn partition_count(&self) -> Result<i64, Error> {
        let read = sqlx::query_scalar::<_, i64>(&self.q.partition_count).fetch_one(&self.pool);
        let read = async { Ok(read.await.map_err(|e| self.err(e))?.max(1)) };
        count_once(&self.own, read).await
    }
}

/// MySQL's own ways: ids in an `IN` list, transactions at `READ COMMITTED` where they must
/// see what committed before each statement, partitions leased through `_partitions`.
impl TextBackend for MySql {
    type Queries = Queries;
    /// The partition count, read once.
    type Own = OnceLock<i64>;
    const FILES: TextFiles = text_files!("mysql");
    const NOW_MS: &'static str = NOW_MS;
    const DEBUG: (&'static str, Option<&'static str>) = ("MySqlStore", Some("partitions"));

    fn names(t: &OutboxTable) -> Fill {
        queries::names(t)
    }

    fn queries(t: &OutboxTable, retention: Retention) -> Queries {
        Queries::new(t, retention)
    }

    fn text(q: &Queries) -> &TextQueries {
        &q.text
    }

    async fn begin_write(pool: &MySqlPool) -> Result<Transaction<'_, MySql>, sqlx::Error> {
        pool.begin().await
    }

    /// Its `{{list}}` a mark per id, and the ids as text.
    fn fenced_ids(sql: &str, ids: &[Uuid]) -> (String, Vec<String>) {
        let values = ids.iter().map(|id| id.hyphenated().to_string()).collect();
        (with_list(sql, &marks(ids.len())), values)
    }

    /// Its `parts` column: the partition numbers, comma-separated.
    fn relay_partitions(row: &MySqlRow) -> Result<Vec<i32>, Error> {
        let parts: Option<String> = row.try_get("parts").map_err(Error::Database)?;
        let parts = parts.unwrap_or_default();
        Ok(parts.split(',').filter_map(|p| p.parse().ok()).collect())
    }

    fn claim_events(
        s: &MySqlStore,
        p: ClaimParams<'_>,
    ) -> impl Future<Output = Result<Claim, Error>> + Send {
        s.claim_events(p)
    }

    async fn rebalance_relays(s: &MySqlStore, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        let mut conn = s.pool.acquire().await.map_err(|e| s.err(e))?;
        // Each statement sees what committed before it (the checks must see a relay that
        // registered while this one waited for the lock).
        let tx = begin_read_committed(&mut conn, &s.table).await?;
        InTransaction::rebalance(tx, &s.table, &s.q.heartbeat, p, Sharing::Ordered).await
    }

    async fn deregister_relay(s: &MySqlStore, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let err = |e| s.err(e);
        let mut conn = s.pool.acquire().await.map_err(err)?;
        // READ COMMITTED and the `locked_by` index (migration 3): the release below locks only
        // this relay's own leased rows. Under REPEATABLE READ without the index it scanned and
        // next-key locked every pending row, and another relay's SKIP LOCKED claim skipped them.
        let mut tx = begin_read_committed(&mut conn, &s.table).await?;
        // Another process holds this relay id: its partitions and leases are not ours.
        let held: Option<i64> = sqlx::query_scalar(&s.q.deregister_held)
            .bind(p.relay_id)
            .bind(p.instance.to_string())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
        if held.is_some() {
            tx.commit().await.map_err(err)?;
            return Ok(0);
        }
        for sql in [&s.q.text.deregister_relay, &s.q.deregister_partitions] {
            let q = sqlx::query(sql).bind(p.relay_id);
            q.execute(&mut *tx).await.map_err(err)?;
        }
        let q = sqlx::query(&s.q.text.deregister_events).bind(p.relay_id);
        let n = q.execute(&mut *tx).await.map_err(err)?.rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(n)
    }

    fn schema_check<'a>(
        pool: &'a MySqlPool,
        t: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        schema::check_schema(pool, t)
    }
}
