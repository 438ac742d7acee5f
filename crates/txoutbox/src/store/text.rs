//! What MySQL and SQLite share word for word: both keep ids as hyphenated text and times as
//! epoch milliseconds, and fill their statements once (their `Queries`, with the same field
//! names), so only a few steps are their own. The [`Store`](super::Store) methods
//! ([`text_store`]), their statements of the same name ([`TextQueries`]), and the write path
//! and the inbox ([`text_write`]).

use super::rows::{COLUMNS, INSERT_COLUMNS, INSERT_COLUMNS_BYTES};
use super::sql::Fill;

/// `f` with the names both text-row stores fill alike: `{{table}}` and `{{relays}}` (`table`
/// and `relays`, validated names), `{{now_ms}}` (`now`, the clock in SQL), `{{columns}}` and
/// `{{insert_columns}}`.
pub(crate) fn text_names(f: Fill, table: String, relays: String, now: &'static str) -> Fill {
    f.name("{{table}}", table)
        .name("{{relays}}", relays)
        .name("{{now_ms}}", now)
        .name("{{columns}}", COLUMNS)
        .name("{{insert_columns}}", INSERT_COLUMNS)
        .name("{{insert_columns_bytes}}", INSERT_COLUMNS_BYTES)
}

/// The statements MySQL and SQLite have alike (each from its own `sql/<name>.sql`), built
/// once by [`text_queries`]. `published` and `release` have, on MySQL, a `{{list}}` (a mark
/// per id); on SQLite they take the ids as one JSON array.
#[derive(Debug)]
pub(crate) struct TextQueries {
    /// `published_mark.sql` or `published_delete.sql`, by retention.
    pub published: String,
    pub release: String,
    pub retry_now: String,
    pub settle_failed: String,
    pub has_unfinished: String,
    pub has_unfinished_hold: String,
    pub due_in: String,
    pub deregister_relay: String,
    pub deregister_events: String,
    pub counts: String,
    pub relays: String,
    pub event: String,
    pub purge: String,
    pub events_page: String,
    pub dead_retry: String,
    pub dead_discard: String,
}

/// The [`TextQueries`] of database `$db`, filled by `$fill` (a `store::sql::Fill`), with
/// published events kept or deleted by `$retention`.
macro_rules! text_queries {
    ($db:literal, $fill:expr, $retention:expr) => {{
        use $crate::store::sql::sql_file;
        let f = $fill;
        let published = match $retention {
            $crate::store::Retention::Mark => sql_file!($db, "published_mark"),
            $crate::store::Retention::Delete => sql_file!($db, "published_delete"),
        };
        $crate::store::text::TextQueries {
            published: f.fill(published),
            settle_failed: f.fill(sql_file!($db, "settle_failed")),
            release: f.fill(sql_file!($db, "release")),
            retry_now: f.fill(sql_file!($db, "retry_now")),
            has_unfinished: f.fill(sql_file!($db, "has_unfinished")),
            has_unfinished_hold: f.fill(sql_file!($db, "has_unfinished_hold")),
            due_in: f.fill(sql_file!($db, "due_in")),
            deregister_relay: f.fill(sql_file!($db, "deregister_relay")),
            deregister_events: f.fill(sql_file!($db, "deregister_events")),
            counts: f.fill(sql_file!($db, "counts")),
            relays: f.fill(sql_file!($db, "relays")),
            event: f.fill(sql_file!($db, "event")),
            purge: f.fill(sql_file!($db, "purge")),
            events_page: f.fill(sql_file!($db, "events_page")),
            dead_retry: f.fill(sql_file!($db, "dead_retry")),
            dead_discard: f.fill(sql_file!($db, "dead_discard")),
        }
    }};
}
pub(crate) use text_queries;

/// The constructors and accessors of text-row store `$store` on pools `$pool`, and its
/// `impl Store`. `$store` must have the fields `pool`, `table`, `q` (its `Queries`, built by
/// `Queries::new(&table, retention)`, with the [`TextQueries`] as `text`), `wakeup`, `poll`
/// and those in `$own` (with their initial values), and the methods `begin_write` (the
/// transaction of a settle), `fenced_ids` (a statement over ids and the values to bind for
/// them, before the claim token), `claim_events`, `rebalance_relays` and `deregister_relay`;
/// the invoking module `schema::check_schema` and `queries::Queries`.
macro_rules! text_store {
    ($store:ident, $pool:ty, { $($own:ident: $init:expr),* $(,)? }) => {
        impl $store {
            /// A store on `table` that keeps published events
            /// ([`Retention::Mark`](crate::store::Retention::Mark)). `wakeup` wakes the relay
            /// at once when writers of this process enqueue (give the same one to their
            /// `Outbox`; see the module docs); writers elsewhere are found by polling.
            pub fn new(
                pool: $pool,
                table: $crate::OutboxTable,
                wakeup: $crate::store::wakeup::Wakeup,
            ) -> Self {
                Self::with_retention(pool, table, wakeup, $crate::store::Retention::Mark)
            }

            /// A store on `table` with the given retention for published events.
            pub fn with_retention(
                pool: $pool,
                table: $crate::OutboxTable,
                wakeup: $crate::store::wakeup::Wakeup,
                retention: $crate::store::Retention,
            ) -> Self {
                Self {
                    q: queries::Queries::new(&table, retention),
                    pool,
                    table,
                    wakeup,
                    poll: $crate::store::wakeup::AdaptivePoll::default(),
                    $($own: $init,)*
                }
            }

            /// The pool the store runs its statements on.
            pub fn pool(&self) -> &$pool {
                &self.pool
            }

            /// The table the store works on (on MySQL its `schema` is the database; SQLite
            /// has no schemas: always the `main` file).
            pub fn table(&self) -> &$crate::OutboxTable {
                &self.table
            }

            /// The wake-up this store's relay sleeps on: give it to the writers of this
            /// process (`Outbox::with_wakeup`, or SQLite's `connect`) to wake it at once.
            pub fn wakeup(&self) -> &$crate::store::wakeup::Wakeup {
                &self.wakeup
            }

            /// Fail with "run `txoutbox migrate`" unless the schema is in place at this
            /// build's version.
            pub async fn check_schema(&self) -> Result<(), $crate::Error> {
                schema::check_schema(&self.pool, &self.table).await
            }

            fn err(&self, e: sqlx::Error) -> $crate::Error {
                $crate::error::db_error(&self.table, e)
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn claim(
                &self,
                p: $crate::store::ClaimParams<'_>,
            ) -> Result<$crate::store::Claim, $crate::Error> {
                self.claim_events(p).await
            }

            async fn settle(
                &self,
                p: $crate::store::SettleParams<'_>,
            ) -> Result<$crate::store::SettleOutcome, $crate::Error> {
                let mut out = $crate::store::SettleOutcome::default();
                if p.published.is_empty() && p.failed.is_empty() {
                    return Ok(out);
                }
                let token = p.claim.lease_token()?.hyphenated().to_string();
                let err = |e| self.err(e);
                let mut tx = self.begin_write().await.map_err(err)?;
                if !p.published.is_empty() {
                    let (sql, ids) = self.fenced_ids(&self.q.text.published, p.published);
                    let q = ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id));
                    let done = q.bind(&token).execute(&mut *tx).await.map_err(err)?;
                    out.published = done.rows_affected();
                }
                if !p.failed.is_empty() {
                    let failed = $crate::store::rows::failures_json(p.failed);
                    let q = sqlx::query(&self.q.text.settle_failed).bind(failed);
                    let done = q.bind(&token).execute(&mut *tx).await.map_err(err)?;
                    out.failed = done.rows_affected();
                }
                tx.commit().await.map_err(err)?;
                Ok(out)
            }

            async fn release(
                &self,
                p: $crate::store::ReleaseParams<'_>,
            ) -> Result<u64, $crate::Error> {
                let token = p.claim.lease_token()?.hyphenated().to_string();
                if p.ids.is_empty() {
                    return Ok(0);
                }
                let (sql, ids) = self.fenced_ids(&self.q.text.release, p.ids);
                let q = ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id));
                let done = q.bind(token).execute(&self.pool).await;
                Ok(done.map_err(|e| self.err(e))?.rows_affected())
            }

            async fn retry_now(
                &self,
                p: $crate::store::RetryNowParams<'_>,
            ) -> Result<u64, $crate::Error> {
                if p.ids.is_empty() {
                    return Ok(0);
                }
                let (sql, ids) = self.fenced_ids(&self.q.text.retry_now, p.ids);
                let q = ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id));
                let done = q.execute(&self.pool).await.map_err(|e| self.err(e))?;
                self.wakeup.fire();
                Ok(done.rows_affected())
            }

            async fn has_unfinished(
                &self,
                ordering: $crate::store::Ordering,
            ) -> Result<bool, $crate::Error> {
                let sql = if ordering == $crate::store::Ordering::OrderedHold {
                    &self.q.text.has_unfinished_hold
                } else {
                    &self.q.text.has_unfinished
                };
                let n: i64 = sqlx::query_scalar(sql)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(n != 0)
            }

            /// Ready when something is due; otherwise sleep until a writer of this process
            /// wakes us, the earliest backing-off or leased event falls due, or the adaptive
            /// poll comes round (10 ms after work was found, doubling while idle, at most
            /// `max`): writers in other processes are seen within that poll.
            async fn wait_for_work(
                &self,
                p: $crate::store::WaitParams<'_>,
            ) -> Result<$crate::store::Wake, $crate::Error> {
                let due: Option<i64> = sqlx::query_scalar(&self.q.text.due_in)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(self.poll.wait(due, p.max, &self.wakeup).await)
            }

            async fn rebalance(
                &self,
                p: $crate::store::RebalanceParams<'_>,
            ) -> Result<$crate::store::Membership, $crate::Error> {
                self.rebalance_relays(p).await
            }

            async fn deregister(
                &self,
                p: $crate::store::DeregisterParams<'_>,
            ) -> Result<u64, $crate::Error> {
                self.deregister_relay(p).await
            }

            async fn counts(&self) -> Result<$crate::store::Counts, $crate::Error> {
                let r = sqlx::query(&self.q.text.counts)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                $crate::store::rows::counts(&r)
            }
        }
    };
}
pub(crate) use text_store;

/// The write path and the inbox of text-row store `$db` (its `sql/insert_one.sql`,
/// `insert_many.sql`, `inbox_create.sql`, `inbox_mark.sql`, filled by its `queries::names`),
/// in the caller's own transaction, on sqlx database `$database`.
macro_rules! text_write {
    ($db:literal, $database:ty) => {
        use $crate::store::sql::sql_file;

        /// One event: a plain insert. Several: one statement over one JSON array of rows (no
        /// limit on bound parameters), inserted in array order, so `seq` follows the slice.
        pub(crate) async fn insert<'e, E>(
            t: &$crate::OutboxTable,
            executor: E,
            events: &[$crate::NewEvent],
        ) -> Result<(), $crate::Error>
        where
            E: sqlx::Executor<'e, Database = $database>,
        {
            use $crate::store::rows::{any_bytes, text_values, text_values_json};
            let f = super::queries::names(t);
            // JSON events alone name schema 4's columns only (see `INSERT_COLUMNS`).
            let bytes = any_bytes(events);
            let columns = if bytes { 8 } else { 6 };
            let (one, many);
            let query = if let [e] = events {
                one = f.fill(if bytes {
                    sql_file!($db, "insert_one_bytes")
                } else {
                    sql_file!($db, "insert_one")
                });
                text_values(e)?
                    .into_iter()
                    .take(columns)
                    .fold(sqlx::query(&one), |q, v| q.bind(v))
            } else {
                many = f.fill(if bytes {
                    sql_file!($db, "insert_many_bytes")
                } else {
                    sql_file!($db, "insert_many")
                });
                sqlx::query(&many).bind(text_values_json(events, columns)?)
            };
            query
                .execute(executor)
                .await
                .map_err(|e| $crate::error::db_error(t, e))?;
            Ok(())
        }

        /// The inbox table, for consumers that do not run the migrations.
        pub(crate) async fn create_inbox<'e, E>(
            t: &$crate::OutboxTable,
            executor: E,
        ) -> Result<(), $crate::Error>
        where
            E: sqlx::Executor<'e, Database = $database>,
        {
            sqlx::query(&super::queries::names(t).fill(sql_file!($db, "inbox_create")))
                .execute(executor)
                .await
                .map_err($crate::Error::Database)?;
            Ok(())
        }

        /// `true` the first time `id` is seen: an insert on the primary key that does nothing
        /// on a repeat (a concurrent consumer of the same id waits for the first one's
        /// transaction, then sees the row).
        pub(crate) async fn mark_processed<'e, E>(
            t: &$crate::OutboxTable,
            executor: E,
            id: uuid::Uuid,
        ) -> Result<bool, $crate::Error>
        where
            E: sqlx::Executor<'e, Database = $database>,
        {
            let done = sqlx::query(&super::queries::names(t).fill(sql_file!($db, "inbox_mark")))
                .bind(id.hyphenated().to_string())
                .execute(executor)
                .await
                .map_err(|e| $crate::error::db_error(t, e))?;
            Ok(done.rows_affected() == 1)
        }
    };
}
pub(crate) use text_write;
