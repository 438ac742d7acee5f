//! MySQL / MariaDB row locks against the real server: a deregister locks only its own rows,
//! and an ordered claim never leases an aggregate's event past one it could not lock.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use sqlx::{Connection, Row};
use txoutbox::store::{ClaimParams, DeregisterParams, Ordering, RebalanceParams, Retention, Store};
use txoutbox::testing::mysql::MySqlHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

fn event(aggregate: &str, i: usize) -> NewEvent {
    NewEvent::new("order", aggregate, "e", &serde_json::json!({ "i": i })).unwrap()
}

fn claim(relay_id: &str, ordering: Ordering) -> ClaimParams<'_> {
    ClaimParams {
        relay_id,
        token: Uuid::new_v4(),
        limit: 100,
        bytes: txoutbox::store::ClaimBytes::UNLIMITED,
        lease: Duration::from_secs(30),
        ordering,
        in_flight: &[],
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    }
}

/// Another connection holds a row lock on the event with `seq` (a transaction left open) until
/// it is dropped. A connection of its own, not the pool's: a test that fails closes it, so the
/// lock does not outlive the test and block the clean-up.
async fn lock_row(h: &MySqlHarness, seq: i64) -> sqlx::MySqlConnection {
    let mut conn = sqlx::MySqlConnection::connect(&txoutbox::testing::mysql::url_for(&h.database))
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query(&format!(
        "SELECT seq FROM `{}` WHERE seq = ? FOR UPDATE",
        h.table.table().as_str()
    ))
    .bind(seq)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn
}

/// End the lock of [`lock_row`] now. A rollback, not only a disconnect: the server rolls a
/// dropped connection's transaction back in its own time, so a claim right after a bare
/// close could still find the row locked.
async fn unlock(mut conn: sqlx::MySqlConnection) {
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
}

async fn seq_of(h: &MySqlHarness, id: Uuid) -> i64 {
    sqlx::query(&format!(
        "SELECT seq FROM `{}` WHERE id = ?",
        h.table.table().as_str()
    ))
    .bind(id.hyphenated().to_string())
    .fetch_one(&h.pool)
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn an_ordered_claim_leases_nothing_of_an_aggregate_past_a_row_it_could_not_lock() {
    let h = MySqlHarness::new().await;
    let store = h.store(Retention::Mark).await;
    store
        .rebalance(RebalanceParams {
            relay_id: "r",
            instance: Uuid::new_v4(),
            ordering: Ordering::Ordered,
            lease: Duration::from_secs(10),
            may_release: true,
        })
        .await
        .unwrap();
    let a = h
        .enqueue(&[event("a", 0), event("a", 1), event("a", 2)])
        .await;
    let b = h.enqueue(&[event("b", 0)]).await;
    // Something else holds a's first event for a moment (an operator's statement, a scan).
    let held = lock_row(&h, seq_of(&h, a[0]).await).await;
    let got: Vec<Uuid> = store
        .claim(claim("r", Ordering::Ordered))
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.id)
        .collect();
    unlock(held).await;
    assert_eq!(
        got, b,
        "a's later events must wait for its first, which was locked"
    );
    let next: Vec<Uuid> = store
        .claim(claim("r", Ordering::Ordered))
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(next, a, "then a goes on, in order");
    h.cleanup().await;
}

#[tokio::test]
async fn deregister_locks_only_the_relays_own_rows() {
    let h = MySqlHarness::new().await;
    let store = h.store(Retention::Mark).await;
    let ids = h
        .enqueue(&[event("a", 0), event("b", 0), event("c", 0)])
        .await;
    let mut leaving = claim("leaving", Ordering::Unordered);
    leaving.limit = 1;
    let got = store.claim(leaving).await.unwrap().events;
    assert_eq!(got[0].id, ids[0]);
    // Another relay is in the middle of claiming (or an operator updating) a pending row.
    let held = lock_row(&h, seq_of(&h, ids[2]).await).await;
    let released = tokio::time::timeout(
        Duration::from_secs(5),
        store.deregister(DeregisterParams {
            relay_id: "leaving",
            instance: Uuid::new_v4(),
        }),
    )
    .await;
    // Let go of the lock before judging, so that a failure does not leave the deregister
    // waiting on it (and the clean-up behind that).
    unlock(held).await;
    let Ok(released) = released else {
        // The abandoned deregister's transaction must not outlive the test either.
        store.pool().close().await;
        panic!("deregister waited for a row lock on someone else's pending row");
    };
    let released = released.unwrap();
    assert_eq!(released, 1);
    let mut conn = sqlx::MySqlConnection::connect(&txoutbox::testing::mysql::url_for(&h.database))
        .await
        .unwrap();
    let leased: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM `{}` WHERE locked_by IS NOT NULL",
        h.table.table().as_str()
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(leased, 0);
    h.cleanup().await;
}

fn heartbeat(relay_id: &str, instance: Uuid, ordering: Ordering) -> RebalanceParams<'_> {
    RebalanceParams {
        relay_id,
        instance,
        ordering,
        lease: Duration::from_secs(30),
        may_release: true,
    }
}

/// The shared rebalance algorithm with MySQL's statements: a second relay gets its fair
/// share once the first gives it up, and a relay of the other mode is refused.
#[tokio::test]
async fn relays_share_the_partitions_fairly_and_modes_do_not_mix() {
    let h = MySqlHarness::new().await;
    let store = h.store(Retention::Mark).await;
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let first = store
        .rebalance(heartbeat("a", a, Ordering::Ordered))
        .await
        .unwrap();
    assert_eq!((first.partitions, first.live_relays), (64, 1));
    assert_eq!(first.owned, (0..64).collect::<Vec<i32>>());
    // b joins while a owns everything: nothing is free yet.
    let joined = store
        .rebalance(heartbeat("b", b, Ordering::Ordered))
        .await
        .unwrap();
    assert_eq!((joined.live_relays, joined.target), (2, 32));
    assert!(joined.owned.is_empty(), "{joined:?}");
    // a's next heartbeat gives up the upper half, b's takes it.
    let shrunk = store
        .rebalance(heartbeat("a", a, Ordering::Ordered))
        .await
        .unwrap();
    assert_eq!(shrunk.owned, (0..32).collect::<Vec<i32>>());
    assert_eq!(shrunk.released, (32..64).collect::<Vec<i32>>());
    let grown = store
        .rebalance(heartbeat("b", b, Ordering::Ordered))
        .await
        .unwrap();
    assert_eq!(grown.owned, (32..64).collect::<Vec<i32>>());
    assert_eq!(grown.acquired, grown.owned);
    // An unordered relay on the same table is refused, and does not stay registered.
    let err = store
        .rebalance(heartbeat("c", Uuid::new_v4(), Ordering::Unordered))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, txoutbox::Error::ModeConflict { other_mode, .. } if other_mode == "ordered"),
        "{err:?}"
    );
    // What the database holds, not what the heartbeats said.
    let mut relays: Vec<(String, Vec<i32>)> = store
        .relays()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.relay_id, r.partitions))
        .collect();
    relays.sort();
    assert_eq!(
        relays,
        [
            ("a".into(), (0..32).collect()),
            ("b".into(), (32..64).collect())
        ]
    );
    h.cleanup().await;
}
