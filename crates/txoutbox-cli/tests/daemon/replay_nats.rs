//! `txoutbox replay` to NATS JetStream on PostgreSQL: the messages a relay published, sent
//! again to another stream with the same subject, headers (the event id as `Nats-Msg-Id`) and
//! payload bytes, each aggregate in seq order, at the rate asked; what is not retained (pending,
//! dead, or deleted on settle) is never replayed; bad input is refused; `POST /api/v1/replay`
//! with and without the admin token. The rows of the table never change.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::*;

/// One JetStream message as the test compares it: subject (without the stream's prefix),
/// headers, payload.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Msg {
    pub subject: String,
    pub headers: BTreeMap<String, Vec<String>>,
    pub payload: Vec<u8>,
}

/// Every message of `s`, in stream order.
pub(crate) async fn messages(s: &TestStream) -> Vec<Msg> {
    let stream = s.js.get_stream(&s.name).await.expect("stream exists");
    let last = stream.cached_info().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.unwrap();
        let headers = m
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|v| v.to_string()).collect()))
            .collect();
        out.push(Msg {
            subject: m.subject.to_string().replacen(&s.prefix, "", 1),
            headers,
            payload: m.payload.to_vec(),
        });
    }
    out
}

/// Every row, every column, as JSON text in seq order: what "no row changed" compares.
pub(crate) async fn rows(db: &TestSchema) -> Vec<String> {
    sqlx::query_scalar(&format!(
        "SELECT to_jsonb(t)::text FROM {} t ORDER BY seq",
        db.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Events of three aggregates with headers and a payload whose digits a float would lose,
/// published by a relay to `first`.
async fn published(db: &TestSchema, first: &TestStream, n: i64) {
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers)
         SELECT 'order', (g % 3)::text, CASE WHEN g % 2 = 0 THEN 'order.paid' ELSE 'order.created' END,
                ('{{\"n\": ' || g || ', \"total\": 12345678901234567890.000000000000000001}}')::jsonb,
                jsonb_build_object('traceparent', '00-' || lpad(g::text, 32, '0') || '-' || lpad(g::text, 16, '0') || '-01')
         FROM generate_series(1, $1) g",
        db.table()
    ))
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
    let out = db
        .cli(&["relay", "--publisher", &first.publisher_url(), "--drain"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn replay_to_jetstream_sends_the_relayed_messages_per_aggregate_in_order_at_the_rate() {
    let db = TestSchema::migrated().await;
    let (first, second) = (TestStream::new().await, TestStream::new().await);
    published(&db, &first, 30).await;
    let before = rows(&db).await;
    let started = Instant::now();
    let out = db
        .cli(&[
            "replay",
            "--publisher",
            &second.publisher_url(),
            "--rate",
            "20/s",
        ])
        .await;
    let took = started.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed 30 event(s)"),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("guest"), "no secret printed");
    // 30 events at 20 a second: the last goes 29/20 s after the first (loosely).
    assert!(took >= Duration::from_millis(1200), "{took:?}");

    let (relayed, replayed) = (messages(&first).await, messages(&second).await);
    assert_eq!(replayed.len(), 30);
    let (mut a, mut b) = (relayed.clone(), replayed.clone());
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "subjects, headers and payload bytes as the relay sent them"
    );
    // Each aggregate's events in seq order (the payload's n grows with seq).
    let mut per: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for m in &replayed {
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let agg = m.headers["outbox-aggregate-id"][0].clone();
        per.entry(agg).or_default().push(v["n"].as_u64().unwrap());
    }
    assert_eq!(per.len(), 3);
    for (agg, ns) in &per {
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{agg}: {ns:?}");
    }
    assert!(
        String::from_utf8_lossy(&replayed[0].payload)
            .contains("12345678901234567890.000000000000000001"),
        "every digit"
    );
    assert_eq!(rows(&db).await, before, "replay changes no row");
    first.cleanup().await;
    second.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn only_retained_events_are_replayed_and_bad_input_is_refused() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    db.insert_events(6, 2).await;
    // Two published an hour and two days ago, one dead, the rest pending.
    let seq0 = db.scalar("SELECT min(seq) FROM {t}").await;
    sqlx::query(&format!(
        "UPDATE {t} SET processed_at = now(), created_at = now() - interval '1 hour' WHERE seq = $1",
        t = db.table()
    ))
    .bind(seq0)
    .execute(&db.pool)
    .await
    .unwrap();
    for (seq, sql) in [
        (
            seq0 + 1,
            "processed_at = now(), created_at = now() - interval '2 days'",
        ),
        (seq0 + 2, "dead_at = now(), last_error = 'x'"),
    ] {
        sqlx::query(&format!("UPDATE {} SET {sql} WHERE seq = $1", db.table()))
            .bind(seq)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let before = rows(&db).await;
    let count = |args: &'static [&'static str]| {
        let db = &db;
        async move {
            let mut all = vec!["replay", "--dry-run", "--json"];
            all.extend_from_slice(args);
            let out = db.cli(&all).await;
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
            v["replayed"].as_u64().unwrap()
        }
    };
    assert_eq!(count(&[]).await, 2, "published rows only");
    assert_eq!(count(&["--since", "3h"]).await, 1);
    assert_eq!(
        count(&["--created-before", "2999-01-01T00:00:00Z"]).await,
        2
    );
    assert_eq!(count(&["--aggregate-id", "1"]).await, 1, "seq0's g is 1");
    assert_eq!(stream.count().await, 0, "a dry run publishes nothing");

    let cases: &[(&[&str], i32, &str)] = &[
        (&["replay"], 2, "--publisher"),
        (&["replay", "--publisher", "bogus://x"], 2, "bogus"),
        (
            &["replay", "--dry-run", "--from-seq", "5", "--to-seq", "4"],
            2,
            "--to-seq 4 is below --from-seq 5",
        ),
        (&["replay", "--dry-run", "--since", "soon"], 2, "--since"),
        (&["replay", "--dry-run", "--rate", "0"], 2, "--rate"),
        (
            &[
                "replay",
                "--dry-run",
                "--created-after",
                "2024-05-02T00:00:00Z",
                "--created-before",
                "2024-05-01T00:00:00Z",
            ],
            2,
            "--created-before must be later",
        ),
        (
            &["replay", "--publisher", "nats://user:s3cret@127.0.0.1:1"],
            1,
            "cannot reach the broker",
        ),
    ];
    for (args, code, needle) in cases {
        let out = db.cli(args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("s3cret"), "{args:?}: {err}");
    }
    // The target from a file (a URL with a password is a secret).
    let file = std::env::temp_dir().join(unique("replay_publisher"));
    std::fs::write(&file, format!("{}\n", stream.publisher_url())).unwrap();
    let out = db
        .cli(&["replay", "--publisher-file", file.to_str().unwrap()])
        .await;
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed 2 event(s)"),
        "{}",
        stdout(&out)
    );
    assert_eq!(stream.count().await, 2);
    // Deleted on settle (the WAL source's default): nothing retained, and it says so.
    sqlx::query(&format!(
        "DELETE FROM {} WHERE processed_at IS NOT NULL",
        db.table()
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let out = db
        .cli(&["replay", "--publisher", &stream.publisher_url()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed 0 event(s)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("keeps no published events"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stream.count().await, 2, "nothing more sent");
    let after = rows(&db).await;
    assert_eq!(after.len(), before.len() - 2);
    stream.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn the_admin_api_replays_with_the_token_and_counts_without_it() {
    let db = TestSchema::migrated().await;
    let (first, second) = (TestStream::new().await, TestStream::new().await);
    published(&db, &first, 9).await;
    let before = rows(&db).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = db.spawn(&[
        "relay",
        "--publisher",
        "null:",
        "--admin-addr",
        &addr,
        "--admin-token",
        "t0ken",
    ]);
    wait_connected(port).await;
    let target = second.publisher_url();
    let body = serde_json::json!({ "publisher": target, "event_type": "order.paid" }).to_string();
    for token in [None, Some("wrong")] {
        let (status, text) = http(port, "POST", "/api/v1/replay", token, &body).await;
        assert_eq!(status, 401, "{token:?}: {text}");
    }
    let (status, text) = http(port, "POST", "/api/v1/replay", None, "not json").await;
    assert_eq!(
        status, 401,
        "a body that is no dry run needs the token first: {text}"
    );
    assert_eq!(second.count().await, 0, "refused: nothing sent");
    // A dry run is a read: open on loopback.
    let (status, text) = http(port, "POST", "/api/v1/replay", None, r#"{"dry_run": true}"#).await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["replayed"].as_u64(), v["dry_run"].as_bool()),
        (Some(9), Some(true))
    );
    for (bad, needle) in [
        (r#"{"publisher": "file:/tmp/x"}"#, "file:"),
        (r#"{"dry_run": true, "limit": 20000}"#, "limit"),
        (r#"{"dry_run": true, "colour": "red"}"#, "colour"),
        (r#"{"dry_run": true, "from_seq": 5, "to_seq": 1}"#, "to_seq"),
        (r#"{}"#, "publisher"),
    ] {
        let (status, text) = http(port, "POST", "/api/v1/replay", Some("t0ken"), bad).await;
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains(needle), "{bad}: {text}");
    }
    let (status, text) = http(port, "POST", "/api/v1/replay", Some("t0ken"), &body).await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // g = 2, 4, 6, 8 are paid.
    assert_eq!(v["replayed"], 4, "{text}");
    assert_eq!(v["by_event_type"]["order.paid"], 4, "{text}");
    assert_eq!(second.count().await, 4);
    let limited = serde_json::json!({ "publisher": target, "limit": 2 }).to_string();
    let (status, text) = http(port, "POST", "/api/v1/replay", Some("t0ken"), &limited).await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["replayed"], 2, "{text}");
    assert!(v["next_from_seq"].as_i64().is_some(), "{text}");
    // One replay per outbox at a time: while a slow one runs (3 events at 1 a second, to
    // `null:`), another call is a 409.
    let slow = tokio::spawn(http(
        port,
        "POST",
        "/api/v1/replay",
        Some("t0ken"),
        r#"{"publisher": "null:", "rate": 1, "limit": 3}"#,
    ));
    let mut refused = false;
    while !slow.is_finished() && !refused {
        let (status, text) =
            http(port, "POST", "/api/v1/replay", None, r#"{"dry_run": true}"#).await;
        refused = status == 409;
        assert!(status == 200 || refused, "{status}: {text}");
    }
    assert!(refused, "a second replay meanwhile is refused");
    let (status, text) = slow.await.unwrap();
    assert_eq!(status, 200, "{text}");
    stop(relay).await;
    assert_eq!(rows(&db).await, before, "replay changes no row");
    first.cleanup().await;
    second.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_broker_that_refuses_an_event_stops_the_replay_and_names_where_to_go_on() {
    let db = TestSchema::migrated().await;
    let s = TestStream::new().await;
    // A stream for order.created only: JetStream has no responder for order.paid.
    s.js.create_stream(async_nats::jetstream::stream::Config {
        name: s.name.clone(),
        subjects: vec![format!("{}.order.created", s.prefix)],
        ..Default::default()
    })
    .await
    .unwrap();
    // One aggregate, published, the fourth of six an order.paid.
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, processed_at)
         SELECT 'order', 'a', CASE WHEN g = 4 THEN 'order.paid' ELSE 'order.created' END,
                jsonb_build_object('n', g), now()
         FROM generate_series(1, 6) g",
        db.table()
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let seq0 = db.scalar("SELECT min(seq) FROM {t}").await;
    let before = rows(&db).await;
    let url = format!(
        "{}?stream={}&subject={}.{{event_type}}&create_stream=false",
        nats_url(),
        s.name,
        s.prefix
    );
    let out = db.cli(&["replay", "--publisher", &url]).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let resume = format!("--from-seq {}", seq0 + 3);
    assert!(err.contains(&resume), "{err}");
    assert!(err.contains("3 event(s) were replayed"), "{err}");
    assert_eq!(
        s.count().await,
        3,
        "the aggregate stops at its failed event"
    );
    // Going on past it sends the rest.
    let past = (seq0 + 4).to_string();
    let out = db
        .cli(&["replay", "--publisher", &url, "--from-seq", &past])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(s.count().await, 5);
    assert_eq!(rows(&db).await, before, "replay changes no row");
    s.cleanup().await;
    db.cleanup().await;
}
