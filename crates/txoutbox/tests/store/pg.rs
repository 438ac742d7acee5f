//! The PostgreSQL store, migrations, write path and inbox against a real server
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`). Each test works in a
//! schema of its own and drops it at the end.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use sqlx::{Connection, Row};
use txoutbox::store::{ClaimParams, EventFilter, Operator, SettleParams, Store};
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::store::bury;
use txoutbox::testing::Harness;
use txoutbox::{check_schema, migrate, Error, Inbox, NewEvent, OutboxTable};
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        format!("o-{}", i % 7),
        "order.created",
        &serde_json::json!({ "i": i }),
    )
    .unwrap()
}

fn claim(relay_id: &str, token: Uuid, limit: usize, lease: Duration) -> ClaimParams<'_> {
    ClaimParams {
        relay_id,
        token,
        limit,
        bytes: txoutbox::store::ClaimBytes::UNLIMITED,
        lease,
        ordering: txoutbox::store::Ordering::Unordered,
        in_flight: &[],
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    }
}

async fn enqueue_n(db: &PgHarness, n: usize) -> Vec<Uuid> {
    let events: Vec<NewEvent> = (0..n).map(event).collect();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap()
}

#[tokio::test]
async fn migrations_are_idempotent_and_safe_to_run_concurrently() {
    let db = PgHarness::new().await;
    // Second run on a migrated schema: nothing to do.
    let again = migrate(&db.pool, &db.table).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.version, txoutbox::SCHEMA_VERSION);
    check_schema(&db.pool, &db.table).await.unwrap();
    db.pool_store().check_schema().await.unwrap();

    // Two migrators racing on a fresh schema: both succeed, exactly one applies version 1.
    let fresh = PgHarness::unmigrated().await;
    // (Joined on one task: `migrate`'s future is not `Send` enough for `tokio::spawn`.)
    let (a, b) = tokio::join!(
        migrate(&fresh.pool, &fresh.table),
        migrate(&fresh.pool, &fresh.table)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut applied = [a.applied.clone(), b.applied.clone()];
    applied.sort();
    assert_eq!(
        applied,
        [vec![], (1..=txoutbox::SCHEMA_VERSION).collect::<Vec<_>>()],
        "{a:?} {b:?}"
    );
    check_schema(&fresh.pool, &fresh.table).await.unwrap();
    let versions: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".txoutbox_migrations",
        fresh.schema
    ))
    .fetch_one(&fresh.pool)
    .await
    .unwrap();
    assert_eq!(
        versions,
        i64::from(txoutbox::SCHEMA_VERSION),
        "each version recorded once"
    );
    // And the migrated table works.
    let id = fresh
        .outbox()
        .enqueue(&fresh.pool, &event(1))
        .await
        .unwrap();
    let got = fresh
        .pool_store()
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![id]);
    fresh.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn the_seeds_literal_insert_works_unchanged() {
    let db = PgHarness::new().await;
    const SEED: &str =
        "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) \
                        VALUES ('order', '1', 'order.created', '{\"a\":1}')";
    // Schema-qualified, as a service with its own schema would write it...
    let qualified = SEED.replacen(
        "INSERT INTO outbox_events",
        &format!("INSERT INTO {}.outbox_events", db.schema),
        1,
    );
    sqlx::raw_sql(&qualified).execute(&db.pool).await.unwrap();
    // ...and byte for byte, with the schema on the search path.
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::raw_sql(&format!("SET search_path TO {}", db.schema))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql(SEED).execute(&mut *conn).await.unwrap();
    sqlx::raw_sql("RESET search_path")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    let got = db
        .pool_store()
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(got.len(), 2);
    for e in &got {
        assert_eq!(e.aggregate_type, "order");
        assert_eq!(e.aggregate_id, "1");
        assert_eq!(e.event_type, "order.created");
        assert_eq!(e.payload, serde_json::json!({"a": 1}));
        assert!(e.headers.is_empty());
        assert_eq!(e.attempts, 0);
        assert!(!e.id.is_nil());
    }
    assert!(got[0].seq < got[1].seq);
    db.cleanup().await;
}

#[tokio::test]
async fn bad_names_are_refused_and_a_missing_table_says_run_migrate() {
    let e = OutboxTable::new("public", "outbox; DROP TABLE x").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("table"), "{text}");
    assert!(text.contains("outbox; DROP TABLE x"), "{text}");
    assert!(OutboxTable::new("pub\"lic", "outbox_events").is_err());

    let db = PgHarness::unmigrated().await;
    let assert_not_migrated = |e: Error| {
        let text = e.to_string();
        assert!(matches!(e, Error::NotMigrated { .. }), "{e:?}");
        assert!(text.contains("txoutbox migrate"), "{text}");
        assert!(text.contains(&db.table.display()), "{text}");
    };
    // The schema does not exist at all.
    assert_not_migrated(check_schema(&db.pool, &db.table).await.unwrap_err());
    // The schema exists, the table does not.
    db.exec(&format!("CREATE SCHEMA \"{}\"", db.schema)).await;
    assert_not_migrated(check_schema(&db.pool, &db.table).await.unwrap_err());
    assert_not_migrated(db.pool_store().check_schema().await.unwrap_err());
    // Using the store or the outbox on it says the same.
    assert_not_migrated(
        db.pool_store()
            .claim(claim("r", Uuid::new_v4(), 1, LEASE))
            .await
            .unwrap_err(),
    );
    assert_not_migrated(db.outbox().enqueue(&db.pool, &event(0)).await.unwrap_err());
    // Another table of the same schema is migrated: still not this one.
    let other = OutboxTable::new(&db.schema, "other_events").unwrap();
    migrate(&db.pool, &other).await.unwrap();
    assert_not_migrated(check_schema(&db.pool, &db.table).await.unwrap_err());
    check_schema(&db.pool, &other).await.unwrap();
    db.cleanup().await;
}

/// The seed's `outbox_dead_letters` view follows dead-lettering, retry and discard (the
/// operator calls themselves are in the conformance suite).
#[tokio::test]
async fn the_dead_letters_view_follows_the_dead_letters() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    let ids = enqueue_n(&db, 3).await;
    bury(&db, &store, &ids[..2]).await; // ids[2] stays pending
    let view = format!("\"{}\".outbox_dead_letters", db.schema);
    let in_view = || async {
        sqlx::query(&format!("SELECT id FROM {view} ORDER BY seq"))
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get("id"))
            .collect::<Vec<Uuid>>()
    };
    assert_eq!(in_view().await, ids[..2]);
    let one = |id| EventFilter {
        id: Some(id),
        ..Default::default()
    };
    assert_eq!(store.retry_dead(&one(ids[0])).await.unwrap(), 1);
    assert_eq!(in_view().await, ids[1..2]);
    assert_eq!(store.discard_dead(&one(ids[1])).await.unwrap(), 1);
    assert!(in_view().await.is_empty());
    assert_eq!(db.total().await, 2);
    db.cleanup().await;
}

#[tokio::test]
async fn inbox_marks_each_event_once_even_concurrently() {
    let db = PgHarness::new().await;
    let inbox = Inbox::new(db.table.clone());
    let id = Uuid::now_v7();
    assert!(inbox.mark_processed(&db.pool, id).await.unwrap());
    assert!(!inbox.mark_processed(&db.pool, id).await.unwrap());

    // Two consumers with the same id at once: the second waits on the first and sees false.
    let id = Uuid::now_v7();
    let mut tx1 = db.pool.begin().await.unwrap();
    assert!(inbox.mark_processed(&mut *tx1, id).await.unwrap());
    let second = {
        let (pool, inbox) = (db.pool.clone(), inbox.clone());
        tokio::spawn(async move {
            let mut tx2 = pool.begin().await.unwrap();
            let first_time = inbox.mark_processed(&mut *tx2, id).await.unwrap();
            tx2.commit().await.unwrap();
            first_time
        })
    };
    // The second consumer is blocked on the first one's row lock until it commits.
    wait_until("the second consumer waits on the first", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() \
             AND query LIKE '%processed_events%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        waiting >= 1
    })
    .await;
    tx1.commit().await.unwrap();
    assert!(!second.await.unwrap(), "both consumers saw `true`");

    // If the first consumer rolls back, the second one is the first after all.
    let id = Uuid::now_v7();
    let mut tx1 = db.pool.begin().await.unwrap();
    assert!(inbox.mark_processed(&mut *tx1, id).await.unwrap());
    let second = {
        let (pool, inbox) = (db.pool.clone(), inbox.clone());
        tokio::spawn(async move {
            let mut tx2 = pool.begin().await.unwrap();
            let first_time = inbox.mark_processed(&mut *tx2, id).await.unwrap();
            tx2.commit().await.unwrap();
            first_time
        })
    };
    tx1.rollback().await.unwrap();
    assert!(second.await.unwrap(), "nobody processed the event");

    // Many concurrent consumers of one id: exactly one `true`.
    let id = Uuid::now_v7();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (pool, inbox) = (db.pool.clone(), inbox.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let t = inbox.mark_processed(&mut *tx, id).await.unwrap();
                tx.commit().await.unwrap();
                t
            })
        })
        .collect();
    let mut trues = 0;
    for t in tasks {
        trues += usize::from(t.await.unwrap());
    }
    assert_eq!(trues, 1);

    // An inbox in a consumer's own database: create_table is idempotent.
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    inbox.create_table(&mut conn).await.unwrap();
    inbox.create_table(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    db.cleanup().await;
}

/// Unordered claims skip the already-drained front of the pending index while they come back
/// full; an event committed late with a lower `seq` (and one released behind the cursor) must
/// still be found once a claim comes back short.
#[tokio::test]
async fn unordered_claims_past_the_cursor_still_find_late_commits_and_releases() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    // A transaction takes its seq first and commits last.
    let mut late = db.pool.begin().await.unwrap();
    let late_id = db.outbox().enqueue(&mut *late, &event(0)).await.unwrap();
    enqueue_n(&db, 50).await;
    let mut claimed = Vec::new();
    let first = store
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(first.len(), 10);
    claimed.extend(first.iter().map(|e| e.id));
    // Give back one of them: it is now behind the cursor too.
    let released = first[3].id;
    let token = Uuid::new_v4();
    let again = store
        .claim(claim("r", token, 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(again.len(), 10, "a full claim past the cursor");
    sqlx::query(&format!(
        "UPDATE {} SET locked_until = NULL, locked_by = NULL, lock_token = NULL WHERE id = $1",
        db.table.qualified()
    ))
    .bind(released)
    .execute(&db.pool)
    .await
    .unwrap();
    claimed.extend(again.iter().map(|e| e.id));
    late.commit().await.unwrap();
    // Keep claiming until nothing is left: the late event and the released one must come.
    loop {
        let batch = store
            .claim(claim("r", Uuid::new_v4(), 10, LEASE))
            .await
            .unwrap()
            .events;
        if batch.is_empty() {
            break;
        }
        claimed.extend(batch.iter().map(|e| e.id));
    }
    assert!(claimed.contains(&late_id), "the late commit was claimed");
    assert_eq!(
        claimed.iter().filter(|id| **id == released).count(),
        2,
        "the released event was claimed again"
    );
    assert_eq!(claimed.len(), 52, "51 events, one of them twice");
    assert_eq!(db.count_where("locked_until IS NULL").await, 0);
    db.cleanup().await;
}

/// The relay's statements run with JIT off (it cost the server as much CPU as the claim
/// itself), unless the URL's own `options` set `jit`.
#[tokio::test]
async fn relay_connect_options_turn_jit_off_unless_the_url_sets_it() {
    use sqlx::postgres::{PgConnectOptions, PgConnection};
    use std::str::FromStr;
    use txoutbox::store::postgres::relay_connect_options;

    async fn jit(url: &str) -> String {
        let opts = relay_connect_options(PgConnectOptions::from_str(url).unwrap());
        let mut conn = PgConnection::connect_with(&opts).await.unwrap();
        let jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        jit
    }
    let url = database_url();
    assert_eq!(jit(&url).await, "off");
    let sep = if url.contains('?') { '&' } else { '?' };
    assert_eq!(jit(&format!("{url}{sep}options=-c%20jit%3Don")).await, "on");
    // Another setting whose value merely contains "jit" does not count.
    assert_eq!(
        jit(&format!("{url}{sep}options=-c%20application_name%3Djitter")).await,
        "off"
    );
}

/// One event of each of these aggregates, in this order; their ids.
async fn enqueue_of(db: &PgHarness, aggregates: &[&str]) -> Vec<Uuid> {
    let outbox = txoutbox::Outbox::new(db.table.clone());
    let mut ids = Vec::new();
    for (i, agg) in aggregates.iter().enumerate() {
        let e = NewEvent::new("order", *agg, "e", &serde_json::json!({ "i": i })).unwrap();
        ids.push(outbox.enqueue(&db.pool, &e).await.unwrap());
    }
    ids
}

/// `relay_id` takes its share of the partitions as an ordered relay (all of them, alone).
async fn join_ordered(store: &impl Store, relay_id: &str) {
    store
        .rebalance(txoutbox::store::RebalanceParams {
            relay_id,
            instance: uuid::Uuid::nil(),
            ordering: txoutbox::store::Ordering::Ordered,
            lease: LEASE,
            may_release: true,
        })
        .await
        .unwrap();
}

/// An ordered claim of up to `limit` events by `relay_id`, with these claims in flight.
fn ordered_claim<'a>(
    relay_id: &'a str,
    limit: usize,
    in_flight: &'a [Arc<txoutbox::store::Claim>],
) -> ClaimParams<'a> {
    ClaimParams {
        relay_id,
        token: Uuid::new_v4(),
        limit,
        bytes: txoutbox::store::ClaimBytes::UNLIMITED,
        lease: LEASE,
        ordering: txoutbox::store::Ordering::Ordered,
        in_flight,
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    }
}

/// Once the broker acknowledged some events of an ordered claim in flight, the claim that
/// stands for it while it settles (`Claim::acknowledged`) frees those events' aggregates: the
/// next claim takes their next events, skips the acknowledged events themselves (not settled
/// yet), and still holds back the aggregate of an event that was not acknowledged.
#[tokio::test]
async fn an_acknowledged_event_frees_its_aggregate_before_its_settle() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    // a1 b1 a2 b2
    let ids = enqueue_of(&db, &["a", "b", "a", "b"]).await;
    join_ordered(&store, "r").await;
    let ordered = |limit, in_flight| ordered_claim("r", limit, in_flight);
    let first = Arc::new(store.claim(ordered(2, &[])).await.unwrap());
    assert_eq!(first.ids(), ids[..2]);
    // Publishing: both aggregates are held.
    let publishing = [first.clone()];
    let held = store.claim(ordered(10, &publishing)).await.unwrap();
    assert!(held.events.is_empty(), "{:?}", held.ids());
    // a1 acknowledged, b1 not (it failed): a2 may go, b2 not, and a1 is not claimed again.
    let settling = Arc::new(
        first
            .acknowledged(&[true, false])
            .expect("an ordered claim"),
    );
    let acked = [settling.clone()];
    let next = store.claim(ordered(10, &acked)).await.unwrap();
    assert_eq!(next.ids(), vec![ids[2]]);
    // Acknowledged in turn, a2's claim stands for itself too: nothing of a or b goes.
    let next = Arc::new(next);
    let both = [
        settling,
        Arc::new(next.acknowledged(&[true]).expect("an ordered claim")),
    ];
    let none = store.claim(ordered(10, &both)).await.unwrap();
    assert!(none.events.is_empty(), "{:?}", none.ids());
    // Settled out of order (a2's first), a1 published, b1 given back (its claim's settle
    // names it neither way): b's events come next, in order, and nothing is lost.
    for (claim, published) in [(&next, &ids[2..3]), (&first, &ids[..1])] {
        store
            .settle(SettleParams {
                claim,
                published,
                failed: &[],
            })
            .await
            .unwrap();
    }
    let rest = store.claim(ordered(10, &[])).await.unwrap();
    assert_eq!(rest.ids(), vec![ids[1], ids[3]]);
}

/// While an ordered claim is in flight, the next claim skips its aggregates and reads only a
/// few batches past it: with every aggregate of that stretch in flight it finds nothing (and
/// does not read the whole backlog to find so). Once the batch is settled, all is claimable
/// again, in order.
#[tokio::test]
async fn an_ordered_claim_ahead_skips_busy_aggregates_within_a_window() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    // 20 events of aggregate a, then one of b.
    let mut aggregates = vec!["a"; 20];
    aggregates.push("b");
    let ids = enqueue_of(&db, &aggregates).await;
    join_ordered(&store, "r").await;
    let ordered = |limit, in_flight| ordered_claim("r", limit, in_flight);
    let first = Arc::new(store.claim(ordered(2, &[])).await.unwrap());
    assert_eq!(first.ids(), ids[..2]);

    // a is in flight; b's event lies past the window (4 batches of 2 after the last in
    // flight), so the claim ahead finds nothing.
    let in_flight = [first.clone()];
    let ahead = store.claim(ordered(2, &in_flight)).await.unwrap().events;
    assert!(
        ahead.is_empty(),
        "{:?}",
        ahead.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    // A big enough batch reaches b, and only b.
    let wide = store.claim(ordered(10, &in_flight)).await.unwrap();
    assert_eq!(wide.ids(), ids[20..]);
    store
        .settle(SettleParams {
            claim: &wide,
            published: &ids[20..],
            failed: &[],
        })
        .await
        .unwrap();

    // a's first batch settled: a goes on from its third event.
    store
        .settle(SettleParams {
            claim: &first,
            published: &ids[..2],
            failed: &[],
        })
        .await
        .unwrap();
    let next = store.claim(ordered(100, &[])).await.unwrap();
    assert_eq!(next.ids(), ids[2..20]);
    // Deregistering gives the partitions back at once (an ordered claim leases no rows), so
    // another relay takes the claim's 18 events over without waiting for a lease.
    assert_eq!(
        store
            .deregister(txoutbox::store::DeregisterParams {
                relay_id: "r",
                instance: uuid::Uuid::nil()
            })
            .await
            .unwrap(),
        0
    );
    join_ordered(&store, "r2").await;
    let taken = store.claim(ordered_claim("r2", 100, &[])).await.unwrap();
    assert_eq!(taken.ids(), ids[2..20]);
    db.cleanup().await;
}

/// The retention purge walks the published rows by seq (migration 7 dropped the index on
/// `processed_at`): old rows go lowest seq first in batches, dead letters and unfinished rows
/// stay, a backlog published late is stepped over until it ages, and the walk stops at the
/// first row created after the cutoff.
#[tokio::test]
async fn purge_takes_old_published_rows_by_seq_and_steps_over_a_late_backlog() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    let t = db.table.qualified();
    let insert = |kind: &str, n: usize, created: &str, processed: &str, dead: &str| {
        format!(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, created_at, processed_at, dead_at)
             SELECT 'order', g::text, '{kind}', '{{}}', {created}, {processed}, {dead}
             FROM generate_series(1, {n}) g;"
        )
    };
    let days = |d: u32| format!("now() - interval '{d} days'");
    // In seq order: a backlog published an hour ago, though written three days ago (late);
    // old rows; a dead letter and an unfinished row, both old; rows written and published
    // now (young); and one more old row, written by a transaction open all that time.
    db.exec(
        &[
            insert("late", 30, &days(3), "now() - interval '1 hour'", "NULL"),
            insert("old", 50, &days(3), &days(2), "NULL"),
            insert("dead", 1, &days(3), "NULL", &days(2)),
            insert("unfinished", 1, &days(3), "NULL", "NULL"),
            insert("young", 10, "now()", "now()", "NULL"),
            insert("straggler", 1, &days(3), &days(2), "NULL"),
        ]
        .concat(),
    )
    .await;
    let keep = Duration::from_secs(24 * 3600);
    let kinds = || async {
        sqlx::query_scalar::<_, String>(&format!(
            "SELECT event_type || ':' || count(*) FROM {t} GROUP BY event_type ORDER BY event_type"
        ))
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };

    // Batches of 20, the walk counting only old and young rows: 20, 20, then 10 old before
    // the first young row (a short batch: the retention task's round ends there).
    let mut batches = Vec::new();
    for _ in 0..4 {
        batches.push(store.purge_processed(keep, 20).await.unwrap());
    }
    assert_eq!(batches, [20, 20, 10, 0]);
    assert_eq!(
        kinds().await,
        [
            "dead:1",
            "late:30",
            "straggler:1",
            "unfinished:1",
            "young:10"
        ]
    );

    // Once the young rows age, the walk goes past them to the straggler; once the late
    // backlog ages, it goes too. Dead letters and unfinished rows are never purged.
    db.exec(&format!(
        "UPDATE {t} SET created_at = {}, processed_at = {} WHERE event_type = 'young'",
        days(2),
        days(2)
    ))
    .await;
    assert_eq!(store.purge_processed(keep, 20).await.unwrap(), 11);
    db.exec(&format!(
        "UPDATE {t} SET processed_at = {} WHERE event_type = 'late'",
        days(2)
    ))
    .await;
    assert_eq!(store.purge_processed(keep, 100).await.unwrap(), 30);
    assert_eq!(kinds().await, ["dead:1", "unfinished:1"]);

    // No index on processed_at is left for a settle to pay for.
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname",
    )
    .bind(&db.schema)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        indexes.iter().any(|i| i.ends_with("_published_seq")),
        "{indexes:?}"
    );
    assert!(
        !indexes.iter().any(|i| i.ends_with("_processed")),
        "{indexes:?}"
    );
    db.cleanup().await;
}

/// A harness dropped without `cleanup` (its test panicked) drops its schema even when a
/// transaction the test left open still holds a lock in it: the drop, under a lock timeout,
/// ends the sessions holding locks in the test's own schema and tries again. Before, the
/// schema was left behind. (It waits out that lock timeout, 5 s: the drop must first fail.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_harness_drops_its_schema_past_a_transaction_left_open() {
    let db = PgHarness::new().await;
    let (schema, pool) = (db.schema.clone(), db.pool.clone());
    let mut tx = db.pool.begin().await.unwrap();
    let lock = format!("LOCK TABLE {} IN ACCESS SHARE MODE", db.table.qualified());
    sqlx::query(&lock).execute(&mut *tx).await.unwrap();
    // As after a panic: the transaction is never rolled back by its owner.
    std::mem::forget(tx);
    tokio::task::spawn_blocking(move || drop(db)).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "schema {schema} left behind");
}
