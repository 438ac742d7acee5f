//! The binary on SQLite and MySQL/MariaDB: the store picked from the URL scheme, the demo
//! with no database given, one relay per SQLite file, and clear errors for what stays
//! PostgreSQL-only. Each test works in a directory of its own under the temp directory (and,
//! on MySQL, a database of its own on `MYSQL_URL`'s server), removed at the end.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::{stderr, stdout, unique};
use tokio::process::Command;

struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(unique("txo_sqlite_cli"));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    fn url(&self) -> String {
        format!("sqlite://{}", self.0.join("outbox.db").display())
    }
    /// The binary with this directory as its temp directory and, when `url` is given, as
    /// its database.
    fn command(&self, url: Option<&str>, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_txoutbox"));
        c.args(args)
            .env("TMPDIR", &self.0)
            .env_remove("DATABASE_URL")
            .env_remove("TXOUTBOX_SCHEMA")
            .env_remove("TXOUTBOX_TABLE")
            .env_remove("TXOUTBOX_PUBLISHER")
            .env_remove("TXOUTBOX_CONFIG")
            .env_remove("TXOUTBOX_ADMIN_ADDR")
            .env("TXOUTBOX_LOG", "info")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(u) = url {
            c.env("DATABASE_URL", u);
        }
        c
    }
    async fn run(&self, url: Option<&str>, args: &[&str]) -> Output {
        tokio::time::timeout(Duration::from_secs(120), self.command(url, args).output())
            .await
            .expect("command timed out")
            .expect("run txoutbox")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The README's first command with no server at all: an SQLite file in the temp directory,
/// named on stderr.
#[tokio::test]
async fn demo_runs_on_sqlite_when_no_database_is_given() {
    let dir = Dir::new();
    let events = dir.0.join("events.jsonl");
    let publisher = format!("file:{}", events.display());
    let out = dir
        .run(None, &["demo", "--orders", "25", "--publisher", &publisher])
        .await;
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let file = dir.0.join("txoutbox-demo.db");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(file.exists());
    assert!(
        err.contains("OK: every committed event was delivered"),
        "{err}"
    );
    let lines = std::fs::read_to_string(&events).unwrap();
    assert_eq!(
        lines.lines().count(),
        20,
        "25 orders, every 5th rolled back"
    );
}

/// migrate, enqueue, status, relay --drain and dlq on an sqlite:// URL.
#[tokio::test]
async fn migrate_enqueue_relay_status_on_sqlite() {
    let dir = Dir::new();
    let url = dir.url();
    let out = dir.run(Some(&url), &["status"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("txoutbox migrate"),
        "{}",
        stderr(&out)
    );
    let out = dir.run(Some(&url), &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("applied migration(s) [1, 2, 3]"),
        "{}",
        stdout(&out)
    );
    let out = dir.run(Some(&url), &["migrate"]).await;
    assert!(stdout(&out).contains("up to date"), "{}", stdout(&out));
    for i in 0..3 {
        let payload = format!("{{\"n\":{i}}}");
        let out = dir
            .run(
                Some(&url),
                &[
                    "enqueue",
                    "--aggregate-type",
                    "order",
                    "--aggregate-id",
                    "1",
                    "--event-type",
                    "order.created",
                    "--payload",
                    &payload,
                ],
            )
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = dir.run(Some(&url), &["status", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(status["pending"], 3, "{status}");

    let events = dir.0.join("out.jsonl");
    let publisher = format!("file:{}", events.display());
    let out = dir
        .run(Some(&url), &["relay", "--publisher", &publisher, "--drain"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let out = dir.run(Some(&url), &["status", "--json"]).await;
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["processed"], 3, "{status}");

    let out = dir.run(Some(&url), &["dlq", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // What stays PostgreSQL-only says so, with exit code 2.
    let out = dir.run(Some(&url), &["events", "list"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("needs PostgreSQL"),
        "{}",
        stderr(&out)
    );
    let out = dir
        .run(
            Some(&url),
            &[
                "relay",
                "--publisher",
                "null:",
                "--drain",
                "--admin-addr",
                "127.0.0.1:0",
            ],
        )
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("needs PostgreSQL"),
        "{}",
        stderr(&out)
    );
}

/// A second relay on the same file is refused while the first one runs.
#[tokio::test]
async fn a_second_relay_on_one_file_is_refused() {
    let dir = Dir::new();
    let url = dir.url();
    assert!(dir.run(Some(&url), &["migrate"]).await.status.success());
    let mut first = dir
        .command(Some(&url), &["relay", "--publisher", "null:"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first relay has registered (status lists it as live).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = dir.run(Some(&url), &["status", "--json"]).await;
        let s: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        let live = s["relays"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["alive"] == true));
        if live {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first relay never registered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = dir
        .run(Some(&url), &["relay", "--publisher", "null:", "--drain"])
        .await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("one relay per database file"), "{err}");
    first.kill().await.unwrap();
}

/// Unknown schemes and schemas SQLite has not got are usage errors; the scheme picks the
/// database (mysql:// on a closed port is a connection error, not a usage one).
#[tokio::test]
async fn scheme_errors_are_clear() {
    let dir = Dir::new();
    let out = dir
        .run(Some("mysql://root@127.0.0.1:1/test"), &["migrate"])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot connect to MySQL"),
        "{}",
        stderr(&out)
    );
    let out = dir.run(Some("redis://127.0.0.1"), &["migrate"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unsupported database URL"),
        "{}",
        stderr(&out)
    );
    let url = dir.url();
    let out = dir.run(Some(&url), &["--schema", "app", "migrate"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("SQLite has no schemas"),
        "{}",
        stderr(&out)
    );
}

fn mysql_url(database: &str) -> String {
    let base =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let mut u = url::Url::parse(&base).unwrap();
    u.set_path(&format!("/{database}"));
    u.to_string()
}

/// migrate, enqueue, relay --drain, status, dlq and demo on a mysql:// URL.
#[tokio::test]
async fn migrate_enqueue_relay_status_and_demo_on_mysql() {
    let dir = Dir::new();
    let name = unique("txo_cli");
    let admin = sqlx::MySqlPool::connect(&mysql_url("")).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE `{name}`"))
        .execute(&admin)
        .await
        .unwrap();
    let url = mysql_url(&name);
    let out = dir.run(Some(&url), &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("applied migration(s) [1, 2, 3]"),
        "{}",
        stdout(&out)
    );
    for i in 0..3 {
        let payload = format!("{{\"n\":{i}}}");
        let out = dir
            .run(
                Some(&url),
                &[
                    "enqueue",
                    "--aggregate-type",
                    "order",
                    "--aggregate-id",
                    "1",
                    "--event-type",
                    "order.created",
                    "--payload",
                    &payload,
                ],
            )
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let events = dir.0.join("out.jsonl");
    let publisher = format!("file:{}", events.display());
    let out = dir
        .run(Some(&url), &["relay", "--publisher", &publisher, "--drain"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let n: Vec<i64> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["payload"]["n"]
                .as_i64()
                .unwrap_or(-1)
        })
        .collect();
    assert_eq!(n.len(), 3);
    let out = dir.run(Some(&url), &["status", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (status["pending"].as_i64(), status["processed"].as_i64()),
        (Some(0), Some(3)),
        "{status}"
    );
    let out = dir.run(Some(&url), &["dlq", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let demo_events = dir.0.join("demo.jsonl");
    let publisher = format!("file:{}", demo_events.display());
    let out = dir
        .run(
            Some(&url),
            &["demo", "--orders", "25", "--publisher", &publisher],
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("OK: every committed event was delivered"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&demo_events)
            .unwrap()
            .lines()
            .count(),
        20
    );
    sqlx::query(&format!("DROP DATABASE `{name}`"))
        .execute(&admin)
        .await
        .unwrap();
}
