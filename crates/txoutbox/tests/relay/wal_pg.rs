//! The relay with `--source wal` against the real server (`wal_level = logical`, which
//! `scripts/services.sh` sets): commit order, never a rolled-back event, dead letters and
//! retries through the table path without holding up other aggregates, a relay killed
//! mid-stream, the slot dropped under a running relay, a standby taking over, `--drain`. Each
//! test has a schema, publication and slot of its own, dropped at its end.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::Connection;
use txoutbox::relay::{Relay, RelayConfig, RelayError, RelayHandle, Source};
use txoutbox::retry::Backoff;
use txoutbox::store::postgres::wal;
use txoutbox::store::Ordering;
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

use crate::common::*;

fn config(relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.source = Source::Wal;
    c.relay_id = relay_id.to_string();
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(200);
    c.lease = Duration::from_secs(10);
    c.max_attempts = 5;
    c.backoff = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        jitter: true,
    };
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

fn event(aggregate: &str, i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate,
        "order.placed",
        &serde_json::json!({ "i": i }),
    )
    .unwrap()
}

fn start(h: &PgHarness, publisher: &RecordingPublisher, cfg: RelayConfig) -> RelayHandle {
    txoutbox::testing::postgres::relay(h.pool_store(), publisher.boxed(), cfg).spawn()
}

/// Wait until the relay has made its slot (what commits after it, the stream delivers). A
/// slot being created is listed already, without a confirmed position: its creation waits
/// for the transactions open at the time to end, so a test must not open one before.
async fn slot_ready(h: &PgHarness) {
    let slot = h.slot().await;
    wait_until("the relay created its slot", || async {
        wal::slot_info(&h.pool, &slot)
            .await
            .unwrap()
            .is_some_and(|i| i.confirmed_flush_lsn.is_some())
    })
    .await;
}

/// Wait until the relay reads the stream: its slot is made and what was committed before it
/// handed to the table, and it streams the slot (or, reading through SQL, waits for commits).
pub(crate) async fn streaming(h: &PgHarness) {
    slot_ready(h).await;
    let slot = h.slot().await;
    wait_until("the relay streams the slot", || async {
        // A walsender holds it (not the backend that created it).
        let streamed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s \
             JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)",
        )
        .bind(&slot)
        .fetch_one(&h.pool)
        .await
        .unwrap();
        streamed || h.waiter_count().await > 0
    })
    .await;
}

async fn shutdown(handle: RelayHandle) {
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay failed");
}

/// Per aggregate, the order in which the publisher first acknowledged its events.
fn first_deliveries(p: &RecordingPublisher) -> HashMap<String, Vec<Uuid>> {
    let mut seen = HashSet::new();
    let mut by_agg: HashMap<String, Vec<Uuid>> = HashMap::new();
    for m in p.acked() {
        if seen.insert(m.id) {
            by_agg.entry(m.aggregate_id.clone()).or_default().push(m.id);
        }
    }
    by_agg
}

#[tokio::test]
async fn delivers_in_commit_order_and_never_a_rolled_back_event() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("wal-order"));
    commit_order(h, &p, relay).await;
}

/// The same through SQL (`pg_logical_slot_peek_binary_changes`), for a store without
/// replication settings.
#[tokio::test]
async fn reading_the_slot_through_sql_delivers_in_commit_order_too() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let store = h.pool_store_sql(txoutbox::store::Retention::Mark);
    let relay =
        txoutbox::testing::postgres::relay(store, p.boxed(), config("wal-order-sql")).spawn();
    commit_order(h, &p, relay).await;
}

/// The same over the server's Unix-domain socket (the URL's host is the socket's directory,
/// percent-encoded, as sqlx and libpq read it): the walsender's client has no address.
#[tokio::test]
async fn over_a_unix_domain_socket_delivers_in_commit_order_too() {
    let h = PgHarness::new().await;
    let (dirs, port, user, db): (String, String, String, String) = sqlx::query_as(
        "SELECT current_setting('unix_socket_directories'), current_setting('port'), \
         current_user::text, current_database()::text",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    // The server's socket, if it is on this machine (not so when it runs elsewhere).
    let dir = dirs.split(',').next().unwrap_or_default().trim().to_owned();
    let socket = std::path::Path::new(&dir).join(format!(".s.PGSQL.{port}"));
    if !dir.starts_with('/') || !socket.exists() {
        eprintln!("skipped: no Unix-domain socket of the server here ({dirs:?}, port {port})");
        h.cleanup().await;
        return;
    }
    let host: String = url::form_urlencoded::byte_serialize(dir.as_bytes()).collect();
    let user: String = url::form_urlencoded::byte_serialize(user.as_bytes()).collect();
    // The test URL's password, if it has one.
    let password = url::Url::parse(&database_url())
        .ok()
        .and_then(|u| u.password().map(|p| format!(":{p}")))
        .unwrap_or_default();
    let url = format!("postgres://{user}{password}@{host}/{db}?port={port}");
    let cfg = wal::stream::ReplicationConfig::from_url(&url).unwrap();
    assert!(cfg.socket_path().is_some(), "{url}");
    let p = RecordingPublisher::new();
    let store = h
        .pool_store_sql(txoutbox::store::Retention::Mark)
        .with_replication(cfg);
    let relay =
        txoutbox::testing::postgres::relay(store, p.boxed(), config("wal-order-unix")).spawn();
    streaming(&h).await;
    let over_unix: bool = sqlx::query_scalar(
        "SELECT r.client_addr IS NULL AND r.client_port = -1 FROM pg_replication_slots s \
         JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
    )
    .bind(h.slot().await)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert!(
        over_unix,
        "the walsender's client is not on the Unix-domain socket"
    );
    commit_order(h, &p, relay).await;
}

async fn commit_order(h: PgHarness, p: &RecordingPublisher, relay: RelayHandle) {
    slot_ready(&h).await;
    let outbox = h.outbox();
    let mut c1 = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut c2 = sqlx::PgConnection::connect(&database_url()).await.unwrap();

    // T1 inserts first (the lower seq) and stays open; T2 commits; T3 rolls back; T1 commits.
    let mut t1 = c1.begin().await.unwrap();
    let first = outbox.enqueue(&mut *t1, &event("a", 1)).await.unwrap();
    let mut t2 = c2.begin().await.unwrap();
    let second = outbox.enqueue(&mut *t2, &event("a", 2)).await.unwrap();
    t2.commit().await.unwrap();
    wait_until("T2 delivered while T1 is open", || async {
        p.was_acked(second)
    })
    .await;
    assert!(!p.was_acked(first), "an open transaction's event went out");
    let mut t3 = h.pool.begin().await.unwrap();
    let rolled_back = outbox.enqueue(&mut *t3, &event("a", 3)).await.unwrap();
    t3.rollback().await.unwrap();
    t1.commit().await.unwrap();
    wait_until("T1 delivered", || async { p.was_acked(first) }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(p.acked_ids(), vec![second, first], "commit order");
    assert!(!p.was_acked(rolled_back));
    // Settled in the table, and the slot confirmed past both.
    wait_until("both rows marked published", || async {
        h.processed().await == 2
    })
    .await;
    shutdown(relay).await;
    let txs = wal::peek(&h.pool, &h.table, &h.slot().await, 1000)
        .await
        .unwrap();
    assert!(txs.is_empty(), "confirmed transactions came again: {txs:?}");
    h.cleanup().await;
}

#[tokio::test]
async fn events_from_before_the_slot_go_through_the_table_then_the_stream_goes_on() {
    let h = PgHarness::new().await;
    let outbox = h.outbox();
    let mut before = Vec::new();
    for i in 0..20 {
        before.push(
            outbox
                .enqueue(&h.pool, &event(&format!("o-{}", i % 4), i))
                .await
                .unwrap(),
        );
    }
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("wal-before"));
    slot_ready(&h).await;
    let mut after = Vec::new();
    for i in 20..40 {
        after.push(
            outbox
                .enqueue(&h.pool, &event(&format!("o-{}", i % 4), i))
                .await
                .unwrap(),
        );
    }
    wait_until("all 40 delivered", || async {
        before.iter().chain(&after).all(|id| p.was_acked(*id))
    })
    .await;
    wait_until("all 40 marked published", || async {
        h.processed().await == 40
    })
    .await;
    shutdown(relay).await;
    // Per aggregate, everything committed before the slot went out before what came after.
    let order = first_deliveries(&p);
    for (agg, ids) in &order {
        let pos = |id: &Uuid| ids.iter().position(|x| x == id);
        let last_before = before.iter().filter_map(pos).max();
        let first_after = after.iter().filter_map(pos).min();
        if let (Some(b), Some(a)) = (last_before, first_after) {
            assert!(
                b < a,
                "aggregate {agg}: a later event overtook an older one"
            );
        }
    }
    h.cleanup().await;
}

#[tokio::test]
async fn a_poison_event_is_dead_lettered_and_a_failing_one_retried_without_holding_up_others() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("wal-poison"));
    streaming(&h).await;
    let outbox = h.outbox();

    let mut tx = h.pool.begin().await.unwrap();
    let poison = outbox.enqueue(&mut *tx, &event("a", 1)).await.unwrap();
    let after_poison = outbox.enqueue(&mut *tx, &event("a", 2)).await.unwrap();
    let flaky = outbox.enqueue(&mut *tx, &event("c", 3)).await.unwrap();
    let behind_flaky = outbox.enqueue(&mut *tx, &event("c", 4)).await.unwrap();
    let other = outbox.enqueue(&mut *tx, &event("b", 5)).await.unwrap();
    p.fail_id(poison, Fail::Permanent);
    p.fail_id_times(flaky, Fail::Transient, Some(2));
    tx.commit().await.unwrap();

    wait_until("the others delivered", || async {
        p.was_acked(other) && p.was_acked(after_poison)
    })
    .await;
    wait_until("the flaky one and the one behind it delivered", || async {
        p.was_acked(flaky) && p.was_acked(behind_flaky)
    })
    .await;
    wait_until("the poison event dead", || async { h.dead().await == 1 }).await;
    let order = first_deliveries(&p);
    assert_eq!(
        order["c"],
        vec![flaky, behind_flaky],
        "order behind a retry"
    );
    assert!(!p.was_acked(poison));
    // The failing event was retried by the table path: three sends in all.
    assert_eq!(p.send_times(flaky).len(), 3);
    wait_until("the rest marked published", || async {
        h.processed().await == 4
    })
    .await;
    assert_eq!(
        h.count_where("handed_off_at IS NOT NULL").await,
        3,
        "the poison event, the flaky one and the one held behind it were handed to the table"
    );
    shutdown(relay).await;
    h.cleanup().await;
}

#[tokio::test]
async fn hold_keeps_an_aggregate_behind_its_dead_letter() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let mut cfg = config("wal-hold");
    cfg.ordering = Ordering::OrderedHold;
    let relay = start(&h, &p, cfg);
    streaming(&h).await;
    let outbox = h.outbox();
    let mut tx = h.pool.begin().await.unwrap();
    let poison = outbox.enqueue(&mut *tx, &event("a", 1)).await.unwrap();
    p.fail_id(poison, Fail::Permanent);
    tx.commit().await.unwrap();
    let mut tx = h.pool.begin().await.unwrap();
    let held = outbox.enqueue(&mut *tx, &event("a", 2)).await.unwrap();
    let other = outbox.enqueue(&mut *tx, &event("b", 3)).await.unwrap();
    tx.commit().await.unwrap();
    wait_until("the other aggregate delivered", || async {
        p.was_acked(other)
    })
    .await;
    wait_until("the poison event dead", || async { h.dead().await == 1 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !p.was_acked(held),
        "went out past its aggregate's dead letter"
    );
    shutdown(relay).await;
    h.cleanup().await;
}

#[tokio::test]
async fn killed_mid_stream_a_new_relay_delivers_everything() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    p.set_ack_delay(Duration::from_millis(20));
    let mut cfg = config("wal-crash");
    cfg.batch_size = 20;
    let relay = start(&h, &p, cfg.clone());
    streaming(&h).await;
    let outbox = h.outbox();
    // Twenty transactions of ten events each, committed at once: the relay reads them a
    // transaction or two at a time.
    let mut ids = Vec::new();
    for t in 0..20 {
        let events: Vec<NewEvent> = (0..10)
            .map(|i| event(&format!("o-{}", (t * 10 + i) % 8), t * 10 + i))
            .collect();
        ids.extend(outbox.enqueue_many(&h.pool, &events).await.unwrap());
    }
    wait_until("some delivered", || async { p.acked_count() >= 30 }).await;
    relay.abort();
    let delivered_before = p.acked_count();
    assert!(delivered_before < 200, "the relay was done before the kill");

    let p2 = RecordingPublisher::new();
    // The killed relay's slot lock goes with its connection; a new one takes over. (A new
    // process, so a relay id of its own: the killed one's stays registered until its
    // partition lease runs out, as a table relay's does.)
    cfg.relay_id = "wal-crash-2".into();
    let relay = start(&h, &p2, cfg);
    wait_until("all delivered after the restart", || async {
        let again: HashSet<Uuid> = p2.acked_ids().into_iter().collect();
        let first: HashSet<Uuid> = p.acked_ids().into_iter().collect();
        ids.iter()
            .all(|id| again.contains(id) || first.contains(id))
    })
    .await;
    wait_until("all marked published", || async {
        h.processed().await == 200
    })
    .await;
    shutdown(relay).await;
    // Per aggregate, the new relay's deliveries are in commit (here: insert) order.
    for (agg, got) in first_deliveries(&p2) {
        let want: Vec<Uuid> = ids.iter().copied().filter(|id| got.contains(id)).collect();
        assert_eq!(got, want, "aggregate {agg} out of order after the restart");
    }
    h.cleanup().await;
}

#[tokio::test]
async fn a_slot_dropped_under_the_relay_is_created_again_and_nothing_is_lost() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("wal-slot-lost"));
    slot_ready(&h).await;
    let outbox = h.outbox();
    let first = outbox.enqueue(&h.pool, &event("a", 1)).await.unwrap();
    wait_until("the first delivered", || async { p.was_acked(first) }).await;

    // Drop the slot: end the relay's stream on it, then drop it before the relay is back
    // (try until that wins).
    let slot = h.slot().await;
    wait_until("the slot dropped", || async {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(&slot)
        .execute(&h.pool)
        .await
        .unwrap();
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&slot)
            .execute(&h.pool)
            .await
            .is_ok()
    })
    .await;
    let mut lost_window = Vec::new();
    for i in 0..10 {
        lost_window.push(outbox.enqueue(&h.pool, &event("a", 10 + i)).await.unwrap());
    }
    slot_ready(&h).await;
    let later = outbox.enqueue(&h.pool, &event("a", 100)).await.unwrap();
    wait_until("everything delivered", || async {
        lost_window.iter().all(|id| p.was_acked(*id)) && p.was_acked(later)
    })
    .await;
    wait_until("everything marked published", || async {
        h.processed().await == 12
    })
    .await;
    shutdown(relay).await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_standby_takes_over_when_the_reader_dies_and_two_never_read_at_once() {
    let h = PgHarness::new().await;
    let active = RecordingPublisher::new();
    let standby = RecordingPublisher::new();
    let a = start(&h, &active, config("wal-active"));
    slot_ready(&h).await;
    let b = start(&h, &standby, config("wal-standby"));
    let outbox = h.outbox();
    let mut first = Vec::new();
    for i in 0..10 {
        first.push(outbox.enqueue(&h.pool, &event("a", i)).await.unwrap());
    }
    wait_until("the active relay delivered", || async {
        first.iter().all(|id| active.was_acked(*id))
    })
    .await;
    assert_eq!(standby.sent_count(), 0, "the standby read the slot too");
    let wal_side = h.pool_store().wal().named().await.unwrap();
    assert!(
        wal_side.reader_present().await.unwrap(),
        "a relay reads the slot"
    );

    a.abort();
    let mut second = Vec::new();
    for i in 10..20 {
        second.push(outbox.enqueue(&h.pool, &event("a", i)).await.unwrap());
    }
    wait_until_for("the standby took over", Duration::from_secs(15), || async {
        second.iter().all(|id| standby.was_acked(*id))
    })
    .await;
    shutdown(b).await;
    assert!(
        !wal_side.reader_present().await.unwrap(),
        "the reader lock outlived its relay"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn drain_exits_once_everything_committed_is_settled() {
    let h = PgHarness::new().await;
    let outbox = h.outbox();
    let p = RecordingPublisher::new();
    // A first run makes the slot; what is committed after it is in the stream.
    let mut cfg = config("wal-drain");
    cfg.exit_when_drained = true;
    tokio::time::timeout(DEADLINE, start(&h, &p, cfg.clone()).join())
        .await
        .unwrap()
        .unwrap();
    for i in 0..30 {
        outbox
            .enqueue(&h.pool, &event(&format!("o-{}", i % 3), i))
            .await
            .unwrap();
    }
    let stats = tokio::time::timeout(DEADLINE, start(&h, &p, cfg).join())
        .await
        .expect("the drain did not end")
        .unwrap();
    assert_eq!(stats.published, 30);
    assert_eq!(h.processed().await, 30);
    h.cleanup().await;
}

#[tokio::test]
async fn the_wal_source_on_another_database_is_a_usage_error() {
    let dir = std::env::temp_dir().join(format!("txo-wal-{}.db", Uuid::new_v4().simple()));
    let url = format!("sqlite://{}?mode=rwc", dir.display());
    let store = txoutbox::store::sqlite::SqliteStore::open(
        &url,
        txoutbox::OutboxTable::default(),
        2,
        txoutbox::store::Retention::Mark,
    )
    .await
    .unwrap();
    let p = RecordingPublisher::new();
    let err = Relay::new(store, p.boxed(), config("wal-sqlite"))
        .run(tokio_util::sync::CancellationToken::new())
        .await
        .unwrap_err();
    match err {
        RelayError::Config(e) => assert_eq!(e.field, "source", "{e}"),
        other => panic!("expected a usage error, got {other}"),
    }
    let _ = std::fs::remove_file(dir);
}

#[tokio::test]
async fn shutdown_mid_batch_confirms_only_what_was_settled() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    p.set_ack_delay(Duration::from_millis(50));
    let mut cfg = config("wal-shutdown");
    cfg.shutdown_timeout = Duration::from_millis(100);
    let relay = start(&h, &p, cfg.clone());
    streaming(&h).await;
    let outbox = h.outbox();
    // One transaction of 40 events over two aggregates: 20 acknowledgements of 50 ms in a row
    // each, so the shutdown lands in the middle of it.
    let events: Vec<NewEvent> = (0..40).map(|i| event(&format!("s-{}", i % 2), i)).collect();
    let ids = outbox.enqueue_many(&h.pool, &events).await.unwrap();
    wait_until("some acknowledged", || async { p.acked_count() >= 4 }).await;
    shutdown(relay).await;
    let first: HashSet<Uuid> = p.acked_ids().into_iter().collect();
    assert!(first.len() < 40, "the relay was done before the shutdown");

    // The transaction was not confirmed: a new relay reads all of it again, and publishes
    // what the first one did not settle (a row marked published is not sent twice).
    let settled: HashSet<Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM {} WHERE processed_at IS NOT NULL",
        h.table.qualified()
    ))
    .fetch_all(&h.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let p2 = RecordingPublisher::new();
    let relay = start(&h, &p2, cfg);
    wait_until("the rest delivered after the restart", || async {
        let again: HashSet<Uuid> = p2.acked_ids().into_iter().collect();
        ids.iter()
            .all(|id| again.contains(id) || settled.contains(id))
    })
    .await;
    assert!(
        p2.acked_ids().iter().all(|id| !settled.contains(id)),
        "an event settled as published went out again"
    );
    wait_until("all marked published", || async {
        h.processed().await == 40
    })
    .await;
    shutdown(relay).await;
    h.cleanup().await;
}

/// An event of bytes comes off the stream as written (bytea's binary form, a NUL and bytes
/// that are not UTF-8 included), with its content type, beside a JSON one; and a plain-SQL
/// insert of bytes with its own columns (the README's) goes out the same way.
#[tokio::test]
async fn bytes_come_off_the_stream_as_written() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("wal-bytes"));
    streaming(&h).await;
    let data = vec![0x08, 0x2a, 0x00, 0xff, 0x80, 0x7f];
    let outbox = h.outbox();
    let bytes = NewEvent::bytes(
        "order",
        "b",
        "order.placed",
        data.clone(),
        "application/x-protobuf",
    )
    .unwrap();
    let ids = outbox
        .enqueue_many(&h.pool, &[bytes, event("b", 1)])
        .await
        .unwrap();
    let plain: Uuid = sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type) \
         VALUES ('order', 'b', 'order.placed', 'null', '\\x0a0b'::bytea, 'application/vnd.test') RETURNING id",
        h.table.qualified()
    ))
    .fetch_one(&h.pool)
    .await
    .unwrap();
    wait_until("all three delivered", || async {
        ids.iter().chain([&plain]).all(|id| p.was_acked(*id))
    })
    .await;
    let acked = p.acked();
    let by_id = |id: Uuid| acked.iter().find(|m| m.id == id).unwrap().clone();
    let m = by_id(ids[0]);
    assert_eq!(
        (m.body, m.content_type.as_str()),
        (data, "application/x-protobuf")
    );
    let m = by_id(ids[1]);
    assert_eq!(m.content_type, "application/json");
    // jsonb's own text, as the table source sends it too.
    assert_eq!(m.body, br#"{"i": 1}"#);
    let m = by_id(plain);
    assert_eq!(
        (m.body, m.content_type.as_str()),
        (vec![0x0a, 0x0b], "application/vnd.test")
    );
    shutdown(relay).await;
    h.cleanup().await;
}
