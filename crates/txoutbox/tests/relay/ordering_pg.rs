//! Ordered mode against the real PostgreSQL: per-aggregate order of first deliveries with
//! faults, several relays, a crash and a late joiner; partition sharing; dead heads.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;
use txoutbox::publish::{FaultyPublisher, Message};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::{EventFilter, Operator, Ordering, Retention, Store};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

fn ordered(relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.relay_id = relay_id.to_string();
    c.ordering = Ordering::Ordered;
    c.batch_size = 200;
    c.poll_interval = Duration::from_millis(100);
    c.lease = Duration::from_secs(5);
    c.partition_lease = Duration::from_secs(2);
    c.max_attempts = 1000;
    c.backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(100),
        jitter: true,
    };
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

/// `n` events spread round-robin over `aggregates` aggregates, written in transactions of 50.
async fn write(db: &PgHarness, n: usize, aggregates: usize) -> Vec<Uuid> {
    let outbox = db.outbox();
    let mut ids = Vec::new();
    let events: Vec<NewEvent> = (0..n)
        .map(|i| {
            NewEvent::new(
                "account",
                format!("a-{}", i % aggregates),
                "account.changed",
                &serde_json::json!({ "i": i }),
            )
            .unwrap()
        })
        .collect();
    for chunk in events.chunks(50) {
        let mut tx = db.pool.begin().await.unwrap();
        ids.extend(outbox.enqueue_many(&mut *tx, chunk).await.unwrap());
        tx.commit().await.unwrap();
    }
    ids
}

/// One relay with `cfg` until it has drained the table (within a minute).
async fn drain(db: &PgHarness, p: &RecordingPublisher, mut cfg: RelayConfig) {
    cfg.exit_when_drained = true;
    tokio::time::timeout(
        Duration::from_secs(60),
        Relay::new(db.pool_store(), p.boxed(), cfg).spawn().join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
}

/// Per aggregate, the seqs of first deliveries must rise. Returns the number of violations.
fn order_violations(acked: &[Message]) -> usize {
    let mut seen = HashSet::new();
    let mut last: HashMap<(String, String), i64> = HashMap::new();
    let mut violations = 0;
    for m in acked {
        if !seen.insert(m.id) {
            continue; // a redelivery
        }
        let key = (m.aggregate_type.clone(), m.aggregate_id.clone());
        if let Some(prev) = last.get(&key) {
            if m.seq < *prev {
                violations += 1;
            }
        }
        last.insert(key, m.seq);
    }
    violations
}

fn faulty(p: &RecordingPublisher, seed: u64) -> Box<dyn txoutbox::publish::Publisher> {
    Box::new(FaultyPublisher::new(p.boxed(), 0.05, seed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_keeps_each_aggregates_order_under_faults() {
    let db = PgHarness::new().await;
    let ids = write(&db, 2000, 40).await;
    let p = RecordingPublisher::new();
    let mut cfg = ordered("solo");
    cfg.exit_when_drained = true;
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        Relay::new(db.pool_store(), faulty(&p, 1), cfg)
            .spawn()
            .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert!(
        stats.failed > 0,
        "no fault was injected: the test proves nothing"
    );
    let acked = p.acked();
    let got: HashSet<Uuid> = acked.iter().map(|m| m.id).collect();
    assert_eq!(
        got,
        ids.iter().copied().collect::<HashSet<_>>(),
        "lost events"
    );
    assert_eq!(order_violations(&acked), 0);
    assert_eq!(db.processed().await, 2000);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_a_crash_and_a_late_joiner_keep_order() {
    let db = PgHarness::new().await;
    let ids = write(&db, 6000, 200).await;
    let p = RecordingPublisher::new();
    // Slow acks keep the run going long enough for the crash and the join to land mid-way.
    p.set_ack_delay(Duration::from_millis(2));
    let a = Relay::new(db.store(Retention::Mark).await, faulty(&p, 1), ordered("a")).spawn();
    let b = Relay::new(db.store(Retention::Mark).await, faulty(&p, 2), ordered("b")).spawn();
    wait_until("a third delivered", || async { p.acked_count() > 2000 }).await;
    a.abort(); // crash: nothing released
    let c = Relay::new(db.store(Retention::Mark).await, faulty(&p, 3), ordered("c")).spawn();
    wait_until("two thirds delivered", || async { p.acked_count() > 4000 }).await;
    let a2 = Relay::new(
        db.store(Retention::Mark).await,
        faulty(&p, 4),
        ordered("a2"),
    )
    .spawn();
    wait_until_for("everything published", Duration::from_secs(90), || async {
        db.processed().await == 6000
    })
    .await;
    for h in [b, c, a2] {
        h.shutdown().await.unwrap();
    }
    let acked = p.acked();
    let got: HashSet<Uuid> = acked.iter().map(|m| m.id).collect();
    assert_eq!(
        got,
        ids.iter().copied().collect::<HashSet<_>>(),
        "lost events"
    );
    assert_eq!(order_violations(&acked), 0, "first deliveries out of order");
    db.cleanup().await;
}

/// Who owns what, from the database: (owner -> partitions), and unowned partitions.
async fn ownership(db: &PgHarness) -> (HashMap<String, usize>, usize) {
    let rows: Vec<(Option<String>,)> = sqlx::query_as(&format!(
        "SELECT CASE WHEN lease_until > now() THEN owner END FROM \"{}\".outbox_partitions",
        db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut by = HashMap::new();
    let mut free = 0;
    for (o,) in rows {
        match o {
            Some(o) => *by.entry(o).or_insert(0) += 1,
            None => free += 1,
        }
    }
    (by, free)
}

fn balanced(by: &HashMap<String, usize>, free: usize, relays: &[&str]) -> bool {
    free == 0
        && by.len() == relays.len()
        && relays.iter().all(|r| by.contains_key(*r))
        && by.values().max().unwrap() - by.values().min().unwrap() <= 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_shared_and_taken_over() {
    let db = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let a = Relay::new(db.pool_store(), p.boxed(), ordered("a")).spawn();
    wait_until("a owns everything", || async {
        let (by, free) = ownership(&db).await;
        balanced(&by, free, &["a"])
    })
    .await;
    let b = Relay::new(db.pool_store(), p.boxed(), ordered("b")).spawn();
    let c = Relay::new(db.pool_store(), p.boxed(), ordered("c")).spawn();
    wait_until("three relays share", || async {
        let (by, free) = ownership(&db).await;
        balanced(&by, free, &["a", "b", "c"])
    })
    .await;
    // A graceful exit hands its partitions back at once.
    c.shutdown().await.unwrap();
    wait_until("two relays share", || async {
        let (by, free) = ownership(&db).await;
        balanced(&by, free, &["a", "b"])
    })
    .await;
    // A crash: its partitions come free when their lease runs out, and the survivor takes them.
    b.abort();
    wait_until("the survivor owns everything", || async {
        let (by, free) = ownership(&db).await;
        balanced(&by, free, &["a"])
    })
    .await;
    let relays = db.pool_store().relays().await.unwrap();
    let a_info = relays.iter().find(|r| r.relay_id == "a").unwrap();
    assert!(a_info.alive);
    assert_eq!(a_info.partitions.len(), 64);
    a.shutdown().await.unwrap();
    let (by, free) = ownership(&db).await;
    assert!(
        by.is_empty() && free == 64,
        "a graceful exit releases everything"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_holds_back_only_its_own_aggregate() {
    let db = PgHarness::new().await;
    let outbox = db.outbox();
    let ev = |agg: &str, i: usize| {
        NewEvent::new(
            "order",
            agg,
            "order.changed",
            &serde_json::json!({ "i": i }),
        )
        .unwrap()
    };
    let x: Vec<NewEvent> = (0..3).map(|i| ev("x", i)).collect();
    let y: Vec<NewEvent> = (0..3).map(|i| ev("y", i)).collect();
    let all: Vec<NewEvent> = x.iter().chain(y.iter()).cloned().collect();
    outbox.enqueue_many(&db.pool, &all).await.unwrap();
    let p = RecordingPublisher::new();
    p.fail_id_times(x[0].id(), Fail::Transient, Some(3));
    let mut cfg = ordered("hold-back");
    cfg.exit_when_drained = true;
    Relay::new(db.pool_store(), p.boxed(), cfg)
        .spawn()
        .join()
        .await
        .unwrap();
    let order: Vec<Uuid> = p.acked_ids();
    let pos = |id: Uuid| order.iter().position(|o| *o == id).unwrap();
    assert!(pos(x[0].id()) < pos(x[1].id()) && pos(x[1].id()) < pos(x[2].id()));
    // y was not held back by x: all of y went out before x's head finally did.
    assert!(y.iter().all(|e| pos(e.id()) < pos(x[0].id())), "{order:?}");
    // x's later events were never sent before its head was delivered.
    let sent = p.sent();
    let first_x1 = sent.iter().position(|m| m.id == x[1].id()).unwrap();
    let x0_ok = order.iter().position(|o| *o == x[0].id()).unwrap();
    assert!(x0_ok < order.len());
    assert!(
        sent[..first_x1]
            .iter()
            .filter(|m| m.id == x[0].id())
            .count()
            == 4
    );
    db.cleanup().await;
}

async fn dead_head(hold: bool) {
    let db = PgHarness::new().await;
    let outbox = db.outbox();
    let ev = |agg: &str, i: usize| {
        NewEvent::new(
            "order",
            agg,
            "order.changed",
            &serde_json::json!({ "i": i }),
        )
        .unwrap()
    };
    let x: Vec<NewEvent> = (0..3).map(|i| ev("x", i)).collect();
    let y: Vec<NewEvent> = (0..2).map(|i| ev("y", i)).collect();
    let all: Vec<NewEvent> = x.iter().chain(y.iter()).cloned().collect();
    outbox.enqueue_many(&db.pool, &all).await.unwrap();
    let p = RecordingPublisher::new();
    p.fail_id(x[0].id(), Fail::Permanent);
    let mut cfg = ordered("dead-head");
    cfg.exit_when_drained = true;
    cfg.ordering = if hold {
        Ordering::OrderedHold
    } else {
        Ordering::Ordered
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        Relay::new(db.pool_store(), p.boxed(), cfg.clone())
            .spawn()
            .join(),
    )
    .await
    .expect("drain ends even with held events")
    .unwrap();
    assert_eq!(db.dead().await, 1);
    let acked = p.acked_ids();
    assert!(
        y.iter().all(|e| acked.contains(&e.id())),
        "other aggregates flow"
    );
    if hold {
        assert!(
            !acked.contains(&x[1].id()) && !acked.contains(&x[2].id()),
            "hold: x's later events wait for the operator"
        );
        // The operator fixes the cause and retries the dead head: x goes out in order.
        p.clear_failures();
        let store = db.pool_store();
        let n = store
            .retry_dead(&EventFilter {
                id: Some(x[0].id()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
        Relay::new(db.pool_store(), p.boxed(), cfg)
            .spawn()
            .join()
            .await
            .unwrap();
        let acked = p.acked_ids();
        let pos = |id: Uuid| acked.iter().position(|o| *o == id).unwrap();
        assert!(pos(x[0].id()) < pos(x[1].id()) && pos(x[1].id()) < pos(x[2].id()));
    } else {
        let pos = |id: Uuid| acked.iter().position(|o| *o == id).unwrap();
        assert!(
            pos(x[1].id()) < pos(x[2].id()),
            "skip: x goes on past its dead letter"
        );
    }
    assert!(!store_has_unfinished(&db).await);
    db.cleanup().await;
}

async fn store_has_unfinished(db: &PgHarness) -> bool {
    db.pool_store()
        .has_unfinished(Ordering::Ordered)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_is_skipped_by_default() {
    dead_head(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_holds_its_aggregate_in_hold_mode() {
    dead_head(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_of_different_modes_are_refused() {
    let db = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let a = Relay::new(db.pool_store(), p.boxed(), ordered("ordered-one")).spawn();
    wait_until("a registered", || async {
        !db.pool_store().relays().await.unwrap().is_empty()
    })
    .await;
    let mut cfg = ordered("unordered-one");
    cfg.ordering = Ordering::Unordered;
    let err = Relay::new(db.pool_store(), p.boxed(), cfg)
        .spawn()
        .join()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ordered-one") && err.contains("--mode"),
        "{err}"
    );
    a.shutdown().await.unwrap();
    db.cleanup().await;
}

/// The relay passes its claims in flight to the next claim: on PostgreSQL an ordered claim
/// leases no rows, so without them a claim made while a batch is still being sent (the
/// pipeline) would take that batch's events again, and their aggregates' later events past
/// them. With slow acks and a pipeline of two, every event is sent exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_ahead_skips_the_aggregates_of_the_batch_in_flight() {
    let db = PgHarness::new().await;
    // Many aggregates, few events each, small batches: claims ahead find work besides the
    // batch in flight, and would find the in-flight events too if nothing held them back.
    let ids = write(&db, 120, 30).await;
    let p = RecordingPublisher::new();
    p.set_ack_delay(Duration::from_millis(20));
    let mut cfg = ordered("ahead");
    cfg.batch_size = 10;
    cfg.pipeline = 2;
    drain(&db, &p, cfg).await;
    let sent = p.sent();
    let mut seen = HashSet::new();
    let twice: Vec<i64> = sent
        .iter()
        .filter(|m| !seen.insert(m.id))
        .map(|m| m.seq)
        .collect();
    assert!(
        twice.is_empty(),
        "sent again while in flight (seqs): {twice:?}"
    );
    assert_eq!(
        seen,
        ids.iter().copied().collect::<HashSet<_>>(),
        "lost events"
    );
    assert_eq!(order_violations(&p.acked()), 0);
    assert_eq!(order_violations(&sent), 0, "sent out of order");
    db.cleanup().await;
}

/// Unordered on PostgreSQL, a claim leases no rows either: the next claim skips the events of
/// the batches in flight (a claim past the cursor has none behind it; a full scan, after a
/// short claim or once a second, passes over them). With slow acks and a pipeline of two,
/// every event is sent exactly once, and no row was ever leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unordered_claim_ahead_skips_the_events_of_the_batch_in_flight() {
    let db = PgHarness::new().await;
    // Not a multiple of the batch: the last claims come back short, and the claims after
    // them scan from the start while a batch is still in flight.
    let ids = write(&db, 125, 7).await;
    let p = RecordingPublisher::new();
    p.set_ack_delay(Duration::from_millis(150));
    let mut cfg = ordered("unordered-ahead");
    cfg.ordering = Ordering::Unordered;
    cfg.batch_size = 10;
    cfg.pipeline = 2;
    drain(&db, &p, cfg).await;
    let sent = p.sent();
    let mut seen = HashSet::new();
    let twice: Vec<i64> = sent
        .iter()
        .filter(|m| !seen.insert(m.id))
        .map(|m| m.seq)
        .collect();
    assert!(
        twice.is_empty(),
        "sent again while in flight (seqs): {twice:?}"
    );
    assert_eq!(
        seen,
        ids.iter().copied().collect::<HashSet<_>>(),
        "lost events"
    );
    assert_eq!(db.processed().await, 125);
    assert_eq!(
        db.count_where("lock_token IS NOT NULL").await,
        0,
        "a relay that owns partitions leased rows"
    );
    db.cleanup().await;
}

/// On PostgreSQL an aggregate's next event waits for the broker's acknowledgement of the one
/// before, not for that one's settle: with the settle of a1 held up for 3 s at the database,
/// the relay publishes a2 meanwhile (pipeline 1, batches of one). Both are settled in the end,
/// in order at the broker, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregates_next_event_goes_while_the_previous_one_settles() {
    let db = PgHarness::new().await;
    let ids = write(&db, 2, 1).await;
    let t = db.table.qualified();
    let schema = db.table.schema().quoted();
    // The settle of the first event (its row marked published) sleeps.
    db.exec(&format!(
        "CREATE FUNCTION {schema}.slow_settle() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$; \
         CREATE TRIGGER slow_settle BEFORE UPDATE ON {t} FOR EACH ROW \
           WHEN (OLD.processed_at IS NULL AND NEW.processed_at IS NOT NULL \
                 AND OLD.id = '{}') EXECUTE FUNCTION {schema}.slow_settle()",
        ids[0]
    ))
    .await;
    let p = RecordingPublisher::new();
    let mut cfg = ordered("settling");
    cfg.batch_size = 1;
    cfg.pipeline = 1;
    drain(&db, &p, cfg).await;
    assert_eq!(p.acked_ids(), ids, "each once, in order");
    let (first, second) = (p.send_times(ids[0])[0], p.send_times(ids[1])[0]);
    assert!(
        second.duration_since(first) < Duration::from_secs(2),
        "a2 waited {:?} for a1's settle",
        second.duration_since(first)
    );
    assert!(!store_has_unfinished(&db).await, "both settled");
    db.cleanup().await;
}
