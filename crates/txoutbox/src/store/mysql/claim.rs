//! The claim on MySQL: one short transaction (`READ COMMITTED`): pick in `seq` order, lock the
//! picked rows (`FOR UPDATE SKIP LOCKED`), lease them under the claim's token, read them back,
//! dead-letter those that do not decode, COMMIT.

use std::collections::HashSet;
use std::time::Instant;

use super::schema::{derived, table, NOW_MS};
use super::{ms, MySqlStore, CLAIM_MARGIN_MS, COLUMNS};
use crate::error::Error;
use crate::store::undecodable::{self, Decoded};
use crate::store::{Claim, ClaimParams, Ordering};
use crate::OutboxEvent;

impl MySqlStore {
    /// One short transaction (`READ COMMITTED`, no gap locks: writers inserting new events
    /// never wait for a claim): pick, lock, lease, read back, commit.
    pub(super) async fn claim_events(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let q = table(&self.table);
        let limit = i64::try_from(p.limit).unwrap_or(i64::MAX);
        let partitions = if p.ordering.is_ordered() {
            self.partition_count().await?
        } else {
            0
        };
        let err = |e| self.err(e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let mut tx = super::begin_read_committed(&mut conn, &self.table).await?;
        let base = format!(
            "SELECT e.seq FROM {q} e
             WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= {NOW_MS}
               AND (e.locked_until IS NULL OR e.locked_until <= {NOW_MS})"
        );
        let base_agg = base.replacen(
            "SELECT e.seq",
            "SELECT e.seq, e.aggregate_type, e.aggregate_id",
            1,
        );
        let seqs: Vec<i64> = if p.ordering.is_ordered() {
            // Pick with a plain read, then lock what was picked: a locking read would also
            // lock (and, with SKIP LOCKED, skip) the rows its NOT EXISTS looks at, and a
            // blocker skipped is a blocker missed. (MariaDB has no `FOR UPDATE OF`.)
            let picked: Vec<(i64, String, String)> = sqlx::query_as(&format!(
                "{base_agg}
                   AND MOD(e.partition_key, ?) IN (
                       SELECT `partition` FROM {} WHERE owner = ? AND lease_until > {NOW_MS} + {CLAIM_MARGIN_MS})
                   AND NOT EXISTS (
                       SELECT 1 FROM {q} b
                       WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                         AND b.processed_at IS NULL AND b.seq < e.seq
                         AND ((b.dead_at IS NULL AND (b.available_at > {NOW_MS} OR b.locked_until > {NOW_MS}))
                              OR (b.dead_at IS NOT NULL AND ?)))
                 ORDER BY e.seq LIMIT ?",
                derived(&self.table, "partitions")
            ))
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
                // Still claimable, and not being changed by anyone else right now.
                let locked: Vec<i64> = sqlx::query_scalar(&format!(
                    "SELECT seq FROM {q} WHERE seq IN ({}) AND processed_at IS NULL AND dead_at IS NULL
                       AND (locked_until IS NULL OR locked_until <= {NOW_MS})
                     ORDER BY seq FOR UPDATE SKIP LOCKED",
                    picked.iter().map(|(seq, _, _)| seq.to_string()).collect::<Vec<_>>().join(",")
                ))
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?;
                ordered_prefix(&picked, &locked)
            }
        } else {
            sqlx::query_scalar(&format!(
                "{base} ORDER BY e.seq LIMIT ? FOR UPDATE SKIP LOCKED"
            ))
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?
        };
        if seqs.is_empty() {
            tx.commit().await.map_err(err)?;
            return Ok(Claim::leased(p.token, Vec::new(), started + p.lease));
        }
        // Integers read from the database: safe to inline.
        let list = seqs
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let token = p.token.hyphenated().to_string();
        sqlx::query(&format!(
            "UPDATE {q} SET locked_until = {NOW_MS} + ?, locked_by = ?, lock_token = ? WHERE seq IN ({list})"
        ))
        .bind(ms(p.lease))
        .bind(p.relay_id)
        .bind(&token)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM {q} WHERE seq IN ({list}) AND lock_token = ? ORDER BY seq"
        ))
        .bind(&token)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let (events, bad, held) = undecodable::split_text_rows(&rows, p.ordering)?;
        if !bad.is_empty() {
            self.bury_undecodable(&mut tx, &token, &bad, &held).await?;
        }
        tx.commit().await.map_err(err)?;
        undecodable::count_dead(&bad);
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
        let q = table(&self.table);
        let err = |e| self.err(e);
        let rows = undecodable::bad_rows_json(bad);
        sqlx::query(&format!(
            "UPDATE {q} e
             JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', err LONGTEXT PATH '$[1]')) AS f
               ON e.seq = f.seq
             SET e.dead_at = {NOW_MS}, e.last_error = f.err,
                 e.locked_until = NULL, e.locked_by = NULL, e.lock_token = NULL
             WHERE e.lock_token = ?"
        ))
        .bind(rows)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        if !held.is_empty() {
            let list = held
                .iter()
                .map(|e| e.seq.to_string())
                .collect::<Vec<_>>()
                .join(",");
            sqlx::query(&format!(
                "UPDATE {q} SET locked_until = NULL, locked_by = NULL, lock_token = NULL \
                 WHERE seq IN ({list}) AND lock_token = ?"
            ))
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        Ok(())
    }
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
