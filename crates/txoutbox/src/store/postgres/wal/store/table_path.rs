//! The table path of a WAL relay: a [`Store`] over the events the stream handed to the table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::WalStore;
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::{
    undecodable, Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering,
    RebalanceParams, ReleaseParams, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};

/// The table path of a WAL relay: claims only handed-off events (see [`WalStore`]).
#[derive(Debug, Clone)]
pub struct TablePath(pub(super) Arc<WalStore>);

#[async_trait::async_trait]
impl Store for TablePath {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let w = &self.0;
        let started = Instant::now();
        let query = sqlx::query(&w.q.claim)
            .bind(i64::try_from(p.limit).unwrap_or(i64::MAX))
            .bind(millis(p.lease))
            .bind(p.relay_id)
            .bind(p.token)
            .bind(p.ordering.is_ordered())
            .bind(p.ordering == Ordering::OrderedHold)
            .bind(p.bytes.batch_param())
            .bind(p.bytes.event_param());
        let rows = if p.ordering.is_ordered() {
            // Ordered claims of the table's relays (the slot's reader and its standbys all
            // claim here) take turns: one statement's snapshot cannot see an earlier event
            // that another claim leased but has not committed yet (its commit waiting on a
            // synchronous standby, or a slow fsync). That row is not yet in the `blocking`
            // index, and SKIP LOCKED passes over it, so the aggregate's later events would be
            // claimed and go out ahead of it. Behind the lock, the claim's statement starts
            // after the other's commit, and sees the row leased.
            let mut tx = w.pool().begin().await.map_err(|e| w.store.err(e))?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(w.table_path_lock_key())
                .execute(&mut *tx)
                .await
                .map_err(|e| w.store.err(e))?;
            let rows = query
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| w.store.err(e))?;
            tx.commit().await.map_err(|e| w.store.err(e))?;
            rows
        } else {
            query
                .fetch_all(w.pool())
                .await
                .map_err(|e| w.store.err(e))?
        };
        let rows = crate::store::postgres::claim::decode_claimed(&rows, &p)?;
        let (events, bad, held) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            w.store.bury_undecodable(&p, &bad, None).await;
        }
        let claim = Claim::leased(p.token, events, started + p.lease);
        if !held.is_empty() {
            let ids: Vec<Uuid> = held.iter().map(|e| e.id).collect();
            w.store
                .release(ReleaseParams {
                    claim: &claim,
                    ids: &ids,
                })
                .await?;
        }
        Ok(claim)
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        self.0.store.settle(p).await
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        self.0.store.release(p).await
    }

    async fn retry_now(&self, p: crate::store::RetryNowParams<'_>) -> Result<u64, Error> {
        self.0.store.retry_now(p).await
    }

    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        let w = &self.0;
        sqlx::query_scalar(&w.q.unfinished)
            .bind(ordering == Ordering::OrderedHold)
            .fetch_one(w.pool())
            .await
            .map_err(|e| w.store.err(e))
    }

    /// The WAL relay's heartbeat: registered as the reader of its slot (`wal:<slot>`; one
    /// source per table: a table relay, or a WAL relay of another slot, is refused whichever
    /// starts second). One WAL relay at a time reads the slot (the slot lock): it needs no
    /// partitions.
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        let w = &self.0;
        let mut m = w.store.register_wal(p, w.slot()).await?;
        m.live_relays = m.live_relays.max(1);
        Ok(m)
    }

    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let w = &self.0;
        let due: Option<f64> = sqlx::query_scalar(&w.q.due)
            .bind(p.ordering.is_ordered())
            .bind(p.ordering == Ordering::OrderedHold)
            .fetch_one(w.pool())
            .await
            .map_err(|e| w.store.err(e))?;
        let sleep = match due {
            Some(s) if s <= 0.0 => return Ok(Wake::Ready),
            Some(s) => Duration::from_secs_f64(s.min(p.max.as_secs_f64())),
            None => p.max,
        };
        tokio::select! {
            _ = w.handed_off.notified() => Ok(Wake::Notified),
            _ = tokio::time::sleep(sleep) => Ok(Wake::Timeout),
        }
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        self.0.store.deregister(p).await
    }

    async fn counts(&self) -> Result<Counts, Error> {
        self.0.store.counts().await
    }
}
