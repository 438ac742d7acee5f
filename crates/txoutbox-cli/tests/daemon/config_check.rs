//! `txoutbox config check` through the real binary: every setting with where it came from
//! (flag, environment, config file key, default), secrets masked, the database and each
//! publisher checked for real, and an exit status that says what would fail.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Output;

use crate::common::*;

async fn run(db: &TestSchema, env: &[(&str, &str)], args: &[&str]) -> Output {
    db.cli_env(env, args).await
}

/// The line of the settings table for `key`, split into its words.
fn setting<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    out.lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .find(|w| w.first() == Some(&key))
        .unwrap_or_else(|| panic!("no line for {key} in:\n{out}"))
}

#[tokio::test]
async fn each_setting_says_where_it_came_from_and_the_checks_pass() {
    let db = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txoutbox-check"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("txoutbox.toml");
    std::fs::write(
        &config,
        format!(
            "[relay]\npoll_interval = \"250ms\"\npublisher = \"file:{}\"\n",
            dir.join("out.jsonl").display()
        ),
    )
    .unwrap();
    // The database URL with a password PostgreSQL ignores here (trust authentication): it
    // must never be shown.
    let url = database_url().replacen("postgres://postgres@", "postgres://postgres:s3cr3t-pw@", 1);
    let out = run(
        &db,
        &[("TXOUTBOX_BATCH_SIZE", "7"), ("DATABASE_URL", &url)],
        &[
            "--config",
            config.to_str().unwrap(),
            "config",
            "check",
            "--max-attempts",
            "3",
            "--admin-token",
            "t0ken-value-1",
        ],
    )
    .await;
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(
        setting(&text, "batch_size")[1..],
        ["7", "environment", "TXOUTBOX_BATCH_SIZE"]
    );
    assert_eq!(
        setting(&text, "max_attempts")[1..],
        ["3", "flag", "--max-attempts"]
    );
    let poll = setting(&text, "poll_interval");
    assert_eq!(poll[1], "250ms", "{text}");
    assert!(
        poll[2..]
            .join(" ")
            .starts_with("`relay.poll_interval` in config file"),
        "{text}"
    );
    assert_eq!(setting(&text, "lease")[2..], ["default"]);
    assert_eq!(setting(&text, "admin_token")[1], "***");
    assert!(
        setting(&text, "database_url")[1].contains(":***@"),
        "{text}"
    );
    for secret in ["s3cr3t-pw", "t0ken-value-1"] {
        assert!(!text.contains(secret), "{secret} shown:\n{text}");
        assert!(!stderr(&out).contains(secret), "{secret} logged");
    }
    assert!(text.contains("ok    database"), "{text}");
    assert!(text.contains("ok    publisher file:"), "{text}");
    // Nothing was relayed or written.
    assert!(
        !dir.join("out.jsonl").exists() || std::fs::read(dir.join("out.jsonl")).unwrap().is_empty()
    );
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn what_would_fail_is_said_and_the_exit_status_says_so() {
    let db = TestSchema::migrated().await;
    // A broker nobody listens on: a check that fails (exit 1), the database still checked.
    let down = free_port();
    let out = run(
        &db,
        &[],
        &[
            "config",
            "check",
            "--publisher",
            &format!("nats://127.0.0.1:{down}?connect_timeout=1s"),
        ],
    )
    .await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(text.contains("ok    database"), "{text}");
    assert!(text.contains("FAIL  publisher nats://127.0.0.1:"), "{text}");

    // A table that is not migrated: the database check fails.
    let fresh = TestSchema::new().await;
    let out = run(&fresh, &[], &["config", "check", "--publisher", "null:"]).await;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    assert!(text.contains("FAIL  database"), "{text}");
    assert!(text.contains("txoutbox migrate"), "{text}");

    // A setting that cannot work: exit 2, before anything connects.
    let out = run(
        &db,
        &[],
        &["config", "check", "--publisher", "null:", "--slot", "s"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stdout(&out).contains("--source wal"), "{}", stdout(&out));
    fresh.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn every_outbox_of_the_config_file_is_shown_and_checked() {
    let orders = TestSchema::migrated().await;
    let billing = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txoutbox-check-many"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("txoutbox.toml");
    std::fs::write(
        &config,
        format!(
            r#"
publisher = "null:"

[[outbox]]
name = "orders"
schema = "{}"
batch_size = 11

[[outbox]]
name = "billing"
schema = "{}"
"#,
            orders.schema, billing.schema
        ),
    )
    .unwrap();
    let out = run(
        &orders,
        &[],
        &["--config", config.to_str().unwrap(), "config", "check"],
    )
    .await;
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let at = |name: &str| text.find(&format!("outbox `{name}`")).unwrap();
    let (o, b) = (at("orders"), at("billing"));
    let orders_part = &text[o.min(b)..o.max(b)];
    let batch = setting(orders_part, "batch_size");
    assert_eq!(batch[1], "11", "{text}");
    assert!(
        batch[2..].join(" ").contains("[[outbox]] `orders`"),
        "{text}"
    );
    assert_eq!(text.matches("ok    database").count(), 2, "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
    orders.cleanup().await;
    billing.cleanup().await;
}
