//! Tableless events (transactional logical messages, no row) on the WAL source against the
//! real server: delivered as written (JSON, bytes, headers) in commit order among the table's
//! events, from the library and from plain SQL with the same content; never from a rolled-back
//! transaction; other prefixes skipped; a failing one retried through the table path in order;
//! a malformed one dead-lettered, not a stall; and a slot lost under unconfirmed ones reported
//! as a gap.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use txoutbox::relay::{Relay, RelayConfig, RelayHandle, Source};
use txoutbox::retry::Backoff;
use txoutbox::store::postgres::wal::{self, pgoutput, TablelessGaps};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::{JsonPayload, NewEvent};
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

/// A relay whose WAL store records its gaps in `gaps`.
fn start(
    h: &PgHarness,
    p: &RecordingPublisher,
    cfg: RelayConfig,
    gaps: &TablelessGaps,
) -> RelayHandle {
    let store = h.pool_store();
    let wal = store.wal().with_gaps(gaps.clone());
    Relay::new(store, p.boxed(), cfg).with_wal(wal).spawn()
}

async fn shutdown(handle: RelayHandle) {
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay failed");
}

/// The ids the publisher first acknowledged for `aggregate`, in that order.
fn order_of(p: &RecordingPublisher, aggregate: &str) -> Vec<Uuid> {
    let mut seen = std::collections::HashSet::new();
    p.acked()
        .into_iter()
        .filter(|m| m.aggregate_id == aggregate && seen.insert(m.id))
        .map(|m| m.id)
        .collect()
}

#[tokio::test]
async fn tableless_events_are_delivered_as_written_in_commit_order_among_rows() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("tl-order"), &TablelessGaps::default());
    crate::wal_pg::streaming(&h).await;
    let outbox = h.outbox();
    let emit = h.table.derived("emit");

    let mut tx = h.pool.begin().await.unwrap();
    let r1 = outbox.enqueue(&mut *tx, &event("a", 1)).await.unwrap();
    let json = NewEvent::from_payload(
        "order",
        "a",
        "order.paid",
        JsonPayload::from_text(r#"{"total": 12345678901234567890.50, "deep": [[[1]]]}"#).unwrap(),
    )
    .header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let t2 = outbox.emit(&mut *tx, &json).await.unwrap();
    let bytes = NewEvent::bytes(
        "order",
        "a",
        "order.packed",
        vec![0, 0xff, 0x80, 0x2a],
        "application/x-protobuf",
    )
    .unwrap();
    let t3 = outbox.emit(&mut *tx, &bytes).await.unwrap();
    let r4 = outbox.enqueue(&mut *tx, &event("a", 4)).await.unwrap();
    tx.commit().await.unwrap();
    // Plain SQL, another transaction; then one rolled back; then other prefixes.
    let t5: Uuid = sqlx::query_scalar(&format!(
        "SELECT {emit}('order', 'a', 'order.shipped', '{{\"by\": \"sql\"}}', '{{\"x-from\": \"psql\"}}')"
    ))
    .fetch_one(&h.pool)
    .await
    .unwrap();
    let mut tx = h.pool.begin().await.unwrap();
    let gone = outbox.emit(&mut *tx, &event("a", 99)).await.unwrap();
    tx.rollback().await.unwrap();
    let other = format!("txoutbox:{}.other_events", h.schema);
    h.exec(&format!(
        "SELECT pg_logical_emit_message(true, 'someone-else', 'not an event'); \
         SELECT pg_logical_emit_message(true, '{other}', '\\x01'::bytea);"
    ))
    .await;
    let many = outbox
        .emit_many(&h.pool, &[event("b", 1), event("a", 6), event("b", 2)])
        .await
        .unwrap();

    wait_until("everything delivered", || async {
        [r1, t2, t3, r4, t5]
            .iter()
            .chain(&many)
            .all(|id| p.was_acked(*id))
    })
    .await;
    assert_eq!(order_of(&p, "a"), vec![r1, t2, t3, r4, t5, many[1]]);
    assert_eq!(order_of(&p, "b"), vec![many[0], many[2]]);
    assert!(
        !p.was_acked(gone),
        "a rolled-back tableless event was delivered"
    );
    let acked = p.acked();
    let msg = |id: Uuid| acked.iter().find(|m| m.id == id).unwrap();
    // JSON as jsonb prints it (what a row of it would hold), digits and depth kept.
    assert_eq!(
        String::from_utf8_lossy(&msg(t2).body),
        r#"{"deep": [[[1]]], "total": 12345678901234567890.50}"#
    );
    assert_eq!(msg(t2).content_type, "application/json");
    assert_eq!(
        msg(t2).headers.get("traceparent").map(String::as_str),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(msg(t3).body, vec![0, 0xff, 0x80, 0x2a]);
    assert_eq!(msg(t3).content_type, "application/x-protobuf");
    assert_eq!(
        msg(t5).headers.get("x-from").map(String::as_str),
        Some("psql")
    );
    assert_eq!(msg(t5).event_type, "order.shipped");
    // No row for a tableless event, nothing handed to the table.
    assert_eq!(
        h.count_where("handed_off_at IS NOT NULL OR dead_at IS NOT NULL")
            .await,
        0
    );
    assert_eq!(h.count_where("processed_at IS NULL").await, 0);
    shutdown(relay).await;
    h.cleanup().await;
}

/// The library calls the SQL function: one event written both ways in one transaction (the
/// same `now()`) is the same message, byte for byte.
#[tokio::test]
async fn the_library_and_plain_sql_write_the_same_content() {
    let h = PgHarness::new().await;
    wal::ensure_publication(&h.pool, &h.table).await.unwrap();
    let slot = format!("tl_same_{}", Uuid::new_v4().simple());
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(&slot)
        .execute(&h.pool)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    let e = NewEvent::from_payload(
        "order",
        "zoë-1",
        "order.placed",
        JsonPayload::from_text(r#"{"n": 1.50}"#).unwrap(),
    )
    .header("k", "v")
    .with_id(id);
    let b = NewEvent::bytes(
        "order",
        "b",
        "order.packed",
        vec![1, 2, 3],
        "application/x-protobuf",
    )
    .unwrap()
    .with_id(id);
    let (emit, emit_bytes) = (h.table.derived("emit"), h.table.derived("emit_bytes"));
    let mut tx = h.pool.begin().await.unwrap();
    h.outbox().emit(&mut *tx, &e).await.unwrap();
    sqlx::query(&format!(
        "SELECT {emit}('order', 'zoë-1', 'order.placed', '{{\"n\": 1.50}}', '{{\"k\": \"v\"}}', $1)"
    ))
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap();
    h.outbox().emit(&mut *tx, &b).await.unwrap();
    sqlx::query(&format!(
        "SELECT {emit_bytes}('order', 'b', 'order.packed', '\\x010203', 'application/x-protobuf', '{{}}', $1)"
    ))
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
         'proto_version', '1', 'publication_names', $2, 'messages', 'true')",
    )
    .bind(&slot)
    .bind(format!("\"{}\"", wal::publication_name(&h.table)))
    .fetch_all(&h.pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&h.pool)
        .await
        .unwrap();
    let contents: Vec<Vec<u8>> = rows
        .iter()
        .filter_map(|r| match pgoutput::decode(r).unwrap() {
            pgoutput::Message::Message {
                prefix,
                content,
                transactional,
                ..
            } => {
                assert!(transactional);
                assert_eq!(prefix, h.table.tableless_prefix());
                Some(content.to_vec())
            }
            _ => None,
        })
        .collect();
    assert_eq!(contents.len(), 4, "{contents:?}");
    assert_eq!(contents[0], contents[1], "JSON: the library and SQL differ");
    assert_eq!(
        contents[2], contents[3],
        "bytes: the library and SQL differ"
    );
    let got = wal::tableless::decode(&contents[0], wal::Lsn(1), chrono::Utc::now());
    assert!(got.problems.is_empty(), "{:?}", got.problems);
    assert_eq!(
        (got.event.id, got.event.payload.as_str()),
        (id, r#"{"n": 1.50}"#)
    );
    h.cleanup().await;
}

/// A publish that fails sends the tableless event to the table path (written as a row,
/// handed off): retried there, and the aggregate's later events, rows or not, go behind it.
#[tokio::test]
async fn a_failing_tableless_event_is_retried_through_the_table_path_in_order() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("tl-retry"), &TablelessGaps::default());
    crate::wal_pg::streaming(&h).await;
    let outbox = h.outbox();
    let failing = event("a", 2);
    p.fail_id_times(failing.id(), Fail::Transient, Some(3));
    let mut tx = h.pool.begin().await.unwrap();
    let r1 = outbox.enqueue(&mut *tx, &event("a", 1)).await.unwrap();
    let t2 = outbox.emit(&mut *tx, &failing).await.unwrap();
    let r3 = outbox.enqueue(&mut *tx, &event("a", 3)).await.unwrap();
    let t4 = outbox.emit(&mut *tx, &event("a", 4)).await.unwrap();
    let other = outbox.emit(&mut *tx, &event("b", 1)).await.unwrap();
    tx.commit().await.unwrap();
    let r5 = outbox.enqueue(&h.pool, &event("a", 5)).await.unwrap();
    let t6 = outbox.emit(&h.pool, &event("a", 6)).await.unwrap();
    wait_until("everything delivered", || async {
        [r1, t2, r3, t4, r5, t6, other]
            .iter()
            .all(|id| p.was_acked(*id))
    })
    .await;
    assert_eq!(order_of(&p, "a"), vec![r1, t2, r3, t4, r5, t6]);
    assert_eq!(
        p.send_times(t2).len(),
        4,
        "three failures, then the success"
    );
    wait_until("the table path settled its rows", || async {
        h.count_where("processed_at IS NULL AND dead_at IS NULL")
            .await
            == 0
    })
    .await;
    shutdown(relay).await;
    h.cleanup().await;
}

/// A message of this outbox's prefix that does not decode is written into the table as a dead
/// letter (saying why), and the stream goes on.
#[tokio::test]
async fn a_malformed_tableless_message_is_a_dead_letter_not_a_stall() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let relay = start(&h, &p, config("tl-bad"), &TablelessGaps::default());
    crate::wal_pg::streaming(&h).await;
    let prefix = h.table.tableless_prefix();
    h.exec(&format!(
        "SELECT pg_logical_emit_message(true, '{prefix}', '\\x02ffff'::bytea); \
         SELECT pg_logical_emit_message(true, '{prefix}', '\\x01'::bytea);"
    ))
    .await;
    let after = h.outbox().emit(&h.pool, &event("a", 1)).await.unwrap();
    wait_until("the next event delivered", || async { p.was_acked(after) }).await;
    wait_until("two dead letters", || async {
        h.count_where(
            "dead_at IS NOT NULL AND last_error LIKE 'undecodable row: tableless event: %'",
        )
        .await
            == 2
    })
    .await;
    assert_eq!(
        h.count_where("last_error LIKE '%content version 2%'").await,
        1,
        "the dead letter says why"
    );
    shutdown(relay).await;
    h.cleanup().await;
}

/// The slot dropped while tableless events wait unconfirmed: they are gone with it, and the
/// relay records the gap, naming a WAL range that covers them.
#[tokio::test]
async fn a_slot_lost_under_unconfirmed_tableless_events_is_reported_as_a_gap() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let gaps = TablelessGaps::default();
    let relay = start(&h, &p, config("tl-gap"), &gaps);
    crate::wal_pg::streaming(&h).await;
    let outbox = h.outbox();
    let first = outbox.emit(&h.pool, &event("a", 1)).await.unwrap();
    wait_until("the first delivered", || async { p.was_acked(first) }).await;
    // The broker answers slowly: what follows is read but not confirmed when the slot goes.
    p.set_ack_delay(Duration::from_secs(3));
    let mut lost = Vec::new();
    for i in 0..5 {
        lost.push(outbox.emit(&h.pool, &event("a", 10 + i)).await.unwrap());
    }
    let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    let written: wal::Lsn = written.parse().unwrap();
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
    p.set_ack_delay(Duration::ZERO);
    wait_until("the gap recorded", || async { gaps.last().is_some() }).await;
    let gap = gaps.last().unwrap();
    assert_eq!(gap.slot, slot);
    assert!(
        gap.from < written && written <= gap.to,
        "{gap}: not around {written}"
    );
    assert!(gap.to_string().contains("were not delivered"), "{gap}");
    // The relay reads on from the new slot.
    let later = outbox.emit(&h.pool, &event("a", 100)).await.unwrap();
    wait_until("a later event delivered", || async { p.was_acked(later) }).await;
    assert_eq!(gaps.all().len(), 1);
    shutdown(relay).await;
    h.cleanup().await;
}
