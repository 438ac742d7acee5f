//! The admin router through `oneshot`, against a real PostgreSQL schema per test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::store::postgres::PgStore;
use txoutbox::OutboxTable;

use super::*;

const TOKEN: &str = "t0ken-for-tests";

struct Db {
    pool: sqlx::PgPool,
    schema: String,
    table: OutboxTable,
}

fn db_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Readiness's own pool, as `ops::start_for_relay` makes it.
fn probe_pool() -> sqlx::PgPool {
    crate::ctx::connect_lazy(&db_url(), 1, api::PROBE_TIMEOUT).unwrap()
}

impl Db {
    async fn new() -> Self {
        let url = db_url();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        let schema = format!(
            "txo_admin_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let table = OutboxTable::new(&schema, "outbox_events").unwrap();
        txoutbox::migrate(&pool, &table).await.unwrap();
        Self {
            pool,
            schema,
            table,
        }
    }

    fn state(&self, token: Option<&str>, broker: Option<Arc<dyn Publisher>>) -> SharedState {
        self.state_on(token, broker, self.pool.clone(), "127.0.0.1:0")
    }

    /// The state of a listener on `addr`, its store on `pool`.
    fn state_on(
        &self,
        token: Option<&str>,
        broker: Option<Arc<dyn Publisher>>,
        pool: sqlx::PgPool,
        addr: &str,
    ) -> SharedState {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        Arc::new(AdminState {
            store: Arc::new(PgStore::new(pool, self.table.clone())),
            probe: probe_pool(),
            auth: Auth::new(token.map(String::from), addr.parse().unwrap()).unwrap(),
            metrics: Some(recorder.handle()),
            broker,
            relay_id: Some("relay-test".into()),
            history: Arc::default(),
            secrets: vec!["hunter2".into()],
        })
    }

    /// `n` events of `event_type`; the first `dead` of them dead-lettered.
    async fn insert(&self, n: i64, event_type: &str, dead: i64) -> Vec<(uuid::Uuid, i64)> {
        let t = self.table.qualified();
        let rows: Vec<(uuid::Uuid, i64)> = sqlx::query_as(&format!(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', g::text, $2, jsonb_build_object('n', g) FROM generate_series(1, $1) g
             RETURNING id, seq"
        ))
        .bind(n)
        .bind(event_type)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let ids: Vec<uuid::Uuid> = rows.iter().take(dead as usize).map(|r| r.0).collect();
        sqlx::query(&format!(
            "UPDATE {t} SET dead_at = now(), attempts = 10, last_error = 'boom' WHERE id = ANY($1)"
        ))
        .bind(&ids)
        .execute(&self.pool)
        .await
        .unwrap();
        rows
    }

    async fn dead_count(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE dead_at IS NOT NULL",
            self.table.qualified()
        ))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn cleanup(self) {
        sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", self.schema))
            .execute(&self.pool)
            .await
            .unwrap();
        self.pool.close().await;
    }
}

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

#[tokio::test]
async fn health_status_and_metrics() {
    let db = Db::new().await;
    db.insert(5, "order.created", 2).await;
    let st = db.state(None, None);
    assert_eq!(get(&st, "/healthz").await.0, StatusCode::OK);
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["database"], "ok");
    // Before the sampler's first reading there is nothing to show yet.
    let (s, v) = get(&st, "/api/v1/status").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    // The gauges and the status come from the refresher, not from the scrape or the call.
    sampler::refresh(&st.store, st.metrics.as_ref(), &st.history).await;
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

#[tokio::test]
async fn readiness_names_what_failed_without_secrets() {
    let db = Db::new().await;
    let st = db.state(None, Some(Arc::new(DownBroker)));
    let (s, v) = get(&st, "/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["database"], "ok");
    let broker = v["broker"].as_str().unwrap();
    assert!(
        broker.contains("refused") && !broker.contains("hunter2"),
        "{broker}"
    );
    // A database that does not answer.
    let dead_pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://postgres:hunter2@127.0.0.1:1/test")
        .unwrap();
    let st = Arc::new(AdminState {
        store: Arc::new(PgStore::new(dead_pool.clone(), db.table.clone())),
        probe: dead_pool,
        auth: Auth::default(),
        metrics: None,
        broker: None,
        relay_id: None,
        history: Arc::default(),
        secrets: vec!["hunter2".into()],
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
    db.cleanup().await;
}

#[tokio::test]
async fn listing_filters_and_pages() {
    let db = Db::new().await;
    let rows = db.insert(5, "order.created", 5).await;
    db.insert(3, "order.paid", 1).await;
    let st = db.state(None, None);
    let (s, v) = get(&st, "/api/v1/dead-letters?event_type=order.created&limit=2").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let events = v["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["last_error"], "boom");
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
    let (s, v) = get(&st, &format!("/api/v1/events/{}", rows[0].0)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["payload"]["n"], 1);
    let (s, _) = get(&st, &format!("/api/v1/events/{}", uuid::Uuid::new_v4())).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
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

#[tokio::test]
async fn changes_need_the_token() {
    let db = Db::new().await;
    let rows = db.insert(3, "order.created", 3).await;
    let id = rows[0].0;
    let st = db.state(Some(TOKEN), None);
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

    // Without a configured token, changes are off altogether.
    let open = db.state(None, None);
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

#[tokio::test]
async fn bulk_retry_and_discard_by_filter() {
    let db = Db::new().await;
    db.insert(4, "order.created", 4).await;
    db.insert(2, "order.paid", 2).await;
    let st = db.state(Some(TOKEN), None);
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
    sampler::refresh(&st.store, st.metrics.as_ref(), &st.history).await;
    let (_, v) = get(&st, "/api/v1/status").await;
    assert_eq!(v["pending"], 2, "retried events are pending again");
    db.cleanup().await;
}

#[tokio::test]
async fn dashboard_is_self_contained() {
    let db = Db::new().await;
    let st = db.state(None, None);
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

#[tokio::test]
async fn every_api_call_needs_the_token_off_loopback() {
    let db = Db::new().await;
    let rows = db.insert(2, "order.created", 1).await;
    let st = db.state_on(Some(TOKEN), None, db.pool.clone(), "0.0.0.0:8720");
    sampler::refresh(&st.store, st.metrics.as_ref(), &st.history).await;
    let id = rows[0].0;
    for uri in [
        "/api/v1/status".to_string(),
        "/api/v1/history".into(),
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
    let local = db.state(Some(TOKEN), None);
    sampler::refresh(&local.store, local.metrics.as_ref(), &local.history).await;
    assert_eq!(get(&local, "/api/v1/status").await.0, StatusCode::OK);
    assert_eq!(get(&local, "/api/v1/history").await.0, StatusCode::OK);
    db.cleanup().await;
}

/// Lock the outbox table against every reader until the transaction ends.
async fn lock_table(db: &Db) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        db.table.qualified()
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

#[tokio::test]
async fn status_is_served_from_the_sampler_without_a_query() {
    let db = Db::new().await;
    db.insert(5, "order.created", 1).await;
    let st = db.state(None, None);
    sampler::refresh(&st.store, st.metrics.as_ref(), &st.history).await;
    db.insert(7, "order.created", 0).await;
    // The last reading, not a count of its own (that would say 11).
    let (s, v) = get(&st, "/api/v1/status").await;
    assert_eq!((s, &v["pending"]), (StatusCode::OK, &Value::from(4)), "{v}");
    // With the table locked, a count would wait for the lock; the status does not.
    let tx = lock_table(&db).await;
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        get(&st, "/api/v1/status"),
    )
    .await;
    let elapsed = started.elapsed();
    tx.rollback().await.unwrap();
    let (s, v) = answer.expect("/api/v1/status waited for the table");
    assert_eq!((s, &v["dead"]), (StatusCode::OK, &Value::from(1)), "{v}");
    assert!(
        elapsed < std::time::Duration::from_millis(500),
        "{elapsed:?}"
    );
    sampler::refresh(&st.store, st.metrics.as_ref(), &st.history).await;
    assert_eq!(get(&st, "/api/v1/status").await.1["pending"], 11);
    db.cleanup().await;
}

#[tokio::test]
async fn readiness_answers_while_slow_queries_hold_the_admin_pool() {
    let db = Db::new().await;
    // The admin pool as the relay sizes it (3), every connection held by a slow query.
    let admin_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&db_url())
        .await
        .unwrap();
    let st = db.state_on(None, None, admin_pool.clone(), "127.0.0.1:0");
    let marker = format!("txo_slow_{}", &db.schema);
    let mut slow = Vec::new();
    for _ in 0..3 {
        let (pool, sql) = (
            admin_pool.clone(),
            format!("SELECT pg_sleep(30) /* {marker} */"),
        );
        slow.push(tokio::spawn(async move {
            let _ = sqlx::query(&sql).execute(&pool).await;
        }));
    }
    let count_sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{marker}%' AND state = 'active' \
         AND pid <> pg_backend_pid()"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let n: i64 = sqlx::query_scalar(&count_sql)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if n == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slow queries not running: {n}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), get(&st, "/readyz")).await;
    let elapsed = started.elapsed();
    sqlx::query(&format!(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%{marker}%' \
         AND pid <> pg_backend_pid()"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    for t in slow {
        let _ = t.await;
    }
    let (s, v) = answer.expect("/readyz did not answer");
    assert_eq!(s, StatusCode::OK, "{v} after {elapsed:?}");
    assert_eq!(v["database"], "ok");
    assert!(elapsed < std::time::Duration::from_secs(1), "{elapsed:?}");
    admin_pool.close().await;
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

#[tokio::test]
async fn publisher_errors_reach_last_error_and_the_api_redacted() {
    let db = Db::new().await;
    db.insert(1, "order.created", 0).await;
    let mut config = txoutbox::relay::RelayConfig::default();
    config.ordering = txoutbox::store::Ordering::Unordered;
    let relay = txoutbox::relay::Relay::new(
        PgStore::new(db.pool.clone(), db.table.clone()),
        Box::new(EchoingBroker),
        config,
    );
    let report = relay
        .run_once(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    let last: String =
        sqlx::query_scalar(&format!("SELECT last_error FROM {}", db.table.qualified()))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        last.contains("sasl_password=***") && last.contains("sasl.password"),
        "{last}"
    );
    let st = db.state(None, None);
    let (_, v) = get(&st, "/api/v1/events").await;
    for text in [last, v.to_string()] {
        for n in 1..=4 {
            assert!(!text.contains(&format!("pw-Echo-{n}")), "{text}");
        }
    }
    db.cleanup().await;
}

/// The relay's handle on the shared publisher answers what the publisher answers: behind a
/// wrapper that said "no" to `keeps_key_order`, Kafka lost its ordered pipelining.
#[test]
fn the_shared_publisher_forwards_what_the_relay_asks() {
    struct KeyOrdered;
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
    }
    let (relay_side, _) = SharedPublisher::split(Box::new(KeyOrdered));
    assert!(relay_side.keeps_key_order());
    let m = Message {
        id: uuid::Uuid::now_v7(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "1".into(),
        event_type: "created".into(),
        body: b"{}".to_vec(),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    };
    assert_eq!(relay_side.destination(&m).as_deref(), Some("topic.order"));
}
