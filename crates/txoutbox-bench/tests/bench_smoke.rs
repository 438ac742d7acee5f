//! `txoutbox-bench` for a second or two per scenario, tiny sizes, against the real PostgreSQL:
//! it runs, every event arrives (the bench checks that itself and fails otherwise), --json
//! parses, and its schemas are gone afterwards. Nothing here asserts a speed.
//!
//! The relays are the `txoutbox` binary beside the bench's, which cargo builds there for
//! `cargo test --workspace`; alone, build it first: `cargo build -p txoutbox-cli
//! --all-features && cargo test -p txoutbox-bench`.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use txoutbox::testing::postgres::database_url;

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A NATS stream of the test's own (`prefix` and a random part) and a publisher URL that
/// sends to it, on subjects of its own.
fn nats_stream(prefix: &str) -> (String, String) {
    let stream = unique(prefix).to_uppercase();
    let url = format!(
        "{}?stream={stream}&subject={stream}.{{event_type}}",
        nats_url()
    );
    (stream, url)
}

/// How many messages `stream` holds; the stream is deleted.
async fn messages_then_delete(stream: &str) -> u64 {
    let client = async_nats::connect(nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(stream).await.unwrap();
    let messages = s.info().await.unwrap().state.messages;
    js.delete_stream(stream).await.unwrap();
    messages
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The daemon the bench runs as its relays.
fn txoutbox() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_txoutbox-bench")).with_file_name("txoutbox");
    assert!(
        path.is_file(),
        "no {} to run the relays: `cargo build -p txoutbox-cli --all-features` first",
        path.display()
    );
    path
}

/// Run `txoutbox-bench ARGS`; returns its output and its pid (the bench's schemas are
/// named txo_bench_<pid>_<n>).
async fn bench(args: &[&str]) -> (Output, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_txoutbox-bench"))
        .args(args)
        .env("DATABASE_URL", database_url())
        .env("TXOUTBOX_BIN", txoutbox())
        .env("TXOUTBOX_LOG", "warn")
        .env_remove("TXOUTBOX_PUBLISHER")
        .env_remove("TXOUTBOX_CONFIG")
        .env_remove("TXOUTBOX_SCHEMA")
        .env_remove("TXOUTBOX_TABLE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run txoutbox-bench");
    let pid = child.id().unwrap();
    // Generous: a loaded CI machine must not fail this on slowness.
    let out = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
        .await
        .expect("bench timed out")
        .expect("bench output");
    (out, pid)
}

/// Exit 0, JSON on stdout, and no schema of this bench process left behind.
async fn ok_json(args: &[&str]) -> Value {
    let (out, pid) = bench(args).await;
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
    assert_no_schemas_left(pid).await;
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("--json output does not parse: {e}\n{}", stdout(&out)))
}

async fn assert_no_schemas_left(pid: u32) {
    let pool = sqlx::PgPool::connect(&database_url()).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1")
        .bind(format!("txo\\_bench\\_{pid}\\_%"))
        .fetch_one(&pool)
        .await
        .unwrap();
    // The WAL source's slot is named for the database and table: txoutbox_<db>_<schema>_...
    let slots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1")
            .bind(format!("txoutbox\\_%\\_txo\\_bench\\_{pid}\\_%"))
            .fetch_one(&pool)
            .await
            .unwrap();
    let publications: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_publication WHERE pubname LIKE $1")
            .bind(format!("txoutbox\\_txo\\_bench\\_{pid}\\_%"))
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(left, 0, "the bench left {left} schema(s) behind");
    assert_eq!(
        slots, 0,
        "the bench left {slots} replication slot(s) behind"
    );
    assert_eq!(
        publications, 0,
        "the bench left {publications} publication(s) behind"
    );
}

fn section<'a>(report: &'a Value, scenario: &str) -> &'a Vec<Value> {
    let s = report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no {scenario} section in {report}"));
    s["rows"].as_array().unwrap()
}

fn median(row: &Value, metric: &str) -> f64 {
    row["metrics"][metric]["median"]
        .as_f64()
        .unwrap_or_else(|| panic!("no {metric} in {row}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_publishes_every_event_and_writes_a_chart() {
    let chart = std::env::temp_dir().join(format!("{}.svg", unique("txo_bench_chart")));
    let chart_arg = chart.to_str().unwrap().to_string();
    let report = ok_json(&[
        "drain",
        "--events",
        "2000",
        "--repeats",
        "2",
        "--json",
        "--chart",
        &chart_arg,
    ])
    .await;
    let rows = section(&report, "drain");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["params"]["publisher"], "null:");
    let runs = rows[0]["metrics"]["events_per_s"]["runs"]
        .as_array()
        .unwrap();
    assert_eq!(runs.len(), 2, "--repeats 2 makes two runs");
    assert!(median(&rows[0], "events_per_s") > 0.0);
    assert!(
        median(&rows[0], "peak_rss_mib") > 1.0,
        "the relay's RSS was not measured"
    );
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("Drain rate"),
        "not the chart: {svg:.200}"
    );
    let _ = std::fs::remove_file(&chart);
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_measures_every_committed_event() {
    let report = ok_json(&[
        "latency",
        "--rate",
        "200",
        "--duration",
        "1s",
        "--writers",
        "4",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "latency");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        median(&rows[0], "events"),
        200.0,
        "every committed event has a latency"
    );
    let (p50, p99, max) = (
        median(&rows[0], "p50_ms"),
        median(&rows[0], "p99_ms"),
        median(&rows[0], "max_ms"),
    );
    assert!(
        p50 <= p99 && p99 <= max,
        "percentiles out of order: {p50} {p99} {max}"
    );
    assert!(rows[0]["flags"]["kept_up"].as_array().unwrap()[0].is_boolean());
}

#[tokio::test(flavor = "multi_thread")]
async fn write_compares_every_configuration_to_no_outbox() {
    let report = ok_json(&[
        "write",
        "--duration",
        "1s",
        "--writers",
        "4",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "write");
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(rows[0]["config"], "no outbox");
    assert_eq!(median(&rows[0], "ratio"), 1.0);
    for r in rows {
        assert!(median(r, "commits_per_s") > 0.0, "{r}");
        assert!(median(r, "ratio") > 0.0, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_runs_one_and_two_relays_in_both_modes() {
    let report = ok_json(&[
        "scale",
        "--events",
        "2000",
        "--relays",
        "1,2",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "scale");
    let configs: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["params"]["relays"].as_u64().unwrap(),
                r["params"]["mode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        configs,
        [
            (1, "ordered"),
            (2, "ordered"),
            (1, "unordered"),
            (2, "unordered")
        ]
    );
    for r in rows {
        assert!(median(r, "events_per_s") > 0.0, "{r}");
    }
}

fn sources(rows: &[Value]) -> Vec<&str> {
    rows.iter()
        .map(|r| r["params"]["source"].as_str().unwrap_or("-"))
        .collect()
}

/// Both sources side by side: the WAL relay publishes every event from the stream (none
/// handed to its table path: the slot existed before the events), and the ratio is to the
/// table row of the same round.
#[tokio::test(flavor = "multi_thread")]
async fn drain_compares_the_wal_source_with_the_table() {
    let report = ok_json(&[
        "drain",
        "--events",
        "2500",
        "--source",
        "table,wal",
        "--repeats",
        "2",
        "--json",
    ])
    .await;
    let rows = section(&report, "drain");
    assert_eq!(sources(rows), ["table", "wal"], "{rows:?}");
    assert_eq!(median(&rows[0], "ratio_to_table"), 1.0);
    let ratios = rows[1]["metrics"]["ratio_to_table"]["runs"]
        .as_array()
        .unwrap();
    assert_eq!(ratios.len(), 2, "a ratio per round: {}", rows[1]);
    assert!(median(&rows[1], "ratio_to_table") > 0.0);
    assert!(median(&rows[1], "peak_rss_mib") > 1.0);
    assert_eq!(
        median(&rows[1], "handed_off"),
        0.0,
        "the WAL relay published from the stream: {}",
        rows[1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_and_write_run_with_the_wal_source() {
    let report = ok_json(&[
        "latency",
        "--rate",
        "200",
        "--duration",
        "1s",
        "--writers",
        "4",
        "--source",
        "wal",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "latency");
    assert_eq!(sources(rows), ["wal"]);
    assert_eq!(median(&rows[0], "events"), 200.0);

    let report = ok_json(&[
        "write",
        "--duration",
        "1s",
        "--writers",
        "4",
        "--source",
        "table,wal",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "write");
    let relays: Vec<&str> = rows
        .iter()
        .filter(|r| r["params"]["relay"] == true)
        .map(|r| r["params"]["source"].as_str().unwrap())
        .collect();
    // Table, WAL, WAL on the lean write path, the seed's trigger (table).
    assert_eq!(relays, ["table", "wal", "wal", "table"], "{rows:?}");
    let lean: Vec<&str> = rows
        .iter()
        .map(|r| r["params"]["write_path"].as_str().unwrap())
        .collect();
    assert_eq!(lean.iter().filter(|&&p| p == "lean").count(), 1, "{rows:?}");
    for r in rows {
        assert!(median(r, "ratio") > 0.0, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wal_source_on_another_database_is_a_usage_error() {
    let (out, _) = bench(&[
        "drain",
        "--source",
        "table,wal",
        "--database-url",
        "mysql://root@127.0.0.1:3306/test",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("--source wal needs PostgreSQL"), "{err}");
}

/// The bench's own check can fail: when every publish fails and each event is dead-lettered
/// at its first failure, the relays exit with nothing published and the bench says so.
/// `--tableless`: the WAL source drains the same events written as logical messages, checked
/// by the slot's confirmed position (there is no row to look at), beside the table's rows.
#[tokio::test(flavor = "multi_thread")]
async fn drain_of_tableless_events_is_compared_with_the_table() {
    let report = ok_json(&[
        "drain",
        "--events",
        "2500",
        "--source",
        "table,wal",
        "--tableless",
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "drain");
    assert_eq!(sources(rows), ["table", "wal", "tableless"], "{rows:?}");
    assert!(median(&rows[2], "ratio_to_table") > 0.0, "{}", rows[2]);
    assert_eq!(
        median(&rows[2], "handed_off"),
        0.0,
        "published from the stream, none written into the table: {}",
        rows[2]
    );
    assert!(
        rows[2]["config"]
            .as_str()
            .unwrap_or("")
            .contains("tableless"),
        "{}",
        rows[2]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tableless_without_the_wal_source_is_a_usage_error() {
    let (out, _) = bench(&["drain", "--events", "10", "--tableless"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--tableless needs wal among --source"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_fails_when_events_do_not_arrive() {
    let (out, pid) = bench(&[
        "drain",
        "--events",
        "300",
        "--repeats",
        "1",
        "--relay-arg=--inject-faults=1",
        "--relay-arg=--max-attempts=1",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("300 of 300 events were not published"),
        "{err}"
    );
    assert!(err.contains("300 dead letters"), "{err}");
    assert_no_schemas_left(pid).await;
}

/// A 2,000-event drain checked against the cost baseline at `path`.
async fn check_costs(path: &str) -> (Output, u32) {
    let args = [
        "drain",
        "--events",
        "2000",
        "--repeats",
        "1",
        "--check-costs",
        path,
    ];
    bench(&args).await
}

/// `--payload-bytes` sizes the drain's payloads: what comes from the database per event grows
/// with it (each payload once, whole: the claim's fast form sends none of a payload too large
/// for it, and the full statement sends it).
#[tokio::test(flavor = "multi_thread")]
async fn payload_bytes_sizes_the_drained_payloads() {
    let report = ok_json(&[
        "drain",
        "--events",
        "300",
        "--repeats",
        "1",
        "--payload-bytes",
        "5000",
        "--costs",
        "--json",
    ])
    .await;
    let row = &section(&report, "drain")[0];
    let bytes = median(row, "db_bytes_in_per_event");
    assert!(
        (4_900.0..10_000.0).contains(&bytes),
        "~5,000-byte payloads, each read once: {bytes} bytes per event; {row}"
    );
}

/// `--costs` counts through its proxy (bytes, statements, WAL); `--write-costs` stores them and
/// `--check-costs` fails on a count over the stored one by more than the threshold. Other tests
/// write WAL meanwhile, so only the bytes are compared exactly here.
#[tokio::test(flavor = "multi_thread")]
async fn costs_are_counted_and_a_count_over_its_baseline_fails() {
    let file = std::env::temp_dir().join(format!("{}.json", unique("txo_bench_costs")));
    let path = file.to_str().unwrap().to_string();
    let report = ok_json(&[
        "drain",
        "--events",
        "2000",
        "--repeats",
        "1",
        "--json",
        "--write-costs",
        &path,
    ])
    .await;
    let row = &section(&report, "drain")[0];
    // Every event's ~200-byte payload comes from the database once, at least.
    assert!(median(row, "db_bytes_in_per_event") > 200.0, "{row}");
    assert!(median(row, "db_bytes_out_per_event") > 0.0, "{row}");
    assert!(median(row, "round_trips_per_1k") > 0.0, "{row}");
    assert!(median(row, "wal_bytes_per_event") > 0.0, "{row}");
    let mut stored: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let config = row["config"].as_str().unwrap().to_string();
    assert_eq!(stored["threshold"], 0.1);
    let bytes = &stored["configurations"][&config]["db_bytes_in_per_event"];
    assert_eq!(bytes.as_f64(), Some(median(row, "db_bytes_in_per_event")));

    // A baseline at half today's bytes, and no other count (the WAL of the tests beside this
    // one would count in this run's): the bytes fail, named.
    let half = bytes.as_f64().unwrap() / 2.0;
    stored["configurations"][&config] = serde_json::json!({ "db_bytes_in_per_event": half });
    std::fs::write(&file, stored.to_string()).unwrap();
    let (out, pid) = check_costs(&path).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("db_bytes_in_per_event"),
        "{}",
        stderr(&out)
    );
    assert_no_schemas_left(pid).await;

    // Within the threshold: passes.
    stored["configurations"][&config]["db_bytes_in_per_event"] =
        serde_json::json!(median(row, "db_bytes_in_per_event"));
    std::fs::write(&file, stored.to_string()).unwrap();
    let (out, _) = check_costs(&path).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("bytes from db"), "{}", stdout(&out));
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cost_baseline_that_cannot_be_read_is_a_usage_error_before_anything_runs() {
    let (out, _) = bench(&["drain", "--check-costs", "/nonexistent/costs.json"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("/nonexistent/costs.json"), "{err}");
    let (out, _) = bench(&["latency", "--costs"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("drain and scale only"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_publisher_is_a_usage_error() {
    let (out, _) = bench(&["drain", "--publisher", "carrier-pigeon://coop"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: --publisher"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_database_is_a_usage_error_not_a_postgres_connection_error() {
    let (out, _) = bench(&["drain", "--database-url", "sqlite:///tmp/txo-bench.db"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("PostgreSQL only"), "{err}");
    assert!(!std::path::Path::new("/tmp/txo-bench.db").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_measures_each_broker_alone() {
    let (stream, nats) = nats_stream("TXO_BENCH_PUB");
    let report = ok_json(&[
        "publish",
        "--events",
        "3000",
        "--publisher",
        "null:",
        "--publisher",
        &nats,
        "--repeats",
        "1",
        "--json",
    ])
    .await;
    let rows = section(&report, "publish");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in rows {
        assert!(median(r, "messages_per_s") > 0.0, "{r}");
    }
    // Every message reached the stream (JetStream acknowledged each one).
    assert_eq!(messages_then_delete(&stream).await, 3000);
}

/// `latency` at 200 events/s for a second to a NATS stream of its own (`extra` after the
/// sources): its rows, the stream deleted after.
async fn latency_to_nats(sources: &str, extra: &[&str]) -> Vec<Value> {
    let (stream, nats) = nats_stream("TXO_BENCH_LAT");
    let mut args = vec![
        "latency",
        "--rate",
        "200",
        "--duration",
        "1s",
        "--writers",
        "4",
        "--source",
        sources,
        "--publisher",
        &nats,
        "--repeats",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    let report = ok_json(&args).await;
    let rows = section(&report, "latency").to_vec();
    let client = async_nats::connect(nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.delete_stream(&stream).await.unwrap();
    rows
}

/// With a NATS publisher the latency is also taken at the broker: every committed event is
/// seen arriving there, from both sources.
#[tokio::test(flavor = "multi_thread")]
async fn latency_to_nats_is_also_measured_at_the_broker() {
    let rows = latency_to_nats("table,wal", &[]).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(median(r, "events"), 200.0, "{r}");
        assert_eq!(median(r, "broker_missing"), 0.0, "every event arrived: {r}");
        let (p50, p99) = (median(r, "broker_p50_ms"), median(r, "broker_p99_ms"));
        assert!(p50 <= p99, "{r}");
        // Each copy reaches the subscriber about when the ack reaches the relay, before the
        // settle that sets processed_at, and not long before the writer took its time (the
        // margins are for a loaded machine's scheduling): stamped wrong, this fails.
        assert!(p99 <= median(r, "max_ms") + 50.0, "{r}");
        assert!(median(r, "broker_min_ms") >= -50.0, "{r}");
    }
}

/// With rows deleted on settle there is no processed_at: only the broker's side is measured,
/// and every event is still accounted for.
#[tokio::test(flavor = "multi_thread")]
async fn latency_with_delete_on_settle_is_measured_at_the_broker_only() {
    let rows = latency_to_nats("wal", &["--relay-arg=--retention-period=0"]).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert!(
        r["metrics"].get("p99_ms").is_none(),
        "no settle latency: {r}"
    );
    assert_eq!(median(r, "events"), 200.0, "{r}");
    assert_eq!(median(r, "broker_missing"), 0.0, "{r}");
    assert!(median(r, "broker_p99_ms").is_finite(), "{r}");
}

/// A --txoutbox-bin that is not there is named before anything is created.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_txoutbox_binary_is_named() {
    let (out, pid) = bench(&["drain", "--txoutbox-bin", "/nonexistent/txoutbox"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("/nonexistent/txoutbox"), "{err}");
    assert_no_schemas_left(pid).await;
}

/// `--baseline-bin`: every configuration once per build, back to back, each run's schema
/// migrated by the binary that runs it, and each row's ratio to the baseline build of the
/// same configuration (here the same binary both times, on both sources).
#[tokio::test(flavor = "multi_thread")]
async fn drain_compares_a_baseline_build_configuration_by_configuration() {
    let bin = txoutbox();
    let report = ok_json(&[
        "drain",
        "--events",
        "2000",
        "--source",
        "table,wal",
        "--repeats",
        "1",
        "--baseline-bin",
        bin.to_str().unwrap(),
        "--json",
    ])
    .await;
    let rows = section(&report, "drain");
    let builds: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["params"]["source"].as_str().unwrap(),
                r["params"]["build"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        builds,
        [
            ("table", "current"),
            ("table", "baseline"),
            ("wal", "current"),
            ("wal", "baseline")
        ],
        "{rows:?}"
    );
    for r in rows {
        assert!(median(r, "ratio_to_baseline") > 0.0, "{r}");
        assert!(median(r, "ratio_to_table") > 0.0, "{r}");
        assert!(median(r, "events_per_s") > 0.0, "{r}");
    }
    assert_eq!(median(&rows[1], "ratio_to_baseline"), 1.0);
    // The same division, up to the last bit (the bench divides run by run).
    let expected = median(&rows[2], "events_per_s") / median(&rows[0], "events_per_s");
    let ratio = median(&rows[2], "ratio_to_table");
    assert!(
        (ratio - expected).abs() <= 1e-12 * expected,
        "{ratio} against {expected}"
    );
}

/// A baseline that is not there, or one given to a scenario that does not compare builds, is
/// a usage error before anything is created.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_baseline_is_a_usage_error() {
    let (out, pid) = bench(&["drain", "--baseline-bin", "/nonexistent/txoutbox"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/txoutbox"),
        "{}",
        stderr(&out)
    );
    assert_no_schemas_left(pid).await;
    let bin = txoutbox();
    let (out, pid) = bench(&["latency", "--baseline-bin", bin.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("drain and scale"), "{}", stderr(&out));
    assert_no_schemas_left(pid).await;
}

/// A drain to NATS empties the publisher's stream before each run: after two runs of 500
/// events it holds the last run's 500, not 1,000 (the stream would grow by every run).
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_to_nats_starts_each_run_on_an_empty_stream() {
    let (stream, nats) = nats_stream("TXO_BENCH_DRAIN");
    let report = ok_json(&[
        "drain",
        "--events",
        "500",
        "--publisher",
        &nats,
        "--repeats",
        "2",
        "--json",
    ])
    .await;
    let rows = section(&report, "drain");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(median(&rows[0], "events_per_s") > 0.0, "{}", rows[0]);
    assert_eq!(messages_then_delete(&stream).await, 500);
}

/// A stream that was there before the bench is someone's: a drain never empties it (the runs
/// add to what it held), and says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_to_nats_leaves_a_stream_it_did_not_make_alone() {
    let (stream, nats) = nats_stream("TXO_BENCH_THEIRS");
    let subject = format!("{stream}.>");
    let client = async_nats::connect(nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish(format!("{stream}.theirs"), "kept".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let (out, _) = bench(&[
        "drain",
        "--events",
        "300",
        "--publisher",
        &nats,
        "--repeats",
        "2",
        "--json",
    ])
    .await;
    let messages = messages_then_delete(&stream).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("was there before the bench"),
        "{}",
        stderr(&out)
    );
    assert_eq!(messages, 601);
}
