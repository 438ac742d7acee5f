//! Relay membership against the real PostgreSQL: settles fenced by ownership epoch,
//! registration serialised (modes, relay ids), conflicts found by a later heartbeat stop the
//! relay, and an idle relay beside work it cannot take stays idle.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::store::postgres::PgStore;
use txoutbox::store::{
    Claim, ClaimParams, Counts, DeregisterParams, Failure, Membership, Ordering, RebalanceParams,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::{Error, NewEvent};
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(10);

fn join<'a>(relay_id: &'a str, instance: Uuid, ordering: Ordering) -> RebalanceParams<'a> {
    RebalanceParams {
        relay_id,
        instance,
        ordering,
        lease: LEASE,
        may_release: true,
    }
}

fn ordered_claim(relay_id: &str, token: Uuid) -> ClaimParams<'_> {
    ClaimParams {
        relay_id,
        token,
        limit: 100,
        bytes: txoutbox::store::ClaimBytes::UNLIMITED,
        lease: Duration::from_secs(30),
        ordering: Ordering::Ordered,
        in_flight: &[],
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    }
}

fn config(relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.relay_id = relay_id.into();
    c.poll_interval = Duration::from_millis(200);
    c.partition_lease = Duration::from_secs(3);
    c.shutdown_timeout = Duration::from_secs(2);
    c
}

/// A relay `relay_id` on the harness's pool, publishing to a recording publisher.
fn relay(db: &PgHarness, relay_id: &str) -> Relay {
    Relay::new(
        db.pool_store(),
        RecordingPublisher::new().boxed(),
        config(relay_id),
    )
}

async fn enqueue(db: &PgHarness, aggregate: &str, n: usize) -> Vec<Uuid> {
    let outbox = db.outbox();
    let mut ids = Vec::new();
    for i in 0..n {
        let e = NewEvent::new("order", aggregate, "e", &serde_json::json!({ "i": i })).unwrap();
        ids.push(outbox.enqueue(&db.pool, &e).await.unwrap());
    }
    ids
}

/// Let `relay_id`'s partitions and liveness run out now, as if it had paused.
async fn expire(db: &PgHarness, relay_id: &str) {
    db.exec(&format!(
        "UPDATE {p} SET lease_until = now() - interval '1 second' WHERE owner = '{relay_id}';
         UPDATE {r} SET alive_until = now() - interval '1 second' WHERE relay_id = '{relay_id}';",
        p = db.table.derived("partitions"),
        r = db.table.derived("relays"),
    ))
    .await;
}

/// Relay A claims E; B takes the partitions over and dead-letters E; they come back to A.
/// Returns (A's store, A's claim, E). A's settle must now change nothing.
async fn round_trip(db: &PgHarness) -> (PgStore, Claim, Uuid) {
    let (a, b) = (db.pool_store(), db.pool_store());
    let (ia, ib) = (Uuid::new_v4(), Uuid::new_v4());
    let e = enqueue(db, "x", 1).await[0];
    a.rebalance(join("A", ia, Ordering::Ordered)).await.unwrap();
    let token_a = Uuid::new_v4();
    let claim_a = a.claim(ordered_claim("A", token_a)).await.unwrap();
    assert_eq!(claim_a.ids(), vec![e]);

    expire(db, "A").await;
    let m = b.rebalance(join("B", ib, Ordering::Ordered)).await.unwrap();
    assert_eq!(m.owned.len(), 64, "B took every partition over");
    let token_b = Uuid::new_v4();
    let claim_b = b.claim(ordered_claim("B", token_b)).await.unwrap();
    assert_eq!(claim_b.events.len(), 1);
    let dead = Failure {
        id: e,
        error: "refused for good".into(),
        retry_in: Duration::ZERO,
        dead: true,
        unavailable: false,
    };
    let out = b
        .settle(SettleParams {
            claim: &claim_b,
            published: &[],
            failed: &[dead],
        })
        .await
        .unwrap();
    assert_eq!(out.failed, 1);

    expire(db, "B").await;
    let m = a.rebalance(join("A", ia, Ordering::Ordered)).await.unwrap();
    assert_eq!(m.owned.len(), 64, "the partitions came back to A");
    (a, claim_a, e)
}

#[tokio::test]
async fn a_late_ordered_success_after_an_ownership_round_trip_changes_nothing() {
    let db = PgHarness::new().await;
    let (a, claim_a, e) = round_trip(&db).await;
    let out = a
        .settle(SettleParams {
            claim: &claim_a,
            published: &[e],
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(out, SettleOutcome::default(), "fenced off by the epoch");
    let row = db.row(e).await;
    assert!(row.dead_at.is_some(), "still a dead letter: {row:?}");
    assert!(row.processed_at.is_none(), "not marked published: {row:?}");
    db.cleanup().await;
}

#[tokio::test]
async fn a_late_ordered_failure_after_an_ownership_round_trip_does_not_revive_a_dead_letter() {
    let db = PgHarness::new().await;
    let (a, claim_a, e) = round_trip(&db).await;
    let retry = Failure {
        id: e,
        error: "timed out".into(),
        retry_in: Duration::from_millis(10),
        dead: false,
        unavailable: false,
    };
    let out = a
        .settle(SettleParams {
            claim: &claim_a,
            published: &[],
            failed: &[retry],
        })
        .await
        .unwrap();
    assert_eq!(out, SettleOutcome::default(), "fenced off by the epoch");
    let row = db.row(e).await;
    assert!(row.dead_at.is_some(), "the dead letter stays dead: {row:?}");
    assert_eq!(row.last_error.as_deref(), Some("refused for good"));
    db.cleanup().await;
}

#[tokio::test]
async fn a_settle_within_one_ownership_still_lands() {
    let db = PgHarness::new().await;
    let a = db.pool_store();
    let ia = Uuid::new_v4();
    let e = enqueue(&db, "x", 1).await[0];
    a.rebalance(join("A", ia, Ordering::Ordered)).await.unwrap();
    let token = Uuid::new_v4();
    let claim = a.claim(ordered_claim("A", token)).await.unwrap();
    // Heartbeats renew without a new epoch.
    a.rebalance(join("A", ia, Ordering::Ordered)).await.unwrap();
    a.rebalance(join("A", ia, Ordering::Ordered)).await.unwrap();
    let out = a
        .settle(SettleParams {
            claim: &claim,
            published: &[e],
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(out.published, 1);
    db.cleanup().await;
}

/// Ordered and unordered relays registering at the same moment: at most one may pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_of_both_modes_registering_at_once_never_both_pass() {
    let db = PgHarness::new().await;
    let (a, b) = (
        Arc::new(db.store(Retention::Mark).await),
        Arc::new(db.store(Retention::Mark).await),
    );
    for round in 0..40 {
        let (ro, ru) = (format!("o{round}"), format!("u{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (a2, b2, bar1, bar2) = (a.clone(), b.clone(), barrier.clone(), barrier.clone());
        let (ro2, ru2) = (ro.clone(), ru.clone());
        let t1 = tokio::spawn(async move {
            bar1.wait().await;
            a2.rebalance(join(&ro2, Uuid::new_v4(), Ordering::Ordered))
                .await
        });
        let t2 = tokio::spawn(async move {
            bar2.wait().await;
            b2.rebalance(join(&ru2, Uuid::new_v4(), Ordering::Unordered))
                .await
        });
        let (r1, r2) = (t1.await.unwrap(), t2.await.unwrap());
        assert!(
            r1.is_err() || r2.is_err(),
            "round {round}: an ordered and an unordered relay both registered on one table"
        );
        for r in [&r1, &r2] {
            if let Err(e) = r {
                assert!(matches!(e, Error::ModeConflict { .. }), "{e}");
            }
        }
        db.exec(&format!("DELETE FROM {}", db.table.derived("relays")))
            .await;
        db.exec(&format!(
            "UPDATE {} SET owner = NULL, lease_until = NULL",
            db.table.derived("partitions")
        ))
        .await;
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_mode_conflict_found_by_a_later_heartbeat_stops_the_relay() {
    let db = PgHarness::new().await;
    let relay = relay(&db, "ord").spawn();
    wait_until("the relay registered", || async {
        db.count_relays("relay_id = 'ord'").await == 1
    })
    .await;
    // An unordered relay slipped in (say this one was paused past its lease meanwhile).
    db.exec(&format!(
        "INSERT INTO {} (relay_id, mode, alive_until) VALUES ('intruder', 'unordered', now() + interval '1 hour')",
        db.table.derived("relays")
    ))
    .await;
    let result = tokio::time::timeout(DEADLINE, relay.join())
        .await
        .expect("the relay stops by itself");
    match result {
        Err(txoutbox::relay::RelayError::Store(Error::ModeConflict { other, .. })) => {
            assert_eq!(other, "intruder")
        }
        other => panic!("expected a mode conflict, got {other:?}"),
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_relay_id_held_by_a_live_process_is_refused_and_its_exit_strips_nobody() {
    let db = PgHarness::new().await;
    let first = relay(&db, "same").spawn();
    wait_until("the first relay owns partitions", || async {
        db.count_partitions("owner = 'same'").await == 64
    })
    .await;
    let second = relay(&db, "same");
    let result = tokio::time::timeout(DEADLINE, second.run(Default::default()))
        .await
        .expect("the second relay gives up at once");
    match result {
        Err(txoutbox::relay::RelayError::Store(e @ Error::RelayIdInUse { .. })) => {
            assert!(e.to_string().contains("--relay-id"), "{e}")
        }
        other => panic!("expected the relay id to be refused, got {other:?}"),
    }
    // The refused process (and a deregister by any other instance) leaves the holder alone.
    db.pool_store()
        .deregister(DeregisterParams {
            relay_id: "same",
            instance: Uuid::new_v4(),
        })
        .await
        .unwrap();
    assert_eq!(db.count_partitions("owner = 'same'").await, 64);
    assert_eq!(db.count_relays("relay_id = 'same'").await, 1);
    // The holder still relays.
    let e = enqueue(&db, "y", 1).await[0];
    wait_until("the first relay published", || async {
        db.row(e).await.processed_at.is_some()
    })
    .await;
    first.shutdown().await.unwrap();
    assert_eq!(
        db.count_relays("relay_id = 'same'").await,
        0,
        "its own exit deregisters"
    );
    db.cleanup().await;
}

/// Counts the relay's calls into a real store.
struct Counting {
    inner: PgStore,
    claims: Arc<AtomicU64>,
    waits: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        self.claims.fetch_add(1, AtomicOrdering::SeqCst);
        self.inner.claim(p).await
    }
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        self.inner.settle(p).await
    }
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        self.inner.release(p).await
    }
    async fn has_unfinished(&self, o: Ordering) -> Result<bool, Error> {
        self.inner.has_unfinished(o).await
    }
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        self.inner.rebalance(p).await
    }
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        self.waits.fetch_add(1, AtomicOrdering::SeqCst);
        self.inner.wait_for_work(p).await
    }
    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        self.inner.deregister(p).await
    }
    async fn counts(&self) -> Result<Counts, Error> {
        self.inner.counts().await
    }
}

/// Runs `relay_id` with `ordering` on a counting store for `window` once it has settled in,
/// and returns (claims, waits) in that window.
async fn calls_while_idle(
    db: &PgHarness,
    cfg: RelayConfig,
    ready: impl Fn() -> futures::future::BoxFuture<'static, bool>,
    window: Duration,
) -> (u64, u64) {
    let (claims, waits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let store = Counting {
        inner: db.pool_store(),
        claims: claims.clone(),
        waits: waits.clone(),
    };
    let relay = Relay::new(store, RecordingPublisher::new().boxed(), cfg).spawn();
    wait_until("the relay settled in", ready).await;
    let (c0, w0) = (
        claims.load(AtomicOrdering::SeqCst),
        waits.load(AtomicOrdering::SeqCst),
    );
    tokio::time::sleep(window).await;
    let (c1, w1) = (
        claims.load(AtomicOrdering::SeqCst),
        waits.load(AtomicOrdering::SeqCst),
    );
    relay.shutdown().await.unwrap();
    (c1 - c0, w1 - w0)
}

#[tokio::test]
async fn an_idle_ordered_relay_beside_a_backlog_in_another_relays_partitions_stays_idle() {
    let db = PgHarness::new().await;
    // "busy" owns the partitions of a backlog it is slow to drain (here: not running at all).
    db.pool_store()
        .rebalance(RebalanceParams {
            lease: Duration::from_secs(3600),
            ..join("busy", Uuid::new_v4(), Ordering::Ordered)
        })
        .await
        .unwrap();
    for agg in ["a", "b", "c"] {
        enqueue(&db, agg, 100).await;
    }
    // It keeps only the partitions its backlog is in; the idle relay gets others.
    db.exec(&format!(
        "UPDATE {p} SET owner = NULL, lease_until = NULL
         WHERE partition NOT IN (SELECT DISTINCT partition_key % 64 FROM {q})",
        p = db.table.derived("partitions"),
        q = db.table.qualified(),
    ))
    .await;
    let cfg = config("idle");
    let poll = cfg.poll_interval;
    let window = Duration::from_secs(2);
    let (claims, waits) = calls_while_idle(
        &db,
        cfg,
        || {
            let pool = db.pool.clone();
            let p = db.table.derived("partitions");
            Box::pin(async move {
                let n: i64 =
                    sqlx::query_scalar(&format!("SELECT count(*) FROM {p} WHERE owner = 'idle'"))
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                n > 0
            })
        },
        window,
    )
    .await;
    // One claim and one wait per poll interval, and a few for heartbeats that took partitions.
    let bound = (window.as_millis() / poll.as_millis()) as u64 + 5;
    assert!(
        claims <= bound && waits <= bound,
        "an idle relay made {claims} claims and {waits} waits in {window:?} (poll {poll:?}, at most {bound} each)"
    );
    assert_eq!(db.processed().await, 0, "nothing of busy's was taken");
    db.cleanup().await;
}

#[tokio::test]
async fn an_idle_relay_does_not_wake_for_events_held_behind_a_dead_letter() {
    let db = PgHarness::new().await;
    let ids = enqueue(&db, "held", 20).await;
    db.exec(&format!(
        "UPDATE {} SET dead_at = now(), last_error = 'poison' WHERE id = '{}'",
        db.table.qualified(),
        ids[0]
    ))
    .await;
    let mut cfg = config("hold");
    cfg.ordering = Ordering::OrderedHold;
    let poll = cfg.poll_interval;
    let window = Duration::from_secs(2);
    let (claims, waits) = calls_while_idle(
        &db,
        cfg,
        || {
            let pool = db.pool.clone();
            let p = db.table.derived("partitions");
            Box::pin(async move {
                let n: i64 =
                    sqlx::query_scalar(&format!("SELECT count(*) FROM {p} WHERE owner = 'hold'"))
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                n == 64
            })
        },
        window,
    )
    .await;
    let bound = (window.as_millis() / poll.as_millis()) as u64 + 5;
    assert!(
        claims <= bound && waits <= bound,
        "a relay with only held events made {claims} claims and {waits} waits in {window:?} (at most {bound} each)"
    );
    assert_eq!(db.processed().await, 0, "the held events stay held");
    db.cleanup().await;
}

/// An aggregate id of type "order" whose partition `relay_id` owns now.
async fn aggregate_owned_by(db: &PgHarness, relay_id: &str) -> String {
    let sql = format!(
        "SELECT a FROM generate_series(1, 10000) g, LATERAL (SELECT 'own' || g AS a) x
         WHERE ((('x' || left(md5('order/' || a), 8))::bit(32)::int & 2147483647) % 64)
               IN (SELECT partition FROM {} WHERE owner = $1)
         LIMIT 1",
        db.table.derived("partitions")
    );
    sqlx::query_scalar(&sql)
        .bind(relay_id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn commits_to_another_relays_partitions_neither_notify_nor_wake_an_idle_relay() {
    let db = PgHarness::new().await;
    // "busy" owns the partitions of aggregate "a" (and keeps them: it never runs here).
    db.pool_store()
        .rebalance(RebalanceParams {
            lease: Duration::from_secs(3600),
            ..join("busy", Uuid::new_v4(), Ordering::Ordered)
        })
        .await
        .unwrap();
    enqueue(&db, "a", 1).await;
    db.exec(&format!(
        "UPDATE {p} SET owner = NULL, lease_until = NULL
         WHERE partition NOT IN (SELECT DISTINCT partition_key % 64 FROM {q})",
        p = db.table.derived("partitions"),
        q = db.table.qualified(),
    ))
    .await;
    // The poll is long: only a wake-up can deliver quickly.
    let mut cfg = config("idle");
    cfg.poll_interval = Duration::from_secs(30);
    let (claims, waits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let store = Counting {
        inner: db.pool_store(),
        claims: claims.clone(),
        waits: waits.clone(),
    };
    let publisher = RecordingPublisher::new();
    let relay = Relay::new(store, publisher.boxed(), cfg).spawn();
    wait_until("idle took the free partitions and waits", || async {
        db.count_partitions("owner = 'idle'").await == 32 && db.waiter_count().await == 1
    })
    .await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen(&db.table.channel()).await.unwrap();
    let (c0, w0) = (
        claims.load(AtomicOrdering::SeqCst),
        waits.load(AtomicOrdering::SeqCst),
    );
    // 100 commits, one event each, all in busy's partition.
    enqueue(&db, "a", 100).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (c1, w1) = (
        claims.load(AtomicOrdering::SeqCst),
        waits.load(AtomicOrdering::SeqCst),
    );
    let mut notified = 0;
    while let Ok(n) = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await {
        n.unwrap();
        notified += 1;
        if notified > 100 {
            break;
        }
    }
    assert_eq!(notified, 0, "commits to busy's partition notified");
    assert!(
        c1 - c0 <= 2 && w1 - w0 <= 2,
        "100 commits to another relay's partition woke the idle relay: {} claims, {} waits",
        c1 - c0,
        w1 - w0
    );
    // A commit to one of its own partitions still wakes it at once (the poll is 30 s).
    let mine = aggregate_owned_by(&db, "idle").await;
    let e = NewEvent::new("order", &mine, "e", &serde_json::json!({})).unwrap();
    let id = db.outbox().enqueue(&db.pool, &e).await.unwrap();
    wait_until_for(
        "the idle relay was woken for its own partition",
        Duration::from_secs(5),
        || async {
            db.count_where(&format!("id = '{id}' AND processed_at IS NOT NULL"))
                .await
                == 1
        },
    )
    .await;
    relay.shutdown().await.unwrap();
    assert_eq!(db.count_where("processed_at IS NOT NULL").await, 1);
    db.cleanup().await;
}

/// The table source's half of the WAL table path's test
/// (`wal_pg::an_ordered_claim_never_takes_later_events_past_an_earlier_row_it_skipped`): an
/// earlier event's row held by another statement (the outage watch's `retry_now`, not yet
/// committed) is not passed over by the ordered claim, which reads and locks no row: the
/// aggregate's events come together, in order, never the later one alone.
#[tokio::test]
async fn an_ordered_claim_takes_an_earlier_event_whose_row_another_statement_holds() {
    use sqlx::Connection;
    let db = PgHarness::new().await;
    let a = db.pool_store();
    let ids = enqueue(&db, "x", 2).await;
    let t = db.table.qualified();
    // The first failed once and its backoff has run out; the second was never attempted.
    db.exec(&format!(
        "UPDATE {t} SET attempts = 1, attempts_unavailable = 1, \
         available_at = now() - interval '1 second' WHERE id = '{}'",
        ids[0]
    ))
    .await;
    a.rebalance(join("A", Uuid::new_v4(), Ordering::Ordered))
        .await
        .unwrap();
    let url = txoutbox::testing::postgres::database_url();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {t} SET available_at = now() WHERE id = $1"
    ))
    .bind(ids[0])
    .execute(&mut *tx)
    .await
    .unwrap();
    let c = a.claim(ordered_claim("A", Uuid::new_v4())).await.unwrap();
    assert_eq!(c.ids(), ids, "x's events together, in order");
    tx.commit().await.unwrap();
    db.cleanup().await;
}
