//! The dashboard's view of an outage through the router (`oneshot`): `GET /api/v1/readiness`
//! says what `/readyz` says, answered 200, and while the database's admin queries fail, since
//! when and why; every failed call counts in one outage. The database is a pool of a port
//! nothing listens on.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
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

struct DownBroker;

#[async_trait::async_trait]
impl Publisher for DownBroker {
    fn kind(&self) -> &'static str {
        "down"
    }
    async fn send(&self, _: &Message) -> Result<Ack, PublishError> {
        Err(PublishError::unavailable("down"))
    }
    async fn check(&self) -> Result<(), PublishError> {
        Err(PublishError::unavailable(
            "connection refused (amqp://guest:hunter2@127.0.0.1:1)",
        ))
    }
}

/// A relay of one table whose database and broker are both down.
fn down_state() -> SharedState {
    let dead_pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres:hunter2@127.0.0.1:1/test")
        .unwrap();
    let table = txoutbox::OutboxTable::default();
    let store: Arc<dyn Operator> = Arc::new(txoutbox::store::postgres::PgStore::new(
        dead_pool,
        table.clone(),
    ));
    let outbox = OutboxAdmin::new(None, table, None, Some(Arc::new(DownBroker)));
    outbox.connected(store.clone(), store);
    Arc::new(AdminState {
        auth: Auth::default(),
        metrics: None,
        secrets: vec!["hunter2".into()],
        outboxes: vec![Arc::new(outbox)],
    })
}

#[tokio::test]
async fn readiness_api_names_what_is_down_and_the_outage_of_the_queries() {
    let st = down_state();
    let (s, v) = get(&st, "/api/v1/readiness").await;
    assert_eq!(s, StatusCode::OK, "the call worked, whatever it says: {v}");
    assert_eq!(v["ready"], false, "{v}");
    assert_ne!(v["database"], "ok", "{v}");
    assert!(v["broker"].as_str().unwrap().contains("refused"), "{v}");
    assert!(v["stale_since"].is_null(), "no query has failed yet: {v}");
    assert!(v["last_error"].is_null(), "{v}");
    assert!(v["checked_at"].is_string(), "{v}");

    // A dashboard polling: every call fails, all in one outage.
    for _ in 0..3 {
        let (s, v) = get(&st, "/api/v1/dead-letters?limit=50").await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
        assert!(!v.to_string().contains("127.0.0.1"), "not echoed: {v}");
    }
    let down = st.outboxes[0].history.queries().down().unwrap();
    assert_eq!(down.failures, 3);
    let (_, v) = get(&st, "/api/v1/readiness").await;
    assert_eq!(v["stale_since"], serde_json::json!(down.since), "{v}");
    let last = v["last_error"].as_str().unwrap();
    assert!(last.contains("pool timed out"), "{last}");
    assert!(!v.to_string().contains("hunter2"), "{v}");
}
