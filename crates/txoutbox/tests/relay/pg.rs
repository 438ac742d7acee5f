//! The relay (claim -> publish -> settle) against a real PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`) and a scriptable in-memory publisher. Each test
//! works in a schema of its own and drops it at the end.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use txoutbox::relay::{Relay, RelayConfig, RelayHandle, RelayStats};
use txoutbox::retry::Backoff;
use txoutbox::store::postgres::PgStore;
use txoutbox::store::{
    ClaimParams, Counts, EventFilter, Operator, ReleaseParams, Retention, SettleOutcome,
    SettleParams, Store, Wake,
};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::{Harness, RowState};
use txoutbox::NewEvent;
use uuid::Uuid;

/// Small, fast settings for tests. `RelayConfig` is `#[non_exhaustive]`: built from the
/// default and then assigned field by field. These tests are about claiming, leases, retries
/// and shutdown, which work the same in every mode; they run unordered, where every event of
/// a batch is attempted at once. Ordered mode has tests of its own (`ordering_pg.rs` beside this file).
fn config(relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.ordering = txoutbox::store::Ordering::Unordered;
    c.relay_id = relay_id.to_string();
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(200);
    c.lease = Duration::from_secs(10);
    c.max_attempts = 3;
    c.backoff = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        jitter: true,
    };
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        format!("o-{}", i % 10),
        "order.created",
        &serde_json::json!({ "i": i, "total": 10.5, "lines": [{"sku": format!("s{i}"), "qty": 2}] }),
    )
    .unwrap()
    .header("traceparent", format!("00-{i:032x}-00f067aa0ba902b7-01"))
}

fn typed(i: usize, event_type: &str) -> NewEvent {
    NewEvent::new(
        "order",
        format!("o-{i}"),
        event_type,
        &serde_json::json!({ "i": i }),
    )
    .unwrap()
}

async fn join(handle: RelayHandle) -> RelayStats {
    tokio::time::timeout(DEADLINE, handle.join())
        .await
        .expect("relay did not stop in time")
        .expect("relay failed")
}

async fn shutdown(handle: RelayHandle) -> RelayStats {
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay shutdown failed")
}

fn assert_no_duplicates(ids: &[Uuid]) {
    let set: HashSet<_> = ids.iter().collect();
    assert_eq!(set.len(), ids.len(), "some event was delivered twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_everything_once_in_order_with_the_message_contract() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    // One batch in flight at a time, so that even unordered the relay sends in seq order
    // (with more, batches interleave; ordering_pg checks per-aggregate order with those).
    let mut cfg = config("happy");
    cfg.pipeline = 1;
    let handle = Relay::new(db.pool_store(), publisher.boxed(), cfg).spawn();

    let mut written: Vec<NewEvent> = Vec::new();
    for chunk in (0..1000).collect::<Vec<_>>().chunks(125) {
        let events: Vec<NewEvent> = chunk.iter().map(|&i| event(i)).collect();
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox().enqueue_many(&mut *tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        written.extend(events);
    }
    wait_until("1000 events published", || async {
        db.processed().await == 1000
    })
    .await;
    let owned = handle.publisher();
    let stats = shutdown(handle).await;
    assert_eq!(stats.published, 1000);
    // The relay leaves its publisher open: its owner closes it.
    assert!(
        !publisher.is_closed(),
        "the relay closed a publisher it does not own"
    );
    owned.close().await.unwrap();
    assert!(publisher.is_closed(), "closed by its owner");

    let acked = publisher.acked();
    assert_eq!(acked.len(), 1000);
    let ids: Vec<Uuid> = acked.iter().map(|m| m.id).collect();
    assert_no_duplicates(&ids);
    // One relay: sent (and, with immediate acks, acknowledged) in seq order.
    let sent = publisher.sent();
    assert_eq!(sent.len(), 1000, "no retries on the happy path");
    assert!(
        sent.windows(2).all(|w| w[0].seq < w[1].seq),
        "not sent in seq order"
    );
    assert_eq!(
        ids,
        written.iter().map(|e| e.id()).collect::<Vec<_>>(),
        "delivered in commit/slice order"
    );
    let seq_by_id: HashMap<Uuid, i64> = db.rows().await.iter().map(|r| (r.id, r.seq)).collect();
    for (m, e) in acked.iter().zip(&written) {
        assert_eq!(m.id, e.id());
        assert_eq!(m.seq, seq_by_id[&m.id]);
        assert_eq!(m.aggregate_type, e.aggregate_type());
        assert_eq!(m.aggregate_id, e.aggregate_id());
        assert_eq!(m.event_type, e.event_type());
        assert_eq!(&m.headers, e.headers());
        let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(&body, e.payload(), "body is the payload JSON");
        assert_eq!(m.attempt, 1);
        let age = chrono::Utc::now() - m.created_at;
        assert!(age >= chrono::Duration::zero() && age < chrono::Duration::minutes(5));
        let headers: HashMap<_, _> = m.contract_headers().into_iter().collect();
        assert_eq!(headers["outbox-event-id"], m.id.to_string());
        assert_eq!(headers["outbox-event-type"], "order.created");
        assert_eq!(headers["outbox-aggregate-type"], "order");
        assert_eq!(headers["outbox-aggregate-id"], e.aggregate_id());
    }
    assert_eq!(db.locked().await, 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transactions_publish_nothing() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    let handle = Relay::new(db.pool_store(), publisher.boxed(), config("rollback")).spawn();

    let mut committed = HashSet::new();
    let mut rolled_back = HashSet::new();
    for round in 0..20 {
        let events: Vec<NewEvent> = (0..5).map(|i| event(round * 5 + i)).collect();
        let mut tx = db.pool.begin().await.unwrap();
        let ids = db.outbox().enqueue_many(&mut *tx, &events).await.unwrap();
        let single = db
            .outbox()
            .enqueue(&mut *tx, &event(1000 + round))
            .await
            .unwrap();
        match round % 3 {
            0 => {
                tx.commit().await.unwrap();
                committed.extend(ids);
                committed.insert(single);
            }
            1 => {
                tx.rollback().await.unwrap();
                rolled_back.extend(ids);
                rolled_back.insert(single);
            }
            _ => {
                // Business logic failed after the enqueue: the transaction is dropped.
                drop(tx);
                rolled_back.extend(ids);
                rolled_back.insert(single);
            }
        }
    }
    wait_until("every committed event published", || async {
        db.processed().await == committed.len() as i64
    })
    .await;
    let stats = shutdown(handle).await;
    let acked: HashSet<Uuid> = publisher.acked_ids().into_iter().collect();
    assert_eq!(acked, committed);
    assert!(acked.is_disjoint(&rolled_back));
    assert!(publisher
        .sent()
        .iter()
        .all(|m| !rolled_back.contains(&m.id)));
    assert_eq!(stats.published as usize, committed.len());
    assert_eq!(db.total().await as usize, committed.len());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_backs_off_without_dead_letters_then_drains() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    publisher.set_down(true);
    let cfg = config("outage");
    let backoff = cfg.backoff;
    let handle = Relay::new(db.pool_store(), publisher.boxed(), cfg).spawn();
    let ids = db
        .outbox()
        .enqueue_many(&db.pool, &(0..20).map(event).collect::<Vec<_>>())
        .await
        .unwrap();

    wait_until("every event failed twice", || async {
        db.count_where("attempts >= 2").await == 20
    })
    .await;
    let early = db.rows().await;
    // Well past max_attempts (3): an outage must not dead-letter anything.
    wait_until("every event failed 7 times", || async {
        db.count_where("attempts >= 7").await == 20
    })
    .await;
    let late = db.rows().await;
    assert_eq!(db.dead().await, 0, "an outage dead-lettered events");
    assert_eq!(db.processed().await, 0);
    assert_eq!(publisher.acked_count(), 0);
    for (a, b) in early.iter().zip(&late) {
        assert_eq!(a.id, b.id);
        assert!(b.attempts > a.attempts);
        assert!(
            b.available_at > a.available_at,
            "available_at did not advance"
        );
        assert!(b.dead_at.is_none());
        assert!(b
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("broker is down")));
    }
    // Backoff between attempts: at least half the un-jittered delay (equal jitter), and capped.
    for id in &ids {
        let times = publisher.send_times(*id);
        assert!(times.len() >= 7);
        for (k, w) in times.windows(2).enumerate().take(7) {
            let failures = k as u32 + 1;
            let gap = w[1] - w[0];
            let floor = backoff.ceiling(failures) / 2;
            assert!(
                gap + Duration::from_millis(10) >= floor,
                "retry {failures} of {id} after {gap:?}, backoff floor {floor:?}"
            );
            assert!(
                gap < Duration::from_millis(1200),
                "retry {failures} of {id} after {gap:?}: backoff not capped at {:?}",
                backoff.max
            );
        }
        let attempts: Vec<i32> = publisher
            .sent()
            .iter()
            .filter(|m| m.id == *id)
            .map(|m| m.attempt)
            .collect();
        assert_eq!(attempts, (1..=attempts.len() as i32).collect::<Vec<_>>());
    }

    publisher.set_down(false);
    wait_until("everything drains after the outage", || async {
        db.processed().await == 20
    })
    .await;
    shutdown(handle).await;
    let acked = publisher.acked_ids();
    assert_eq!(acked.len(), 20);
    assert_no_duplicates(&acked);
    assert_eq!(db.dead().await, 0);
    db.cleanup().await;
}

/// `max_attempts` counts transient failures (`RelayConfig::max_attempts`: "Failed attempts
/// (transient errors) before an event is dead-lettered"); an outage (`Unavailable`) "never
/// dead-letters an event by itself". So one transient failure after an outage must not bury
/// an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_transient_failure_after_an_outage_is_not_dead_lettered() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    publisher.set_down(true);
    let handle = Relay::new(db.pool_store(), publisher.boxed(), config("after-outage")).spawn();
    let id = db.outbox().enqueue(&db.pool, &event(1)).await.unwrap();
    wait_until("the outage outlasts max_attempts", || async {
        db.row(id).await.attempts >= 4
    })
    .await;
    // The broker comes back, and refuses the event once, transiently.
    publisher.fail_id_times(id, Fail::Transient, Some(1));
    publisher.set_down(false);
    wait_until("the event is published or dead", || async {
        db.pending().await == 0
    })
    .await;
    shutdown(handle).await;
    let row = db.row(id).await;
    assert!(
        row.dead_at.is_none() && row.processed_at.is_some(),
        "dead-lettered after a single transient failure (attempts {}, last error {:?})",
        row.attempts,
        row.last_error
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_events_are_dead_lettered_and_others_flow() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    let mut events: Vec<NewEvent> = (0..30).map(event).collect();
    events[10] = typed(10, "order.flaky");
    let permanent = events[5].id();
    let flaky = events[10].id();
    publisher.fail_id(permanent, Fail::Permanent);
    publisher.fail_type("order.flaky", Fail::Transient);
    let handle = Relay::new(db.pool_store(), publisher.boxed(), config("poison")).spawn();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap();

    wait_until("28 published and 2 dead", || async {
        db.processed().await == 28 && db.dead().await == 2
    })
    .await;
    let p = db.row(permanent).await;
    assert!(p.dead_at.is_some());
    assert_eq!(p.attempts, 1, "a permanent error dead-letters at once");
    assert!(p
        .last_error
        .as_deref()
        .unwrap()
        .contains("refused for good"));
    assert_eq!(publisher.send_times(permanent).len(), 1);
    let f = db.row(flaky).await;
    assert!(f.dead_at.is_some());
    assert_eq!(f.attempts, 3, "dead after max_attempts");
    assert!(f.last_error.as_deref().unwrap().contains("transient"));
    assert_eq!(publisher.send_times(flaky).len(), 3);
    let acked = publisher.acked_ids();
    assert_eq!(acked.len(), 28);
    assert_no_duplicates(&acked);
    assert!(!acked.contains(&permanent) && !acked.contains(&flaky));

    // The operator fixes the cause and retries the flaky one: it is delivered.
    publisher.clear_failures();
    publisher.fail_id(permanent, Fail::Permanent);
    let admin = db.pool_store();
    let n = admin
        .retry_dead(&EventFilter {
            event_type: Some("order.flaky".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    wait_until("the retried event is published", || async {
        db.processed().await == 29
    })
    .await;
    shutdown(handle).await;
    let acked = publisher.acked_ids();
    assert_eq!(acked.iter().filter(|&&i| i == flaky).count(), 1);
    assert_no_duplicates(&acked);
    let f = db.row(flaky).await;
    assert!(f.processed_at.is_some() && f.dead_at.is_none());
    let p = db.row(permanent).await;
    assert!(p.dead_at.is_some(), "the other dead letter was left alone");
    db.cleanup().await;
}

/// Two relays on one table: each event is delivered once, and both relays work. On
/// PostgreSQL both modes share the table by partition, so the events are written once the two
/// relays share the partitions (a relay that joins a backlog gets partitions only at its
/// owner's next heartbeats, by when a fast relay may have drained it all), over 100 aggregates
/// so that both halves of the partitions hold some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_share_a_table_without_double_delivery() {
    let db = PgHarness::new().await;
    let (pa, pb) = (RecordingPublisher::new(), RecordingPublisher::new());
    pa.set_ack_delay(Duration::from_millis(1));
    pb.set_ack_delay(Duration::from_millis(1));
    let relay = |id: &str| {
        let mut c = config(id);
        c.batch_size = 20;
        c.max_in_flight = 10;
        c.poll_interval = Duration::from_millis(100);
        c
    };
    let a = Relay::new(
        db.store(Retention::Mark).await,
        pa.boxed(),
        relay("relay-a"),
    )
    .spawn();
    let b = Relay::new(
        db.store(Retention::Mark).await,
        pb.boxed(),
        relay("relay-b"),
    )
    .spawn();
    wait_until("the two relays share the partitions", || async {
        let (ta, tb) = (
            db.count_partitions("owner = 'relay-a'").await,
            db.count_partitions("owner = 'relay-b'").await,
        );
        ta > 0 && tb > 0 && ta + tb == 64
    })
    .await;
    let events: Vec<NewEvent> = (0..1000)
        .map(|i| NewEvent::new("order", format!("o-{}", i % 100), "order.created", &i).unwrap())
        .collect();
    let ids = db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    wait_until("1000 events published", || async {
        db.processed().await == 1000
    })
    .await;
    let (sa, sb) = tokio::join!(shutdown(a), shutdown(b));

    let (ia, ib) = (pa.acked_ids(), pb.acked_ids());
    let mut all: Vec<Uuid> = ia.iter().chain(&ib).copied().collect();
    assert_no_duplicates(&all);
    all.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(all, want, "every event delivered");
    assert!(
        !ia.is_empty() && !ib.is_empty(),
        "both relays should have worked ({} / {})",
        ia.len(),
        ib.len()
    );
    assert_eq!(sa.published + sb.published, 1000);
    assert_eq!(db.processed().await, 1000);
    assert_eq!(db.locked().await, 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_when_drained_returns_once_everything_is_settled() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    let mut cfg = config("drain");
    cfg.exit_when_drained = true;
    cfg.max_attempts = 5;

    // Nothing to do: returns at once.
    let relay = Relay::new(db.pool_store(), publisher.boxed(), cfg.clone());
    let stats = tokio::time::timeout(DEADLINE, relay.run(CancellationToken::new()))
        .await
        .expect("did not return on an empty outbox")
        .unwrap();
    assert_eq!(stats.published, 0);

    let mut events: Vec<NewEvent> = (0..50).map(event).collect();
    events[7] = typed(7, "order.poison");
    let ids = db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    // One event backs off twice before it goes through; one is a dead letter.
    publisher.fail_id_times(ids[3], Fail::Transient, Some(2));
    publisher.fail_type("order.poison", Fail::Permanent);
    let relay = Relay::new(db.pool_store(), publisher.boxed(), cfg);
    let stats = tokio::time::timeout(DEADLINE, relay.run(CancellationToken::new()))
        .await
        .expect("exit_when_drained did not return")
        .unwrap();
    // It must not return while the backing-off event is unfinished.
    assert_eq!(db.processed().await, 49);
    assert_eq!(db.dead().await, 1);
    assert_eq!(db.pending().await, 0);
    assert_eq!(db.locked().await, 0);
    assert_eq!(db.row(ids[3]).await.attempts, 2);
    assert!(db.row(ids[3]).await.processed_at.is_some());
    assert_eq!(stats.published, 49);
    assert_eq!(stats.failed, 3);
    assert_eq!(stats.dead, 1);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_settles_in_flight_and_releases_the_rest() {
    let db = PgHarness::new().await;
    let total = 2000;
    db.outbox()
        .enqueue_many(&db.pool, &(0..total).map(event).collect::<Vec<_>>())
        .await
        .unwrap();
    let publisher = RecordingPublisher::new();
    publisher.set_ack_delay(Duration::from_millis(20));
    let mut cfg = config("graceful");
    cfg.batch_size = 50;
    cfg.max_in_flight = 10;
    let handle = Relay::new(db.pool_store(), publisher.boxed(), cfg).spawn();
    // (Unordered claims on PostgreSQL are held by partition and lease no row: what is in
    // flight does not show in the table.)
    wait_until("the backlog is draining", || async {
        publisher.acked_count() >= 100
    })
    .await;
    let stats = shutdown(handle).await;

    assert_eq!(db.locked().await, 0, "leases left behind");
    assert_eq!(db.waiter_count().await, 0, "still registered as a waiter");
    let processed = db.processed().await;
    let pending = db.pending().await;
    assert_eq!(processed + pending, total as i64, "events lost");
    assert!(pending > 0, "shutdown came too late to test anything");
    assert_eq!(db.dead().await, 0);
    assert_eq!(
        db.count_where("attempts > 0").await,
        0,
        "released events must not count an attempt"
    );
    // Every acknowledged message was settled as published, and nothing else was.
    let acked: HashSet<Uuid> = publisher.acked_ids().into_iter().collect();
    let published: HashSet<Uuid> = db
        .rows()
        .await
        .iter()
        .filter(|r| r.processed_at.is_some())
        .map(|r| r.id)
        .collect();
    assert_eq!(acked, published);
    assert_eq!(stats.published as i64, processed);
    assert!(
        !publisher.is_closed(),
        "the relay closed a publisher it does not own"
    );

    // What is left is delivered by the next relay.
    let next = RecordingPublisher::new();
    let mut cfg = config("graceful-2");
    cfg.exit_when_drained = true;
    join(Relay::new(db.pool_store(), next.boxed(), cfg).spawn()).await;
    assert_eq!(db.processed().await, total as i64);
    assert!(next.acked_ids().iter().all(|id| !acked.contains(id)));
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_is_woken_by_a_commit() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    let mut cfg = config("notify");
    cfg.poll_interval = Duration::from_secs(60);
    let handle = Relay::new(db.pool_store(), publisher.boxed(), cfg).spawn();

    for round in 1..=3usize {
        wait_until("the relay is idle and waiting", || async {
            db.waiter_count().await == 1
        })
        .await;
        let started = Instant::now();
        if round == 2 {
            // A business transaction with many events: one (folded) notification.
            let mut tx = db.pool.begin().await.unwrap();
            db.outbox()
                .enqueue_many(&mut *tx, &(0..100).map(event).collect::<Vec<_>>())
                .await
                .unwrap();
            tx.commit().await.unwrap();
        } else {
            db.outbox().enqueue(&db.pool, &event(round)).await.unwrap();
        }
        let want = if round == 1 {
            1
        } else if round == 2 {
            101
        } else {
            102
        };
        wait_until_for(
            "the new events are published",
            Duration::from_secs(5),
            || async { publisher.acked_count() == want },
        )
        .await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "round {round} took {took:?}");
        eprintln!("round {round}: delivered {took:?} after commit");
    }
    shutdown(handle).await;
    db.cleanup().await;
}

/// A writer whose transaction inserted its event before the relay went to sleep, and commits
/// after, must still wake the relay (the design: "notify only while a relay is actually
/// waiting (a flag ... read at commit time)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_commit_after_the_relay_fell_asleep_wakes_it() {
    let db = PgHarness::new().await;
    let publisher = RecordingPublisher::new();
    let mut cfg = config("late-commit");
    cfg.poll_interval = Duration::from_secs(60);

    let mut tx = db.pool.begin().await.unwrap();
    let id = db.outbox().enqueue(&mut *tx, &event(1)).await.unwrap();
    let handle = Relay::new(db.pool_store(), publisher.boxed(), cfg).spawn();
    wait_until("the relay is idle and waiting", || async {
        db.waiter_count().await == 1
    })
    .await;
    tx.commit().await.unwrap();
    let started = Instant::now();
    let deadline = Duration::from_secs(5);
    while publisher.acked_count() == 0 && started.elapsed() < deadline {
        tokio::time::sleep(POLL).await;
    }
    let delivered = publisher.was_acked(id);
    shutdown(handle).await;
    db.cleanup().await;
    assert!(
        delivered,
        "an event whose transaction began before the relay slept and committed after it was \
         not delivered within {deadline:?} (the relay sleeps until its 60 s poll)"
    );
}

#[tokio::test]
async fn inserts_notify_only_while_a_relay_waits() {
    let db = PgHarness::new().await;
    let channel = db.table.channel();
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen(&channel).await.unwrap();
    let quiet = Duration::from_millis(300);

    // Nobody waits: no notification.
    db.outbox().enqueue(&db.pool, &event(1)).await.unwrap();
    let got = tokio::time::timeout(quiet, listener.recv()).await;
    assert!(got.is_err(), "notified with no relay waiting: {got:?}");

    // A relay waits: one notification, on our channel.
    db.exec(&format!(
        "INSERT INTO {} (relay_id, waiting_until) VALUES ('test', now() + interval '1 minute')",
        db.table.derived("waiters")
    ))
    .await;
    db.outbox().enqueue(&db.pool, &event(2)).await.unwrap();
    let n = tokio::time::timeout(DEADLINE, listener.recv())
        .await
        .expect("no notification while a relay waits")
        .unwrap();
    assert_eq!(n.channel(), channel);

    // Many rows in one transaction fold into one notification.
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox()
        .enqueue_many(&mut *tx, &(0..50).map(event).collect::<Vec<_>>())
        .await
        .unwrap();
    db.outbox().enqueue(&mut *tx, &event(3)).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(DEADLINE, listener.recv())
        .await
        .expect("no notification for a batch")
        .unwrap();
    let again = tokio::time::timeout(quiet, listener.recv()).await;
    assert!(again.is_err(), "one transaction notified twice: {again:?}");

    // A waiter whose time has passed (a relay that died) does not count.
    db.exec(&format!(
        "UPDATE {} SET waiting_until = now() - interval '1 second'",
        db.table.derived("waiters")
    ))
    .await;
    db.outbox().enqueue(&db.pool, &event(4)).await.unwrap();
    let got = tokio::time::timeout(quiet, listener.recv()).await;
    assert!(got.is_err(), "notified for an expired waiter: {got:?}");
    drop(listener);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_acks_hang_gives_up_before_its_lease_ends() {
    let db = PgHarness::new().await;
    let ids = db
        .outbox()
        .enqueue_many(&db.pool, &(0..10).map(event).collect::<Vec<_>>())
        .await
        .unwrap();
    let lease = Duration::from_secs(2);
    let hanging = RecordingPublisher::new();
    hanging.set_ack_delay(Duration::from_secs(30));
    let mut cfg = config("relay-a");
    cfg.lease = lease;
    let relay_a = Arc::new(Relay::new(db.pool_store(), hanging.boxed(), cfg));
    let started = Instant::now();
    let a = {
        let relay_a = relay_a.clone();
        tokio::spawn(async move { relay_a.run_once(&CancellationToken::new()).await })
    };
    wait_until("relay A holds every event", || async {
        db.count_where("locked_by = 'relay-a'").await == 10
    })
    .await;
    let fast = RecordingPublisher::new();
    let b = Relay::new(db.pool_store(), fast.boxed(), config("relay-b")).spawn();

    let report = tokio::time::timeout(DEADLINE, a)
        .await
        .expect("relay A never gave up")
        .unwrap()
        .unwrap();
    let a_took = started.elapsed();
    assert!(
        a_took < lease,
        "relay A held on past its {lease:?} lease ({a_took:?})"
    );
    assert_eq!(report.claimed, 10);
    assert_eq!(report.published, 0);
    assert_eq!(report.failed, 0);
    assert_eq!(report.released, 10, "{report:?}");
    assert_eq!(report.fenced_off, 0);
    assert_eq!(hanging.acked_count(), 0);

    wait_until("relay B delivers everything", || async {
        db.processed().await == 10
    })
    .await;
    shutdown(b).await;
    let acked = fast.acked_ids();
    assert_no_duplicates(&acked);
    assert_eq!(acked.len(), 10);
    for r in db.rows().await {
        assert!(ids.contains(&r.id));
        assert_eq!(
            r.attempts, 0,
            "giving up on a hanging ack is not a failed attempt"
        );
        assert!(r.processed_at.is_some() && r.locked_by.is_none());
    }
    db.cleanup().await;
}

/// A store whose `settle` waits for the test to open a gate: a relay paused (GC, SIGSTOP,
/// network stall) between its broker's acks and its settle.
struct PausedStore {
    inner: PgStore,
    gate: Arc<tokio::sync::Semaphore>,
    settling: Arc<AtomicBool>,
    /// The whole relay is paused (SIGSTOP, a long GC pause): its heartbeat stops too, so its
    /// partitions run out while it waits.
    freeze_heartbeat: bool,
}

#[async_trait::async_trait]
impl Store for PausedStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<txoutbox::store::Claim, txoutbox::Error> {
        self.inner.claim(p).await
    }
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, txoutbox::Error> {
        self.settling.store(true, Ordering::SeqCst);
        let _permit = self.gate.acquire().await.unwrap();
        self.inner.settle(p).await
    }
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, txoutbox::Error> {
        self.inner.release(p).await
    }
    async fn has_unfinished(
        &self,
        ordering: txoutbox::store::Ordering,
    ) -> Result<bool, txoutbox::Error> {
        self.inner.has_unfinished(ordering).await
    }
    async fn rebalance(
        &self,
        p: txoutbox::store::RebalanceParams<'_>,
    ) -> Result<txoutbox::store::Membership, txoutbox::Error> {
        if self.freeze_heartbeat && self.settling.load(Ordering::SeqCst) {
            let _permit = self.gate.acquire().await.unwrap();
        }
        self.inner.rebalance(p).await
    }
    async fn wait_for_work(
        &self,
        p: txoutbox::store::WaitParams<'_>,
    ) -> Result<Wake, txoutbox::Error> {
        self.inner.wait_for_work(p).await
    }
    async fn deregister(
        &self,
        p: txoutbox::store::DeregisterParams<'_>,
    ) -> Result<u64, txoutbox::Error> {
        self.inner.deregister(p).await
    }
    async fn counts(&self) -> Result<Counts, txoutbox::Error> {
        self.inner.counts().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_relays_late_settle_is_fenced_off() {
    let db = PgHarness::new().await;
    let events: Vec<NewEvent> = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                event(i)
            } else {
                typed(i, "order.flaky")
            }
        })
        .collect();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    // Relay A: half its events are acked, half fail; then it pauses before settling.
    let pa = RecordingPublisher::new();
    pa.fail_type("order.flaky", Fail::Transient);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let settling = Arc::new(AtomicBool::new(false));
    let store_a = PausedStore {
        inner: db.pool_store(),
        gate: gate.clone(),
        settling: settling.clone(),
        freeze_heartbeat: false,
    };
    let mut cfg = config("relay-a");
    cfg.lease = Duration::from_secs(2);
    cfg.max_attempts = 10;
    let relay_a = Arc::new(Relay::new(store_a, pa.boxed(), cfg));
    let a = {
        let relay_a = relay_a.clone();
        tokio::spawn(async move { relay_a.run_once(&CancellationToken::new()).await })
    };
    wait_until("relay A is about to settle", || async {
        settling.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(pa.acked_count(), 5);

    // Relay B takes over once A's lease has run out, and delivers everything.
    let pb = RecordingPublisher::new();
    let b = Relay::new(db.pool_store(), pb.boxed(), config("relay-b")).spawn();
    wait_until("relay B delivers everything", || async {
        db.processed().await == 10
    })
    .await;
    shutdown(b).await;
    let settled_by_b: Vec<RowState> = db.rows().await.iter().map(RowState::without_now).collect();

    // A wakes up and settles: nothing it says may take effect.
    gate.add_permits(1);
    let report = tokio::time::timeout(DEADLINE, a)
        .await
        .expect("relay A did not finish")
        .unwrap()
        .unwrap();
    assert_eq!((report.published, report.failed), (5, 5));
    assert_eq!(report.fenced_off, 10, "{report:?}");
    let after: Vec<RowState> = db.rows().await.iter().map(RowState::without_now).collect();
    assert_eq!(
        after, settled_by_b,
        "a stale relay overwrote another relay's result"
    );
    for r in &after {
        assert!(r.processed_at.is_some());
        assert_eq!(r.attempts, 0);
        assert!(r.last_error.is_none());
    }
    assert_eq!(pb.acked_count(), 10);
    db.cleanup().await;
}

/// Ordered mode holds events by partition, not by row lease: a relay paused (heartbeat and
/// all) between its broker's acks and its settle loses its partitions to another relay, and
/// when it wakes up its settle is fenced off by partition ownership: nothing it says takes
/// effect, and the other relay's results stand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_ordered_relays_late_settle_is_fenced_off() {
    let db = PgHarness::new().await;
    let events: Vec<NewEvent> = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                typed(i, "order.created")
            } else {
                typed(i, "order.flaky")
            }
        })
        .collect();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    let ordered = |id: &str| {
        let mut c = config(id);
        c.ordering = txoutbox::store::Ordering::Ordered;
        c.partition_lease = Duration::from_secs(2);
        c.max_attempts = 10;
        c
    };
    let pa = RecordingPublisher::new();
    pa.fail_type("order.flaky", Fail::Transient);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let settling = Arc::new(AtomicBool::new(false));
    let store_a = PausedStore {
        inner: db.pool_store(),
        gate: gate.clone(),
        settling: settling.clone(),
        freeze_heartbeat: true,
    };
    let a = Relay::new(store_a, pa.boxed(), ordered("relay-a")).spawn();
    wait_until("relay A is about to settle", || async {
        settling.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(pa.acked_count(), 5);
    assert_eq!(
        db.processed().await,
        0,
        "an ordered claim wrote to the table"
    );

    // Relay B gets the partitions once A's lease on them has run out: it delivers the good
    // events and dead-letters the flaky ones (they fail for good at B).
    let pb = RecordingPublisher::new();
    pb.fail_type("order.flaky", Fail::Permanent);
    let b = Relay::new(db.pool_store(), pb.boxed(), ordered("relay-b")).spawn();
    wait_until("relay B settles everything", || async {
        db.processed().await == 5 && db.dead().await == 5
    })
    .await;
    let settled_by_b: Vec<RowState> = db.rows().await.iter().map(RowState::without_now).collect();

    // A wakes up and settles: 5 published, 5 failed (transient: "retry later"). Without the
    // partition fence the failures would bring B's dead letters back to life.
    gate.add_permits(1000);
    tokio::time::timeout(DEADLINE, a.shutdown())
        .await
        .expect("relay A did not stop")
        .unwrap();
    let after: Vec<RowState> = db.rows().await.iter().map(RowState::without_now).collect();
    assert_eq!(
        after, settled_by_b,
        "a stale relay overwrote another relay's result"
    );
    assert_eq!(db.dead().await, 5);
    assert_eq!(
        pa.acked_count(),
        5,
        "the stale relay sent again after waking"
    );
    assert_eq!(pb.acked_count(), 5);
    shutdown(b).await;
    db.cleanup().await;
}

/// Refuses everything, asking to come back later (as an HTTP 429 with Retry-After would).
struct SaysRetryAfter(Duration);

#[async_trait::async_trait]
impl txoutbox::publish::Publisher for SaysRetryAfter {
    fn kind(&self) -> &'static str {
        "retry-after"
    }
    async fn send(
        &self,
        m: &txoutbox::publish::Message,
    ) -> Result<txoutbox::publish::Ack, txoutbox::publish::PublishError> {
        Err(
            txoutbox::publish::PublishError::transient(format!("{} throttled", m.id))
                .with_retry_after(self.0),
        )
    }
}

#[tokio::test]
async fn a_brokers_retry_after_is_honoured() {
    let db = PgHarness::new().await;
    let id = db.outbox().enqueue(&db.pool, &event(1)).await.unwrap();
    let mut cfg = config("retry-after");
    cfg.backoff.max = Duration::from_secs(60);
    let relay = Relay::new(
        db.pool_store(),
        Box::new(SaysRetryAfter(Duration::from_secs(30))),
        cfg,
    );
    let report = relay
        .run_once(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.failed, 1);
    let row = db.row(id).await;
    let wait = row.available_at - row.db_now;
    assert!(
        wait > chrono::Duration::seconds(25),
        "retried after {wait:?}, not after the broker's 30 s"
    );
    db.cleanup().await;
}
