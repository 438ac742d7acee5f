//! `txoutbox replay` on PostgreSQL, MySQL/MariaDB and SQLite: what a relay published is sent
//! again, line for line as the relay sent it (the `file:` publisher writes each message's id,
//! seq, headers, attempt and payload), per aggregate in seq order, filtered, counted by a dry
//! run, and no row of the table changes. The broker side (JetStream), the rate and the admin
//! API are in `replay_nats.rs`.
#![allow(clippy::unwrap_used)]
#![cfg(all(feature = "sqlite", feature = "mysql"))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::{stderr, stdout, unique};
use tokio::process::Command;
use txoutbox::testing::Harness;
use txoutbox::{JsonPayload, NewEvent};

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

per_database!(replay_sends_what_the_relay_sent_filtered_and_changes_no_row);

/// A directory of its own for one test's files, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(unique("txo_replay"));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The binary on the harness's outbox.
async fn run<H: Harness>(h: &H, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_txoutbox"));
    c.args(args)
        .env("DATABASE_URL", h.url())
        .env("TXOUTBOX_SCHEMA", h.table().schema().as_str())
        .env("TXOUTBOX_TABLE", h.table().table().as_str())
        .env_remove("TXOUTBOX_PUBLISHER")
        .env_remove("TXOUTBOX_REPLAY_PUBLISHER")
        .env_remove("TXOUTBOX_CONFIG")
        .env_remove("TXOUTBOX_RETENTION_PERIOD")
        .env("TXOUTBOX_ADMIN_ADDR", "off")
        .env("TXOUTBOX_LOG", "info")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), c.output())
        .await
        .expect("command timed out")
        .expect("run txoutbox")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn field(line: &str, name: &str) -> serde_json::Value {
    serde_json::from_str::<serde_json::Value>(line).unwrap()[name].clone()
}

/// Every row of the table as `events list --json` prints it (all columns an operator sees:
/// state, attempts, lease, processed_at, dead_at, last error, payload).
async fn snapshot<H: Harness>(h: &H) -> String {
    let out = run(h, &["events", "list", "--json", "--limit", "1000"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// Replay `args` to a new file; (the command's output, the file's lines).
async fn replay_to<H: Harness>(h: &H, dir: &Dir, args: &[&str]) -> (Output, Vec<String>) {
    let path = dir.file(&format!("{}.jsonl", unique("r")));
    let publisher = format!("file:{}", path.display());
    let mut all = vec!["replay", "--publisher", &publisher];
    all.extend_from_slice(args);
    let out = run(h, &all).await;
    (out, lines(&path))
}

async fn replay_sends_what_the_relay_sent_filtered_and_changes_no_row<H: Harness>() {
    let h = H::new().await;
    let dir = Dir::new();
    // Three aggregates, two types, headers, digits a float would lose, and bytes.
    let mut events = Vec::new();
    for i in 0..12 {
        let payload = JsonPayload::from_text(&format!(
            r#"{{"n": {i}, "total": 12345678901234567890.000000000000000001, "s": "é\u00e9"}}"#
        ))
        .unwrap();
        let t = if i % 3 == 0 {
            "order.paid"
        } else {
            "order.created"
        };
        events.push(
            NewEvent::from_payload("order", (i % 3).to_string(), t, payload).header(
                "traceparent",
                format!("00-{:032x}-{:016x}-01", i + 1, i + 1),
            ),
        );
    }
    events.push(
        NewEvent::bytes(
            "order",
            "0",
            "order.blob",
            vec![0u8, 159, 146, 150, 255],
            "application/x-protobuf",
        )
        .unwrap(),
    );
    let ids = h.enqueue(&events).await;
    assert_eq!(ids.len(), 13);

    // The relay publishes them (and keeps the rows: the table relay's 7-day retention).
    let relayed = dir.file("relayed.jsonl");
    let publisher = format!("file:{}", relayed.display());
    let out = run(&h, &["relay", "--publisher", &publisher, "--drain"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let original = lines(&relayed);
    assert_eq!(original.len(), 13);
    // One more event, never published: not replayed.
    h.enqueue(&[NewEvent::new("order", "9", "order.created", &1).unwrap()])
        .await;
    let before = snapshot(&h).await;

    // A dry run counts, per type, and publishes nothing.
    let out = run(&h, &["replay", "--dry-run"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("would replay 13 event(s)"), "{text}");
    assert!(text.contains("8  order.created"), "{text}");
    assert!(text.contains("4  order.paid"), "{text}");
    assert!(text.contains("nothing was published"), "{text}");

    // Everything: the relay's lines, byte for byte, each aggregate in seq order.
    let (out, got) = replay_to(&h, &dir, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed 13 event(s)"),
        "{}",
        stdout(&out)
    );
    let (mut a, mut b) = (original.clone(), got.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "the replay sends exactly what the relay sent");
    let mut per_aggregate: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for l in &got {
        let agg = field(l, "aggregate_id").as_str().unwrap().to_string();
        per_aggregate
            .entry(agg)
            .or_default()
            .push(field(l, "seq").as_i64().unwrap());
    }
    for (agg, seqs) in &per_aggregate {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{agg}: {seqs:?}");
    }
    let seqs: Vec<i64> = {
        let mut s: Vec<i64> = got
            .iter()
            .map(|l| field(l, "seq").as_i64().unwrap())
            .collect();
        s.sort();
        s
    };

    // Filters: type, aggregate, seq range, limit (and where to go on).
    let (out, got) = replay_to(&h, &dir, &["--event-type", "order.paid"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|l| field(l, "event_type") == "order.paid"));
    let (_, got) = replay_to(
        &h,
        &dir,
        &["--aggregate-id", "1", "--aggregate-type", "order"],
    )
    .await;
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|l| field(l, "aggregate_id") == "1"));
    let (from, to) = (seqs[2].to_string(), seqs[6].to_string());
    let (_, got) = replay_to(&h, &dir, &["--from-seq", &from, "--to-seq", &to]).await;
    let mut range: Vec<i64> = got
        .iter()
        .map(|l| field(l, "seq").as_i64().unwrap())
        .collect();
    range.sort();
    assert_eq!(range, seqs[2..=6]);
    let (out, got) = replay_to(&h, &dir, &["--limit", "5"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(got.len(), 5);
    let next = format!("--from-seq {}", seqs[5]);
    assert!(stderr(&out).contains(&next), "{}", stderr(&out));
    let (out, got) = replay_to(&h, &dir, &["--created-after", "2999-01-01T00:00:00Z"]).await;
    assert!(
        out.status.success(),
        "nothing matching is no error: {}",
        stderr(&out)
    );
    assert!(got.is_empty());
    assert!(
        stdout(&out).contains("replayed 0 event(s)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("no retained event matches"),
        "{}",
        stderr(&out)
    );
    let (out, _) = replay_to(&h, &dir, &["--from-seq", "9", "--to-seq", "3"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--to-seq 3 is below --from-seq 9"),
        "{}",
        stderr(&out)
    );

    // JSON report.
    let out = run(
        &h,
        &[
            "replay",
            "--dry-run",
            "--json",
            "--event-type",
            "order.blob",
        ],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["replayed"], 1);
    assert_eq!(v["by_event_type"]["order.blob"], 1);
    assert_eq!(v["dry_run"], true);

    assert_eq!(snapshot(&h).await, before, "replay changes no row");
    h.cleanup().await;
}
