//! The binary on SQLite and MySQL/MariaDB: the store picked from the URL scheme, the demo
//! with no database given, one relay per SQLite file; and the operator commands (`status`,
//! `events`, `dlq`) and the relay's admin listener written once and run on PostgreSQL, MySQL
//! and SQLite. Each test works in a directory of its own under the temp directory (and, on
//! MySQL, a database of its own on `MYSQL_URL`'s server), removed at the end.
#![allow(clippy::unwrap_used)]
#![cfg(all(feature = "sqlite", feature = "mysql"))]

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::{free_port, http, stderr, stdout, stop, unique, wait_until};
use tokio::process::Command;
use txoutbox::store::Retention;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

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

/// What `migrate` prints of a table it brought from nothing to this build's version.
fn all_applied() -> String {
    let all: Vec<i32> = (1..=txoutbox::SCHEMA_VERSION).collect();
    format!("applied migration(s) {all:?}")
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
    assert!(stdout(&out).contains(&all_applied()), "{}", stdout(&out));
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
    let out = dir.run(Some(&url), &["events", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
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
    // The WAL source's lean write path is PostgreSQL's: refused before anything is migrated.
    let out = dir.run(Some(&url), &["migrate", "--source", "wal"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("PostgreSQL's"), "{}", stderr(&out));
    assert!(!stdout(&out).contains("applied"), "{}", stdout(&out));
    let out = dir.run(Some(&url), &["migrate", "--source", "table"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// migrate, enqueue, relay --drain, status, dlq and demo on a mysql:// URL.
#[tokio::test]
async fn migrate_enqueue_relay_status_and_demo_on_mysql() {
    let dir = Dir::new();
    let h = txoutbox::testing::mysql::MySqlHarness::unmigrated().await;
    let url = h.url();
    let out = dir.run(Some(&url), &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&all_applied()), "{}", stdout(&out));
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
    h.cleanup().await;
}

/// Each check once per database: `mod postgres`, `mod mysql`, `mod sqlite`.
macro_rules! per_database {
    ($($name:ident),* $(,)?) => {
        per_database!(@db postgres, txoutbox::testing::postgres::PgHarness, $($name),*);
        per_database!(@db mysql, txoutbox::testing::mysql::MySqlHarness, $($name),*);
        per_database!(@db sqlite, txoutbox::testing::sqlite::SqliteHarness, $($name),*);
    };
    (@db $db:ident, $harness:ty, $($name:ident),*) => {
        mod $db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name::<$harness>().await;
                }
            )*
        }
    };
}

per_database!(
    operator_commands_filter_page_and_change,
    the_relay_serves_its_admin_listener,
);

/// The binary on the harness's outbox (its URL, schema and table), from a directory of its own.
fn on<H: Harness>(h: &H, dir: &Dir, args: &[&str]) -> Command {
    let mut c = dir.command(Some(&h.url()), args);
    c.env("TXOUTBOX_SCHEMA", h.table().schema().as_str())
        .env("TXOUTBOX_TABLE", h.table().table().as_str());
    c
}

async fn run_on<H: Harness>(h: &H, dir: &Dir, args: &[&str]) -> Output {
    tokio::time::timeout(Duration::from_secs(120), on(h, dir, args).output())
        .await
        .expect("command timed out")
        .expect("run txoutbox")
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `n` events (aggregate `order`/i, `order.paid` for even i, else `order.created`), the
/// first `dead` dead-lettered by the store.
async fn write<H: Harness>(h: &H, n: usize, dead: usize) -> Vec<uuid::Uuid> {
    let events: Vec<NewEvent> = (0..n)
        .map(|i| {
            let t = if i % 2 == 0 {
                "order.paid"
            } else {
                "order.created"
            };
            NewEvent::new("order", i.to_string(), t, &serde_json::json!({ "n": i })).unwrap()
        })
        .collect();
    let ids = h.enqueue(&events).await;
    let store = h.store(Retention::Mark).await;
    txoutbox::testing::store::bury(h, &store, &ids[..dead]).await;
    ids
}

/// `dlq` and `events` filter and page as the API does, show one event, retry and discard;
/// `status` counts what they did.
async fn operator_commands_filter_page_and_change<H: Harness>() {
    let h = H::new().await;
    let dir = Dir::new();
    let ids = write(&h, 4, 3).await; // ids[3] stays pending
    let out = run_on(&h, &dir, &["dlq", "list", "--json", "--limit", "2"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let first = json_lines(&out);
    assert_eq!(first.len(), 2);
    assert!(
        stderr(&out).contains("--after-seq"),
        "cursor for the next page: {}",
        stderr(&out)
    );
    let after = first[1]["seq"].as_i64().unwrap().to_string();
    let out = run_on(
        &h,
        &dir,
        &[
            "dlq",
            "list",
            "--json",
            "--limit",
            "2",
            "--after-seq",
            &after,
        ],
    )
    .await;
    let rest = json_lines(&out);
    assert_eq!(rest.len(), 1, "{}", stdout(&out));
    assert_eq!(rest[0]["id"], ids[2].to_string());
    assert!(!stderr(&out).contains("--after-seq"), "the last page");
    let out = run_on(
        &h,
        &dir,
        &["dlq", "list", "--json", "--event-type", "order.paid"],
    )
    .await;
    let paid: Vec<_> = json_lines(&out).iter().map(|v| v["id"].clone()).collect();
    assert_eq!(paid, [ids[0].to_string(), ids[2].to_string()]);
    let out = run_on(
        &h,
        &dir,
        &[
            "dlq",
            "list",
            "--json",
            "--created-after",
            "2999-01-01T00:00:00Z",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_lines(&out).len(), 0);
    let out = run_on(&h, &dir, &["dlq", "list", "--created-after", "yesterday"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("created-after"), "{}", stderr(&out));
    let out = run_on(
        &h,
        &dir,
        &["events", "list", "--json", "--state", "pending"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let pending = json_lines(&out);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["id"], ids[3].to_string());
    let out = run_on(
        &h,
        &dir,
        &["events", "list", "--json", "--aggregate-id", "1"],
    )
    .await;
    assert_eq!(json_lines(&out)[0]["id"], ids[1].to_string());
    let out = run_on(&h, &dir, &["events", "show", &ids[3].to_string(), "--json"]).await;
    assert_eq!(json_lines(&out)[0]["payload"]["n"], 3);
    let out = run_on(
        &h,
        &dir,
        &["events", "show", &uuid::Uuid::new_v4().to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "no such event");
    let out = run_on(&h, &dir, &["dlq", "show", &ids[3].to_string()]).await;
    assert_eq!(out.status.code(), Some(1), "not a dead letter");
    let out = run_on(&h, &dir, &["dlq", "show", &ids[1].to_string()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("poison"), "{}", stdout(&out));
    let out = run_on(
        &h,
        &dir,
        &[
            "dlq",
            "retry",
            "--all",
            "--event-type",
            "order.created",
            "--json",
        ],
    )
    .await;
    assert_eq!(json_lines(&out)[0]["retried"], 1, "{}", stderr(&out));
    let out = run_on(&h, &dir, &["dlq", "retry", &ids[1].to_string()]).await;
    assert_eq!(out.status.code(), Some(1), "no longer dead");
    let out = run_on(&h, &dir, &["dlq", "discard", "--all", "--json"]).await;
    assert_eq!(json_lines(&out)[0]["discarded"], 2, "{}", stderr(&out));
    let out = run_on(&h, &dir, &["status", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            v["pending"].as_i64(),
            v["dead"].as_i64(),
            v["leased"].as_i64()
        ),
        (Some(2), Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(h.rows().await.len(), 2, "the discarded rows are gone");
    h.cleanup().await;
}

/// `txoutbox relay --admin-addr` serves readiness, the status, the API and `/metrics` on
/// every database, and a dead letter retried through the API is delivered.
async fn the_relay_serves_its_admin_listener<H: Harness>() {
    let h = H::new().await;
    let dir = Dir::new();
    let ids = write(&h, 3, 1).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let token = "admin-test-token";
    let events = dir.0.join("out.jsonl");
    let publisher = format!("file:{}", events.display());
    let relay = on(
        &h,
        &dir,
        &["relay", "--publisher", &publisher, "--admin-addr", &addr],
    )
    .args(["--metrics-interval", "100ms", "--admin-token", token])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let delivered = || {
        std::fs::read_to_string(&events)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    wait_until(60, "the two pending events delivered", || async {
        delivered() == 2
    })
    .await;
    wait_until(60, "a status reading with them published", || async {
        let (code, body) = http(port, "GET", "/api/v1/status", None, "").await;
        code == 200 && body.contains("\"processed\":2")
    })
    .await;
    let (code, body) = http(port, "GET", "/readyz", None, "").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"database\":\"ok\""), "{body}");
    let (code, body) = http(port, "GET", "/api/v1/status", None, "").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"dead\":1"), "{body}");
    let (code, body) = http(port, "GET", "/metrics", None, "").await;
    assert_eq!(code, 200);
    assert!(body.contains("outbox_events_dead 1"), "{body}");
    let (code, body) = http(port, "GET", "/api/v1/dead-letters", None, "").await;
    assert_eq!(code, 200);
    assert!(body.contains(&ids[0].to_string()), "{body}");
    let retry = format!("/api/v1/dead-letters/{}/retry", ids[0]);
    let (code, body) = http(port, "POST", &retry, Some(token), "").await;
    assert_eq!(code, 200, "{body}");
    wait_until(60, "the retried event delivered", || async {
        delivered() == 3
    })
    .await;
    stop(relay).await;
    h.cleanup().await;
}
