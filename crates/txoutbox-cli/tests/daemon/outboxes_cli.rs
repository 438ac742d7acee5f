//! `[[outbox]]` entries: one relay process for two PostgreSQL schemas, an SQLite file and a
//! database that is down. The three that work deliver (one through routes to NATS and a file,
//! two sharing one file publisher), each counted under its `outbox` label; the broken one is
//! reported by the status, the admin API and `/readyz` without its password, and stops
//! nothing. Bad entries are one error each, before anything connects.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::*;

const PASSWORD: &str = "s3cr3t-pw";
const TOKEN: &str = "outboxes-test-token";

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique("txoutbox-outboxes"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, text: &str) -> String {
    let path = dir.join("outboxes.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn event_types(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["event_type"].as_str().unwrap().to_string()
        })
        .collect()
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test]
async fn outboxes_run_side_by_side_and_a_broken_one_stops_nothing() {
    let orders = TestSchema::migrated().await;
    let billing = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let dir = dir();
    let shared_file = dir.join("shared.jsonl");
    let rest_file = dir.join("rest.jsonl");
    let sqlite = dir.join("edge.db");
    // `orders` takes the database from the environment (DATABASE_URL) and sets only its schema;
    // the environment's TXOUTBOX_SCHEMA (orders' own schema, set by the harness) is overridden
    // by each entry that names one.
    let config = write(
        &dir,
        &format!(
            r#"
[relay]
poll_interval = "100ms"

[[outbox]]
name = "orders"
schema = "{orders_schema}"
publisher = "file:{shared}"

[[outbox]]
name = "billing"
database_url = "{db}"
schema = "{billing_schema}"
[[outbox.route]]
name = "invoices"
event_type = "invoice.*"
publisher = "{nats}"
[[outbox.route]]
name = "rest"
publisher = "file:{rest}"

[[outbox]]
name = "edge"
database_url = "sqlite://{sqlite}"
schema = "public"
publisher = "file:{shared}"
batch_size = 1

[[outbox]]
name = "down"
database_url = "postgres://postgres:{PASSWORD}@127.0.0.1:1/test"
publisher = "null:"

[[outbox]]
name = "nobroker"
schema = "{orders_schema}_nobroker"
publisher = "nats://127.0.0.1:2"
"#,
            orders_schema = orders.schema,
            billing_schema = billing.schema,
            db = database_url(),
            shared = shared_file.display(),
            rest = rest_file.display(),
            nats = stream.publisher_url(),
            sqlite = sqlite.display(),
        ),
    );
    // The SQLite outbox, migrated and written through --outbox.
    let out = orders
        .cli(&["--config", &config, "--outbox", "edge", "migrate"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("outbox edge: "),
        "{}",
        stdout(&out)
    );
    for (aggregate, event_type) in [("1", "edge.a"), ("1", "edge.b")] {
        let out = orders
            .cli(&[
                "--config",
                &config,
                "--outbox",
                "edge",
                "enqueue",
                "--aggregate-type",
                "device",
                "--aggregate-id",
                aggregate,
                "--event-type",
                event_type,
                "--payload",
                "{}",
            ])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // A command on one outbox needs --outbox when there are several.
    let out = orders.cli(&["--config", &config, "dlq", "list"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--outbox NAME")
            && stderr(&out).contains("orders, billing, edge, down, nobroker"),
        "{}",
        stderr(&out)
    );
    orders.insert_events(3, 1).await;
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) VALUES
         ('invoice', '9', 'invoice.sent', '{{}}'), ('invoice', '9', 'invoice.note', '{{}}'),
         ('customer', '4', 'customer.moved', '{{}}')",
        billing.table()
    ))
    .execute(&billing.pool)
    .await
    .unwrap();

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = orders.spawn(&[
        "--config",
        &config,
        "relay",
        "--admin-addr",
        &addr,
        "--admin-token",
        TOKEN,
    ]);
    wait_until(60, "every working outbox delivered", || {
        let (orders, billing, stream) = (&orders, &billing, &stream);
        let (shared_file, rest_file) = (&shared_file, &rest_file);
        async move {
            orders
                .scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                .await
                == 3
                && billing
                    .scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                    .await
                    == 3
                && event_types(shared_file).len() == 5
                && event_types(rest_file).len() == 1
                && stream.count().await == 2
        }
    })
    .await;
    // One file publisher served two outboxes; each aggregate in order.
    let shared = event_types(&shared_file);
    let edge: Vec<&String> = shared.iter().filter(|t| t.starts_with("edge.")).collect();
    assert_eq!(edge, ["edge.a", "edge.b"]);
    assert_eq!(shared.iter().filter(|t| *t == "order.created").count(), 3);
    assert_eq!(event_types(&rest_file), ["customer.moved"]);

    // The admin listener: every outbox, the broken one with why (and no password).
    wait_until(30, "the sampler's first readings", || async move {
        let (_, body) = http(port, "GET", "/api/v1/outboxes", None, "").await;
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["outboxes"].as_array().is_some_and(|l| {
            l.len() == 5 && l[..3].iter().all(|o| o["processed"].as_i64() > Some(0))
        })
    })
    .await;
    let (status, body) = http(port, "GET", "/api/v1/outboxes", None, "").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(PASSWORD), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = v["outboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders", "billing", "edge", "down", "nobroker"]);
    let down = &v["outboxes"][3];
    assert_eq!(down["running"], false, "{down}");
    assert!(
        down["error"].as_str().unwrap().contains("127.0.0.1:1"),
        "{down}"
    );
    // A broker that does not answer stops its outbox only, too.
    let nobroker = &v["outboxes"][4];
    assert_eq!(nobroker["running"], false, "{nobroker}");
    assert!(
        nobroker["error"].as_str().unwrap().contains("nobroker"),
        "{nobroker}"
    );
    assert_eq!(v["outboxes"][0]["running"], true);
    assert_eq!(
        v["outboxes"][0]["table"],
        format!("{}.outbox_events", orders.schema)
    );
    let (status, body) = http(port, "GET", "/api/v1/dead-letters", None, "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("?outbox=NAME"), "{body}");
    let (status, body) = http(port, "GET", "/api/v1/events?outbox=billing", None, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["events"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let (status, body) = http(port, "GET", "/api/v1/status?outbox=edge", None, "").await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["outbox"].as_str(), v["processed"].as_i64()),
        (Some("edge"), Some(2))
    );
    let (status, body) = http(port, "GET", "/api/v1/status?outbox=down", None, "").await;
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains(PASSWORD), "{body}");
    let (status, body) = http(port, "GET", "/api/v1/status?outbox=nope", None, "").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(port, "GET", "/readyz", None, "").await;
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outboxes"]["orders"]["ready"], true, "{v}");
    assert_eq!(v["outboxes"]["edge"]["ready"], true, "{v}");
    assert_eq!(v["outboxes"]["down"]["ready"], false, "{v}");
    assert!(!body.contains(PASSWORD), "{body}");

    // Metrics: every series under its outbox; none without the label.
    let (_, m) = http(port, "GET", "/metrics", None, "").await;
    let published = |o: &str| {
        metric(
            &m,
            &format!("outbox_events_published_total{{outbox=\"{o}\"}}"),
        )
    };
    assert_eq!(published("orders"), Some(3.0), "{m}");
    assert_eq!(published("billing"), Some(3.0), "{m}");
    assert_eq!(published("edge"), Some(2.0), "{m}");
    assert_eq!(published("down"), Some(0.0), "{m}");
    assert_eq!(metric(&m, "outbox_events_published_total"), None, "{m}");
    assert_eq!(
        metric(
            &m,
            r#"outbox_route_published_total{outbox="billing",route="invoices"}"#
        ),
        Some(2.0),
        "{m}"
    );
    assert!(
        m.contains(r#"outbox_events_pending{outbox="billing"}"#),
        "{m}"
    );
    // Series start at zero (the recorder is in place before the routes are built).
    assert_eq!(
        metric(
            &m,
            r#"outbox_route_failed_total{outbox="billing",route="invoices"}"#
        ),
        Some(0.0),
        "{m}"
    );
    assert!(
        m.contains(r#"outbox_oldest_pending_age_seconds{outbox="edge"}"#),
        "{m}"
    );
    for name in ["orders", "billing", "edge", "down", "nobroker"] {
        assert!(
            m.contains(&format!("outbox_relay_info{{outbox=\"{name}\",relay_id=")),
            "{m}"
        );
    }
    assert!(!m.contains(PASSWORD));

    // A dead letter is retried through its own outbox: the id is unknown to another one.
    let dead: uuid::Uuid = sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, dead_at, last_error)
         VALUES ('order', '77', 'order.poisoned', '{{}}', now(), 'test: poisoned') RETURNING id",
        orders.table()
    ))
    .fetch_one(&orders.pool)
    .await
    .unwrap();
    let retry = |outbox: &str| format!("/api/v1/dead-letters/{dead}/retry?outbox={outbox}");
    let (status, body) = http(port, "POST", &retry("billing"), Some(TOKEN), "").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(port, "POST", &retry("orders"), Some(TOKEN), "").await;
    assert_eq!(
        (status, body.contains("\"retried\":1")),
        (200, true),
        "{body}"
    );
    wait_until(30, "the retried event published by its outbox", || {
        let orders = &orders;
        async move {
            orders
                .scalar("SELECT count(*) FROM {t} WHERE event_type = 'order.poisoned' AND processed_at IS NOT NULL")
                .await
                == 1
        }
    })
    .await;
    assert!(event_types(&shared_file).contains(&"order.poisoned".to_string()));

    // `status` goes through every outbox; the one down fails alone.
    let out = orders.cli(&["--config", &config, "status"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    for name in ["orders", "billing", "edge"] {
        assert!(text.contains(&format!("outbox     {name}\n")), "{text}");
    }
    assert!(stderr(&out).contains("outbox `down`"), "{}", stderr(&out));
    // (nobroker's table does not exist: `status` says so too.)
    assert!(
        stderr(&out).contains("outbox `nobroker`"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains(PASSWORD), "{}", stderr(&out));
    let out = orders
        .cli(&[
            "--config", &config, "--outbox", "billing", "status", "--json",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (v["outbox"].as_str(), v["processed"].as_i64()),
        (Some("billing"), Some(3))
    );

    // SIGTERM stops every relay cleanly (the broken one too).
    stop(relay).await;
    std::fs::remove_dir_all(&dir).unwrap();
    stream.cleanup().await;
    orders.cleanup().await;
    billing.cleanup().await;
}

#[tokio::test]
async fn with_drain_a_broken_outbox_fails_alone_after_the_others_drained() {
    let good = TestSchema::migrated().await;
    let dir = dir();
    let out_file = dir.join("out.jsonl");
    let config = write(
        &dir,
        &format!(
            r#"
poll_interval = "100ms"
[[outbox]]
name = "good"
schema = "{schema}"
publisher = "file:{out}"
[[outbox]]
name = "unmigrated"
schema = "{schema}_none"
publisher = "file:{out}"
"#,
            schema = good.schema,
            out = out_file.display()
        ),
    );
    good.insert_events(4, 2).await;
    // The environment's publisher file loses to the outbox's own publisher (were it used, the
    // events would go to null:).
    let elsewhere = dir.join("publisher");
    std::fs::write(&elsewhere, "null:\n").unwrap();
    let out = good
        .command(&["--config", &config, "relay", "--drain"])
        .env("TXOUTBOX_PUBLISHER_FILE", &elsewhere)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("unmigrated"), "{err}");
    assert!(!err.contains("outbox(es) failed: good"), "{err}");
    assert_eq!(event_types(&out_file).len(), 4);
    assert_eq!(
        good.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
            .await,
        0
    );
    std::fs::remove_dir_all(&dir).unwrap();
    good.cleanup().await;
}

#[tokio::test]
async fn a_bad_outbox_entry_is_one_error_that_names_it() {
    let db = TestSchema::migrated().await;
    let dir = dir();
    let ok = "[[outbox]]\nname = \"a\"\npublisher = \"null:\"\n";
    let cases: Vec<(String, Vec<&str>, Vec<&str>)> = vec![
        (
            format!("{ok}[[outbox]]\nname = \"b\"\nbatch_sise = 3\n"),
            vec!["[[outbox]] number 2 (`b`)", "batch_sise"],
            vec![],
        ),
        (
            format!("{ok}[[outbox]]\nname = \"b\"\nadmin_addr = \"127.0.0.1:1\"\n"),
            vec!["(`b`)", "admin_addr", "the process's"],
            vec![],
        ),
        (
            format!("{ok}{ok}"),
            vec!["number 2 (`a`)", "unique"],
            vec![],
        ),
        (
            "[[outbox]]\npublisher = \"null:\"\n".to_string(),
            vec!["number 1", "name"],
            vec![],
        ),
        (
            format!("[[route]]\nname = \"r\"\npublisher = \"null:\"\n{ok}"),
            vec!["[[outbox.route]]"],
            vec![],
        ),
        (
            format!("{ok}[[outbox]]\nname = \"b\"\npublisher = \"null:\"\n[[outbox.route]]\nname = \"x\"\nevnt = \"y\"\n"),
            vec!["[[outbox]] `b` [[outbox.route]] number 1 (`x`)", "evnt"],
            vec![],
        ),
        (
            format!("{ok}[[outbox]]\nname = \"b\"\nbatch_size = \"many\"\n"),
            vec!["[[outbox]] number 2 (`b`): `batch_size`", "many", "whole number"],
            vec![],
        ),
        (
            format!("{ok}[[outbox]]\nname = \"b\"\n"),
            vec!["outbox `b`", "no publisher"],
            vec![],
        ),
        (
            format!("{ok}[[outbox]]\nname = \"b\"\npublisher = \"null:\"\n"),
            vec!["`a` and `b`", "same table"],
            vec![],
        ),
        (
            format!(
                "{ok}[[outbox]]\nname = \"b\"\nschema = \"x\"\ndatabase_url = \"postgres://u:{PASSWORD}@127.0.0.1:5432/test\"\npublisher = \"amqp://u:{PASSWORD}@127.0.0.1:5672/%2f?bogus=1\"\n"
            ),
            vec!["outbox `b`", "bogus"],
            vec![],
        ),
        (
            "slot = \"txo_one\"\n[[outbox]]\nname = \"a\"\nsource = \"wal\"\npublisher = \"null:\"\n\
             [[outbox]]\nname = \"b\"\ntable = \"other\"\nsource = \"wal\"\npublisher = \"null:\"\n"
                .to_string(),
            vec!["`a` and `b`", "txo_one", "its own `slot`"],
            vec![],
        ),
        (
            ok.to_string(),
            vec!["--outbox nope", "it has: a"],
            vec!["--outbox", "nope"],
        ),
        (
            "[[outbox]]\nname = \"a\"\nbatch_size = 5\npublisher = \"null:\"\n".to_string(),
            vec!["outbox `a` sets `batch_size`", "--batch-size"],
            vec!["--batch-size", "9"],
        ),
    ];
    for (file, wanted, flags) in &cases {
        let config = write(&dir, file);
        let mut args = vec!["--config", config.as_str(), "relay", "--drain"];
        args.extend(flags.iter().copied());
        let out = db.cli(&args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        for w in wanted {
            assert!(err.contains(w), "{file}: {w:?} not in {err}");
        }
        assert!(!err.contains(PASSWORD), "a password in: {err}");
        assert_eq!(
            err.lines().filter(|l| l.starts_with("error")).count(),
            1,
            "{err}"
        );
    }
    // --outbox without [[outbox]] entries.
    let out = db.cli(&["--outbox", "a", "status"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("[[outbox]]"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn a_failed_outbox_is_started_again_and_readiness_says_so_meanwhile() {
    let a = TestSchema::migrated().await;
    let b = TestSchema::new().await; // not migrated yet
    let dir = dir();
    let out_a = dir.join("a.jsonl");
    let out_b = dir.join("b.jsonl");
    let config = write(
        &dir,
        &format!(
            r#"
poll_interval = "100ms"
[[outbox]]
name = "a"
schema = "{}"
publisher = "file:{}"
[[outbox]]
name = "b"
schema = "{}"
publisher = "file:{}"
"#,
            a.schema,
            out_a.display(),
            b.schema,
            out_b.display()
        ),
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = a.spawn(&["--config", &config, "relay", "--admin-addr", &addr]);
    let running = |name: &'static str| async move {
        let (_, body) = http(port, "GET", "/api/v1/outboxes", None, "").await;
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["outboxes"]
            .as_array()
            .and_then(|l| l.iter().find(|o| o["name"] == name))
            .map(|o| o["running"] == true)
    };
    // b cannot start (no table); a runs, and readiness names b.
    a.insert_events(2, 1).await;
    wait_until(30, "a delivers while b is down", || {
        let out_a = &out_a;
        async move { event_types(out_a).len() == 2 && running("b").await == Some(false) }
    })
    .await;
    let (status, body) = http(port, "GET", "/readyz", None, "").await;
    assert_eq!(status, 503, "{body}");
    // Migrated, b starts by itself (the backoff is seconds) and delivers.
    let out = b
        .cli(&["--config", &config, "--outbox", "b", "migrate"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    b.insert_events(1, 1).await;
    wait_until(60, "b started again and delivered", || {
        let out_b = &out_b;
        async move { event_types(out_b).len() == 1 && running("b").await == Some(true) }
    })
    .await;
    wait_until(30, "ready", || async move {
        http(port, "GET", "/readyz", None, "").await.0 == 200
    })
    .await;
    // A relay that fails while running: not ready (although its database answers), then
    // started again once its table is back.
    sqlx::query(&format!("ALTER TABLE {} RENAME TO gone", a.table()))
        .execute(&a.pool)
        .await
        .unwrap();
    wait_until(60, "a reported not running", || async move {
        running("a").await == Some(false)
    })
    .await;
    let (status, body) = http(port, "GET", "/readyz", None, "").await;
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outboxes"]["a"]["database"], "ok", "{v}");
    assert!(v["outboxes"]["a"]["relay"].is_string(), "{v}");
    sqlx::query(&format!(
        "ALTER TABLE \"{}\".gone RENAME TO outbox_events",
        a.schema
    ))
    .execute(&a.pool)
    .await
    .unwrap();
    a.insert_events(1, 1).await;
    wait_until(90, "a started again and delivered", || {
        let out_a = &out_a;
        async move { event_types(out_a).len() == 3 && running("a").await == Some(true) }
    })
    .await;
    stop(relay).await;
    std::fs::remove_dir_all(&dir).unwrap();
    a.cleanup().await;
    b.cleanup().await;
}
