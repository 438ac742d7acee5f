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
mod queries;
pub(crate) mod schema;
mod wake;
pub(crate) mod write;

use std::future::Future;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row, Sqlite, Transaction};
use uuid::Uuid;

pub use wake::{connect, Wakeup, BUSY_TIMEOUT};

use self::queries::Queries;
use self::schema::NOW_MS;
use super::operator::millis;
use super::sql::Fill;
use super::text::{text_files, TextBackend, TextFiles, TextQueries, TextStore};
use super::{Claim, ClaimParams, DeregisterParams, Membership, RebalanceParams, Retention};
use crate::error::Error;
use crate::OutboxTable;

/// The outbox on SQLite. See the module docs for what it guarantees.
pub type SqliteStore = TextStore<Sqlite>;

impl SqliteStore {
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
}

/// Ids as one JSON array of hyphenated text (`json_each(?1)`).
fn id_list(ids: &[Uuid]) -> String {
    serde_json::Value::Array(
        ids.iter()
            .map(|id| serde_json::Value::String(id.hyphenated().to_string()))
            .collect(),
    )
    .to_string()
}

/// SQLite's own ways: ids as one JSON array, `BEGIN IMMEDIATE` (the write lock up front), one
/// relay per file.
impl TextBackend for Sqlite {
    type Queries = Queries;
    type Own = ();
    const FILES: TextFiles = text_files!("sqlite");
    const NOW_MS: &'static str = NOW_MS;
    const DEBUG: (&'static str, Option<&'static str>) = ("SqliteStore", None);

    fn names(t: &OutboxTable) -> Fill {
        queries::names(t)
    }

    fn queries(t: &OutboxTable, retention: Retention) -> Queries {
        Queries::new(t, retention)
    }

    fn text(q: &Queries) -> &TextQueries {
        &q.text
    }

    /// `BEGIN IMMEDIATE`: the write lock up front.
    async fn begin_write(pool: &SqlitePool) -> Result<Transaction<'_, Sqlite>, sqlx::Error> {
        pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// As it is (`sql/fenced_ids.sql`), and the ids as one JSON array.
    fn fenced_ids(sql: &str, ids: &[Uuid]) -> (String, Vec<String>) {
        (sql.to_owned(), vec![id_list(ids)])
    }

    /// None: one relay per file, no partitions.
    fn relay_partitions(_: &SqliteRow) -> Result<Vec<i32>, Error> {
        Ok(Vec::new())
    }

    fn claim_events(
        s: &SqliteStore,
        p: ClaimParams<'_>,
    ) -> impl Future<Output = Result<Claim, Error>> + Send {
        s.claim_events(p)
    }

    /// Renew this relay's lease on the file, or refuse to run beside another live relay.
    async fn rebalance_relays(
        s: &SqliteStore,
        p: RebalanceParams<'_>,
    ) -> Result<Membership, Error> {
        let err = |e| s.err(e);
        let mut tx = s.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        let instance = p.instance.to_string();
        if let Some(row) = sqlx::query(&s.q.relay_other)
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
                    table: s.table.display(),
                    relay_id: other,
                    remaining_secs: left.max(0) as f64 / 1000.0,
                });
            }
            return Err(Error::RelayRunning {
                table: s.table.display(),
                other,
                remaining_secs: left as f64 / 1000.0,
            });
        }
        sqlx::query(&s.q.relay_upsert)
            .bind(p.relay_id)
            .bind(p.ordering.mode_name())
            .bind(millis(p.lease))
            .bind(&instance)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(&s.q.relay_gc)
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

    /// Forget the relay and give back its leases, unless another process holds its id.
    async fn deregister_relay(s: &SqliteStore, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let relay_id = p.relay_id;
        let err = |e| s.err(e);
        let mut tx = s.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        // Another process holds this relay id: its leases are not ours.
        let held = sqlx::query(&s.q.relay_held)
            .bind(relay_id)
            .bind(p.instance.to_string())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
        if held.is_some() {
            tx.rollback().await.map_err(err)?;
            return Ok(0);
        }
        sqlx::query(&s.q.text.deregister_relay)
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let n = sqlx::query(&s.q.text.deregister_events)
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(n)
    }

    fn schema_check<'a>(
        pool: &'a SqlitePool,
        t: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        schema::check_schema(pool, t)
    }
}
