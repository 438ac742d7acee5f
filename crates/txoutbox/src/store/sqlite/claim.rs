//! The claim on SQLite: one statement that leases in `seq` order (`UPDATE ... RETURNING`;
//! claims never overlap, as it takes the write lock up front), then the dead-lettering of
//! the claimed rows that do not decode.

use std::time::Instant;

use sqlx::Row;
use uuid::Uuid;

use super::{id_list, SqliteStore};
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::undecodable::{self, decode_text_row, Decoded};
use crate::store::{Claim, ClaimParams, Ordering};
use crate::OutboxEvent;

impl SqliteStore {
    /// One `UPDATE ... RETURNING` statement, which takes the write lock up front; then the
    /// rows that do not decode are dead-lettered.
    pub(super) async fn claim_events(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        let started = Instant::now();
        let limit = i64::try_from(p.limit).unwrap_or(i64::MAX);
        let sql = if p.ordering.is_ordered() {
            &self.q.claim_ordered
        } else {
            &self.q.claim
        };
        let rows = sqlx::query(sql)
            .bind(limit)
            .bind(millis(p.lease))
            .bind(p.relay_id)
            .bind(p.token.hyphenated().to_string())
            .bind(p.ordering == Ordering::OrderedHold)
            .bind(p.bytes.batch_param())
            .bind(p.bytes.event_param())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let decoded = rows
            .iter()
            .map(|r| {
                let mut d = decode_text_row(r)?;
                d.refuse_over(r.try_get("payload_size").ok(), p.bytes.event);
                Ok(d)
            })
            .collect::<Result<_, Error>>()?;
        let (events, bad, held) = undecodable::split(decoded, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(&p, &bad, &held).await;
        }
        if !events.is_empty() {
            self.poll.busy();
        }
        Ok(Claim::leased(p.token, events, started + p.lease))
    }

    /// Dead-letter the claimed rows that do not decode, and give back (`held`) the events of
    /// the claim that a dead letter holds back; fenced by the claim token. On failure they
    /// stay leased, and are claimed again when the lease runs out.
    async fn bury_undecodable(&self, p: &ClaimParams<'_>, bad: &[Decoded], held: &[OutboxEvent]) {
        let token = p.token.hyphenated().to_string();
        let rows = undecodable::bad_rows_json(bad);
        let held: Vec<Uuid> = held.iter().map(|e| e.id).collect();
        let result = async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query(&self.q.bury)
                .bind(rows)
                .bind(&token)
                .execute(&mut *tx)
                .await?;
            if !held.is_empty() {
                sqlx::query(&self.q.text.release)
                    .bind(id_list(&held))
                    .bind(&token)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        }
        .await;
        match result {
            Ok(()) => undecodable::count_dead(bad, p.metric_labels),
            Err(e) => tracing::warn!(error = %self.err(e),
                "could not dead-letter rows that do not decode; they are claimed again after their lease"),
        }
    }
}
