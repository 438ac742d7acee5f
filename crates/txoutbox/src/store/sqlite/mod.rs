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

mod claim;
mod operator;
mod queries;
pub(crate) mod schema;
mod wake;
pub(crate) mod write;

use std::time::Duration;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

pub use wake::{connect, Wakeup, BUSY_TIMEOUT};

use self::queries::Queries;
use self::schema::{derived, NOW_MS};
use super::rows::{self, relay as relay_from_row, COLUMNS};
use super::undecodable::decode_text_row;
use super::wakeup::AdaptivePoll;
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::{OutboxEvent, OutboxTable};

/// The row as an event, with placeholders where a column does not decode (operator listings).
fn event_from_row(r: &SqliteRow) -> Result<OutboxEvent, Error> {
    Ok(decode_text_row(r)?.event)
}

const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

/// An ordered claim needs the relay's lease to have at least this much left.
const CLAIM_MARGIN_MS: i64 = 1000;

/// The outbox on SQLite. See the module docs for what it guarantees.
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    table: OutboxTable,
    q: Queries,
    wakeup: Wakeup,
    poll: AdaptivePoll,
}

impl SqliteStore {
    /// A store on `pool`. Wake-ups come from `wakeup` (pass the one given to [`connect`]) or,
    /// for writers in other processes, from polling.
    pub fn new(pool: SqlitePool, table: OutboxTable, wakeup: Wakeup) -> Self {
        Self::with_retention(pool, table, wakeup, Retention::Mark)
    }

    /// A store with the given retention for published events.
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
            poll: AdaptivePoll::default(),
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

    /// The pool the store runs its statements on; its commits wake this relay.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
    /// The table the store works on (SQLite has no schemas: always the `main` file).
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }
    /// The wake-up the pool's commit hooks fire (see [`connect`]).
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
        rows.iter().map(|r| relay_from_row(r, Vec::new())).collect()
    }
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
        self.claim_events(p).await
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
        sqlx::query_scalar(self.q.has_unfinished(ordering))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))
    }

    /// Ready when something is due; otherwise sleep until a commit of this process wakes us,
    /// the earliest backing-off or leased event falls due, or the adaptive poll comes round
    /// (10 ms after work was found, doubling while idle, at most `max`): writers in other
    /// processes are seen within that poll.
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let due: Option<i64> = sqlx::query_scalar(&self.q.due_in_ms)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(self.poll.wait(due, p.max, &self.wakeup).await)
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
        rows::counts(&r)
    }
}
