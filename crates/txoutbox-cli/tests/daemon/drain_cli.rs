//! `relay --drain` as a scheduler runs it: an interrupted drain is not reported as a finished
//! one, and a long drain says how it is getting on.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

/// The exit status of a `--drain` stopped by a signal while events were left
/// (`EX_TEMPFAIL`: run it again to finish).
const INTERRUPTED: i32 = 75;

/// Insert `n` events that are not due for an hour: a drain cannot finish while they wait.
async fn insert_not_due(db: &TestSchema, n: i64) {
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, available_at)
         SELECT 'later', g::text, 'later.due', '{{}}'::jsonb, now() + interval '1 hour'
         FROM generate_series(1, $1) g",
        db.table()
    ))
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// A relay in the background whose stderr goes to a file this test reads.
fn spawn_logged(db: &TestSchema, args: &[&str]) -> (tokio::process::Child, PathBuf) {
    let log = std::env::temp_dir().join(format!("{}-{}.log", db.schema, unique("drain")));
    let file = std::fs::File::create(&log).unwrap();
    eprintln!("relay logs to {}", log.display());
    let child = db
        .command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    (child, log)
}

/// Wait until the relay logging to `log` has started (its signal handlers are in place).
async fn wait_started(log: &std::path::Path) {
    wait_until(60, "the relay to start", || async {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("relay started")
    })
    .await;
}

/// SIGTERM while five events are still pending: the drain did not finish, so the exit status
/// says so (not 0, not 1 or 2) and stderr says how many are left; on both sources.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_drain_exits_75_and_says_how_many_are_left() {
    for source in ["table", "wal"] {
        let db = TestSchema::migrated().await;
        insert_not_due(&db, 5).await;
        db.insert_events(20, 4).await;
        let (mut relay, log) = spawn_logged(
            &db,
            &[
                "relay",
                "--publisher",
                "null:",
                "--drain",
                "--source",
                source,
            ],
        );
        wait_started(&log).await;
        wait_until(60, "the due events to be published", || async {
            db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
                .await
                == 5
        })
        .await;
        signal(&relay, "TERM");
        let status = tokio::time::timeout(Duration::from_secs(30), relay.wait())
            .await
            .expect("relay exits after SIGTERM")
            .unwrap();
        let err = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(INTERRUPTED), "--source {source}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && last.contains("5 pending"),
            "--source {source}: the last line says what is left: {err}"
        );
        let _ = std::fs::remove_file(&log);
        // A drain that finishes is still a success.
        sqlx::query(&format!(
            "UPDATE {} SET available_at = now() WHERE processed_at IS NULL",
            db.table()
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        let out = db
            .cli(&[
                "relay",
                "--publisher",
                "null:",
                "--drain",
                "--source",
                source,
            ])
            .await;
        assert!(out.status.success(), "--source {source}: {}", stderr(&out));
        db.cleanup().await;
    }
}

/// While a drain has work left, the relay logs its progress every --metrics-interval:
/// published so far, pending, and the rate.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_drain_logs_its_progress() {
    let db = TestSchema::migrated().await;
    insert_not_due(&db, 5).await;
    db.insert_events(300, 10).await;
    let (relay, log) = spawn_logged(
        &db,
        &[
            "relay",
            "--publisher",
            "null:",
            "--drain",
            "--metrics-interval",
            "1s",
        ],
    );
    wait_until(60, "a progress line with the 300 published", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("INFO")
                    && l.contains("published=300")
                    && l.contains("pending=5")
                    && l.contains("/s")
            })
    })
    .await;
    signal(&relay, "TERM");
    let _ = std::fs::remove_file(&log);
    db.cleanup().await;
}

/// With `[[outbox]]` entries, the same: an outbox that had not drained when the signal came
/// is named with what it left, one that had drained is not, and the exit status is 75.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_drain_of_several_outboxes_names_what_each_left() {
    let waiting = TestSchema::migrated().await;
    let done = TestSchema::migrated().await;
    insert_not_due(&waiting, 3).await;
    done.insert_events(10, 2).await;
    let dir = std::env::temp_dir().join(unique("txoutbox-drain-outboxes"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("outboxes.toml");
    std::fs::write(
        &config,
        format!(
            "[[outbox]]\nname = \"waiting\"\nschema = \"{}\"\npublisher = \"null:\"\n\n\
             [[outbox]]\nname = \"done\"\nschema = \"{}\"\npublisher = \"null:\"\n",
            waiting.schema, done.schema
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let (mut relay, log) = spawn_logged(&waiting, &["--config", &config, "relay", "--drain"]);
    wait_until(60, "both relays to start", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("relay started")
            .count()
            >= 2
    })
    .await;
    wait_until(60, "the other outbox to drain", || async {
        done.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
            .await
            == 0
    })
    .await;
    signal(&relay, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .expect("relay exits after SIGTERM")
        .unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(INTERRUPTED), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("outbox `waiting`: 3 event(s)"),
        "{err}"
    );
    assert!(!last.contains("outbox `done`"), "{err}");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_dir_all(&dir);
    waiting.cleanup().await;
    done.cleanup().await;
}
