//! The PostgreSQL store, migrations, write path and inbox against a real server
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`). Each test works in a
//! schema of its own and drops it at the end.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use sqlx::{Connection, Row};
use txoutbox::store::{
    ClaimParams, EventFilter, Failure, Operator, ReleaseParams, Retention, SettleParams, Store,
};
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
        lease,
        ordering: txoutbox::store::Ordering::Unordered,
        in_flight: &[],
    }
}

/// A row-lease claim under `token`, for a settle or release fenced by that token alone.
fn leased(token: Uuid) -> txoutbox::store::Claim {
    txoutbox::store::Claim::leased(token, Vec::new(), std::time::Instant::now() + LEASE)
}

async fn enqueue_n(db: &TestDb, n: usize) -> Vec<Uuid> {
    let events: Vec<NewEvent> = (0..n).map(event).collect();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap()
}

#[tokio::test]
async fn migrations_are_idempotent_and_safe_to_run_concurrently() {
    let db = TestDb::new().await;
    // Second run on a migrated schema: nothing to do.
    let again = migrate(&db.pool, &db.table).await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.version, txoutbox::SCHEMA_VERSION);
    check_schema(&db.pool, &db.table).await.unwrap();
    db.store().check_schema().await.unwrap();

    // Two migrators racing on a fresh schema: both succeed, exactly one applies version 1.
    let fresh = TestDb::unmigrated().await;
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
        .store()
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
    let db = TestDb::new().await;
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
        .store()
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

    let db = TestDb::unmigrated().await;
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
    assert_not_migrated(db.store().check_schema().await.unwrap_err());
    // Using the store or the outbox on it says the same.
    assert_not_migrated(
        db.store()
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

#[tokio::test]
async fn enqueue_many_keeps_slice_order_and_rollback_leaves_nothing() {
    let db = TestDb::new().await;
    // Ids in random (v4) order, so an order by id could not pass by accident.
    let events: Vec<NewEvent> = (0..50)
        .map(|i| event(i).with_id(Uuid::new_v4()).header("n", i.to_string()))
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db.outbox().enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids, events.iter().map(|e| e.id()).collect::<Vec<_>>());
    let by_seq: Vec<Uuid> = db.rows().await.iter().map(|r| r.id).collect();
    assert_eq!(by_seq, ids, "seq follows slice order");
    let claimed = db
        .store()
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    for (i, e) in claimed.iter().enumerate() {
        assert_eq!(e.id, ids[i]);
        assert_eq!(e.payload, serde_json::json!({ "i": i }));
        assert_eq!(e.headers.get("n"), Some(&i.to_string()));
    }
    assert_eq!(
        db.outbox()
            .enqueue_many(&db.pool, &[] as &[NewEvent])
            .await
            .unwrap(),
        Vec::<Uuid>::new()
    );

    // Rolled back: neither a single nor a batch enqueue leaves a row.
    let before = db.total().await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox().enqueue(&mut *tx, &event(1)).await.unwrap();
    db.outbox()
        .enqueue_many(&mut *tx, &(0..10).map(event).collect::<Vec<_>>())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox().enqueue(&mut *tx, &event(2)).await.unwrap();
    drop(tx); // dropped without commit: rolled back too
    assert_eq!(db.total().await, before);
    db.cleanup().await;
}

#[tokio::test]
async fn claims_are_leased_fenced_and_expire() {
    let db = TestDb::new().await;
    let store = db.store();
    let ids = enqueue_n(&db, 5).await;

    let token_a = Uuid::new_v4();
    let a = store
        .claim(claim("relay-a", token_a, 3, Duration::from_secs(1)))
        .await
        .unwrap()
        .events;
    assert_eq!(
        a.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids[..3],
        "limit and seq order"
    );
    for e in &a {
        assert_eq!(e.locked_by.as_deref(), Some("relay-a"));
        assert!(e.locked_until.is_some());
    }
    let rest = store
        .claim(claim("relay-a", token_a, 10, Duration::from_secs(1)))
        .await
        .unwrap()
        .events;
    assert_eq!(rest.iter().map(|e| e.id).collect::<Vec<_>>(), ids[3..]);
    for r in db.rows().await {
        assert_eq!(r.locked_by.as_deref(), Some("relay-a"));
        assert_eq!(r.lock_token, Some(token_a));
        assert!(r.locked_until.unwrap() > r.db_now);
    }
    // A second relay gets nothing while the lease holds.
    let token_b = Uuid::new_v4();
    let b = store
        .claim(claim("relay-b", token_b, 10, LEASE))
        .await
        .unwrap()
        .events;
    assert!(b.is_empty(), "leased rows were claimed twice: {b:?}");

    // Once the 1 s leases run out (the two claims' a moment apart), the second relay gets
    // them all.
    let b = std::sync::Mutex::new(Vec::<Uuid>::new());
    wait_until("relay-b claims the expired rows", || async {
        let got = store
            .claim(claim("relay-b", token_b, 10, LEASE))
            .await
            .unwrap()
            .events;
        let mut b = b.lock().unwrap();
        b.extend(got.iter().map(|e| e.id));
        b.len() >= 5
    })
    .await;
    let mut b = b.into_inner().unwrap();
    b.sort();
    assert_eq!(b, ids, "each expired row claimed once");
    let held_by_b = db.rows().await;

    // Relay A wakes up and settles with its old token: nothing changes.
    let failed: Vec<Failure> = ids[3..]
        .iter()
        .map(|&id| Failure {
            id,
            error: "late".into(),
            retry_in: Duration::from_secs(60),
            dead: true,
            unavailable: false,
        })
        .collect();
    let out = store
        .settle(SettleParams {
            claim: &leased(token_a),
            published: &ids[..3],
            failed: &failed,
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (0, 0));
    let released = store
        .release(ReleaseParams {
            claim: &leased(token_a),
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(released, 0);
    let after: Vec<RowState> = db.rows().await.iter().map(RowState::without_now).collect();
    let before: Vec<RowState> = held_by_b.iter().map(RowState::without_now).collect();
    assert_eq!(after, before, "a stale token changed rows");

    // The holder's token works.
    let out = store
        .settle(SettleParams {
            claim: &leased(token_b),
            published: &ids,
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (5, 0));
    assert_eq!(db.processed().await, 5);
    assert_eq!(db.locked().await, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn release_gives_rows_back_unattempted() {
    let db = TestDb::new().await;
    let store = db.store();
    let ids = enqueue_n(&db, 3).await;
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 10, LEASE)).await.unwrap();
    let n = store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(db.locked().await, 0);
    assert_eq!(db.count_where("attempts = 0").await, 3);
    let again = store
        .claim(claim("other", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(again.len(), 3, "released rows are claimable at once");
    // Deregister frees what a relay holds.
    assert_eq!(
        store
            .deregister(txoutbox::store::DeregisterParams {
                relay_id: "other",
                instance: uuid::Uuid::nil()
            })
            .await
            .unwrap(),
        3
    );
    assert_eq!(db.locked().await, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn settle_marks_published_and_backs_off_or_buries_failures() {
    let db = TestDb::new().await;
    let store = db.store();
    let ids = enqueue_n(&db, 4).await;
    let token = Uuid::new_v4();
    assert_eq!(
        store
            .claim(claim("r", token, 10, LEASE))
            .await
            .unwrap()
            .events
            .len(),
        4
    );
    let failed = vec![
        Failure {
            id: ids[1],
            error: "broker said no".into(),
            retry_in: Duration::from_secs(60),
            dead: false,
            unavailable: false,
        },
        Failure {
            id: ids[2],
            error: "too large".into(),
            retry_in: Duration::ZERO,
            dead: true,
            unavailable: false,
        },
        Failure {
            id: ids[3],
            error: "try again soon".into(),
            retry_in: Duration::from_millis(300),
            dead: false,
            unavailable: true,
        },
    ];
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..1],
            failed: &failed,
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (1, 3));
    let rows = db.rows().await;
    let (ok, backoff, dead, soon) = (&rows[0], &rows[1], &rows[2], &rows[3]);
    assert!(ok.processed_at.is_some() && ok.dead_at.is_none());
    assert_eq!(ok.attempts, 0);
    assert!(backoff.processed_at.is_none() && backoff.dead_at.is_none());
    assert_eq!(backoff.attempts, 1);
    assert_eq!(backoff.last_error.as_deref(), Some("broker said no"));
    assert!(
        backoff.available_at > backoff.db_now + chrono::Duration::seconds(50),
        "available_at {} not ~60 s after {}",
        backoff.available_at,
        backoff.db_now
    );
    assert!(dead.dead_at.is_some() && dead.processed_at.is_none());
    assert_eq!(dead.attempts, 1);
    assert_eq!(dead.last_error.as_deref(), Some("too large"));
    assert_eq!(soon.attempts, 1);
    let unavailable: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT attempts_unavailable FROM {} ORDER BY seq",
        db.table.qualified()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        unavailable,
        vec![0, 0, 0, 1],
        "only the unavailable failure is counted as such"
    );
    for r in &rows {
        assert_eq!(
            (r.locked_by.as_ref(), r.locked_until, r.lock_token),
            (None, None, None)
        );
    }
    // Nothing is claimable right now: published, dead, backing off.
    let none = store
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert!(none.is_empty(), "{none:?}");
    // The short backoff runs out and only that event comes back, with its attempt count.
    let again = wait_for("the 300 ms backoff to pass", || async {
        let got = store
            .claim(claim("r", Uuid::new_v4(), 10, LEASE))
            .await
            .unwrap()
            .events;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, ids[3]);
    assert_eq!(again[0].attempts, 1);
    assert_eq!(again[0].last_error.as_deref(), Some("try again soon"));
    db.cleanup().await;
}

#[tokio::test]
async fn delete_retention_deletes_on_settle() {
    let db = TestDb::new().await;
    let store = db.store_with(Retention::Delete);
    let ids = enqueue_n(&db, 3).await;
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 10, LEASE)).await.unwrap();
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..2],
            failed: &[Failure {
                id: ids[2],
                error: "nope".into(),
                retry_in: Duration::from_secs(60),
                dead: false,
                unavailable: false,
            }],
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (2, 1));
    let rows = db.rows().await;
    assert_eq!(rows.len(), 1, "published rows are gone");
    assert_eq!(rows[0].id, ids[2]);
    assert_eq!(rows[0].attempts, 1);
    // Fenced as well: a stale token deletes nothing.
    let token2 = Uuid::new_v4();
    db.exec(&format!("UPDATE {} SET available_at = now()", db.q()))
        .await;
    store.claim(claim("r", token2, 10, LEASE)).await.unwrap();
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[2..],
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(out.published, 0);
    assert_eq!(db.total().await, 1);
    db.cleanup().await;
}

/// Dead-letter rows by claiming them and settling them as dead.
async fn bury(db: &TestDb, ids: &[Uuid]) {
    let store = db.store();
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 1000, LEASE)).await.unwrap();
    let failed: Vec<Failure> = ids
        .iter()
        .map(|&id| Failure {
            id,
            error: "poison".into(),
            retry_in: Duration::ZERO,
            dead: true,
            unavailable: false,
        })
        .collect();
    store
        .settle(SettleParams {
            claim: &leased(token),
            published: &[],
            failed: &failed,
        })
        .await
        .unwrap();
    store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &db.rows().await.iter().map(|r| r.id).collect::<Vec<_>>(),
        })
        .await
        .unwrap();
}

/// The seed's `outbox_dead_letters` view follows dead-lettering, retry and discard (the
/// operator calls themselves are in the conformance suite).
#[tokio::test]
async fn the_dead_letters_view_follows_the_dead_letters() {
    let db = TestDb::new().await;
    let store = db.store();
    let ids = enqueue_n(&db, 3).await;
    bury(&db, &ids[..2]).await; // ids[2] stays pending
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
    let db = TestDb::new().await;
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

#[tokio::test]
async fn counts_reflect_every_state() {
    let db = TestDb::new().await;
    let store = db.store();
    let c = store.counts().await.unwrap();
    assert_eq!((c.pending, c.leased, c.dead, c.processed), (0, 0, 0, 0));
    assert_eq!(c.oldest_pending_age_secs, None);
    assert!(!store
        .has_unfinished(txoutbox::store::Ordering::Ordered)
        .await
        .unwrap());

    let ids = enqueue_n(&db, 8).await;
    // 3 published, 1 dead, 1 backing off, 2 leased, 1 untouched.
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 6, LEASE)).await.unwrap();
    store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..3],
            failed: &[
                Failure {
                    id: ids[3],
                    error: "dead".into(),
                    retry_in: Duration::ZERO,
                    dead: true,
                    unavailable: false,
                },
                Failure {
                    id: ids[4],
                    error: "later".into(),
                    retry_in: Duration::from_secs(60),
                    dead: false,
                    unavailable: false,
                },
            ],
        })
        .await
        .unwrap();
    store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &ids[5..6],
        })
        .await
        .unwrap();
    let leased = store
        .claim(claim("r2", Uuid::new_v4(), 2, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(leased.iter().map(|e| e.id).collect::<Vec<_>>(), ids[5..7]);
    let c = store.counts().await.unwrap();
    assert_eq!(c.pending, 2, "{c:?}"); // ids[4] (backing off) and ids[7]
    assert_eq!(c.leased, 2, "{c:?}");
    assert_eq!(c.dead, 1, "{c:?}");
    assert_eq!(c.processed, 3, "{c:?}");
    assert!(c.oldest_pending_age_secs.unwrap() >= 0.0);
    assert!(store
        .has_unfinished(txoutbox::store::Ordering::Ordered)
        .await
        .unwrap());
    db.cleanup().await;
}

/// Unordered claims skip the already-drained front of the pending index while they come back
/// full; an event committed late with a lower `seq` (and one released behind the cursor) must
/// still be found once a claim comes back short.
#[tokio::test]
async fn unordered_claims_past_the_cursor_still_find_late_commits_and_releases() {
    let db = TestDb::new().await;
    let store = db.store();
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
        db.q()
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

/// While an ordered claim is in flight, the next claim skips its aggregates and reads only a
/// few batches past it: with every aggregate of that stretch in flight it finds nothing (and
/// does not read the whole backlog to find so). Once the batch is settled, all is claimable
/// again, in order.
#[tokio::test]
async fn an_ordered_claim_ahead_skips_busy_aggregates_within_a_window() {
    use txoutbox::store::{Ordering, RebalanceParams};
    let db = TestDb::new().await;
    let store = db.store();
    let outbox = txoutbox::Outbox::new(db.table.clone());
    // 20 events of aggregate a, then one of b.
    let mut ids = Vec::new();
    for i in 0..21 {
        let agg = if i < 20 { "a" } else { "b" };
        let e = NewEvent::new("order", agg, "e", &serde_json::json!({ "i": i })).unwrap();
        ids.push(outbox.enqueue(&db.pool, &e).await.unwrap());
    }
    store
        .rebalance(RebalanceParams {
            relay_id: "r",
            instance: uuid::Uuid::nil(),
            ordering: Ordering::Ordered,
            lease: LEASE,
            may_release: true,
        })
        .await
        .unwrap();
    let ordered = |limit, in_flight| ClaimParams {
        relay_id: "r",
        token: Uuid::new_v4(),
        limit,
        lease: LEASE,
        ordering: Ordering::Ordered,
        in_flight,
    };
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
    store
        .rebalance(RebalanceParams {
            relay_id: "r2",
            instance: uuid::Uuid::new_v4(),
            ordering: Ordering::Ordered,
            lease: LEASE,
            may_release: true,
        })
        .await
        .unwrap();
    let taken = store
        .claim(ClaimParams {
            relay_id: "r2",
            ..ordered(100, &[])
        })
        .await
        .unwrap();
    assert_eq!(taken.ids(), ids[2..20]);
    db.cleanup().await;
}
