//! What the dashboard is told while a dependency is down (docs/operations.md, "The
//! dashboard"): `GET /api/v1/readiness` says what `/readyz` says (the database, the broker, the
//! last error) on every relay, not only one of `[[outbox]]` entries; while the database is down
//! the status keeps its last reading, marked `stale_since`, and the relay logs the failing
//! admin queries once per outage, not once per poll. The broker that is down is a loopback
//! port nothing listens on; the database that goes down is a TCP relay of the test's own to the
//! shared server ([`DbProxy`]), which is never stopped.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

async fn get_json(port: u16, path: &str) -> (u16, Value) {
    let (status, body) = http(port, "GET", path, None, "").await;
    let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, v)
}

fn still_running(relay: &mut tokio::process::Child) {
    if let Ok(Some(status)) = relay.try_wait() {
        panic!("the relay exited ({status})");
    }
}

/// The admin side's complaints in the log: WARN and ERROR lines of the admin listener and its
/// sampler (their target is `txoutbox::admin::...`).
fn admin_complaints(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| (l.contains(" ERROR ") || l.contains(" WARN ")) && l.contains("admin"))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn readiness_api_says_the_broker_is_down_on_a_single_table_relay() {
    let db = TestSchema::migrated().await;
    let down = free_port();
    let port = free_port();
    let mut relay = db.spawn(&[
        "relay",
        "--publisher",
        &format!("nats://127.0.0.1:{down}?connect_timeout=1s"),
        "--admin-addr",
        &format!("127.0.0.1:{port}"),
        "--metrics-interval",
        "200ms",
    ]);
    wait_connected(port).await;
    // The listener is up before the database is connected: wait for both to be seen.
    wait_until(
        30,
        "/readyz answers 503 naming the broker, the database connected",
        || {
            still_running(&mut relay);
            async move {
                let (status, body) = http(port, "GET", "/readyz", None, "").await;
                let (_, v) = get_json(port, "/api/v1/readiness").await;
                status == 503 && body.contains(&down.to_string()) && v["database"] == "ok"
            }
        },
    )
    .await;
    let (status, v) = get_json(port, "/api/v1/readiness").await;
    assert_eq!(status, 200, "the dashboard's readiness call: {v}");
    assert_eq!(v["ready"], false, "{v}");
    assert_eq!(v["database"], "ok", "{v}");
    let broker = v["broker"].as_str().unwrap_or_default();
    assert!(
        broker.contains("unreachable") && broker.contains(&down.to_string()),
        "{v}"
    );
    assert!(v["stale_since"].is_null(), "the database answers: {v}");
    assert!(v["checked_at"].is_string(), "{v}");
    stop(relay).await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_database_outage_keeps_the_last_reading_stale_and_is_logged_once() {
    let db = TestSchema::migrated().await;
    db.insert_events(4, 4).await;
    let mut proxy = DbProxy::start().await;
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("txoutbox-dash-outage"));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("relay.log");
    eprintln!("relay logs to {}", log.display());
    let mut relay = db
        .command(&[
            "relay",
            // A broker that is never asked: the 4 events stay pending, the counts stay put.
            "--publisher",
            &format!("nats://127.0.0.1:{}?connect_timeout=1s", free_port()),
            "--admin-addr",
            &format!("127.0.0.1:{port}"),
            "--metrics-interval",
            "200ms",
        ])
        .env("DATABASE_URL", proxy.url())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    wait_connected(port).await;
    wait_until(
        30,
        "a status reading of the 4 pending events",
        || async move {
            let (s, v) = get_json(port, "/api/v1/status").await;
            s == 200 && v["pending"] == 4
        },
    )
    .await;
    assert_eq!(
        http(port, "GET", "/api/v1/dead-letters", None, "").await.0,
        200
    );

    proxy.cut();
    // Dashboards polling through the outage: every call that queries the database fails
    // (each after the admin pool's acquire timeout, so in two waves of five at once).
    for _ in 0..2 {
        still_running(&mut relay);
        let polls: Vec<_> = (0..5)
            .map(|_| tokio::spawn(get_json(port, "/api/v1/dead-letters?limit=50")))
            .collect();
        for p in polls {
            let (s, v) = p.await.unwrap();
            assert!(s == 500 || s == 503, "{s} {v}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let complaints = admin_complaints(&log);
    assert_eq!(
        complaints.len(),
        1,
        "one complaint per outage, not one per poll:\n{}",
        complaints.join("\n")
    );
    assert!(!complaints[0].contains("127.0.0.1:"), "{}", complaints[0]);
    // The last reading is still served, marked stale; readiness says what is down.
    let (s, v) = get_json(port, "/api/v1/status").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["pending"], 4, "{v}");
    assert!(v["stale_since"].is_string(), "{v}");
    let (s, v) = get_json(port, "/api/v1/readiness").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["ready"], false, "{v}");
    assert_ne!(v["database"], "ok", "{v}");
    assert!(v["stale_since"].is_string(), "{v}");
    assert!(v["last_error"].is_string(), "{v}");

    proxy.restore().await;
    wait_until(60, "the admin queries answer again", || {
        still_running(&mut relay);
        async move { http(port, "GET", "/api/v1/dead-letters", None, "").await.0 == 200 }
    })
    .await;
    wait_until(30, "the status reading fresh again", || async move {
        get_json(port, "/api/v1/status").await.1["stale_since"].is_null()
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let back: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("answer again"))
        .collect();
    assert_eq!(back.len(), 1, "one line when it ends:\n{text}");
    assert_eq!(admin_complaints(&log).len(), 1, "{text}");
    stop(relay).await;
    let _ = std::fs::remove_dir_all(&dir);
    db.cleanup().await;
}
