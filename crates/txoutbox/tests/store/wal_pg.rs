//! The WAL source's database side against the real server (`wal_level = logical`, which
//! `scripts/services.sh` sets): the publication and slot, and committed outbox inserts read
//! back from the slot through `pgoutput`, in commit order, never a rolled-back one, and again
//! until confirmed. The harness drops each test's slot and publication with its schema.
#![allow(clippy::unwrap_used)]

use sqlx::Connection;
use txoutbox::store::postgres::wal::{self, WalError};
use txoutbox::store::Operator;
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

fn event(aggregate: &str, i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate,
        "order.placed",
        &serde_json::json!({ "i": i, "note": "ü ✓" }),
    )
    .unwrap()
    .header("trace", format!("t-{i}"))
}

/// The test's table, its publication, and a slot of its own.
async fn prepared() -> (PgHarness, String) {
    let h = PgHarness::new().await;
    wal::check_wal_level(&h.pool).await.unwrap();
    assert!(wal::ensure_publication(&h.pool, &h.table).await.unwrap());
    let slot = h.slot().await;
    assert!(wal::ensure_slot(&h.pool, &slot).await.unwrap());
    (h, slot)
}

#[tokio::test]
async fn transactions_come_in_commit_order_whole_and_never_rolled_back() {
    let (h, slot) = prepared().await;
    let outbox = h.outbox();
    let mut c1 = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut c2 = sqlx::PgConnection::connect(&database_url()).await.unwrap();

    // T1 inserts first and stays open; T2 commits two events; T3 rolls back; then T1 commits.
    let mut t1 = c1.begin().await.unwrap();
    let first = outbox.enqueue(&mut *t1, &event("a", 1)).await.unwrap();
    let mut t2 = c2.begin().await.unwrap();
    let second = outbox
        .enqueue_many(&mut *t2, &[event("b", 2), event("a", 3)])
        .await
        .unwrap();
    t2.commit().await.unwrap();
    let mut t3 = h.pool.begin().await.unwrap();
    let rolled_back = outbox.enqueue(&mut *t3, &event("a", 4)).await.unwrap();
    t3.rollback().await.unwrap();
    t1.commit().await.unwrap();
    // A transaction that touches no outbox row yields nothing.
    h.exec("CREATE TEMP TABLE IF NOT EXISTS unrelated (x int)")
        .await;

    let txs = wal::peek(&h.pool, &h.table, &slot, 1000).await.unwrap();
    let ids: Vec<Vec<_>> = txs
        .iter()
        .map(|t| t.events.iter().map(|e| e.event.id).collect())
        .collect();
    assert_eq!(
        ids,
        vec![second.clone(), vec![first]],
        "commit order, whole transactions"
    );
    assert!(txs
        .iter()
        .flat_map(|t| &t.events)
        .all(|e| e.event.id != rolled_back));
    assert!(txs[0].end_lsn < txs[1].end_lsn && txs[0].commit_lsn < txs[0].end_lsn);

    // Every column as the store itself reads the row.
    let store = h.pool_store();
    for e in txs.iter().flat_map(|t| &t.events) {
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        let stored = store.get_event(e.event.id).await.unwrap().unwrap();
        assert_eq!(e.event, stored);
    }

    // Unconfirmed, the same transactions again; confirmed, never again.
    let again = wal::peek(&h.pool, &h.table, &slot, 1000).await.unwrap();
    assert_eq!(again.len(), 2);
    assert_eq!(again[0].end_lsn, txs[0].end_lsn);
    wal::advance(&h.pool, &slot, txs[0].end_lsn).await.unwrap();
    let rest = wal::peek(&h.pool, &h.table, &slot, 1000).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].events[0].event.id, first);
    wal::advance(&h.pool, &slot, rest[0].end_lsn).await.unwrap();
    assert!(wal::peek(&h.pool, &h.table, &slot, 1000)
        .await
        .unwrap()
        .is_empty());
    let info = wal::slot_info(&h.pool, &slot).await.unwrap().unwrap();
    assert_eq!(info.plugin.as_deref(), Some("pgoutput"));
    assert!(!info.active);
    assert!(info.confirmed_flush_lsn >= Some(rest[0].end_lsn));
    drop((c1, c2));
    h.cleanup().await;
}

#[tokio::test]
async fn the_publication_carries_inserts_only_and_other_tables_are_skipped() {
    let (h, slot) = prepared().await;
    let ids = h
        .outbox()
        .enqueue_many(&h.pool, &[event("a", 1), event("b", 2)])
        .await
        .unwrap();
    // The table relay's settle is an UPDATE, its retention a DELETE: neither is published.
    h.exec(&format!(
        "UPDATE {} SET processed_at = now(); DELETE FROM {}",
        h.table.qualified(),
        h.table.qualified()
    ))
    .await;
    let txs = wal::peek(&h.pool, &h.table, &slot, 1000).await.unwrap();
    assert_eq!(txs.len(), 1, "the inserts' transaction alone: {txs:?}");
    let got: Vec<_> = txs[0].events.iter().map(|e| e.event.id).collect();
    assert_eq!(got, ids);
    h.cleanup().await;
}

/// Two tables whose names give the same publication name (`<s>.outbox_events` and
/// `<s>_outbox.events`): the second is refused with a line that names both, not handed a
/// stream that never carries its events.
#[tokio::test]
async fn a_publication_name_taken_by_another_table_is_refused() {
    let (h, _slot) = prepared().await;
    let other_schema = format!("{}_outbox", h.schema);
    h.exec(&format!(
        "CREATE SCHEMA \"{other_schema}\"; CREATE TABLE \"{other_schema}\".events (x int)"
    ))
    .await;
    let other = txoutbox::OutboxTable::new(&other_schema, "events").unwrap();
    let refused = wal::ensure_publication(&h.pool, &other).await;
    // Its own table is still accepted.
    let own = wal::ensure_publication(&h.pool, &h.table).await;
    h.exec(&format!("DROP SCHEMA \"{other_schema}\" CASCADE"))
        .await;
    assert_eq!(
        wal::publication_name(&other),
        wal::publication_name(&h.table)
    );
    let err = refused.unwrap_err();
    assert!(matches!(err, WalError::Setup(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&other.qualified()), "{msg}");
    assert!(
        msg.contains(&format!("{}.outbox_events", h.schema)),
        "{msg}"
    );
    assert!(msg.contains("rename"), "{msg}");
    assert!(!own.unwrap());
    h.cleanup().await;
}

/// A table dropped and made again (the publication outlives it, publishing nothing): the
/// table is added back to its publication, which then carries its inserts again.
#[tokio::test]
async fn a_table_made_again_is_added_back_to_its_publication() {
    let (h, slot) = prepared().await;
    h.exec(&format!("DROP TABLE {} CASCADE", h.table.qualified()))
        .await;
    let publication = wal::publication_name(&h.table);
    let listed = |pool: sqlx::PgPool| {
        let publication = publication.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1",
            )
            .bind(publication)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(listed(h.pool.clone()).await, 0, "the drop empties it");
    // Made again by hand (migrate would make the whole schema).
    h.exec(&format!(
        "CREATE TABLE {} (id uuid PRIMARY KEY, x int)",
        h.table.qualified()
    ))
    .await;
    assert!(wal::ensure_publication(&h.pool, &h.table).await.unwrap());
    assert_eq!(listed(h.pool.clone()).await, 1);
    assert!(!wal::ensure_publication(&h.pool, &h.table).await.unwrap());
    // Its inserts are in the slot's stream again (decoded or not, a change of the table).
    h.exec(&format!(
        "INSERT INTO {} VALUES (gen_random_uuid(), 1)",
        h.table.qualified()
    ))
    .await;
    let changes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
         'proto_version', '1', 'publication_names', $2)",
    )
    .bind(&slot)
    .bind(&publication)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(changes >= 3, "begin, relation/insert, commit: {changes}");
    h.cleanup().await;
}

/// The same, by a role that may not alter the publication: one line that gives the statement
/// to run as the owner (not the CREATE PUBLICATION of a missing one).
#[tokio::test]
async fn a_table_made_again_without_the_right_to_add_it_back_names_the_statement() {
    let (h, _slot) = prepared().await;
    h.exec(&format!("DROP TABLE {} CASCADE", h.table.qualified()))
        .await;
    h.exec(&format!(
        "CREATE TABLE {} (id uuid PRIMARY KEY)",
        h.table.qualified()
    ))
    .await;
    let role = format!("{}_np", h.schema);
    h.exec(&format!("CREATE ROLE \"{role}\" LOGIN")).await;
    let opts: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.username(&role))
        .await
        .unwrap();
    let got = wal::ensure_publication(&pool, &h.table).await;
    pool.close().await;
    h.exec(&format!("DROP ROLE \"{role}\"")).await;
    let err = got.unwrap_err();
    assert!(matches!(err, WalError::Setup(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("ALTER PUBLICATION"), "{msg}");
    assert!(msg.contains(&h.table.qualified()), "{msg}");
    h.cleanup().await;
}

#[tokio::test]
async fn set_up_is_idempotent_and_bad_names_are_refused() {
    let (h, slot) = prepared().await;
    assert!(!wal::ensure_publication(&h.pool, &h.table).await.unwrap());
    assert!(!wal::ensure_slot(&h.pool, &slot).await.unwrap());
    for bad in ["Upper", "a-b", "x; DROP TABLE y", ""] {
        let err = wal::ensure_slot(&h.pool, bad).await.unwrap_err();
        assert!(matches!(err, WalError::Setup(_)), "{bad:?}: {err}");
        assert!(err.to_string().contains("not valid"), "{err}");
    }
    assert!(wal::drop_slot(&h.pool, &slot).await.unwrap());
    assert!(!wal::drop_slot(&h.pool, &slot).await.unwrap());
    assert!(wal::slot_info(&h.pool, &slot).await.unwrap().is_none());
    h.cleanup().await;
}

/// The settle waits for a streamed transaction to be visible: an open transaction's id is
/// not, a committed one's is, and the 32-bit ids the stream gives are widened right.
#[tokio::test]
async fn a_transaction_is_visible_only_once_it_has_ended() {
    use std::time::Duration;
    let h = PgHarness::new().await;
    let w = h.pool_store().wal();
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let full: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let xid = (full.parse::<u64>().unwrap() & 0xFFFF_FFFF) as u32;
    assert!(
        !w.wait_visible(&[xid], Duration::from_millis(50))
            .await
            .unwrap(),
        "an open transaction counted as visible"
    );
    tx.commit().await.unwrap();
    assert!(w
        .wait_visible(&[xid], Duration::from_secs(5))
        .await
        .unwrap());
    assert!(w.wait_visible(&[], Duration::ZERO).await.unwrap());
    h.cleanup().await;
}

/// The stream's settle checks visibility in its own statement: while a transaction of the
/// batch is open it writes nothing (no mark or delete, no failure recorded, nothing handed
/// over, also for rows of other, committed transactions) and says so; once it committed, it
/// settles. With both retentions.
#[tokio::test]
async fn a_settle_writes_nothing_while_a_transaction_of_its_batch_is_open() {
    use std::time::Duration;
    use txoutbox::store::{Failure, Retention};
    for retention in [Retention::Mark, Retention::Delete] {
        let h = PgHarness::new().await;
        let w = h.pool_store_with(retention).wal();
        let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        let id = h.outbox().enqueue(&mut *tx, &event("a", 1)).await.unwrap();
        let full: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let xid = (full.parse::<u64>().unwrap() & 0xFFFF_FFFF) as u32;
        // Committed already: only the open transaction holds the batch back.
        let other = h.outbox().enqueue(&h.pool, &event("b", 1)).await.unwrap();
        let failing = h.outbox().enqueue(&h.pool, &event("c", 1)).await.unwrap();
        let held = h.outbox().enqueue(&h.pool, &event("c", 2)).await.unwrap();
        let failed = [Failure {
            id: failing,
            error: "broker said no".into(),
            retry_in: Duration::from_secs(1),
            dead: false,
            unavailable: false,
        }];

        let open = w
            .settle_stream(&[id, other], &failed, &[held], "held", &[xid])
            .await
            .unwrap();
        assert!(
            open.is_none(),
            "{retention:?}: settled with a transaction open: {open:?}"
        );
        // The open transaction's row is not visible here yet: three.
        assert_eq!(h.total().await, 3, "{retention:?}: a row was deleted");
        assert_eq!(
            h.count_where("processed_at IS NOT NULL OR handed_off_at IS NOT NULL OR attempts > 0")
                .await,
            0,
            "{retention:?}: a settle that saw an open transaction wrote"
        );

        tx.commit().await.unwrap();
        let done = w
            .settle_stream(&[id, other], &failed, &[held], "held", &[xid])
            .await
            .unwrap()
            .expect("visible once committed");
        assert_eq!(
            (done.published, done.failed, done.held),
            (2, 1, 1),
            "{retention:?}"
        );
        assert_eq!(
            h.count_where("handed_off_at IS NOT NULL").await,
            2,
            "{retention:?}"
        );
        match retention {
            Retention::Mark => assert_eq!(h.processed().await, 2),
            Retention::Delete => assert_eq!(h.total().await, 2),
        }
        h.cleanup().await;
    }
}

/// The table path's ordered claim passes over a row another statement holds (SKIP LOCKED):
/// the outage watch's `retry_now`, making due at once a failed event whose backoff is just
/// running out. The claim must not then take that aggregate's later events without it (they
/// would go out ahead of it): they wait, and the next claim takes them all, in order. Other
/// aggregates are claimed as usual.
#[tokio::test]
async fn an_ordered_claim_never_takes_later_events_past_an_earlier_row_it_skipped() {
    use std::time::Duration;
    use txoutbox::store::{ClaimBytes, ClaimParams, Ordering, Retention, Store};
    let h = PgHarness::new().await;
    let path = std::sync::Arc::new(h.pool_store_with(Retention::Delete).wal()).table_path();
    let outbox = h.outbox();
    let first = outbox.enqueue(&h.pool, &event("a", 1)).await.unwrap();
    let second = outbox.enqueue(&h.pool, &event("a", 2)).await.unwrap();
    let other = outbox.enqueue(&h.pool, &event("b", 1)).await.unwrap();
    let t = h.table.qualified();
    // All three handed over: the first after a failed attempt whose backoff has run out, the
    // others held (unattempted, due).
    h.exec(&format!(
        "UPDATE {t} SET handed_off_at = now(), attempts = 1, attempts_unavailable = 1, \
         available_at = now() - interval '1 second' WHERE id = '{first}'; \
         UPDATE {t} SET handed_off_at = now() WHERE id IN ('{second}', '{other}')"
    ))
    .await;
    let claim = |token| ClaimParams {
        relay_id: "wal-relay",
        token,
        limit: 100,
        bytes: ClaimBytes::UNLIMITED,
        lease: Duration::from_secs(30),
        ordering: Ordering::Ordered,
        in_flight: &[],
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    };

    // `retry_now` on the first event, its statement not yet committed: the row is locked.
    let mut conn = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {t} SET available_at = now() WHERE id = $1"
    ))
    .bind(first)
    .execute(&mut *tx)
    .await
    .unwrap();
    let c = path.claim(claim(uuid::Uuid::new_v4())).await.unwrap();
    let ids: Vec<_> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        vec![other],
        "a's second event claimed while its first, claimable, was skipped (first {first}, \
         second {second})"
    );

    tx.commit().await.unwrap();
    let c = path.claim(claim(uuid::Uuid::new_v4())).await.unwrap();
    let ids: Vec<_> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![first, second], "a's events together, in order");
    h.cleanup().await;
}

/// Two relays' ordered claims of the table path at once: relay A's claim has leased an
/// aggregate's first event but its commit is slow (a synchronous standby, a slow fsync: here a
/// deferred trigger that sleeps at commit), so relay B's statement sees that row neither
/// leased nor in the `blocking` index, and SKIP LOCKED passes over it. B must not take the
/// aggregate's second event then (it would go out ahead of the first): B's claim waits for A's
/// commit and leaves the aggregate alone. The chaos run's failover fault found it (order
/// violations with commits waiting on a synchronous standby).
#[tokio::test]
async fn an_ordered_claim_never_takes_later_events_past_one_another_claim_has_not_committed() {
    use std::time::Duration;
    use txoutbox::store::{ClaimBytes, ClaimParams, Ordering, Retention, Store};
    let h = PgHarness::new().await;
    let path = std::sync::Arc::new(h.pool_store_with(Retention::Delete).wal()).table_path();
    let outbox = h.outbox();
    let first = outbox.enqueue(&h.pool, &event("a", 1)).await.unwrap();
    let second = outbox.enqueue(&h.pool, &event("a", 2)).await.unwrap();
    let other = outbox.enqueue(&h.pool, &event("b", 1)).await.unwrap();
    let t = h.table.qualified();
    let schema = h.table.schema().quoted();
    // All three handed over, unattempted and due: none of them in the `blocking` index.
    h.exec(&format!("UPDATE {t} SET handed_off_at = now()"))
        .await;
    // Relay A's claims commit slowly.
    h.exec(&format!(
        "CREATE FUNCTION {schema}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.locked_by = 'relay-a' THEN PERFORM pg_sleep(2); END IF; RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON {t} \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.slow_commit()"
    ))
    .await;
    let claim = |relay_id, limit| ClaimParams {
        relay_id,
        token: uuid::Uuid::new_v4(),
        limit,
        bytes: ClaimBytes::UNLIMITED,
        lease: Duration::from_secs(30),
        ordering: Ordering::Ordered,
        in_flight: &[],
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    };

    // A claims the first event alone and sits in its commit.
    let a = {
        let path = path.clone();
        tokio::spawn(async move {
            let c = path.claim(claim("relay-a", 1)).await.unwrap();
            c.events.iter().map(|e| e.id).collect::<Vec<_>>()
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sleeping: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' \
             AND datname = current_database() AND pid <> pg_backend_pid() \
             AND (query LIKE $1 OR query ILIKE 'commit%')",
        )
        .bind(format!("%{t}%"))
        .fetch_one(&h.pool)
        .await
        .unwrap();
        if sleeping > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "relay A's claim never reached its commit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let b = path.claim(claim("relay-b", 100)).await.unwrap();
    let b: Vec<_> = b.events.iter().map(|e| e.id).collect();
    assert_eq!(
        a.await.unwrap(),
        vec![first],
        "relay A took a's first event"
    );
    assert_eq!(
        b,
        vec![other],
        "relay B took a's second event while A's claim of the first was committing \
         (first {first}, second {second})"
    );
    h.cleanup().await;
}
