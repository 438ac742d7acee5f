//! The SQLite store: the embedded outbox for small services, edge deployments and the demo.
//!
//! - WAL journal mode and a busy timeout ([`connect`]); one write at a time, as SQLite does.
//! - Claim with one `UPDATE ... RETURNING` statement, which takes the write lock up front:
//!   claims never overlap, so the "no earlier blocking event of the aggregate" rule alone
//!   keeps each aggregate in order.
//! - Settle and release set-based over JSON arrays of ids, fenced by the claim token.
//! - **One relay per database file**, enforced by a lease row: a second relay is refused with
//!   [`Error::RelayRunning`] until the first one stops or its lease runs out.
//! - Wake-ups: in-process (a commit that inserted into the outbox fires the relay's
//!   [`Wakeup`]), otherwise adaptive polling: 10 ms after work was found, doubling up to the
//!   poll interval while idle.
//! - Timestamps are integer milliseconds since the Unix epoch, ids hyphenated UUID text.

mod operator;
pub(crate) mod schema;
mod wake;
pub(crate) mod write;

use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

pub use wake::{connect, Wakeup, BUSY_TIMEOUT};

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

/// An ordered claim needs the relay's lease to have at least this much left.
const CLAIM_MARGIN_MS: i64 = 1000;

/// The shortest poll, right after work was found; it doubles per idle wait up to the poll
/// interval.
const FAST_POLL: Duration = Duration::from_millis(10);

/// SQL for one outbox table, built once from validated names.
#[derive(Debug)]
struct Queries {
    claim: String,
    claim_ordered: String,
    settle_ok: String,
    settle_failed: String,
    release: String,
    has_unfinished: String,
    has_unfinished_hold: String,
    due_in_ms: String,
    relay_other: String,
    relay_upsert: String,
    relay_held: String,
    relay_gc: String,
    deregister_relay: String,
    deregister_events: String,
    counts: String,
}

impl Queries {
    fn new(t: &OutboxTable, retention: Retention) -> Self {
        let q = table(t);
        let relays = derived(t, "relays");
        let lease = "locked_until = NULL, locked_by = NULL, lock_token = NULL";
        let ids = "id IN (SELECT value FROM json_each(?1)) AND lock_token = ?2";
        // A text or blob `available_at` (plain SQL can write one) sorts after every number and
        // would never be due: it is claimed, so that the claim dead-letters it.
        let claimed = |filter: &str, extra: &str| {
            format!(
                "UPDATE {q} SET locked_until = {NOW_MS} + ?2, locked_by = ?3, lock_token = ?4
                 WHERE seq IN (
                    SELECT e.seq FROM {q} e
                    WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                      AND (e.available_at <= {NOW_MS} OR typeof(e.available_at) IN ('text', 'blob'))
                      AND (e.locked_until IS NULL OR e.locked_until <= {NOW_MS}) {filter}
                    ORDER BY e.seq LIMIT ?1
                 ) {extra}
                 RETURNING {COLUMNS}"
            )
        };
        Self {
            claim: claimed("", ""),
            // No earlier event of the aggregate leased, backing off or (with ?5, `hold`)
            // dead; and only while this relay holds the file's relay lease.
            claim_ordered: claimed(
                &format!(
                    "AND NOT EXISTS (
                        SELECT 1 FROM {q} b
                        WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                          AND b.seq < e.seq AND b.processed_at IS NULL
                          AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
                          AND ((b.dead_at IS NULL AND (b.available_at > {NOW_MS} OR b.locked_until > {NOW_MS}))
                               OR (b.dead_at IS NOT NULL AND ?5))
                    )"
                ),
                &format!(
                    "AND EXISTS (SELECT 1 FROM {relays} WHERE relay_id = ?3 \
                     AND alive_until > {NOW_MS} + {CLAIM_MARGIN_MS})"
                ),
            ),
            settle_ok: match retention {
                Retention::Mark => format!(
                    "UPDATE {q} SET processed_at = {NOW_MS}, {lease}, last_error = NULL WHERE {ids}"
                ),
                Retention::Delete => format!("DELETE FROM {q} WHERE {ids}"),
            },
            settle_failed: format!(
                "UPDATE {q} AS e SET
                    attempts = e.attempts + 1,
                    attempts_unavailable = e.attempts_unavailable + f.unavailable,
                    last_error = f.err,
                    available_at = {NOW_MS} + f.delay_ms,
                    dead_at = CASE WHEN f.dead THEN {NOW_MS} END,
                    {lease}
                 FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.err') AS err,
                              json_extract(value, '$.delay_ms') AS delay_ms,
                              json_extract(value, '$.dead') AS dead,
                              json_extract(value, '$.unavailable') AS unavailable
                       FROM json_each(?1)) AS f
                 WHERE e.id = f.id AND e.lock_token = ?2"
            ),
            release: format!("UPDATE {q} SET {lease} WHERE {ids}"),
            has_unfinished: format!("SELECT EXISTS (SELECT 1 FROM {q} WHERE {UNFINISHED})"),
            has_unfinished_hold: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} e WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM {q} b
                     WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                       AND b.seq < e.seq AND b.processed_at IS NULL AND b.dead_at IS NOT NULL))"
            ),
            due_in_ms: format!(
                "SELECT min(max(available_at, coalesce(locked_until, available_at))) - {NOW_MS}
                 FROM {q} WHERE {UNFINISHED}"
            ),
            // Another live relay, or this relay id held by another process (?2: instance).
            relay_other: format!(
                "SELECT relay_id, alive_until - {NOW_MS} FROM {relays}
                 WHERE (relay_id <> ?1 OR instance IS NOT ?2) AND alive_until > {NOW_MS}
                 ORDER BY relay_id = ?1 DESC LIMIT 1"
            ),
            relay_upsert: format!(
                "INSERT INTO {relays} (relay_id, mode, instance, heartbeat_at, alive_until)
                 VALUES (?1, ?2, ?4, {NOW_MS}, {NOW_MS} + ?3)
                 ON CONFLICT (relay_id) DO UPDATE
                 SET mode = excluded.mode, instance = excluded.instance,
                     heartbeat_at = excluded.heartbeat_at, alive_until = excluded.alive_until"
            ),
            relay_held: format!(
                "SELECT 1 FROM {relays} WHERE relay_id = ?1 AND instance IS NOT ?2"
            ),
            relay_gc: format!("DELETE FROM {relays} WHERE alive_until < {NOW_MS} - 3600000"),
            deregister_relay: format!("DELETE FROM {relays} WHERE relay_id = ?1"),
            deregister_events: format!(
                "UPDATE {q} SET {lease} WHERE {UNFINISHED} AND locked_by = ?1"
            ),
            counts: format!(
                "SELECT
                    coalesce(sum({UNFINISHED} AND (locked_until IS NULL OR locked_until <= {NOW_MS})), 0),
                    coalesce(sum({UNFINISHED} AND locked_until > {NOW_MS}), 0),
                    coalesce(sum(dead_at IS NOT NULL AND processed_at IS NULL), 0),
                    coalesce(sum(processed_at IS NOT NULL), 0),
                    ({NOW_MS} - min(CASE WHEN {UNFINISHED} THEN created_at END)) / 1000.0
                 FROM {q}"
            ),
        }
    }
}

/// The outbox on SQLite. See the module docs for what it guarantees.
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    table: OutboxTable,
    q: Queries,
    wakeup: Wakeup,
    /// Waits in a row that found nothing (adaptive polling).
    idle: AtomicU32,
}

impl SqliteStore {
    /// A store on `pool`. Wake-ups come from `wakeup` (pass the one given to [`connect`]) or,
    /// for writers in other processes, from polling.
    pub fn new(pool: SqlitePool, table: OutboxTable, wakeup: Wakeup) -> Self {
        Self::with_retention(pool, table, wakeup, Retention::Mark)
    }

    pub fn with_retention(
        pool: SqlitePool,
        table: OutboxTable,
        wakeup: Wakeup,
        retention: Retention,
    ) -> Self {
        Self {
            q: Queries::new(&table, retention),
            pool,
            table,
            wakeup,
            idle: AtomicU32::new(0),
        }
    }

    /// Open the database file at `url` ([`connect`]) and a store on it. Use [`Self::pool`]
    /// for the writers of this process: their commits wake the relay at once.
    pub async fn open(
        url: &str,
        table: OutboxTable,
        max_connections: u32,
        retention: Retention,
    ) -> Result<Self, Error> {
        let wakeup = Wakeup::default();
        let pool = connect(url, &table, max_connections, &wakeup).await?;
        Ok(Self::with_retention(pool, table, wakeup, retention))
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }
    pub fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }

    /// Fail with "run `txoutbox migrate`" unless the schema is in place.
    pub async fn check_schema(&self) -> Result<(), Error> {
        schema::check_schema(&self.pool, &self.table).await
    }

    fn err(&self, e: sqlx::Error) -> Error {
        db_error(&self.table, e)
    }

    /// The relay registered on this file (at most one alive).
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        let rows = sqlx::query(&format!(
            "SELECT relay_id, mode, started_at, heartbeat_at, alive_until > {NOW_MS} AS alive
             FROM {} ORDER BY started_at",
            derived(&self.table, "relays")
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        rows.iter()
            .map(|r| {
                let g = |e| Error::Database(e);
                Ok(RelayInfo {
                    relay_id: r.try_get("relay_id").map_err(g)?,
                    mode: r.try_get("mode").map_err(g)?,
                    started_at: ts(r.try_get("started_at").map_err(g)?)?,
                    heartbeat_at: ts(r.try_get("heartbeat_at").map_err(g)?)?,
                    alive: r.try_get("alive").map_err(g)?,
                    partitions: Vec::new(),
                })
            })
            .collect()
    }
}

impl SqliteStore {
    /// Dead-letter the claimed rows that do not decode, and give back (`held`) the events of
    /// the claim that a dead letter holds back; fenced by the claim token. On failure they
    /// stay leased, and are claimed again when the lease runs out.
    async fn bury_undecodable(&self, token: Uuid, bad: &[Decoded], held: &[OutboxEvent]) {
        let token = token.hyphenated().to_string();
        let rows = serde_json::Value::Array(
            bad.iter()
                .map(|b| serde_json::json!([b.event.seq, b.last_error()]))
                .collect(),
        )
        .to_string();
        let held: Vec<Uuid> = held.iter().map(|e| e.id).collect();
        let sql = format!(
            "UPDATE {} AS e SET dead_at = {NOW_MS}, last_error = f.err,
                locked_until = NULL, locked_by = NULL, lock_token = NULL
             FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS err
                   FROM json_each(?1)) AS f
             WHERE e.seq = f.seq AND e.lock_token = ?2",
            table(&self.table)
        );
        let result = async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query(&sql)
                .bind(rows)
                .bind(&token)
                .execute(&mut *tx)
                .await?;
            if !held.is_empty() {
                sqlx::query(&self.q.release)
                    .bind(id_list(&held))
                    .bind(&token)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        }
        .await;
        match result {
            Ok(()) => undecodable::count_dead(bad),
            Err(e) => tracing::warn!(error = %self.err(e),
                "could not dead-letter rows that do not decode; they are claimed again after their lease"),
        }
    }
}

fn ts(ms: i64) -> Result<DateTime<Utc>, Error> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
        Error::Database(sqlx::Error::Decode(
            format!("timestamp out of range: {ms} ms").into(),
        ))
    })
}

/// The row as an event, with placeholders where a column does not decode (operator listings).
fn event_from_row(r: &SqliteRow) -> Result<OutboxEvent, Error> {
    Ok(decode_text_row(r)?.event)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn id_list(ids: &[Uuid]) -> String {
    serde_json::Value::Array(
        ids.iter()
            .map(|id| serde_json::Value::String(id.hyphenated().to_string()))
            .collect(),
    )
    .to_string()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let limit = i64::try_from(p.limit).unwrap_or(i64::MAX);
        let sql = if p.ordering.is_ordered() {
            &self.q.claim_ordered
        } else {
            &self.q.claim
        };
        let rows = sqlx::query(sql)
            .bind(limit)
            .bind(millis(p.lease))
            .bind(p.relay_id)
            .bind(p.token.hyphenated().to_string())
            .bind(p.ordering == Ordering::OrderedHold)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let rows = rows
            .iter()
            .map(decode_text_row)
            .collect::<Result<Vec<_>, _>>()?;
        let (events, bad, held) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(p.token, &bad, &held).await;
        }
        if !events.is_empty() {
            self.idle.store(0, AtomicOrdering::Relaxed);
        }
        Ok(Claim::leased(p.token, events, started + p.lease))
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(SettleOutcome::default());
        }
        let token = p.claim.lease_token()?.hyphenated().to_string();
        let failed = serde_json::Value::Array(
            p.failed
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "id": f.id.hyphenated().to_string(),
                        "err": f.error,
                        "delay_ms": millis(f.retry_in),
                        "dead": f.dead,
                        "unavailable": f.unavailable,
                    })
                })
                .collect(),
        )
        .to_string();
        let err = |e| self.err(e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        let ok = if p.published.is_empty() {
            0
        } else {
            sqlx::query(&self.q.settle_ok)
                .bind(id_list(p.published))
                .bind(&token)
                .execute(&mut *tx)
                .await
                .map_err(err)?
                .rows_affected()
        };
        let bad = if p.failed.is_empty() {
            0
        } else {
            sqlx::query(&self.q.settle_failed)
                .bind(failed)
                .bind(&token)
                .execute(&mut *tx)
                .await
                .map_err(err)?
                .rows_affected()
        };
        tx.commit().await.map_err(err)?;
        Ok(SettleOutcome {
            published: ok,
            failed: bad,
        })
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        let token = p.claim.lease_token()?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.q.release)
            .bind(id_list(p.ids))
            .bind(token.hyphenated().to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        let sql = if ordering == Ordering::OrderedHold {
            &self.q.has_unfinished_hold
        } else {
            &self.q.has_unfinished
        };
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))
    }

    /// Ready when something is due; otherwise sleep until a commit of this process wakes us,
    /// the earliest backing-off or leased event falls due, or the adaptive poll comes round
    /// (10 ms after work was found, doubling while idle, at most `max`): writers in other
    /// processes are seen within that poll.
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let max = p.max;
        let due: Option<i64> = sqlx::query_scalar(&self.q.due_in_ms)
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
                self.idle.store(0, AtomicOrdering::Relaxed);
                Ok(Wake::Notified)
            }
            _ = tokio::time::sleep(sleep) => Ok(Wake::Timeout),
        }
    }

    /// Renew this relay's lease on the file, or refuse to run beside another live relay.
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        let err = |e| self.err(e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        let instance = p.instance.to_string();
        if let Some(row) = sqlx::query(&self.q.relay_other)
            .bind(p.relay_id)
            .bind(&instance)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?
        {
            let other: String = row.try_get(0).map_err(Error::Database)?;
            let left: i64 = row.try_get(1).map_err(Error::Database)?;
            tx.rollback().await.map_err(err)?;
            if other == p.relay_id {
                return Err(Error::RelayIdInUse {
                    table: self.table.display(),
                    relay_id: other,
                    remaining_secs: left.max(0) as f64 / 1000.0,
                });
            }
            return Err(Error::RelayRunning {
                table: self.table.display(),
                other,
                remaining_secs: left as f64 / 1000.0,
            });
        }
        sqlx::query(&self.q.relay_upsert)
            .bind(p.relay_id)
            .bind(p.ordering.mode_name())
            .bind(millis(p.lease))
            .bind(&instance)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(&self.q.relay_gc)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(if p.ordering.is_ordered() {
            Membership {
                partitions: 1,
                live_relays: 1,
                owned: vec![0],
                target: 1,
                acquired: Vec::new(),
                released: Vec::new(),
            }
        } else {
            Membership::default()
        })
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let relay_id = p.relay_id;
        let err = |e| self.err(e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        // Another process holds this relay id: its leases are not ours.
        let held = sqlx::query(&self.q.relay_held)
            .bind(relay_id)
            .bind(p.instance.to_string())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
        if held.is_some() {
            tx.rollback().await.map_err(err)?;
            return Ok(0);
        }
        sqlx::query(&self.q.deregister_relay)
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let n = sqlx::query(&self.q.deregister_events)
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(n)
    }

    async fn counts(&self) -> Result<Counts, Error> {
        let r = sqlx::query(&self.q.counts)
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
