//! The store of the databases that keep ids as hyphenated text and times as epoch
//! milliseconds, MySQL and SQLite: one [`TextStore`], generic over the database, whose
//! [`Store`] and [`Operator`](super::Operator) (in `operator/text.rs`), constructors and write
//! path are written once. What differs is the database's [`TextBackend`]: its statements
//! (with the same file names for the shared ones, [`TextFiles`]), how a statement takes a set
//! of ids, its write transaction, and its claim, heartbeat and deregistration. What the shared
//! code asks of sqlx is [`TextRows`](db::TextRows).

pub(crate) mod db;
mod files;
pub(crate) mod write;

use std::fmt::Debug;
use std::future::Future;

use sqlx::{Pool, Transaction};
use uuid::Uuid;

use self::db::{Bind, TextRows};
pub(crate) use self::files::{text_files, text_names};
pub use self::files::{TextFiles, TextQueries};
use super::rows::failures_json;
use super::sql::Fill;
use super::wakeup::{AdaptivePoll, Wakeup};
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, RetryNowParams, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::backend::Backend;
use crate::error::{db_error, Error};
use crate::OutboxTable;

/// A database whose store is a [`TextStore`]: what its store does its own way. Implemented
/// for `sqlx::MySql` and `sqlx::Sqlite` only (it is sealed by [`Backend`]).
pub trait TextBackend: Backend + TextRows {
    /// Its statements for one table, the shared ones ([`TextQueries`]) among them.
    #[doc(hidden)]
    type Queries: Debug + Send + Sync + 'static;
    /// What its store keeps besides (MySQL: the partition count, read once).
    #[doc(hidden)]
    type Own: Debug + Default + Send + Sync + 'static;
    /// Its store's name and the name of its `Own` field, if any, in the store's `Debug`.
    #[doc(hidden)]
    const DEBUG: (&'static str, Option<&'static str>);
    /// Its files of the shared statements and of the write path.
    #[doc(hidden)]
    const FILES: TextFiles;
    /// The current time as epoch milliseconds, in SQL.
    #[doc(hidden)]
    const NOW_MS: &'static str;
    /// The validated names of `t`, the clock and the column lists, to fill its statements.
    #[doc(hidden)]
    fn names(t: &OutboxTable) -> Fill;
    /// Its statements for `t`, published events kept or deleted by `retention`.
    #[doc(hidden)]
    fn queries(t: &OutboxTable, retention: Retention) -> Self::Queries;
    /// The shared statements among `q`.
    #[doc(hidden)]
    fn text(q: &Self::Queries) -> &TextQueries;
    /// The transaction of a settle.
    #[doc(hidden)]
    fn begin_write(
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<Transaction<'_, Self>, sqlx::Error>> + Send;
    /// A statement over ids, and the values to bind for them (before the claim token).
    #[doc(hidden)]
    fn fenced_ids(sql: &str, ids: &[Uuid]) -> (String, Vec<String>);
    /// The partitions a row of `relays.sql` says the relay owns.
    #[doc(hidden)]
    fn relay_partitions(row: &Self::Row) -> Result<Vec<i32>, Error>;
    /// [`Store::claim`].
    #[doc(hidden)]
    fn claim_events(
        s: &TextStore<Self>,
        p: ClaimParams<'_>,
    ) -> impl Future<Output = Result<Claim, Error>> + Send;
    /// [`Store::rebalance`].
    #[doc(hidden)]
    fn rebalance_relays(
        s: &TextStore<Self>,
        p: RebalanceParams<'_>,
    ) -> impl Future<Output = Result<Membership, Error>> + Send;
    /// [`Store::deregister`].
    #[doc(hidden)]
    fn deregister_relay(
        s: &TextStore<Self>,
        p: DeregisterParams<'_>,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
    /// Fail with "run `txoutbox migrate`" unless the schema is in place.
    #[doc(hidden)]
    fn schema_check<'a>(
        pool: &'a Pool<Self>,
        t: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;
}

/// The outbox on a database that keeps ids as text and times as epoch milliseconds:
/// [`MySqlStore`](super::mysql::MySqlStore) or [`SqliteStore`](super::sqlite::SqliteStore).
/// See their modules' docs.
pub struct TextStore<DB: TextBackend> {
    pub(super) pool: Pool<DB>,
    pub(super) table: OutboxTable,
    pub(super) q: DB::Queries,
    pub(super) wakeup: Wakeup,
    pub(super) poll: AdaptivePoll,
    /// [`TextBackend::Own`].
    pub(super) own: DB::Own,
}

impl<DB: TextBackend> Debug for TextStore<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, own) = DB::DEBUG;
        let mut d = f.debug_struct(name);
        d.field("pool", &self.pool)
            .field("table", &self.table)
            .field("q", &self.q)
            .field("wakeup", &self.wakeup)
            .field("poll", &self.poll);
        if let Some(own) = own {
            d.field(own, &self.own);
        }
        d.finish()
    }
}

impl<DB: TextBackend> TextStore<DB> {
    /// A store on `table` that keeps published events
    /// ([`Retention::Mark`](crate::store::Retention::Mark)). `wakeup` wakes the relay at once
    /// when writers of this process enqueue (give the same one to their `Outbox`; see the
    /// module docs); writers elsewhere are found by polling.
    pub fn new(pool: Pool<DB>, table: OutboxTable, wakeup: Wakeup) -> Self {
        Self::with_retention(pool, table, wakeup, Retention::Mark)
    }

    /// A store on `table` with the given retention for published events.
    pub fn with_retention(
        pool: Pool<DB>,
        table: OutboxTable,
        wakeup: Wakeup,
        retention: Retention,
    ) -> Self {
        Self {
            q: DB::queries(&table, retention),
            pool,
            table,
            wakeup,
            poll: AdaptivePoll::default(),
            own: DB::Own::default(),
        }
    }

    /// The pool the store runs its statements on.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The table the store works on (on MySQL its `schema` is the database; SQLite has no
    /// schemas: always the `main` file).
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// The wake-up this store's relay sleeps on: give it to the writers of this process
    /// (`Outbox::with_wakeup`, or SQLite's `connect`) to wake it at once.
    pub fn wakeup(&self) -> &Wakeup {
        &self.wakeup
    }

    /// Fail with "run `txoutbox migrate`" unless the schema is in place at this build's
    /// version.
    pub async fn check_schema(&self) -> Result<(), Error> {
        DB::schema_check(&self.pool, &self.table).await
    }

    /// The relays registered on the table, with the partitions each owns (on SQLite: the
    /// relay registered on the file, at most one alive).
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        let rows = DB::fetch_all(DB::on_pool(&self.pool), &self.text().relays, Vec::new())
            .await
            .map_err(|e| self.err(e))?;
        rows.iter()
            .map(|r| DB::relay(r, DB::relay_partitions(r)?))
            .collect()
    }

    pub(super) fn err(&self, e: sqlx::Error) -> Error {
        db_error(&self.table, e)
    }

    pub(super) fn text(&self) -> &TextQueries {
        DB::text(&self.q)
    }

    /// The one row of `sql` on the pool, as sqlx's `fetch_one` has it: the row
    /// `fetch_optional` reads, or `RowNotFound`.
    async fn one_row(&self, sql: &str) -> Result<DB::Row, sqlx::Error> {
        let row = DB::fetch_optional(DB::on_pool(&self.pool), sql, Vec::new()).await?;
        row.ok_or(sqlx::Error::RowNotFound)
    }

    /// `sql` over `ids` ([`TextBackend::fenced_ids`]): the statement and its values, the ids
    /// then `token` if given.
    fn over_ids(&self, sql: &str, ids: &[Uuid], token: Option<String>) -> (String, Vec<Bind>) {
        let (sql, ids) = DB::fenced_ids(sql, ids);
        let binds = ids.into_iter().chain(token).map(Bind::Text).collect();
        (sql, binds)
    }
}

#[async_trait::async_trait]
impl<DB: TextBackend> Store for TextStore<DB> {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        DB::claim_events(self, p).await
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        let mut out = SettleOutcome::default();
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(out);
        }
        let token = p.claim.lease_token()?.hyphenated().to_string();
        let err = |e| self.err(e);
        let mut tx = DB::begin_write(&self.pool).await.map_err(err)?;
        if !p.published.is_empty() {
            let published = &self.text().published;
            let (sql, binds) = self.over_ids(published, p.published, Some(token.clone()));
            let done = DB::execute(DB::on_conn(&mut tx), &sql, binds).await;
            out.published = done.map_err(err)?;
        }
        if !p.failed.is_empty() {
            let binds = vec![Bind::Text(failures_json(p.failed)), Bind::Text(token)];
            let sql = &self.text().settle_failed;
            let done = DB::execute(DB::on_conn(&mut tx), sql, binds).await;
            out.failed = done.map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(out)
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        let token = p.claim.lease_token()?.hyphenated().to_string();
        if p.ids.is_empty() {
            return Ok(0);
        }
        let (sql, binds) = self.over_ids(&self.text().release, p.ids, Some(token));
        let done = DB::execute(DB::on_pool(&self.pool), &sql, binds).await;
        done.map_err(|e| self.err(e))
    }

    async fn retry_now(&self, p: RetryNowParams<'_>) -> Result<u64, Error> {
        if p.ids.is_empty() {
            return Ok(0);
        }
        let (sql, binds) = self.over_ids(&self.text().retry_now, p.ids, None);
        let done = DB::execute(DB::on_pool(&self.pool), &sql, binds).await;
        let n = done.map_err(|e| self.err(e))?;
        self.wakeup.fire();
        Ok(n)
    }

    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        let sql = if ordering == Ordering::OrderedHold {
            &self.text().has_unfinished_hold
        } else {
            &self.text().has_unfinished
        };
        let n = self.one_row(sql).await.and_then(|r| DB::int(&r));
        Ok(n.map_err(|e| self.err(e))? != 0)
    }

    /// Ready when something is due; otherwise sleep until a writer of this process wakes us,
    /// the earliest backing-off or leased event falls due, or the adaptive poll comes round
    /// (10 ms after work was found, doubling while idle, at most `max`): writers in other
    /// processes are seen within that poll.
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let due = self.one_row(&self.text().due_in).await;
        let due = due
            .and_then(|r| DB::maybe_int(&r))
            .map_err(|e| self.err(e))?;
        Ok(self.poll.wait(due, p.max, &self.wakeup).await)
    }

    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        DB::rebalance_relays(self, p).await
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        DB::deregister_relay(self, p).await
    }

    async fn counts(&self) -> Result<Counts, Error> {
        let row = self.one_row(&self.text().counts).await;
        DB::counts(&row.map_err(|e| self.err(e))?)
    }
}
