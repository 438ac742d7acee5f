//! `[[route]]` entries in the config file, through the real binary: each event reaches the
//! destination of the first route that matches it (a file and NATS JetStream), an unmatched one
//! is a dead letter that says so, `/metrics` counts per route, and a bad entry is one error
//! that names it, before anything is connected, with no secret in it.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use crate::common::*;

fn write_config(text: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(unique("txoutbox-routes"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("txoutbox.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The value of the series `name` (with its labels, as Prometheus renders them) on `/metrics`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn routes_send_each_event_to_its_destination_and_count_per_route() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let (dir, config) = write_config("");
    let orders_file = dir.join("orders.jsonl");
    std::fs::write(
        &config,
        format!(
            r#"
[relay]
poll_interval = "100ms"

[[route]]
name = "orders"
event_type = "order.*"
publisher = "file:{}"

[[route]]
name = "audit"
headers = {{ audit = "yes" }}
publisher = "{}"
"#,
            orders_file.display(),
            stream.publisher_url()
        ),
    )
    .unwrap();
    let t = db.table();
    sqlx::query(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
         ('order', '1', 'order.created', '{{}}', '{{\"audit\": \"yes\"}}'),
         ('order', '1', 'order.paid', '{{}}', '{{}}'),
         ('user', '7', 'user.login', '{{}}', '{{\"audit\": \"yes\"}}'),
         ('user', '7', 'user.deleted', '{{}}', '{{}}')"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = db.spawn(&[
        "--config",
        config.to_str().unwrap(),
        "relay",
        "--admin-addr",
        &addr,
    ]);
    wait_until(60, "three published and one dead letter", || {
        let db = &db;
        async move {
            db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                .await
                == 3
                && db
                    .scalar("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
                    .await
                    == 1
        }
    })
    .await;
    let to_file: Vec<String> = lines(&orders_file)
        .iter()
        .map(|l| l["event_type"].as_str().unwrap().to_string())
        .collect();
    // First match wins: order.created carries audit=yes too, and goes to `orders`.
    assert_eq!(to_file, ["order.created", "order.paid"]);
    assert_eq!(stream.count().await, 1, "only user.login went to NATS");
    let why: String = sqlx::query_scalar(&format!(
        "SELECT last_error FROM {t} WHERE event_type = 'user.deleted'"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(why.contains("no route matched"), "{why}");

    let (status, m) = http(port, "GET", "/metrics", None, "").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&m, r#"outbox_route_published_total{route="orders"}"#),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, r#"outbox_route_published_total{route="audit"}"#),
        Some(1.0)
    );
    assert_eq!(metric(&m, "outbox_route_unmatched_total"), Some(1.0));
    let (status, body) = http(port, "GET", "/readyz", None, "").await;
    assert_eq!(status, 200, "{body}");
    stop(relay).await;
    std::fs::remove_dir_all(&dir).unwrap();
    stream.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_bad_route_is_one_error_that_names_it_and_no_secret() {
    let db = TestSchema::migrated().await;
    let cases = [
        (
            "[[route]]\nname = \"orders\"\nevent_tpye = \"order.*\"\npublisher = \"null:\"\n",
            &["[[route]] number 1 (`orders`)", "event_tpye"][..],
        ),
        (
            "[[route]]\nname = \"a\"\npublisher = \"null:\"\n[[route]]\nname = \"b\"\nevent_type = \"x.[\"\npublisher = \"null:\"\n",
            &["[[route]] number 2 (`b`)", "x.["][..],
        ),
        (
            "[[route]]\nname = \"a\"\npublisher = \"null:\"\n[[route]]\nname = \"a\"\npublisher = \"null:\"\n",
            &["number 2 (`a`)", "unique"][..],
        ),
        (
            "[[route]]\nname = \"q\"\npublisher = \"amqp://u:s3cr3t-pw@127.0.0.1:5672/%2f?bogus=1\"\n",
            &["route `q`", "bogus"][..],
        ),
        (
            "[[route]]\nname = \"gone\"\npublisher = \"amqp://u:s3cr3t-pw@127.0.0.1:1/%2f?connect_timeout=2s\"\n",
            &["route `gone`"][..],
        ),
    ];
    for (file, wanted) in cases {
        let (dir, config) = write_config(file);
        let out = db
            .cli(&["--config", config.to_str().unwrap(), "relay", "--drain"])
            .await;
        let err = stderr(&out);
        assert!(!out.status.success(), "{file}: accepted");
        for w in wanted {
            assert!(err.contains(w), "{file}: {w:?} not in {err}");
        }
        assert!(!err.contains("s3cr3t-pw"), "a password in: {err}");
        assert_eq!(
            err.lines().filter(|l| l.starts_with("error")).count(),
            1,
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // A usage error exits 2.
    let (dir, config) = write_config(cases[0].0);
    let out = db
        .cli(&["--config", config.to_str().unwrap(), "relay"])
        .await;
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}
