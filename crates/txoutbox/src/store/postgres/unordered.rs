//! The unordered claim on PostgreSQL. A relay that owns partitions claims read-only from
//! them (`sql/claim_owned.sql`), as an ordered relay does but without the aggregate fences:
//! it writes nothing to the table at claim time, and its claim is held by partition ownership
//! ([`Fence::Partitions`]). Only a relay that owns no partition (more relays than partitions,
//! or a store driven without heartbeats) leases rows (`sql/claim.sql`), and only in
//! partitions no live relay owns.
//!
//! Why: a row lease writes a new version of every row it claims, which, since `locked_until`
//! is in the `blocking` index's condition, is never a HOT update and takes an entry in four
//! indexes; the settle then writes each row again. Leasing cost about 1,900 bytes of WAL per
//! event against 1,000 for the read-only ordered claim, and made the mode that promises less
//! the slower one (docs/performance.md).

use std::time::Instant;

use super::claim::{bytes_of, decode_claimed, ClaimRows};
use super::{millis, PgStore};
use crate::error::Error;
use crate::store::undecodable;
use crate::store::{Claim, ClaimBytes, ClaimParams, Fence};

impl PgStore {
    /// An unordered claim: read-only from the partitions this relay owns, or, if that finds
    /// nothing, the row-lease claim (which takes nothing from a relay that owns a partition).
    ///
    /// What a row lease did besides holding the row, keep this relay's next claim off the
    /// events it is still publishing, the claim params do: the claim skips the seqs of the
    /// relay's claims in flight. While claims come back full the next one starts past the
    /// highest `seq` claimed (the scan cursor), so there is usually nothing to skip.
    pub(super) async fn claim_unordered(&self, p: &ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let partitions = self.partition_count().await?;
        // A claim whose partition lease ran out holds nothing back: the relay does not send
        // it any more.
        let in_flight: Vec<i64> = p
            .in_flight
            .iter()
            .filter(|c| c.expires > started && matches!(c.fence, Fence::Partitions(_)))
            .flat_map(|c| c.events.iter().map(|e| e.seq))
            .collect();
        let skip = |floor: i64, upto: i64| -> Vec<i64> {
            let mut s: Vec<i64> = in_flight
                .iter()
                .copied()
                .filter(|&q| q > floor && q <= upto)
                .collect();
            s.sort_unstable();
            s
        };
        let floor = self.scan.lock().map(|s| s.floor()).unwrap_or(0);
        let ClaimRows { mut rows, mut head } = self
            .claim_owned(p, partitions, (floor, i64::MAX), &skip(floor, i64::MAX))
            .await?;
        if let Ok(mut scan) = self.scan.lock() {
            let last = rows.iter().map(|f| f.row.event.seq).max();
            scan.record(floor, p.limit, rows.len(), last);
        }
        let used = bytes_of(&rows);
        if floor > 0 && rows.len() < p.limit && used < p.bytes.batch {
            // The backlog past the cursor ran out (not the byte budget): look behind it too,
            // so that a short claim means "nothing more is claimable now", within what is
            // left of the budget.
            let rest = ClaimParams {
                limit: p.limit - rows.len(),
                bytes: ClaimBytes {
                    batch: p.bytes.batch - used,
                    ..p.bytes
                },
                ..p.clone()
            };
            let behind = self
                .claim_owned(&rest, partitions, (0, floor), &skip(0, floor))
                .await?;
            // One fence for the claim: if the partitions changed hands between the two
            // statements (a heartbeat took one), the rows behind wait for the next claim. The
            // lease left is each statement's own reading (the later one reads less), so it
            // is not compared: the claim keeps the shorter.
            // And the rows behind must fit what is left of the budget: a claim of their own
            // takes its first event whatever its size, which merged would pass the budget
            // (that event then opens the next claim).
            let fits = bytes_of(&behind.rows) <= p.bytes.batch - used;
            match (head.as_mut(), behind.head) {
                (Some(a), Some(b)) => {
                    if a.same_fence(&b) && fits {
                        a.left = a.left.min(b.left);
                        rows.extend(behind.rows);
                    }
                }
                (None, b) => {
                    rows = behind.rows;
                    head = b;
                }
                (Some(_), None) => {}
            }
        }
        let Some(head) = head else {
            return self.claim_leased(p).await;
        };
        let rows = rows.into_iter().map(|f| f.row).collect();
        let (events, bad, _) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(p, &bad, Some(partitions)).await;
        }
        Ok(head.claim(p.relay_id, events, Vec::new(), started))
    }

    /// One read-only claim of up to `p.limit` rows of the partitions this relay owns, with
    /// `seq` in `(from, upto]`, skipping the seqs `skip` (ascending), in no particular order,
    /// with its head ([`PgStore::fetch_claim`]).
    async fn claim_owned(
        &self,
        p: &ClaimParams<'_>,
        partitions: i32,
        (from, upto): (i64, i64),
        skip: &[i64],
    ) -> Result<ClaimRows, Error> {
        let bind = |sql| {
            sqlx::query(sql)
                .bind(i64::try_from(p.limit).unwrap_or(i64::MAX))
                .bind(p.relay_id)
                .bind(partitions)
                .bind(from)
                .bind(upto)
                .bind(skip)
                .bind(p.bytes.batch_param())
                .bind(p.bytes.event_param())
        };
        self.fetch_claim(p, &self.q.claim_owned_fast, &self.q.claim_owned, bind)
            .await
    }

    /// The row-lease claim of a relay that owns no partition: rows of partitions no live
    /// relay owns, leased under the claim's token, from the start of the pending index.
    async fn claim_leased(&self, p: &ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let partitions = self.partition_count().await?;
        let rows = sqlx::query(&self.q.claim)
            .bind(i64::try_from(p.limit).unwrap_or(i64::MAX))
            .bind(millis(p.lease) as f64)
            .bind(p.relay_id)
            .bind(p.token)
            .bind(0_i64)
            .bind(p.bytes.batch_param())
            .bind(p.bytes.event_param())
            .bind(partitions)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let rows = decode_claimed(&rows, p)?;
        let (events, bad, _) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(p, &bad, None).await;
        }
        Ok(Claim::leased(p.token, events, started + p.lease))
    }
}
