//! The claim on MySQL: one short transaction (`READ COMMITTED`): pick in `seq` order, lock the
//! picked rows (`FOR UPDATE SKIP LOCKED`), lease them under the claim's token, read them back,
//! dead-letter those that do not decode, COMMIT.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::MySqlStore;
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::sql::{int_list, with_list};
use crate::store::undecodable::{self, decode_text_row, Decoded};
use crate::store::{Claim, ClaimParams, Ordering};
use crate::OutboxEvent;

impl MySqlStore {
    /// One short transaction (`READ COMMITTED`, no gap locks: writers inserting new events
    /// never wait for a claim): pick, lock, lease, read back, commit.
    pub(super) async fn claim_events(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let limit = i64::try_from(p.limit).unwrap_or(i64::MAX);
        let partitions = if p.ordering.is_ordered() {
            self.partition_count().await?
        } else {
            0
        };
        let err = |e| self.err(e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = super::begin_read_committed(&mut conn, &self.table).await?;
        // (seq, payload size) of what was picked and locked, in seq order.
        let picked: Vec<(i64, i64)> = if p.ordering.is_ordered() {
            // Pick with a plain read, then lock what was picked: a locking read would also
            // lock (and, with SKIP LOCKED, skip) the rows its NOT EXISTS looks at, and a
            // blocker skipped is a blocker missed. (MariaDB has no `FOR UPDATE OF`.)
            let picked: Vec<(i64, String, String, i64)> =
                sqlx::query_as(&self.q.claim_pick_ordered)
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
                let list = int_list(picked.iter().map(|(seq, ..)| seq));
                let locked: Vec<i64> = sqlx::query_scalar(&with_list(&self.q.claim_lock, &list))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(err)?;
                let sizes: HashMap<i64, i64> = picked
                    .iter()
                    .map(|(seq, _, _, size)| (*seq, *size))
                    .collect();
                let keys: Vec<(i64, String, String)> = picked
                    .into_iter()
                    .map(|(seq, t, i, _)| (seq, t, i))
                    .collect();
                ordered_prefix(&keys, &locked)
                    .into_iter()
                    .map(|seq| (seq, sizes.get(&seq).copied().unwrap_or(0)))
                    .collect()
            }
        } else {
            sqlx::query_as(&self.q.claim_pick)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?
        };
        let picked = within_bytes(picked, p.bytes.batch);
        let seqs: Vec<i64> = picked.iter().map(|(seq, _)| *seq).collect();
        if seqs.is_empty() {
            tx.commit().await.map_err(err)?;
            return Ok(Claim::leased(p.token, Vec::new(), started + p.lease));
        }
        // Integers read from the database: safe to inline.
        let list = int_list(&seqs);
        let token = p.token.hyphenated().to_string();
        sqlx::query(&with_list(&self.q.claim_lease, &list))
            .bind(millis(p.lease))
            .bind(p.relay_id)
            .bind(&token)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        // An event over the per-event ceiling is read without its payload, and dead-lettered.
        let too_large = |size: i64| u64::try_from(size).unwrap_or(0) > p.bytes.event;
        let (big, sent): (Vec<_>, Vec<_>) = picked.iter().partition(|(_, size)| too_large(*size));
        let mut rows = Vec::new();
        for (sql, part) in [
            (&self.q.claim_read, &sent),
            (&self.q.claim_read_unsent, &big),
        ] {
            if part.is_empty() {
                continue;
            }
            let list = int_list(part.iter().map(|(seq, _)| seq));
            rows.extend(
                sqlx::query(&with_list(sql, &list))
                    .bind(&token)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(err)?,
            );
        }
        let sizes: HashMap<i64, i64> = picked.iter().copied().collect();
        let decoded = rows
            .iter()
            .map(|r| {
                let mut d = decode_text_row(r)?;
                d.refuse_over(sizes.get(&d.event.seq).copied(), p.bytes.event);
                Ok(d)
            })
            .collect::<Result<_, Error>>()?;
        let (events, bad, held) = undecodable::split(decoded, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(&mut tx, &token, &bad, &held).await?;
        }
        tx.commit().await.map_err(err)?;
        undecodable::count_dead(&bad, p.metric_labels);
        self.poll.busy();
        Ok(Claim::leased(p.token, events, started + p.lease))
    }

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
        let err = |e| self.err(e);
        sqlx::query(&self.q.bury)
            .bind(undecodable::bad_rows_json(bad))
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        if !held.is_empty() {
            let list = int_list(held.iter().map(|e| e.seq));
            sqlx::query(&with_list(&self.q.bury_held, &list))
                .bind(token)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        Ok(())
    }
}

/// The prefix of `picked` (seq, payload size; in seq order) within `budget` bytes: the first
/// event whatever its size, then each while the running total stays within the budget.
fn within_bytes(picked: Vec<(i64, i64)>, budget: u64) -> Vec<(i64, i64)> {
    let mut total = 0u64;
    let mut out = Vec::with_capacity(picked.len());
    for (seq, size) in picked {
        total = total.saturating_add(u64::try_from(size).unwrap_or(0));
        if !out.is_empty() && total > budget {
            break;
        }
        out.push((seq, size));
    }
    out
}

/// Of the events an ordered claim picked (in `seq` order) and then managed to lock, those it
/// may lease: an event only if every earlier picked event of its aggregate was locked too. A
/// row that another transaction held at that moment (SKIP LOCKED skipped it) holds its
/// aggregate's later events back, or they would be sent before it.
fn ordered_prefix(picked: &[(i64, String, String)], locked: &[i64]) -> Vec<i64> {
    let locked: HashSet<i64> = locked.iter().copied().collect();
    let mut stopped: HashSet<(&str, &str)> = HashSet::new();
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
