//! What MySQL and SQLite share word for word: both keep ids as hyphenated text and times as
//! epoch milliseconds, and fill their statements once (their `Queries`, with the same field
//! names), so only a few steps are their own. The [`Store`](super::Store) methods
//! ([`text_store`]) and the write path and the inbox ([`text_write`]).

/// `impl Store for $store`, for a text-row store. `$store` must have `pool`, `q` (its
/// `Queries`: `published`, `settle_failed`, `release`, `has_unfinished`, `has_unfinished_hold`,
/// `due_in`, `counts`), `wakeup` and `poll`, and the methods `err`, `begin_write` (the
/// transaction of a settle), `fenced_ids` (a statement over ids and the values to bind for
/// them, before the claim token), `claim_events`, `rebalance_relays` and `deregister_relay`.
macro_rules! text_store {
    ($store:ty) => {
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
                    let (sql, ids) = self.fenced_ids(&self.q.published, p.published);
                    let q = ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id));
                    let done = q.bind(&token).execute(&mut *tx).await.map_err(err)?;
                    out.published = done.rows_affected();
                }
                if !p.failed.is_empty() {
                    let failed = $crate::store::rows::failures_json(p.failed);
                    let q = sqlx::query(&self.q.settle_failed).bind(failed);
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
                let (sql, ids) = self.fenced_ids(&self.q.release, p.ids);
                let q = ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id));
                let done = q.bind(token).execute(&self.pool).await;
                Ok(done.map_err(|e| self.err(e))?.rows_affected())
            }

            async fn has_unfinished(
                &self,
                ordering: $crate::store::Ordering,
            ) -> Result<bool, $crate::Error> {
                let sql = if ordering == $crate::store::Ordering::OrderedHold {
                    &self.q.has_unfinished_hold
                } else {
                    &self.q.has_unfinished
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
                let due: Option<i64> = sqlx::query_scalar(&self.q.due_in)
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
                let r = sqlx::query(&self.q.counts)
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
            use $crate::store::rows::{text_values, text_values_json};
            let f = super::queries::names(t);
            let (one, many);
            let query = if let [e] = events {
                one = f.fill(sql_file!($db, "insert_one"));
                text_values(e)?
                    .into_iter()
                    .fold(sqlx::query(&one), |q, v| q.bind(v))
            } else {
                many = f.fill(sql_file!($db, "insert_many"));
                sqlx::query(&many).bind(text_values_json(events)?)
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
