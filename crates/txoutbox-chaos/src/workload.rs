//! Writers: tasks that commit events in transactions, as a service would, and record the
//! ground truth of what committed and what rolled back.
//!
//! Each aggregate belongs to one writer, whose transactions are sequential, so an aggregate's
//! commit order is its `seq` order (the precondition of the relay's order guarantee). Some
//! transactions are rolled back (their events must never arrive), some carry many events,
//! and a few carry a poison event (an event type no broker takes), which must be
//! dead-lettered and nothing else.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// An event type that every publisher of the run refuses, permanently: NATS for the space (an
/// invalid subject), AMQP for the length (over 255 bytes, the most a routing key or the `type`
/// property holds).
pub const POISON_TYPE: &str = concat!(
    "poison pill ",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
);
const _: () = assert!(POISON_TYPE.len() > 255);

/// What the writers know for sure.
#[derive(Default, Debug)]
pub struct Truth {
    /// Committed: event id -> (aggregate id, seq).
    pub committed: HashMap<Uuid, (String, i64)>,
    /// Written in a transaction that was rolled back.
    pub rolled_back: HashSet<Uuid>,
    /// The commit's outcome is unknown (the connection broke during COMMIT): resolved against
    /// the table at the end.
    pub uncertain: HashMap<Uuid, (String, i64)>,
    /// Committed poison events: meant to be dead-lettered.
    pub poison: HashSet<Uuid>,
    pub transactions: u64,
    pub failed_transactions: u64,
}

#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub writers: usize,
    pub aggregates: usize,
    /// Events per second, all writers together.
    pub rate: f64,
    /// Most events in one transaction.
    pub max_events: usize,
    pub rollback_ratio: f64,
    pub poison_ratio: f64,
    pub table: String,
}

/// Run the writers until `stop`; returns the ground truth.
pub async fn run(pool: PgPool, cfg: WorkloadConfig, seed: u64, stop: CancellationToken) -> Truth {
    let truth = Arc::new(Mutex::new(Truth::default()));
    let mut tasks = Vec::new();
    for w in 0..cfg.writers {
        let (pool, cfg, stop, truth) = (pool.clone(), cfg.clone(), stop.clone(), truth.clone());
        tasks.push(tokio::spawn(async move {
            writer(w, pool, cfg, seed, stop, truth).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    match Arc::try_unwrap(truth) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => std::mem::take(&mut *shared.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

struct Planned {
    aggregate: String,
    event_type: &'static str,
    payload: serde_json::Value,
}

async fn writer(
    w: usize,
    pool: PgPool,
    cfg: WorkloadConfig,
    seed: u64,
    stop: CancellationToken,
    truth: Arc<Mutex<Truth>>,
) {
    let mut rng =
        StdRng::seed_from_u64(seed ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(w as u64 + 1)));
    // This writer's aggregates: w, w + writers, w + 2 * writers, ...
    let mine: Vec<usize> = (w..cfg.aggregates).step_by(cfg.writers.max(1)).collect();
    if mine.is_empty() {
        return;
    }
    let per_writer = (cfg.rate / cfg.writers.max(1) as f64).max(0.1);
    let start = Instant::now();
    let mut written = 0u64;
    let mut n = 0u64;
    while !stop.is_cancelled() {
        // Mostly small transactions; now and then a big one.
        let count = if rng.gen_bool(0.05) {
            rng.gen_range(1..=cfg.max_events.max(1))
        } else {
            rng.gen_range(1..=3.min(cfg.max_events.max(1)))
        };
        let rollback = rng.gen_bool(cfg.rollback_ratio);
        let planned: Vec<Planned> = (0..count)
            .map(|_| {
                n += 1;
                let agg = mine[rng.gen_range(0..mine.len())];
                let poison = rng.gen_bool(cfg.poison_ratio);
                Planned {
                    aggregate: format!("a{agg}"),
                    event_type: if poison { POISON_TYPE } else { "item.changed" },
                    payload: serde_json::json!({"writer": w, "n": n, "pad": "x".repeat(rng.gen_range(0..200))}),
                }
            })
            .collect();
        let outcome = transaction(&pool, &cfg.table, &planned, rollback).await;
        let failed = matches!(outcome, Outcome::Failed);
        if let Ok(mut t) = truth.lock() {
            t.transactions += 1;
            match outcome {
                Outcome::Committed(rows) => {
                    for (p, (id, seq)) in planned.iter().zip(rows) {
                        if p.event_type == POISON_TYPE {
                            t.poison.insert(id);
                        }
                        t.committed.insert(id, (p.aggregate.clone(), seq));
                    }
                }
                Outcome::RolledBack(ids) => t.rolled_back.extend(ids),
                Outcome::Uncertain(rows) => {
                    for (p, (id, seq)) in planned.iter().zip(rows) {
                        if p.event_type == POISON_TYPE {
                            t.poison.insert(id);
                        }
                        t.uncertain.insert(id, (p.aggregate.clone(), seq));
                    }
                }
                Outcome::Failed => t.failed_transactions += 1,
            }
        }
        if failed {
            // The database is away (a restart): do not spin.
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        written += count as u64;
        let due = start + Duration::from_secs_f64(written as f64 / per_writer);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(due) => {}
        }
    }
}

enum Outcome {
    /// (id, seq) per planned event, in order.
    Committed(Vec<(Uuid, i64)>),
    RolledBack(Vec<Uuid>),
    Uncertain(Vec<(Uuid, i64)>),
    /// Failed before COMMIT was sent: nothing committed.
    Failed,
}

async fn transaction(pool: &PgPool, table: &str, planned: &[Planned], rollback: bool) -> Outcome {
    let Ok(mut tx) = pool.begin().await else {
        return Outcome::Failed;
    };
    let mut rows = Vec::with_capacity(planned.len());
    // One INSERT per event, as the seed's code does: seq follows statement order.
    for p in planned {
        let r: Result<(Uuid, i64), _> = sqlx::query_as(&format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('item', $1, $2, $3) RETURNING id, seq"
        ))
        .bind(&p.aggregate)
        .bind(p.event_type)
        .bind(&p.payload)
        .fetch_one(&mut *tx)
        .await;
        match r {
            Ok(row) => rows.push(row),
            Err(_) => return Outcome::Failed,
        }
    }
    if rollback {
        // Whether ROLLBACK answers or the connection dies, nothing of it committed.
        let _ = tx.rollback().await;
        return Outcome::RolledBack(rows.into_iter().map(|(id, _)| id).collect());
    }
    match tx.commit().await {
        Ok(()) => Outcome::Committed(rows),
        Err(_) => Outcome::Uncertain(rows),
    }
}
