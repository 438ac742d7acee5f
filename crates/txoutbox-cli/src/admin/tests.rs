//! The admin router through `oneshot`, against a real outbox per test on each database
//! (PostgreSQL, MySQL/MariaDB, SQLite): every check is written once, generic over the
//! library's test [`Harness`], and instantiated per database by [`per_database!`].
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use txoutbox::metrics::MetricLabels;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::store::{Operator, Retention};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use super::*;
use crate::ctx::Db;

const TOKEN: &str = "t0ken-for-tests";

/// One sampler reading of the state's only outbox.
async fn refresh(st: &SharedState) {
    let o = &st.outboxes[0];
    let store = o.store().unwrap();
    sampler::refresh(
        &*store,
        st.metrics.as_ref(),
        &o.history,
        MetricLabels::none(),
    )
    .await;
}

/// A fresh outbox on one database, and the admin listener's pools on it as
/// `txoutbox relay` makes them (`cmd::relay`): a store on a pool of 3, readiness on a pool of 1.
struct TestDb<H: Harness> {
    h: H,
    admin: Db,
}

impl<H: Harness> TestDb<H> {
    async fn new() -> Self {
        let h = H::new().await;
        let admin = Db::open(&h.url(), h.table(), 3).await.unwrap();
        Self { h, admin }
    }

    fn store(&self) -> Arc<dyn Operator> {
        Arc::from(self.admin.store(self.h.table(), Retention::Mark))
    }

    async fn probe(&self) -> Arc<dyn Operator> {
        let probe = self
            .admin
            .probe(&self.h.url(), self.h.table(), api::PROBE_TIMEOUT)
            .await
            .unwrap();
        Arc::from(probe.store(self.h.table(), Retention::Mark))
    }

    async fn state(&self, token: Option<&str>, broker: Option<Arc<dyn Publisher>>) -> SharedState {
        self.state_on(token, broker, "127.0.0.1:0").await
    }

    /// The state of a listener on `addr`.
    async fn state_on(
        &self,
        token: Option<&str>,
        broker: Option<Arc<dyn Publisher>>,
        addr: &str,
    ) -> SharedState {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let outbox = OutboxAdmin::new(
            None,
            self.h.table().clone(),
            Some("relay-test".into()),
            broker,
        );
        outbox.connected(self.store(), self.probe().await);
        Arc::new(AdminState {
            auth: Auth::new(token.map(String::from), addr.parse().unwrap()).unwrap(),
            metrics: Some(recorder.handle()),
            secrets: vec!["hunter2".into()],
            outboxes: vec![Arc::new(outbox)],
        })
    }

    /// `n` events of `event_type` (aggregate `order`/1..=n, payload `{"n": i}`), the first
    /// `dead` of them dead-lettered; their ids and seqs.
    async fn insert(&self, n: usize, event_type: &str, dead: usize) -> Vec<(uuid::Uuid, i64)> {
        let events: Vec<NewEvent> = (1..=n)
            .map(|i| {
                NewEvent::new(
                    "order",
                    i.to_string(),
                    event_type,
                    &serde_json::json!({ "n": i }),
                )
                .unwrap()
            })
            .collect();
        let ids = self.h.enqueue(&events).await;
        let store = self.h.store(Retention::Mark).await;
        txoutbox::testing::store::bury(&self.h, &store, &ids[..dead]).await;
        let rows = self.h.rows().await;
        ids.iter()
            .map(|id| (*id, rows.iter().find(|r| r.id == *id).unwrap().seq))
            .collect()
    }

    async fn dead_count(&self) -> usize {
        self.h
            .rows()
            .await
            .iter()
            .filter(|r| r.dead_at.is_some())
            .count()
    }

    /// Take every connection of the admin store's pool and keep them until dropped, as slow
    /// admin queries would.
    async fn hold_admin_pool(&self) -> Vec<Box<dyn std::any::Any + Send>> {
        let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
        for _ in 0..3 {
            held.push(match &self.admin {
                Db::Postgres(pool) => Box::new(pool.acquire().await.unwrap()),
                Db::Sqlite { pool, .. } => Box::new(pool.acquire().await.unwrap()),
                Db::Mysql { pool, .. } => Box::new(pool.acquire().await.unwrap()),
            });
        }
        held
    }

    async fn cleanup(self) {
        drop(self.admin);
        self.h.cleanup().await;
    }
}

/// Each check once per database: `mod postgres`, `mod mysql`, `mod sqlite`.
macro_rules! per_database {
    ($($name:ident),* $(,)?) => {
        per_database!(@db postgres, txoutbox::testing::postgres::PgHarness, $($name),*);
        per_database!(@db mysql, txoutbox::testing::mysql::MySqlHarness, $($name),*);
        per_database!(@db sqlite, txoutbox::testing::sqlite::SqliteHarness, $($name),*);
    };
    (@db $db:ident, $harness:ty, $($name:ident),*) => {
        mod $db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<$harness>().await;
                }
            )*
        }
    };
}

per_database!(
    health_status_and_metrics,
    readiness_names_the_broker_that_failed_without_secrets,
    listing_filters_and_pages,
    changes_need_the_token,
    bulk_retry_and_discard_by_filter,
    dashboard_is_self_contained,
    every_api_call_needs_the_token_off_loopback,
    status_is_served_from_the_sampler_without_a_query,
    readiness_answers_while_slow_queries_hold_the_admin_pool,
    publisher_errors_reach_last_error_and_the_api_redacted,
    lists_carry_a_payload_preview_and_one_event_its_whole_payload,
);

async fn call(
    state: &SharedState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: &str,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let res = router(state.clone())
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v, headers)
}

async fn get(state: &SharedState, uri: &str) -> (StatusCode, Value) {
    let (s, v, _) = call(state, "GET", uri, None, "").await;
    (s, v)
}

async fn health_status_and_metrics<H: Harness>() {
    let db = TestDb::<H>::new().await;
    db.insert(5, "order.created", 2).await;
    let st = db.state(None, None).await;
    assert_eq!(get(&st, "/healthz").await.0, StatusCode::OK);
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["database"], "ok");
    // Before the sampler's first reading there is nothing to show yet.
    let (s, v) = get(&st, "/api/v1/status").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    // The gauges and the status come from the refresher, not from the scrape or the call.
    refresh(&st).await;
    let (s, v) = get(&st, "/api/v1/status").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["pending"], 3);
    assert_eq!(v["dead"], 2);
    assert_eq!(v["relay_id"], "relay-test");
    assert!(v["sampled_at"].is_string(), "{v}");
    let (s, v, h) = call(&st, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert!(h[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(get(&st, "/api/v1/history").await.1["samples"][0]["dead"], 2);
    // The test's recorder is not the global one, so the text may be empty: no error is what
    // matters here; the real-listener test checks the series.
    assert!(v.is_string());
    db.cleanup().await;
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

async fn readiness_names_the_broker_that_failed_without_secrets<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let st = db.state(None, Some(Arc::new(DownBroker))).await;
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["database"], "ok");
    let broker = v["broker"].as_str().unwrap();
    assert!(
        broker.contains("refused") && !broker.contains("hunter2"),
        "{broker}"
    );
    db.cleanup().await;
}

/// A database that does not answer: readiness says so without the password, and the API
/// answers a generic 500.
#[tokio::test]
async fn readiness_names_a_database_that_does_not_answer_without_secrets() {
    let dead_pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://postgres:hunter2@127.0.0.1:1/test")
        .unwrap();
    let table = txoutbox::OutboxTable::default();
    let store = || -> Arc<dyn Operator> {
        Arc::new(txoutbox::store::postgres::PgStore::new(
            dead_pool.clone(),
            table.clone(),
        ))
    };
    let outbox = OutboxAdmin::new(None, table.clone(), None, None);
    outbox.connected(store(), store());
    let st = Arc::new(AdminState {
        auth: Auth::default(),
        metrics: None,
        secrets: vec!["hunter2".into()],
        outboxes: vec![Arc::new(outbox)],
    });
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_ne!(v["database"], "ok");
    assert_eq!(v["broker"], "ok");
    assert!(!v.to_string().contains("hunter2"));
    // Internal errors are not echoed.
    let (s, v) = get(&st, "/api/v1/events").await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!v.to_string().contains("127.0.0.1"), "{v}");
}

async fn listing_filters_and_pages<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let rows = db.insert(5, "order.created", 5).await;
    db.insert(3, "order.paid", 1).await;
    let st = db.state(None, None).await;
    let (s, v) = get(&st, "/api/v1/dead-letters?event_type=order.created&limit=2").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let events = v["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["last_error"], "poison");
    let next = v["next_after_seq"].as_i64().unwrap();
    assert_eq!(next, rows[1].1);
    let (_, v) = get(
        &st,
        &format!("/api/v1/dead-letters?event_type=order.created&limit=2&after_seq={next}"),
    )
    .await;
    assert_eq!(v["events"][0]["seq"], rows[2].1);
    let (_, v) = get(&st, "/api/v1/dead-letters?limit=1000").await;
    assert_eq!(v["events"].as_array().unwrap().len(), 6);
    assert!(v["next_after_seq"].is_null());
    // Time filters.
    let (_, v) = get(
        &st,
        "/api/v1/dead-letters?created_after=2999-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(v["events"].as_array().unwrap().len(), 0);
    let (_, v) = get(
        &st,
        "/api/v1/dead-letters?created_before=2999-01-01T00:00:00%2B02:00",
    )
    .await;
    assert_eq!(v["events"].as_array().unwrap().len(), 6);
    // Events in any state.
    let (_, v) = get(&st, "/api/v1/events?state=pending").await;
    assert_eq!(v["events"].as_array().unwrap().len(), 2);
    let (_, v) = get(&st, "/api/v1/events?aggregate_id=2&limit=1").await;
    assert_eq!(v["events"][0]["id"], rows[1].0.to_string());
    assert!(v["next_after_seq"].is_i64(), "order.paid 2 is next: {v}");
    let (s, v) = get(&st, &format!("/api/v1/events/{}", rows[0].0)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["payload"]["n"], 1);
    let (s, _) = get(&st, &format!("/api/v1/events/{}", uuid::Uuid::new_v4())).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = get(&st, &format!("/api/v1/dead-letters/{}", rows[0].0)).await;
    assert_eq!((s, &v["payload"]["n"]), (StatusCode::OK, &Value::from(1)));
    // Bad filters: 400 naming the filter.
    for (q, needle) in [
        ("created_after=yesterday", "created_after"),
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("after_seq=x", "after_seq"),
        ("colour=red", "colour"),
        ("state=pending", "state"),
        (
            "created_after=2024-02-01T00:00:00Z&created_before=2024-01-01T00:00:00Z",
            "created_before",
        ),
    ] {
        let (s, v) = get(&st, &format!("/api/v1/dead-letters?{q}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{q}: {v}");
    }
    let (s, v) = get(&st, "/api/v1/events/not-a-uuid").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = get(&st, "/api/v1/nothing").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    db.cleanup().await;
}

async fn changes_need_the_token<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let rows = db.insert(3, "order.created", 3).await;
    let id = rows[0].0;
    let st = db.state(Some(TOKEN), None).await;
    let uri = format!("/api/v1/dead-letters/{id}/retry");
    for token in [None, Some("wrong"), Some("t0ken-for-test")] {
        let (s, _, h) = call(&st, "POST", &uri, token, "").await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
    }
    let (s, _, _) = call(
        &st,
        "POST",
        "/api/v1/dead-letters/discard",
        Some("wrong"),
        r#"{"all": true}"#,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = call(
        &st,
        "DELETE",
        &format!("/api/v1/dead-letters/{id}"),
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(db.dead_count().await, 3, "nothing changed");

    let (s, v, _) = call(&st, "POST", &uri, Some(TOKEN), "").await;
    assert_eq!((s, &v["retried"]), (StatusCode::OK, &Value::from(1)));
    assert_eq!(db.dead_count().await, 2);
    let (s, _, _) = call(&st, "POST", &uri, Some(TOKEN), "").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no longer dead");
    let (s, v, _) = call(
        &st,
        "DELETE",
        &format!("/api/v1/dead-letters/{}", rows[1].0),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!((s, &v["discarded"]), (StatusCode::OK, &Value::from(1)));
    assert_eq!(db.h.rows().await.len(), 2, "the discarded row is gone");

    // Without a configured token, changes are off altogether.
    let open = db.state(None, None).await;
    let (s, v, _) = call(
        &open,
        "POST",
        &format!("/api/v1/dead-letters/{}/retry", rows[2].0),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(db.dead_count().await, 1);
    db.cleanup().await;
}

async fn bulk_retry_and_discard_by_filter<H: Harness>() {
    let db = TestDb::<H>::new().await;
    db.insert(4, "order.created", 4).await;
    db.insert(2, "order.paid", 2).await;
    let st = db.state(Some(TOKEN), None).await;
    for (body, needle) in [
        ("", "JSON body"),
        ("{}", "no filter"),
        (r#"{"colour": "red"}"#, "colour"),
        (r#"{"created_after": "soon"}"#, "created_after"),
        ("not json", "invalid JSON"),
    ] {
        let (s, v, _) = call(&st, "POST", "/api/v1/dead-letters/retry", Some(TOKEN), body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
    assert_eq!(db.dead_count().await, 6);
    let (s, v, _) = call(
        &st,
        "POST",
        "/api/v1/dead-letters/retry",
        Some(TOKEN),
        r#"{"event_type": "order.paid"}"#,
    )
    .await;
    assert_eq!((s, &v["retried"]), (StatusCode::OK, &Value::from(2)));
    let (s, v, _) = call(
        &st,
        "POST",
        "/api/v1/dead-letters/discard",
        Some(TOKEN),
        r#"{"all": true}"#,
    )
    .await;
    assert_eq!((s, &v["discarded"]), (StatusCode::OK, &Value::from(4)));
    assert_eq!(db.dead_count().await, 0);
    refresh(&st).await;
    let (_, v) = get(&st, "/api/v1/status").await;
    assert_eq!(v["pending"], 2, "retried events are pending again");
    db.cleanup().await;
}

async fn dashboard_is_self_contained<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let st = db.state(None, None).await;
    for (uri, kind) in [
        ("/", "text/html"),
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
    ] {
        let (s, v, h) = call(&st, "GET", uri, None, "").await;
        assert_eq!(s, StatusCode::OK, "{uri}");
        assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind));
        assert!(h[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("connect-src 'self'"));
        let text = v.as_str().unwrap();
        assert!(
            !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"),
            "{uri} must not load anything from elsewhere"
        );
    }
    assert_eq!(get(&st, "/assets/nope.js").await.0, StatusCode::NOT_FOUND);
    db.cleanup().await;
}

async fn every_api_call_needs_the_token_off_loopback<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let rows = db.insert(2, "order.created", 1).await;
    let st = db.state_on(Some(TOKEN), None, "0.0.0.0:8720").await;
    refresh(&st).await;
    let id = rows[0].0;
    for uri in [
        "/api/v1/status".to_string(),
        "/api/v1/history".into(),
        "/api/v1/readiness".into(),
        "/api/v1/events".into(),
        format!("/api/v1/events/{id}"),
        "/api/v1/dead-letters".into(),
        format!("/api/v1/dead-letters/{id}"),
        "/api/v1/nothing".into(),
    ] {
        for token in [None, Some("wrong")] {
            let (s, v, h) = call(&st, "GET", &uri, token, "").await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} {token:?}: {v}");
            assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
            assert!(!v.to_string().contains("order.created"), "{uri}: {v}");
        }
        let (s, v, _) = call(&st, "GET", &uri, Some(TOKEN), "").await;
        assert_ne!(s, StatusCode::UNAUTHORIZED, "{uri}: {v}");
    }
    assert_eq!(
        call(&st, "GET", "/api/v1/status", Some(TOKEN), "").await.1["dead"],
        1
    );
    // Probes, metrics and the page (which holds no data) stay open.
    for uri in ["/healthz", "/readyz", "/metrics", "/", "/assets/app.js"] {
        assert_eq!(get(&st, uri).await.0, StatusCode::OK, "{uri}");
    }
    // On loopback, reads stay open.
    let local = db.state(Some(TOKEN), None).await;
    refresh(&local).await;
    assert_eq!(get(&local, "/api/v1/status").await.0, StatusCode::OK);
    assert_eq!(get(&local, "/api/v1/history").await.0, StatusCode::OK);
    db.cleanup().await;
}

async fn status_is_served_from_the_sampler_without_a_query<H: Harness>() {
    let db = TestDb::<H>::new().await;
    db.insert(5, "order.created", 1).await;
    let st = db.state(None, None).await;
    refresh(&st).await;
    db.insert(7, "order.created", 0).await;
    // The last reading, not a count of its own (that would say 11).
    let (s, v) = get(&st, "/api/v1/status").await;
    assert_eq!((s, &v["pending"]), (StatusCode::OK, &Value::from(4)), "{v}");
    // With every connection of the store's pool taken, a count would wait; the status does not.
    let held = db.hold_admin_pool().await;
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(2), get(&st, "/api/v1/status")).await;
    let elapsed = started.elapsed();
    drop(held);
    let (s, v) = answer.expect("/api/v1/status waited for the database");
    assert_eq!((s, &v["dead"]), (StatusCode::OK, &Value::from(1)), "{v}");
    assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
    refresh(&st).await;
    assert_eq!(get(&st, "/api/v1/status").await.1["pending"], 11);
    db.cleanup().await;
}

async fn readiness_answers_while_slow_queries_hold_the_admin_pool<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let st = db.state(None, None).await;
    // The admin pool as the relay sizes it (3), every connection taken.
    let held = db.hold_admin_pool().await;
    // The store's own queries now wait for a connection...
    let blocked = tokio::time::timeout(
        Duration::from_millis(300),
        st.outboxes[0].store().unwrap().counts(),
    )
    .await;
    assert!(blocked.is_err(), "the admin pool is not exhausted");
    // ... and readiness, on its own connection, does not.
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(5), get(&st, "/readyz")).await;
    let elapsed = started.elapsed();
    drop(held);
    let (s, v) = answer.expect("/readyz did not answer");
    assert_eq!(s, StatusCode::OK, "{v} after {elapsed:?}");
    assert_eq!(v["database"], "ok");
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    db.cleanup().await;
}

/// A broker client that echoes its settings in its errors, as librdkafka does.
struct EchoingBroker;

#[async_trait::async_trait]
impl Publisher for EchoingBroker {
    fn kind(&self) -> &'static str {
        "echo"
    }
    async fn send(&self, _: &Message) -> Result<Ack, PublishError> {
        Err(PublishError::transient(
            "Kafka at kafka://u:pw-Echo-1@h:9092?sasl_password=pw-Echo-2&topic=t: produce",
        )
        .with_source(std::io::Error::other(
            "Client config error: Invalid value sasl.password pw-Echo-3 (sasl.password=pw-Echo-4)",
        )))
    }
}

async fn publisher_errors_reach_last_error_and_the_api_redacted<H: Harness>() {
    let db = TestDb::<H>::new().await;
    db.insert(1, "order.created", 0).await;
    let mut config = txoutbox::relay::RelayConfig::default();
    config.ordering = txoutbox::store::Ordering::Unordered;
    let relay = txoutbox::relay::Relay::new(
        db.h.store(Retention::Mark).await,
        Box::new(EchoingBroker),
        config,
    );
    let report = relay
        .run_once(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    let last = db.h.rows().await[0].last_error.clone().unwrap();
    assert!(
        last.contains("sasl_password=***") && last.contains("sasl.password"),
        "{last}"
    );
    let st = db.state(None, None).await;
    let (_, v) = get(&st, "/api/v1/events").await;
    for text in [last, v.to_string()] {
        for n in 1..=4 {
            assert!(!text.contains(&format!("pw-Echo-{n}")), "{text}");
        }
    }
    db.cleanup().await;
}

/// The relay's handle on a shared publisher answers what the publisher answers: behind a
/// wrapper that said "no" to `keeps_key_order`, Kafka lost its ordered pipelining. The relay
/// never closes it (tests/relay/pg.rs); its owner, the process, does, once.
#[tokio::test]
async fn a_shared_publisher_forwards_what_the_relay_asks() {
    #[derive(Default)]
    struct KeyOrdered(std::sync::atomic::AtomicUsize);
    #[async_trait::async_trait]
    impl Publisher for KeyOrdered {
        fn kind(&self) -> &'static str {
            "kafka"
        }
        fn keeps_key_order(&self) -> bool {
            true
        }
        fn destination(&self, m: &Message) -> Option<String> {
            Some(format!("topic.{}", m.aggregate_type))
        }
        async fn send(&self, _: &Message) -> Result<Ack, PublishError> {
            Err(PublishError::unavailable("not used"))
        }
        async fn close(&self) -> Result<(), PublishError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }
    let inner = Arc::new(KeyOrdered::default());
    let shared: Arc<dyn Publisher> = inner.clone();
    let m = Message {
        id: uuid::Uuid::now_v7(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "1".into(),
        event_type: "created".into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    };
    let relay_side: Box<dyn Publisher> = Box::new(shared.clone());
    assert_eq!(relay_side.kind(), "kafka");
    assert!(relay_side.keeps_key_order());
    assert_eq!(relay_side.destination(&m).as_deref(), Some("topic.order"));
    shared.close().await.unwrap();
    assert_eq!(
        inner.0.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "closed once, by its owner"
    );
}

/// A raw GET: status and body bytes, unparsed.
async fn get_raw(state: &SharedState, uri: &str) -> (StatusCode, Vec<u8>) {
    let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
    let res = router(state.clone()).oneshot(req).await.unwrap();
    let status = res.status();
    (
        status,
        res.into_body().collect().await.unwrap().to_bytes().to_vec(),
    )
}

/// The dashboard polls the dead-letter list every few seconds: a list carries each payload's
/// start and length, not megabytes of it; the event itself carries the whole payload, every
/// digit as stored.
async fn lists_carry_a_payload_preview_and_one_event_its_whole_payload<H: Harness>() {
    let db = TestDb::<H>::new().await;
    let blob = "x".repeat(1_000_000);
    // "a" before "blob" in every database's order (jsonb sorts keys by length).
    let text = format!(r#"{{"a": 12345678901234567.89, "blob": "{blob}"}}"#);
    let payload = txoutbox::JsonPayload::from_text(&text).unwrap();
    let events: Vec<NewEvent> = (0..2)
        .map(|i| NewEvent::from_payload("order", i.to_string(), "order.big", payload.clone()))
        .collect();
    let ids = db.h.enqueue(&events).await;
    let store = db.h.store(Retention::Mark).await;
    txoutbox::testing::store::bury(&db.h, &store, &ids).await;
    let st = db.state(None, None).await;
    for uri in ["/api/v1/dead-letters", "/api/v1/events?state=dead"] {
        let (s, body) = get_raw(&st, uri).await;
        assert_eq!(s, StatusCode::OK);
        assert!(
            body.len() < 4_000,
            "{uri}: {} bytes for two dead letters",
            body.len()
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        let e = &v["events"][0];
        assert!(e.get("payload").is_none(), "{uri}: {e}");
        assert_eq!(e["payload_truncated"], true);
        let length = e["payload_length"].as_u64().unwrap() as usize;
        assert!(length >= text.len() - 4, "{uri}: length {length}");
        let preview = e["payload_preview"].as_str().unwrap();
        assert!(
            preview
                .replace(' ', "")
                .starts_with(r#"{"a":12345678901234567.89"#),
            "{preview}"
        );
    }
    let (s, body) = get_raw(&st, &format!("/api/v1/dead-letters/{}", ids[0])).await;
    assert_eq!(s, StatusCode::OK);
    let body = String::from_utf8(body).unwrap();
    assert!(body.contains(&blob), "the whole payload");
    assert!(body.contains("12345678901234567.89"), "every digit");
    db.cleanup().await;
}
