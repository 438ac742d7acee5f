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

mod operator;
mod partitions;
pub(crate) mod schema;
pub(crate) mod write;

use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{Connection, Row};

pub use crate::store::wakeup::Wakeup;

use self::schema::{derived, table, NOW_MS};
use super::undecodable::{self, decode_text_row, Decoded};
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::{OutboxEvent, OutboxTable};

const COLUMNS: &str = "id, seq, aggregate_type, aggregate_id, event_type, payload, headers, \
     attempts, attempts_unavailable, available_at, created_at, processed_at, dead_at, \
     locked_by, locked_until, last_error";

const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

/// An ordered claim takes events only from partitions whose lease has this much left.
const CLAIM_MARGIN_MS: i64 = 1000;

/// The shortest poll, right after work or a wake-up; doubles per idle wait up to the poll
/// interval.
const FAST_POLL: Duration = Duration::from_millis(10);

/// The outbox on MySQL or MariaDB. See the module docs.
#[derive(Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    table: OutboxTable,
    retention: Retention,
    wakeup: Wakeup,
    idle: AtomicU32,
    partitions: OnceLock<i64>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn ts(ms: i64) -> Result<DateTime<Utc>, Error> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
        Error::Database(sqlx::Error::Decode(
            format!("timestamp out of range: {ms} ms").into(),
        ))
    })
}

/// The row as an event, with placeholders where a column does not decode (operator listings).
fn event_from_row(r: &MySqlRow) -> Result<OutboxEvent, Error> {
    Ok(decode_text_row(r)?.event)
}

/// `?, ?, ?` for `n` values.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl MySqlStore {
    pub fn new(pool: MySqlPool, table: OutboxTable, wakeup: Wakeup) -> Self {
        Self::with_retention(pool, table, wakeup, Retention::Mark)
    }

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
            idle: AtomicU32::new(0),
            partitions: OnceLock::new(),
        }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
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

    pub async fn check_schema(&self) -> Result<(), Error> {
        schema::check_schema(&self.pool, &self.table).await
    }

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

/// Of the events an ordered claim picked (in `seq` order) and then managed to lock, those it
/// may lease: an event only if every earlier picked event of its aggregate was locked too. A
/// row that another transaction held at that moment (SKIP LOCKED skipped it) holds its
/// aggregate's later events back, or they would be sent before it.
fn ordered_prefix(picked: &[(i64, String, String)], locked: &[i64]) -> Vec<i64> {
    let locked: std::collections::HashSet<i64> = locked.iter().copied().collect();
    let mut stopped: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (seq, aggregate_type, aggregate_id) in picked {
        let key = (aggregate_type.as_str(), aggregate_id.as_str());
        if stopped.contains(&key) {
            continue;
        }
        if locked.contains(seq) {
            out.push(*seq);
        } else {
            stopped.insert(key);
        }
    }
    out
}

impl MySqlStore {
    /// In the claim's transaction: dead-letter the claimed rows that do not decode (by
    /// `seq`: their id may not be a UUID), and give back (`held`) the events of the claim that
    /// a dead letter holds back; fenced by the claim token.
    async fn bury_undecodable(
        &self,
        tx: &mut sqlx::MySqlConnection,
        token: &str,
        bad: &[Decoded],
        held: &[OutboxEvent],
    ) -> Result<(), Error> {
        let q = table(&self.table);
        let err = |e| self.err(e);
        let rows = serde_json::Value::Array(
            bad.iter()
                .map(|b| serde_json::json!([b.event.seq, b.last_error()]))
                .collect(),
        )
        .to_string();
        sqlx::query(&format!(
            "UPDATE {q} e
             JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', err LONGTEXT PATH '$[1]')) AS f
               ON e.seq = f.seq
             SET e.dead_at = {NOW_MS}, e.last_error = f.err,
                 e.locked_until = NULL, e.locked_by = NULL, e.lock_token = NULL
             WHERE e.lock_token = ?"
        ))
        .bind(rows)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        if !held.is_empty() {
            let list = held
                .iter()
                .map(|e| e.seq.to_string())
                .collect::<Vec<_>>()
                .join(",");
            sqlx::query(&format!(
                "UPDATE {q} SET locked_until = NULL, locked_by = NULL, lock_token = NULL \
                 WHERE seq IN ({list}) AND lock_token = ?"
            ))
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for MySqlStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let q = table(&self.table);
        let limit = i64::try_from(p.limit).unwrap_or(i64::MAX);
        let partitions = if p.ordering.is_ordered() {
            self.partition_count().await?
        } else {
            0
        };
        let err = |e| self.err(e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        // No gap locks: writers inserting new events never wait for a claim.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let mut tx = conn.begin().await.map_err(err)?;
        let base = format!(
            "SELECT e.seq FROM {q} e
             WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= {NOW_MS}
               AND (e.locked_until IS NULL OR e.locked_until <= {NOW_MS})"
        );
        let base_agg = base.replacen(
            "SELECT e.seq",
            "SELECT e.seq, e.aggregate_type, e.aggregate_id",
            1,
        );
        let seqs: Vec<i64> = if p.ordering.is_ordered() {
            // Pick with a plain read, then lock what was picked: a locking read would also
            // lock (and, with SKIP LOCKED, skip) the rows its NOT EXISTS looks at, and a
            // blocker skipped is a blocker missed. (MariaDB has no `FOR UPDATE OF`.)
            let picked: Vec<(i64, String, String)> = sqlx::query_as(&format!(
                "{base_agg}
                   AND MOD(e.partition_key, ?) IN (
                       SELECT `partition` FROM {} WHERE owner = ? AND lease_until > {NOW_MS} + {CLAIM_MARGIN_MS})
                   AND NOT EXISTS (
                       SELECT 1 FROM {q} b
                       WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                         AND b.processed_at IS NULL AND b.seq < e.seq
                         AND ((b.dead_at IS NULL AND (b.available_at > {NOW_MS} OR b.locked_until > {NOW_MS}))
                              OR (b.dead_at IS NOT NULL AND ?)))
                 ORDER BY e.seq LIMIT ?",
                derived(&self.table, "partitions")
            ))
            .bind(partitions)
            .bind(p.relay_id)
            .bind(p.ordering == Ordering::OrderedHold)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
            if picked.is_empty() {
                Vec::new()
            } else {
                // Still claimable, and not being changed by anyone else right now.
                let locked: Vec<i64> = sqlx::query_scalar(&format!(
                    "SELECT seq FROM {q} WHERE seq IN ({}) AND processed_at IS NULL AND dead_at IS NULL
                       AND (locked_until IS NULL OR locked_until <= {NOW_MS})
                     ORDER BY seq FOR UPDATE SKIP LOCKED",
                    picked.iter().map(|(seq, _, _)| seq.to_string()).collect::<Vec<_>>().join(",")
                ))
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?;
                ordered_prefix(&picked, &locked)
            }
        } else {
            sqlx::query_scalar(&format!(
                "{base} ORDER BY e.seq LIMIT ? FOR UPDATE SKIP LOCKED"
            ))
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?
        };
        if seqs.is_empty() {
            tx.commit().await.map_err(err)?;
            return Ok(Claim::leased(p.token, Vec::new(), started + p.lease));
        }
        // Integers read from the database: safe to inline.
        let list = seqs
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let token = p.token.hyphenated().to_string();
        sqlx::query(&format!(
            "UPDATE {q} SET locked_until = {NOW_MS} + ?, locked_by = ?, lock_token = ? WHERE seq IN ({list})"
        ))
        .bind(ms(p.lease))
        .bind(p.relay_id)
        .bind(&token)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM {q} WHERE seq IN ({list}) AND lock_token = ? ORDER BY seq"
        ))
        .bind(&token)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let rows = rows
            .iter()
            .map(decode_text_row)
            .collect::<Result<Vec<_>, _>>()?;
        let (events, bad, held) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(&mut tx, &token, &bad, &held).await?;
        }
        tx.commit().await.map_err(err)?;
        undecodable::count_dead(&bad);
        self.idle.store(0, AtomicOrdering::Relaxed);
        Ok(Claim::leased(p.token, events, started + p.lease))
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
        let max = p.max;
        let due: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT CAST(GREATEST(min(GREATEST(available_at, coalesce(locked_until, available_at))), {NOW_MS} - 1) - {NOW_MS} AS SIGNED)
             FROM {} WHERE {UNFINISHED}",
            table(&self.table)
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        if due.is_some_and(|ms| ms <= 0) {
            return Ok(Wake::Ready);
        }
        let idle = self.idle.fetch_add(1, AtomicOrdering::Relaxed).min(16);
        let poll = FAST_POLL.saturating_mul(1 << idle).min(max);
        let sleep = match due {
            Some(ms) => poll.min(Duration::from_millis(ms.unsigned_abs())),
            None => poll,
        };
        tokio::select! {
            _ = self.wakeup.wait() => {
                // The writer fired before its commit: look again soon, not a poll later.
                self.idle.store(0, AtomicOrdering::Relaxed);
                Ok(Wake::Notified)
            }
            _ = tokio::time::sleep(sleep) => Ok(Wake::Timeout),
        }
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
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let mut tx = conn.begin().await.map_err(err)?;
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
        let g = |e| Error::Database(e);
        Ok(Counts {
            pending: r.try_get(0).map_err(g)?,
            leased: r.try_get(1).map_err(g)?,
            dead: r.try_get(2).map_err(g)?,
            processed: r.try_get(3).map_err(g)?,
            oldest_pending_age_secs: r.try_get(4).map_err(g)?,
        })
    }
}
