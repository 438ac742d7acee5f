//! The end of a run, after the writers stopped: drain the relays, say what they left
//! unfinished, and resolve the writers' uncertain commits against the commit audit.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::check::FinalTruth;
use crate::relays::{RelaySettings, RelaySlot};
use crate::run::{supervise_until, TABLE};
use crate::workload;

/// Wait until nothing is pending or leased (dead letters aside).
pub async fn drain(
    pool: &PgPool,
    slots: &mut [RelaySlot],
    settings: &RelaySettings,
    timeout: Duration,
    restarts: &mut u32,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut left = -1i64;
    while Instant::now() < deadline {
        let n: Result<i64, _> = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {TABLE} WHERE processed_at IS NULL AND dead_at IS NULL"
        ))
        .fetch_one(pool)
        .await;
        if let Ok(n) = n {
            left = n;
            if n == 0 {
                return Ok(true);
            }
        }
        supervise_until(
            slots,
            settings,
            Instant::now() + Duration::from_millis(500),
            restarts,
        )
        .await?;
    }
    eprintln!("chaos: not drained after {timeout:?}: {left} events unfinished");
    Ok(false)
}

/// What the events left unfinished after the drain are: how many reached the broker anyway,
/// how many the table path holds, and a few of them.
pub async fn unfinished(pool: &PgPool, deliveries: &[Uuid]) -> anyhow::Result<String> {
    let rows: Vec<(Uuid, i64, i32, bool)> = sqlx::query_as(&format!(
        "SELECT id, seq, attempts, handed_off_at IS NOT NULL FROM {TABLE} \
         WHERE processed_at IS NULL AND dead_at IS NULL ORDER BY seq"
    ))
    .fetch_all(pool)
    .await
    .context("read the unfinished events")?;
    let delivered: HashSet<&Uuid> = deliveries.iter().collect();
    let reached = rows.iter().filter(|r| delivered.contains(&r.0)).count();
    let handed = rows.iter().filter(|r| r.3).count();
    let sample: Vec<String> = rows
        .iter()
        .take(3)
        .map(|(id, seq, attempts, _)| format!("{id} (seq {seq}, attempts {attempts})"))
        .collect();
    Ok(format!(
        "unfinished after the drain: {} (of which at the broker: {reached}, in the table path: {handed}), for example: {}",
        rows.len(),
        sample.join(", ")
    ))
}

/// The writers' truth, with uncertain commits looked up in the commit audit.
/// Returns (truth, uncertain that committed, committed but missing from the audit).
pub async fn resolve(
    pool: &PgPool,
    truth: workload::Truth,
) -> anyhow::Result<(FinalTruth, usize, usize)> {
    // Committed events, also those whose row the relay deleted on settle.
    let in_table: HashSet<Uuid> = sqlx::query_scalar("SELECT id FROM chaos_commits")
        .fetch_all(pool)
        .await
        .context("read the committed ids")?
        .into_iter()
        .collect();
    let mut t = FinalTruth {
        committed: truth.committed,
        rolled_back: truth.rolled_back,
        poison: HashSet::new(),
    };
    let mut uncertain_committed = 0;
    for (id, v) in truth.uncertain {
        if in_table.contains(&id) {
            uncertain_committed += 1;
            t.committed.insert(id, v);
        } else {
            t.rolled_back.insert(id);
        }
    }
    t.poison = truth
        .poison
        .into_iter()
        .filter(|id| t.committed.contains_key(id))
        .collect();
    let missing = t
        .committed
        .keys()
        .filter(|id| !in_table.contains(id))
        .count();
    Ok((t, uncertain_committed, missing))
}
