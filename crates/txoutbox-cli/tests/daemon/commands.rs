//! The CLI's commands and their errors, through the real binary.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use crate::common::*;

#[tokio::test]
async fn migrate_twice_is_a_noop() {
    let db = TestSchema::migrated().await;
    let out = db.cli(&["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("up to date"), "{}", stdout(&out));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM \"{}\".txoutbox_migrations",
            db.schema
        ))
        .await,
        i64::from(txoutbox::SCHEMA_VERSION),
        "each migration recorded once"
    );
    db.cleanup().await;
}

/// A runtime size that is not a number of threads is a usage error that names the variable,
/// not a panic of the runtime's builder; a good one is taken.
#[tokio::test]
async fn bad_worker_threads_are_refused_with_exit_2() {
    let db = TestSchema::new().await;
    for bad in ["0", "", "two", "-1"] {
        let out = db
            .command(&["migrate"])
            .env("TOKIO_WORKER_THREADS", bad)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("TOKIO_WORKER_THREADS"),
            "{bad:?}: {}",
            stderr(&out)
        );
    }
    let out = db
        .command(&["migrate"])
        .env("TOKIO_WORKER_THREADS", "3")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    db.cleanup().await;
}

#[tokio::test]
async fn bad_identifiers_are_refused_with_exit_2() {
    let db = TestSchema::new().await;
    for (flag, value) in [
        ("--table", "outbox; DROP TABLE x"),
        ("--schema", "a\"b"),
        ("--table", ""),
    ] {
        let out = db.cli(&[flag, value, "migrate"]).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value:?}: {}",
            stderr(&out)
        );
        let err = stderr(&out);
        assert!(err.contains("invalid"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line, got: {err}");
    }
    // Nothing was created.
    let exists = db
        .scalar(&format!(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = '{}'",
            db.schema
        ))
        .await;
    assert_eq!(exists, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn unmigrated_database_says_to_run_migrate() {
    let db = TestSchema::new().await;
    for args in [
        vec!["status"],
        // A relay service waits for the migration (docs/operations.md); a drain job cannot.
        vec!["relay", "--publisher", "null:", "--drain"],
        vec!["dlq", "list"],
        vec![
            "enqueue",
            "--aggregate-type",
            "a",
            "--aggregate-id",
            "1",
            "--event-type",
            "e",
            "--payload",
            "{}",
        ],
    ] {
        let out = db.cli(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains("txoutbox migrate"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    db.cleanup().await;
}

#[tokio::test]
async fn bad_settings_name_the_setting() {
    let db = TestSchema::migrated().await;
    let cases: &[(&[&str], &str)] = &[
        (&["relay", "--publisher", "bogus://x"], "bogus"),
        (
            &["relay", "--publisher", "null:", "--poll-interval", "fast"],
            "poll-interval",
        ),
        (
            &["relay", "--publisher", "null:", "--batch-size", "0"],
            "batch-size",
        ),
        (
            &["relay", "--publisher", "nats://127.0.0.1:4222?strem=X"],
            "strem",
        ),
        (
            &[
                "relay",
                "--publisher",
                "nats://127.0.0.1:4222?subject=a.{nope}",
            ],
            "nope",
        ),
        (&["relay"], "--publisher"),
        (
            &[
                "enqueue",
                "--aggregate-type",
                "a",
                "--aggregate-id",
                "1",
                "--event-type",
                "e",
                "--payload",
                "{oops",
            ],
            "--payload",
        ),
    ];
    for (args, needle) in cases {
        let out = db.cli(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    db.cleanup().await;
}

#[tokio::test]
async fn secrets_stay_out_of_errors() {
    let db = TestSchema::migrated().await;
    let out = db
        .cli(&[
            "relay",
            "--drain",
            "--publisher",
            "amqp://guest:s3cr3t-pw@127.0.0.1:1/%2f",
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("s3cr3t-pw"), "{}", stderr(&out));
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        db.command(&["status"])
            .env(
                "DATABASE_URL",
                "postgres://postgres:s3cr3t-pw@127.0.0.1:1/test",
            )
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!stderr(&out).contains("s3cr3t-pw"), "{}", stderr(&out));
    assert!(stderr(&out).contains("***"), "{}", stderr(&out));
    db.cleanup().await;
}

#[tokio::test]
async fn enqueue_status_and_file_relay() {
    let db = TestSchema::migrated().await;
    let out = db
        .cli(&[
            "enqueue",
            "--aggregate-type",
            "order",
            "--aggregate-id",
            "7",
            "--event-type",
            "order.paid",
            "--payload",
            r#"{"amount": 3}"#,
            "--header",
            "traceparent=00-abc-def-01",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let id: uuid::Uuid = stdout(&out).trim().parse().expect("prints the event id");
    let out = db.cli(&["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pending"], 1);
    assert_eq!(v["processed"], 0);

    let dir = std::env::temp_dir().join(unique("txo_file"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("events.jsonl");
    let url = format!("file:{}", path.display());
    let out = db.cli(&["relay", "--publisher", &url, "--drain"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["id"], id.to_string());
    assert_eq!(line["event_type"], "order.paid");
    assert_eq!(line["aggregate_id"], "7");
    assert_eq!(line["payload"]["amount"], 3);
    assert_eq!(line["headers"]["traceparent"], "00-abc-def-01");
    let out = db.cli(&["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pending"], 0);
    assert_eq!(v["processed"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn config_file_is_read_and_flags_win() {
    let db = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txo_cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("txoutbox.toml");
    std::fs::write(&cfg, "[relay]\npublisher = \"null:\"\nbatch_size = 0\n").unwrap();
    let cfg_s = cfg.display().to_string();
    // The file's bad batch size is reported...
    let out = db.cli(&["--config", &cfg_s, "relay", "--drain"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // ...and a flag overrides it.
    let out = db
        .cli(&["--config", &cfg_s, "relay", "--drain", "--batch-size", "10"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

/// The README's first command, on the test database: orders in transactions (some rolled
/// back), the relay, and the check that exactly the committed events were delivered.
#[tokio::test]
async fn demo_delivers_exactly_the_committed_events() {
    let db = TestSchema::new().await;
    let dir = std::env::temp_dir().join(unique("txo_demo"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("events.jsonl");
    let url = format!("file:{}", path.display());
    let out = db
        .cli(&["demo", "--orders", "25", "--publisher", &url])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("OK: every committed event was delivered"),
        "{}",
        stderr(&out)
    );
    // Its log went to a pipe: plain text, no colour codes.
    assert!(stderr(&out).contains("INFO"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains('\u{1b}'),
        "colour codes in a log written to a pipe: {:?}",
        stderr(&out)
    );
    let lines = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        lines.lines().count(),
        20,
        "25 orders, every 5th rolled back"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}
