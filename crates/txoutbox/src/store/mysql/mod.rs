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
mod operator;
mod partitions;
pub(crate) mod schema;
pub(crate) mod write;

use std::sync::OnceLock;
use std::time::Duration;

use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::{Connection, MySql, Transaction};

pub use crate::store::wakeup::Wakeup;

use self::schema::{derived, table, NOW_MS};
use super::rows::{self, COLUMNS};
use super::undecodable::decode_text_row;
use super::wakeup::AdaptivePoll;
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::{OutboxEvent, OutboxTable};

/// The row as an event, with placeholders where a column does not decode (operator listings).
fn event_from_row(r: &MySqlRow) -> Result<OutboxEvent, Error> {
    Ok(decode_text_row(r)?.event)
}

const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

/// An ordered claim takes events only from partitions whose lease has this much left.
const CLAIM_MARGIN_MS: i64 = 1000;

/// The outbox on MySQL or MariaDB. See the module docs.
#[derive(Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: OutboxTable,
    retention: Retention,
    wakeup: Wakeup,
    poll: AdaptivePoll,
    partitions: OnceLock<i64>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

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

/// `?, ?, ?` for `n` values.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl MySqlStore {
    /// A store on `table` that keeps published events ([`Retention::Mark`]). `wakeup` wakes
    /// the relay when this process's writers enqueue (give the same one to their `Outbox`).
    pub fn new(pool: MySqlPool, table: OutboxTable, wakeup: Wakeup) -> Self {
        Self::with_retention(pool, table, wakeup, Retention::Mark)
    }

    /// A store on `table` with the given retention for published events.
    pub fn with_retention(
        pool: MySqlPool,
        table: OutboxTable,
        wakeup: Wakeup,
        retention: Retention,
    ) -> Self {
        Self {
            pool,
            table,
            retention,
            wakeup,
            poll: AdaptivePoll::default(),
            partitions: OnceLock::new(),
        }
    }

    /// The pool the store runs its statements on.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
    /// The database (`schema`) and table the store works on.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }
    /// Give it to the writers' `Outbox` (`Outbox::with_wakeup`) to wake this relay at once.
    pub fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }

    fn err(&self, e: sqlx::Error) -> Error {
        db_error(&self.table, e)
    }

    /// Fail with "run `txoutbox migrate`" unless the schema is in place at this build's version.
    pub async fn check_schema(&self) -> Result<(), Error> {
        schema::check_schema(&self.pool, &self.table).await
    }

    /// The relays registered on the table, with the partitions each owns.
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        partitions::relays(&self.pool, &self.table).await
    }

    async fn partition_count(&self) -> Result<i64, Error> {
        if let Some(n) = self.partitions.get() {
            return Ok(*n);
        }
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}",
            derived(&self.table, "partitions")
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(*self.partitions.get_or_init(|| n.max(1)))
    }
}

#[async_trait::async_trait]
impl Store for MySqlStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        self.claim_events(p).await
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(SettleOutcome::default());
        }
        let q = table(&self.table);
        let err = |e| self.err(e);
        let token = p.claim.lease_token()?.hyphenated().to_string();
        let mut tx = self.pool.begin().await.map_err(err)?;
        let mut out = SettleOutcome::default();
        if !p.published.is_empty() {
            let cond = format!("id IN ({}) AND lock_token = ?", marks(p.published.len()));
            let sql = match self.retention {
                Retention::Mark => format!(
                    "UPDATE {q} SET processed_at = {NOW_MS}, locked_until = NULL, locked_by = NULL, \
                     lock_token = NULL, last_error = NULL WHERE {cond}"
                ),
                Retention::Delete => format!("DELETE FROM {q} WHERE {cond}"),
            };
            let mut query = sqlx::query(&sql);
            for id in p.published {
                query = query.bind(id.hyphenated().to_string());
            }
            out.published = query
                .bind(&token)
                .execute(&mut *tx)
                .await
                .map_err(err)?
                .rows_affected();
        }
        if !p.failed.is_empty() {
            let failed = serde_json::Value::Array(
                p.failed
                    .iter()
                    .map(|f| {
                        serde_json::json!([
                            f.id.hyphenated().to_string(),
                            f.error,
                            ms(f.retry_in),
                            i32::from(f.dead),
                            i32::from(f.unavailable),
                        ])
                    })
                    .collect(),
            )
            .to_string();
            out.failed = sqlx::query(&format!(
                "UPDATE {q} e
                 JOIN JSON_TABLE(?, '$[*]' COLUMNS (
                     id CHAR(36) PATH '$[0]',
                     err LONGTEXT PATH '$[1]',
                     delay_ms BIGINT PATH '$[2]',
                     dead INT PATH '$[3]',
                     unavailable INT PATH '$[4]'
                 )) AS f ON e.id = f.id
                 SET e.attempts = e.attempts + 1,
                     e.attempts_unavailable = e.attempts_unavailable + f.unavailable,
                     e.last_error = f.err,
                     e.available_at = {NOW_MS} + f.delay_ms,
                     e.dead_at = CASE WHEN f.dead = 1 THEN {NOW_MS} END,
                     e.locked_until = NULL, e.locked_by = NULL, e.lock_token = NULL
                 WHERE e.lock_token = ?"
            ))
            .bind(failed)
            .bind(&token)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        }
        tx.commit().await.map_err(err)?;
        Ok(out)
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        let token = p.claim.lease_token()?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "UPDATE {} SET locked_until = NULL, locked_by = NULL, lock_token = NULL \
             WHERE id IN ({}) AND lock_token = ?",
            table(&self.table),
            marks(p.ids.len())
        );
        let mut query = sqlx::query(&sql);
        for id in p.ids {
            query = query.bind(id.hyphenated().to_string());
        }
        Ok(query
            .bind(token.hyphenated().to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected())
    }

    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        let q = table(&self.table);
        let sql = if ordering == Ordering::OrderedHold {
            format!(
                "SELECT EXISTS (SELECT 1 FROM {q} e WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM {q} b
                     WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                       AND b.processed_at IS NULL AND b.seq < e.seq AND b.dead_at IS NOT NULL))"
            )
        } else {
            format!("SELECT EXISTS (SELECT 1 FROM {q} WHERE {UNFINISHED})")
        };
        let n: i64 = sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(n != 0)
    }

    /// Ready when something is due; otherwise sleep until a writer of this process wakes us,
    /// the earliest backing-off or leased event falls due, or the adaptive poll comes round.
    /// (Overdue counts as 1 ms overdue: a row written with a huge negative `available_at`
    /// would overflow the subtraction.)
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let due: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT CAST(GREATEST(min(GREATEST(available_at, coalesce(locked_until, available_at))), {NOW_MS} - 1) - {NOW_MS} AS SIGNED)
             FROM {} WHERE {UNFINISHED}",
            table(&self.table)
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(self.poll.wait(due, p.max, &self.wakeup).await)
    }

    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        partitions::rebalance(&self.pool, &self.table, p).await
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let err = |e| self.err(e);
        let relays = derived(&self.table, "relays");
        let mut conn = self.pool.acquire().await.map_err(err)?;
        // READ COMMITTED and the `locked_by` index (migration 3): the release below locks only
        // this relay's own leased rows. Under REPEATABLE READ without the index it scanned and
        // next-key locked every pending row, and another relay's SKIP LOCKED claim skipped them.
        let mut tx = begin_read_committed(&mut conn, &self.table).await?;
        // Another process holds this relay id: its partitions and leases are not ours.
        let held: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT 1 FROM {relays} WHERE relay_id = ? AND NOT (instance <=> ?) FOR UPDATE"
        ))
        .bind(p.relay_id)
        .bind(p.instance.to_string())
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        if held.is_some() {
            tx.commit().await.map_err(err)?;
            return Ok(0);
        }
        sqlx::query(&format!("DELETE FROM {relays} WHERE relay_id = ?"))
            .bind(p.relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(&format!(
            "UPDATE {} SET owner = NULL, lease_until = NULL WHERE owner = ?",
            derived(&self.table, "partitions")
        ))
        .bind(p.relay_id)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let n = sqlx::query(&format!(
            "UPDATE {} SET locked_until = NULL, locked_by = NULL, lock_token = NULL \
             WHERE locked_by = ? AND {UNFINISHED}",
            table(&self.table)
        ))
        .bind(p.relay_id)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(n)
    }

    async fn counts(&self) -> Result<Counts, Error> {
        let r = sqlx::query(&format!(
            "SELECT
                CAST(coalesce(sum({UNFINISHED} AND (locked_until IS NULL OR locked_until <= {NOW_MS})), 0) AS SIGNED),
                CAST(coalesce(sum({UNFINISHED} AND locked_until > {NOW_MS}), 0) AS SIGNED),
                CAST(coalesce(sum(dead_at IS NOT NULL AND processed_at IS NULL), 0) AS SIGNED),
                CAST(coalesce(sum(processed_at IS NOT NULL), 0) AS SIGNED),
                (CAST({NOW_MS} AS DOUBLE) - min(CASE WHEN {UNFINISHED} THEN created_at END)) / 1000.0
             FROM {}",
            table(&self.table)
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        rows::counts(&r)
    }
}
