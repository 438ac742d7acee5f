//! Operations through the real binary: the admin listener on a real socket, retention while
//! the relay publishes, CLI parity with the API, log format and redaction.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

const TOKEN: &str = "ops-test-token";

async fn http_json(port: u16, path: &str) -> Value {
    let (status, body) = http(port, "GET", path, None, "").await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Every metric the shipped dashboard and alert rules query, read from those files, is on
/// `/metrics` of a relay that has not published anything: a panel of a fresh relay shows 0,
/// not "no data", and an `increase()` alert sees the first failure.
#[tokio::test]
async fn a_fresh_relay_exposes_every_metric_the_dashboard_and_rules_query() {
    let db = TestSchema::migrated().await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut names = std::collections::BTreeSet::new();
    for file in [
        "grafana/txoutbox-dashboard.json",
        "prometheus/txoutbox-rules.yml",
    ] {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("outbox_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
            // Alert names and the like are CamelCase; metric names are snake_case. The WAL
            // source's series are a WAL relay's (`relay --source wal`), not this table relay's.
            let wal_only = name.starts_with("outbox_wal_");
            if !wal_only && (at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric()) {
                names.insert(name.to_string());
            }
            rest = &tail[end..];
        }
    }
    assert!(names.len() >= 10, "found only {names:?}");
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            &addr,
            "--metrics-interval",
            "100ms",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_connected(port).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = http(port, "GET", "/metrics", None, "").await;
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !m.contains(&format!("# TYPE {n} ")))
            .collect();
        if missing.is_empty() {
            for zero in [
                "outbox_events_published_total 0",
                "outbox_events_dead_lettered_total 0",
                "outbox_events_released_total 0",
                "outbox_settles_fenced_total 0",
                "outbox_batch_duration_seconds_count 0",
                "outbox_commit_to_publish_seconds_count 0",
            ] {
                assert!(m.lines().any(|l| l == zero), "no {zero:?} in:\n{m}");
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing:?} missing from /metrics of a fresh relay:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(relay).await;
}

#[tokio::test]
async fn admin_listener_serves_metrics_health_and_api() {
    let db = TestSchema::migrated().await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dead = db.insert_events(3, 3).await;
    sqlx::query(&format!(
        "UPDATE {} SET dead_at = now(), attempts = 10, last_error = 'boom' WHERE id = $1",
        db.table()
    ))
    .bind(dead[0])
    .execute(&db.pool)
    .await
    .unwrap();
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            &addr,
            "--metrics-interval",
            "100ms",
            "--relay-id",
            "ops-relay-1",
        ])
        .env("TXOUTBOX_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_connected(port).await;
    assert_eq!(http(port, "GET", "/healthz", None, "").await.0, 200);
    let ready = http_json(port, "/readyz").await;
    assert_eq!(ready["database"], "ok");
    assert_eq!(ready["broker"], "ok");
    // The two live events get published; the gauges follow within a refresh.
    let want = [
        "outbox_events_published_total 2",
        "outbox_events_dead 1",
        "outbox_events_pending 0",
        "outbox_events_leased 0",
        "outbox_relay_info{relay_id=\"ops-relay-1\"} 1",
        "outbox_oldest_pending_age_seconds",
        "outbox_batch_duration_seconds_bucket",
        "outbox_commit_to_publish_seconds_bucket",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, m) = http(port, "GET", "/metrics", None, "").await;
        let missing: Vec<&str> = want.iter().copied().filter(|w| !m.contains(w)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{missing:?} missing from:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = http_json(port, "/api/v1/status").await;
    assert_eq!(status["dead"], 1);
    assert_eq!(status["relay_id"], "ops-relay-1");
    // Refusals over the real socket, then the real thing.
    let retry = format!("/api/v1/dead-letters/{}/retry", dead[0]);
    assert_eq!(http(port, "POST", &retry, Some("nope"), "").await.0, 401);
    assert_eq!(http(port, "POST", &retry, None, "").await.0, 401);
    let (code, _) = http(
        port,
        "GET",
        "/api/v1/dead-letters?created_after=today",
        None,
        "",
    )
    .await;
    assert_eq!(code, 400);
    let (code, body) = http(port, "POST", &retry, Some(TOKEN), "").await;
    assert_eq!(code, 200, "{body}");
    wait_until(60, "the retried event published", || async {
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
            .await
            == 0
    })
    .await;
    stop(relay).await;
    db.cleanup().await;
}

#[tokio::test]
async fn non_loopback_admin_address_needs_a_token() {
    let db = TestSchema::migrated().await;
    let out = db
        .cli(&["relay", "--publisher", "null:", "--admin-addr", "0.0.0.0:0"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--admin-token"), "{}", stderr(&out));
    let out = db
        .cli(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            "localhost:x",
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--admin-addr"), "{}", stderr(&out));
    db.cleanup().await;
}

#[tokio::test]
async fn retention_purges_a_large_backlog_while_publishing() {
    let db = TestSchema::migrated().await;
    // 50,000 events published two days ago, and one old dead letter.
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, processed_at, created_at)
         SELECT 'order', (g % 100)::text, 'order.created', jsonb_build_object('n', g),
                now() - interval '2 days', now() - interval '2 days'
         FROM generate_series(1, 50000) g",
        db.table()
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, dead_at, created_at, attempts, last_error)
         VALUES ('order', 'x', 'order.created', '{{}}', now() - interval '3 days', now() - interval '3 days', 10, 'boom')",
        db.table()
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            "off",
            "--retention-period",
            "1d",
            "--retention-interval",
            "200ms",
            "--retention-batch",
            "2000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // New events keep coming while the purge runs; every one must be published.
    let mut written = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        db.insert_events(200, 50).await;
        written += 200;
        let old = db
            .scalar("SELECT count(*) FROM {t} WHERE processed_at < now() - interval '1 day'")
            .await;
        if old == 0 && written >= 1000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backlog not purged: {old} left"
        );
        tokio::task::yield_now().await;
    }
    wait_until(60, "every new event published", || async {
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL AND dead_at IS NULL")
            .await
            == 0
    })
    .await;
    // Recent published events are kept (1d), the dead letter too.
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
            .await,
        written
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        1
    );
    stop(relay).await;
    db.cleanup().await;
}

#[tokio::test]
async fn retention_period_zero_deletes_on_settle() {
    let db = TestSchema::migrated().await;
    db.insert_events(50, 5).await;
    let out = db
        .cli(&[
            "relay",
            "--publisher",
            "null:",
            "--drain",
            "--admin-addr",
            "off",
            "--retention-period",
            "0",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(db.scalar("SELECT count(*) FROM {t}").await, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn json_logs_carry_event_fields_and_no_passwords() {
    let db = TestSchema::migrated().await;
    db.insert_events(3, 3).await;
    let out = db
        .command(&[
            "--log-format",
            "json",
            "relay",
            "--publisher",
            "null:",
            "--drain",
            "--admin-addr",
            "off",
        ])
        .env("TXOUTBOX_LOG", "debug,sqlx=warn")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stderr(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let published: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "published")
        .collect();
    assert_eq!(published.len(), 3, "{}", stderr(&out));
    for l in published {
        for f in ["event_id", "event_type", "aggregate_id", "attempt"] {
            assert!(l["fields"].get(f).is_some(), "{f} missing: {l}");
        }
    }
    // Passwords never appear, also not in errors.
    let url = database_url().replace("postgres@", "postgres:pg-s3cr3t@");
    let out = db
        .command(&[
            "relay",
            "--publisher",
            "amqp://guest:amqp-s3cr3t@127.0.0.1:1/%2f",
            "--admin-addr",
            "off",
            // A service would wait for its broker; a drain job says why it cannot run.
            "--drain",
        ])
        .env("DATABASE_URL", &url)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(!err.contains("s3cr3t"), "{err}");
    let bad_db = "postgres://postgres:pg-s3cr3t@127.0.0.1:1/test";
    let out = db
        .command(&["status"])
        .env("DATABASE_URL", bad_db)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(!stderr(&out).contains("s3cr3t"), "{}", stderr(&out));
    db.cleanup().await;
}

#[test]
fn alert_rules_and_grafana_name_real_metrics() {
    use txoutbox::metrics as m;
    let known = [
        m::PUBLISHED_TOTAL,
        m::FAILED_TOTAL,
        m::PENDING,
        m::BATCH_DURATION_SECONDS,
        m::DEAD_LETTERED_TOTAL,
        m::COMMIT_TO_PUBLISH_SECONDS,
        m::CLAIMED_TOTAL,
        m::RELEASED_TOTAL,
        m::FENCED_TOTAL,
        m::LEASED,
        m::DEAD,
        m::OLDEST_PENDING_AGE_SECONDS,
        m::RELAY_INFO,
        m::PURGED_TOTAL,
        m::PARTITIONS_OWNED,
        m::WAL_SLOT_LAG_BYTES,
        m::WAL_SLOT_RETAINED_BYTES,
        m::WAL_LAG_SECONDS,
        m::WAL_CONFIRMED_LSN,
        m::WAL_SAFE_WAL_SIZE_BYTES,
        m::WAL_SLOT_ACTIVE,
        m::WAL_SLOT_STATUS,
        m::WAL_HANDED_OFF_TOTAL,
        m::WAL_SLOT_RECREATED_TOTAL,
        m::WAL_TABLELESS_GAP_TOTAL,
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let grafana =
        std::fs::read_to_string(root.join("deploy/grafana/txoutbox-dashboard.json")).unwrap();
    let _: Value = serde_json::from_str(&grafana).expect("the Grafana dashboard is JSON");
    for file in [
        "deploy/prometheus/txoutbox-rules.yml",
        "deploy/grafana/txoutbox-dashboard.json",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let names: Vec<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("outbox_"))
            .collect();
        assert!(!names.is_empty(), "{file}");
        for n in names {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            assert!(known.contains(&base), "{file}: unknown metric {n}");
        }
    }
}

/// Off loopback every `/api/` call needs the token, the status and the history included.
#[tokio::test]
async fn every_api_call_needs_the_token_off_loopback() {
    let db = TestSchema::migrated().await;
    db.insert_events(3, 3).await;
    let port = free_port();
    let addr = format!("0.0.0.0:{port}");
    let relay = db
        .command(&["relay", "--publisher", "null:", "--admin-addr", &addr])
        .args(["--metrics-interval", "100ms"])
        .env("TXOUTBOX_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_connected(port).await;
    for path in [
        "/api/v1/status",
        "/api/v1/history",
        "/api/v1/events",
        "/api/v1/dead-letters",
        "/api/v1/nothing",
    ] {
        let (code, body) = http(port, "GET", path, None, "").await;
        assert_eq!(code, 401, "{path} without the token: {body}");
        assert_eq!(
            http(port, "GET", path, Some("nope"), "").await.0,
            401,
            "{path}"
        );
    }
    wait_until(30, "a status reading", || async {
        http(port, "GET", "/api/v1/status", Some(TOKEN), "").await.0 == 200
    })
    .await;
    assert_eq!(
        http(port, "GET", "/api/v1/history", Some(TOKEN), "")
            .await
            .0,
        200
    );
    for path in ["/healthz", "/readyz", "/metrics", "/"] {
        assert_eq!(http(port, "GET", path, None, "").await.0, 200, "{path}");
    }
    stop(relay).await;
    db.cleanup().await;
}

/// With the outbox table locked (every admin query that reads it waits, and they hold the
/// admin pool's connections), `/readyz` and `/api/v1/status` still answer at once: the one has
/// its own connection and a query that touches no table, the other serves the sampler's last
/// reading.
#[tokio::test]
async fn readiness_and_status_answer_while_admin_queries_are_stuck() {
    let db = TestSchema::migrated().await;
    db.insert_events(3, 3).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = db
        .command(&["relay", "--publisher", "null:", "--admin-addr", &addr])
        .args(["--metrics-interval", "100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_connected(port).await;
    wait_until(30, "a status reading", || async {
        http(port, "GET", "/api/v1/status", None, "").await.0 == 200
    })
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        db.table()
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    // More slow requests than the admin pool has connections.
    let stuck: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { http(port, "GET", "/api/v1/events", None, "").await }))
        .collect();
    // The listings, the sampler's counts, and the retention purge when its first round
    // comes after the lock (it runs on the same pool): each holds a connection.
    wait_until(30, "the admin queries waiting for the lock", || async {
        db.scalar(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%{}%' \
             AND (query LIKE '%ORDER BY seq LIMIT $%' OR query LIKE '%count(*) FILTER%' \
                  OR query LIKE 'DELETE FROM %WHERE ctid = ANY%')",
            db.schema
        ))
        .await
            >= 3
    })
    .await;
    let timed = |path: &'static str| async move {
        let started = std::time::Instant::now();
        let r =
            tokio::time::timeout(Duration::from_secs(5), http(port, "GET", path, None, "")).await;
        (r, started.elapsed())
    };
    let (ready, ready_took) = timed("/readyz").await;
    let (status, status_took) = timed("/api/v1/status").await;
    tx.rollback().await.unwrap();
    for t in stuck {
        assert_eq!(
            t.await.unwrap().0,
            200,
            "the stuck requests finish after the lock"
        );
    }
    let (code, body) = ready.expect("/readyz did not answer while the admin pool was busy");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"database\":\"ok\""), "{body}");
    assert!(
        ready_took < Duration::from_secs(1),
        "/readyz took {ready_took:?}"
    );
    let (code, body) = status.expect("/api/v1/status did not answer while the table was locked");
    assert_eq!(code, 200, "{body}");
    assert!(
        status_took < Duration::from_secs(1),
        "/api/v1/status took {status_took:?}"
    );
    stop(relay).await;
    db.cleanup().await;
}
