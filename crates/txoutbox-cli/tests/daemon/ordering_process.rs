//! Per-aggregate order with three relay processes on real PostgreSQL and NATS JetStream,
//! under injected publish faults, a SIGKILL with restart and a late joiner.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;

/// seq, attempts, partition, last_error, locked_by: printed for the first order violations.
type RowDebug = (i64, i32, i32, Option<String>, Option<String>);

const EVENTS: i64 = 30_000;
const AGGREGATES: i64 = 300;

fn relay_args<'a>(url: &'a str, mode: &'a str) -> Vec<&'a str> {
    vec![
        "relay",
        "--publisher",
        url,
        "--mode",
        mode,
        "--inject-faults",
        "0.03",
        "--lease",
        "5s",
        "--partition-lease",
        "3s",
        "--batch-size",
        "500",
        "--poll-interval",
        "200ms",
        "--backoff-base",
        "20ms",
        "--backoff-max",
        "200ms",
        "--max-attempts",
        "1000",
    ]
}

async fn run_three_relays(mode: &str) -> (TestSchema, TestStream) {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    db.insert_events(EVENTS, AGGREGATES).await;
    let url = stream.publisher_url();
    let args = relay_args(&url, mode);
    let mut r1 = db.spawn(&args);
    let mut r2 = db.spawn(&args);
    wait_until(60, "a sixth delivered", || async {
        stream.count().await > 5_000
    })
    .await;
    r1.start_kill().unwrap(); // SIGKILL: nothing released
    let _ = r1.wait().await;
    let mut r1b = db.spawn(&args);
    wait_until(90, "half delivered", || async {
        stream.count().await > 15_000
    })
    .await;
    let mut r3 = db.spawn(&args); // late joiner
    wait_until(180, "everything published", || async {
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
            .await
            == EVENTS
    })
    .await;
    for r in [&r2, &r1b, &r3] {
        signal(r, "TERM");
    }
    for r in [&mut r2, &mut r1b, &mut r3] {
        let status = tokio::time::timeout(Duration::from_secs(30), r.wait())
            .await
            .expect("relay exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    (db, stream)
}

/// Event id -> (aggregate id, seq), from the database.
async fn truth(db: &TestSchema) -> HashMap<String, (String, i64)> {
    let rows: Vec<(uuid::Uuid, String, i64)> =
        sqlx::query_as(&format!("SELECT id, aggregate_id, seq FROM {}", db.table()))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, agg, seq)| (id.to_string(), (agg, seq)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_relays_keep_each_aggregates_order_through_faults_a_kill_and_a_join() {
    let (db, stream) = run_three_relays("ordered").await;
    let truth = truth(&db).await;
    let arrived = stream.ids().await;
    let unique: HashSet<&String> = arrived.iter().collect();
    assert_eq!(
        unique.len() as i64,
        EVENTS,
        "every committed event reached the broker"
    );
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut violations = 0;
    let mut seen = HashSet::new();
    for id in &arrived {
        if !seen.insert(id) {
            continue;
        }
        let (agg, seq) = &truth[id];
        if let Some(prev) = last.insert(agg, *seq) {
            if *seq < prev {
                violations += 1;
                if violations <= 5 {
                    let rows: Vec<RowDebug> = sqlx::query_as(&format!(
                        "SELECT seq, attempts, partition_key % 64, last_error, locked_by FROM {} WHERE aggregate_id = $1 AND seq IN ($2, $3)",
                        db.table()
                    ))
                    .bind(agg)
                    .bind(prev)
                    .bind(*seq)
                    .fetch_all(&db.pool)
                    .await
                    .unwrap();
                    eprintln!("VIOLATION agg {agg}: {seq} arrived after {prev}: {rows:?}");
                }
            }
        }
    }
    assert_eq!(
        violations, 0,
        "first deliveries out of seq order within an aggregate"
    );
    // The faults really happened: some events needed more than one attempt.
    assert!(
        db.scalar("SELECT count(*) FROM {t} WHERE attempts > 0")
            .await
            > 0
    );
    stream.cleanup().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unordered_mode_delivers_everything_too() {
    let (db, stream) = run_three_relays("unordered").await;
    let arrived: HashSet<String> = stream.ids().await.into_iter().collect();
    let truth = truth(&db).await;
    assert_eq!(arrived.len() as i64, EVENTS);
    assert!(truth.keys().all(|id| arrived.contains(id)));
    stream.cleanup().await;
    db.cleanup().await;
}
