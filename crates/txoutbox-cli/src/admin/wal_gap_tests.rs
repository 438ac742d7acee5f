//! `/readyz` of a WAL relay that lost tableless events with its slot: not ready, naming the
//! gap, while the database and the broker answer.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use txoutbox::store::postgres::wal::TablelessGap;
use txoutbox::store::Operator;

use super::*;

async fn get(state: &SharedState, uri: &str) -> (StatusCode, Value) {
    let res = router(state.clone())
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn readiness_names_a_gap_of_lost_tableless_events() {
    let url = txoutbox::testing::postgres::database_url();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let table = txoutbox::OutboxTable::default();
    let store: Arc<dyn Operator> = Arc::new(txoutbox::store::postgres::PgStore::new(
        pool.clone(),
        table.clone(),
    ));
    let outbox = OutboxAdmin::new(None, table, None, None);
    outbox.connected(store.clone(), store);
    let st = Arc::new(AdminState {
        auth: Auth::default(),
        metrics: None,
        secrets: Vec::new(),
        outboxes: vec![Arc::new(outbox)],
    });
    assert_eq!(get(&st, "/readyz").await.0, StatusCode::OK);
    st.outboxes[0].wal_gaps.push(TablelessGap {
        slot: "txoutbox_test_public_outbox_events".into(),
        from: "0/1A2B3C4".parse().unwrap(),
        to: "0/1A9F000".parse().unwrap(),
        found_at: chrono::Utc::now(),
    });
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(
        (v["database"].as_str(), v["broker"].as_str()),
        (Some("ok"), Some("ok"))
    );
    let gap = v["wal_gap"].as_str().unwrap();
    assert!(
        gap.contains("0/1A2B3C4") && gap.contains("0/1A9F000") && gap.contains("not delivered"),
        "{gap}"
    );
    pool.close().await;
}
