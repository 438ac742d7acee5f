//! A payload reaches the broker exactly as the database holds it, on both sources: JSON
//! numbers no `f64` holds (money with 17 significant digits, a 30-digit id, `1e400`, valid
//! `jsonb`) and nesting deeper than a default JSON parser takes, written with plain SQL as any
//! service would, are in the message body digit for digit, and none is dead-lettered as
//! undecodable.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use txoutbox::relay::{RelayConfig, Source};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::store::{holds_exact_json, EXACT_JSON};
use txoutbox::testing::Harness;

use crate::common::*;

/// 200 arrays deep: past serde_json's recursion limit (128), within `jsonb`'s.
fn deep_json() -> String {
    format!("{}7{}", "[".repeat(200), "]".repeat(200))
}

async fn delivers_payloads_as_stored(source: Source) {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let mut cfg = RelayConfig::default();
    cfg.source = source;
    cfg.relay_id = format!("exact-{source:?}");
    cfg.poll_interval = Duration::from_millis(100);
    let relay = txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), cfg).spawn();
    if source == Source::Wal {
        // What commits from now on comes through the stream, not the table path.
        crate::wal_pg::streaming(&h).await;
    }
    let sql = format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'o-1', 'order.paid', $1::jsonb), ('order', 'o-1', 'order.deep', $2::jsonb)",
        h.table.qualified()
    );
    sqlx::query(&sql)
        .bind(EXACT_JSON)
        .bind(deep_json())
        .execute(&h.pool)
        .await
        .unwrap();
    wait_until("both events acknowledged", || async {
        p.acked_count() >= 2
    })
    .await;
    tokio::time::timeout(DEADLINE, relay.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay failed");
    let acked = p.acked();
    let paid = acked.iter().find(|m| m.event_type == "order.paid").unwrap();
    holds_exact_json(&paid.body).unwrap_or_else(|e| panic!("{source:?}: {e}"));
    let deep = acked.iter().find(|m| m.event_type == "order.deep").unwrap();
    let squeezed: String = String::from_utf8(deep.body.clone())
        .unwrap()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    assert_eq!(squeezed, deep_json(), "{source:?}: the deep payload");
    assert_eq!(h.dead().await, 0, "{source:?}: nothing dead-lettered");
    h.cleanup().await;
}

#[tokio::test]
async fn the_table_source_delivers_json_payloads_digit_for_digit() {
    delivers_payloads_as_stored(Source::Table).await;
}

#[tokio::test]
async fn the_wal_source_delivers_json_payloads_digit_for_digit() {
    delivers_payloads_as_stored(Source::Wal).await;
}
