//! The [`Store`](super::Store) methods that MySQL and SQLite share word for word: both keep
//! ids as hyphenated text and times as epoch milliseconds, and fill their statements once
//! (their `Queries`, with the same field names), so only a few steps are their own.

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
