//! Databases whose server encoding is not UTF-8: the migrations apply (no character they
//! cannot hold in the SQL the project sends), and the WAL source delivers non-ASCII text as
//! the table source does (its replication connection asks for UTF-8, as sqlx's pool does).
#![allow(clippy::unwrap_used)]

use txoutbox::relay::Source;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use super::wal_ownership_pg::{config, OtherDatabase};
use crate::common::*;

#[tokio::test]
async fn migrate_applies_on_a_latin1_database() {
    let h = PgHarness::new().await;
    let db = OtherDatabase::create(&h, Some("LATIN1")).await;
    let migrated = txoutbox::migrate(&db.pool, &h.table).await;
    db.drop(&h).await;
    h.cleanup().await;
    migrated.unwrap();
}

#[tokio::test]
async fn on_a_win1252_database_both_sources_deliver_non_ascii_text_as_written() {
    let h = PgHarness::new().await;
    let db = OtherDatabase::create(&h, Some("WIN1252")).await;
    txoutbox::migrate(&db.pool, &h.table).await.unwrap();
    let text = "café – naïve € œuvre";
    for source in [Source::Wal, Source::Table] {
        let p = RecordingPublisher::new();
        let relay = txoutbox::testing::postgres::relay(
            db.store(&h),
            p.boxed(),
            config(&format!("enc-{}", source.as_str()), source),
        )
        .spawn();
        if source == Source::Wal {
            // Streaming: what commits now comes through the replication connection (an event
            // committed before the slot existed would go by the table path).
            wait_until("the WAL relay streams its slot", || async {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s \
                     JOIN pg_stat_replication r ON r.pid = s.active_pid \
                     WHERE s.database = current_database())",
                )
                .fetch_one(&db.pool)
                .await
                .unwrap()
            })
            .await;
        }
        let event = NewEvent::new(
            "order",
            text,
            "order.placed",
            &serde_json::json!({ "note": text }),
        )
        .unwrap();
        let id = h.outbox().enqueue(&db.pool, &event).await.unwrap();
        wait_until("the event delivered", || async { p.was_acked(id) }).await;
        let m = p.acked().into_iter().find(|m| m.id == id).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(body["note"], text, "{source:?}");
        assert_eq!(m.aggregate_id, text, "{source:?}");
        tokio::time::timeout(DEADLINE, relay.shutdown())
            .await
            .unwrap()
            .unwrap();
        // The WAL relay's slot goes before the table relay starts (one source per table).
        if source == Source::Wal {
            sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = current_database()",
            )
            .execute(&db.pool)
            .await
            .unwrap();
        }
    }
    db.drop(&h).await;
    h.cleanup().await;
}
