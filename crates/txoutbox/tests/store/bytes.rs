//! The binary payload columns as plain SQL writes them, on every database: the documented
//! insert of bytes works, and the table refuses a row that is neither one payload nor the
//! other (bytes beside a JSON payload, bytes without a content type, a content type alone).
#![allow(clippy::unwrap_used)]

use txoutbox::testing::mysql::MySqlHarness;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::sqlite::SqliteHarness;
use txoutbox::testing::Harness;

/// (payload, payload_bytes, content_type) as SQL literals, and whether the row is allowed.
fn cases(bytes: &str) -> Vec<(String, String, String, bool)> {
    let c = |p: &str, b: &str, t: &str, ok| (p.to_string(), b.to_string(), t.to_string(), ok);
    vec![
        c("'null'", bytes, "'application/x-protobuf'", true),
        c("'{\"a\": 1}'", "NULL", "NULL", true),
        c("'{\"a\": 1}'", bytes, "'application/x-protobuf'", false),
        c("'null'", bytes, "NULL", false),
        c("'null'", "NULL", "'application/x-protobuf'", false),
    ]
}

async fn check<H: Harness>(h: &H, table: &str, bytes: &str, exec: impl AsyncFn(String) -> bool) {
    for (payload, data, ct, ok) in cases(bytes) {
        let sql = format!(
            "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type) \
             VALUES ('order', '1', 'order.created', {payload}, {data}, {ct})"
        );
        assert_eq!(exec(sql.clone()).await, ok, "{sql}");
    }
    let rows = h.raw_rows().await;
    assert_eq!(rows.len(), 2, "only the allowed rows are there");
}

#[tokio::test]
async fn postgres_takes_one_payload_or_the_other() {
    let h = PgHarness::new().await;
    let table = h.table.qualified();
    check(&h, &table, "'\\x082a'::bytea", async |sql| {
        sqlx::query(&sql).execute(&h.pool).await.is_ok()
    })
    .await;
    h.cleanup().await;
}

#[tokio::test]
async fn mysql_takes_one_payload_or_the_other() {
    let h = MySqlHarness::new().await;
    check(&h, "outbox_events", "X'082A'", async |sql| {
        sqlx::query(&sql).execute(&h.pool).await.is_ok()
    })
    .await;
    h.cleanup().await;
}

#[tokio::test]
async fn sqlite_takes_one_payload_or_the_other() {
    let h = SqliteHarness::new().await;
    check(&h, "outbox_events", "X'082A'", async |sql| {
        sqlx::query(&sql).execute(&h.pool).await.is_ok()
    })
    .await;
    h.cleanup().await;
}

/// A writer upgraded before `txoutbox migrate` ran (the table still without migration 5's
/// columns) writes JSON events as before, one or several; only an event of bytes needs them.
#[tokio::test]
async fn json_writers_do_not_need_migration_5() {
    use txoutbox::NewEvent;
    let h = PgHarness::new().await;
    sqlx::query(&format!(
        "ALTER TABLE {} DROP COLUMN payload_bytes CASCADE, DROP COLUMN content_type CASCADE",
        h.table.qualified()
    ))
    .execute(&h.pool)
    .await
    .unwrap();
    let json = |n: i32| {
        NewEvent::new(
            "order",
            "1",
            "order.created",
            &serde_json::json!({ "n": n }),
        )
        .unwrap()
    };
    let outbox = h.outbox();
    outbox.enqueue(&h.pool, &json(1)).await.unwrap();
    outbox
        .enqueue_many(&h.pool, &[json(2), json(3)])
        .await
        .unwrap();
    assert_eq!(h.raw_rows().await.len(), 3);
    let bytes = NewEvent::bytes(
        "order",
        "1",
        "order.created",
        vec![1],
        "application/x-protobuf",
    )
    .unwrap();
    let e = outbox
        .enqueue(&h.pool, &bytes)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("payload_bytes"), "{e}");
    h.cleanup().await;
}
