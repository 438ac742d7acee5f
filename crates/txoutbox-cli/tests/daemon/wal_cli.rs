//! `relay --source wal`, `slot list|create|drop` and the slot in `status` and
//! `/api/v1/status`, through the real binary on the real PostgreSQL (wal_level = logical).
//! Each test has a schema of its own; its default slot and publication are dropped by the
//! harness's cleanup, any other slot by the test.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashSet;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

async fn slot_of(db: &TestSchema) -> String {
    db.slot().await
}

async fn run_with(db: &TestSchema, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = db.command(args);
    for (k, v) in env {
        c.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(60), c.output())
        .await
        .expect("command timed out")
        .expect("run txoutbox")
}

fn assert_usage_error(out: &Output, names: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line, got: {err}");
    assert!(err.contains(names), "{names} not named in: {err}");
}

/// `migrate` makes the publication (and says so once); events committed before the slot
/// existed go by the table path, those after by the stream; `--drain` exits 0 with each of
/// them delivered.
#[tokio::test]
async fn relay_source_wal_drains_what_was_committed_before_and_after_the_slot() {
    let db = TestSchema::new().await;
    let out = db.cli(&["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "created publication {}",
            txoutbox::store::postgres::wal::publication_name(&db.table)
        )),
        "{}",
        stdout(&out)
    );
    let out = db.cli(&["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("publication"),
        "said again: {}",
        stdout(&out)
    );

    let before: HashSet<_> = db.insert_events(30, 7).await.into_iter().collect();
    let out = db.cli(&["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("30 unpublished event(s) committed before it"),
        "{}",
        stdout(&out)
    );
    // Aggregates of their own: in ordered mode an aggregate with an event still waiting in
    // the table has its later ones handed over behind it, and this test tells the paths apart.
    let after: HashSet<uuid::Uuid> = sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'invoice', (g % 11)::text, 'invoice.sent', jsonb_build_object('n', g)
         FROM generate_series(1, 200) g RETURNING id",
        db.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();

    let dir = std::env::temp_dir().join(unique("txo_wal"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("events.jsonl");
    let url = format!("file:{}", path.display());
    let out = db
        .cli(&[
            "relay",
            "--source",
            "wal",
            "--publisher",
            &url,
            "--drain",
            "--poll-interval",
            "200ms",
            // Kept, to tell below which path delivered each (the WAL default deletes them).
            "--retention-period",
            "1d",
        ])
        .await;
    assert!(out.status.success(), "relay failed: {}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    let got: HashSet<uuid::Uuid> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["id"].as_str().unwrap().parse().unwrap()
        })
        .collect();
    let want: HashSet<_> = before.union(&after).copied().collect();
    assert_eq!(got.len(), want.len(), "every committed event delivered");
    assert!(
        got == want,
        "the delivered events are not the committed ones"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
            .await,
        0
    );
    // The ones from before went by the table (handed off), the ones after by the stream.
    let handed: HashSet<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM {} WHERE handed_off_at IS NOT NULL",
        db.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        handed, before,
        "the table path delivered what preceded the slot"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

/// The WAL source's default retention deletes each published event as it settles it (its
/// start-up line says so), and keeps dead letters; a given --retention-period keeps the
/// published rows too.
#[tokio::test]
async fn relay_source_wal_deletes_published_events_by_default_and_keeps_dead_letters() {
    let db = TestSchema::migrated().await;
    let out = db.cli(&["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let drain = |extra: &'static [&'static str]| {
        let mut args = vec![
            "relay",
            "--source",
            "wal",
            "--publisher",
            "null:",
            "--drain",
            "--poll-interval",
            "200ms",
        ];
        args.extend_from_slice(extra);
        args
    };
    let count = "SELECT count(*) FROM {t}";
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL AND processed_at IS NULL";

    db.insert_events(40, 5).await;
    let out = db.cli(&drain(&[])).await;
    assert!(out.status.success(), "relay failed: {}", stderr(&out));
    assert!(
        stderr(&out).contains("retention_period=0s"),
        "the start-up line names the retention: {}",
        stderr(&out)
    );
    assert_eq!(
        db.scalar(count).await,
        0,
        "published rows deleted on settle"
    );

    // Every publish fails and one attempt is allowed: dead letters, which stay.
    db.insert_events(6, 3).await;
    let out = db
        .cli(&drain(&["--inject-faults", "1", "--max-attempts", "1"]))
        .await;
    assert!(out.status.success(), "relay failed: {}", stderr(&out));
    assert_eq!(db.scalar(dead).await, 6, "dead letters kept");
    assert_eq!(db.scalar(count).await, 6, "and nothing else");

    db.insert_events(10, 5).await;
    let out = db.cli(&drain(&["--retention-period", "1h"])).await;
    assert!(out.status.success(), "relay failed: {}", stderr(&out));
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
            .await,
        10,
        "a given period keeps them, marked"
    );
    db.cleanup().await;
}

/// What cannot work is refused at start-up, on one line naming the flag, before anything is
/// connected (the SQLite file is not created; nothing listens on the MySQL port).
#[tokio::test]
async fn source_wal_off_postgresql_and_slot_without_it_are_usage_errors() {
    let db = TestSchema::new().await;
    let dir = std::env::temp_dir().join(unique("txo_wal_usage"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.db");
    let sqlite = format!("sqlite://{}", file.display());
    let relay = ["relay", "--publisher", "null:", "--drain"];
    let wal: Vec<&str> = relay.iter().copied().chain(["--source", "wal"]).collect();

    let out = run_with(&db, &[("DATABASE_URL", &sqlite)], &wal).await;
    assert_usage_error(&out, "--source wal");
    assert!(stderr(&out).contains("SQLite"), "{}", stderr(&out));
    let out = run_with(
        &db,
        &[("DATABASE_URL", "mysql://root@127.0.0.1:1/none")],
        &wal,
    )
    .await;
    assert_usage_error(&out, "--source wal");
    // The environment and the config file say the same as the flag.
    let out = run_with(
        &db,
        &[("DATABASE_URL", &sqlite), ("TXOUTBOX_SOURCE", "wal")],
        &relay,
    )
    .await;
    assert_usage_error(&out, "--source wal");
    let cfg = dir.join("txoutbox.toml");
    std::fs::write(&cfg, "[relay]\nsource = \"wal\"\n").unwrap();
    let cfg = cfg.display().to_string();
    let with_cfg: Vec<&str> = ["--config", cfg.as_str()]
        .into_iter()
        .chain(relay)
        .collect();
    let out = run_with(&db, &[("DATABASE_URL", &sqlite)], &with_cfg).await;
    assert_usage_error(&out, "--source wal");
    assert!(!file.exists(), "the SQLite database was opened");

    // --slot needs --source wal (here on PostgreSQL, where wal would work).
    let slot: Vec<&str> = relay.iter().copied().chain(["--slot", "x"]).collect();
    let out = db.cli(&slot).await;
    assert_usage_error(&out, "--slot");
    assert!(stderr(&out).contains("--source wal"), "{}", stderr(&out));
    let out = run_with(&db, &[("TXOUTBOX_SLOT", "x")], &relay).await;
    assert_usage_error(&out, "--slot");
    let out = db
        .cli(&["relay", "--source", "wal", "--slot", "Bad-Name"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("replication slot name"),
        "{}",
        stderr(&out)
    );

    // The slot commands are PostgreSQL's.
    let out = run_with(&db, &[("DATABASE_URL", &sqlite)], &["slot", "list"]).await;
    assert_usage_error(&out, "PostgreSQL");
    assert!(!file.exists(), "the SQLite database was opened");
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

/// `slot list|create|drop`, the default slot and one named with --slot, and the slot in
/// `status` (text and JSON).
#[tokio::test]
async fn slot_list_create_drop_round_trip_and_status_shows_it() {
    let db = TestSchema::migrated().await;
    let slot = slot_of(&db).await;
    let out = db.cli(&["slot", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("no replication slot {slot}")),
        "{}",
        stdout(&out)
    );
    let out = db.cli(&["slot", "list", "--json"]).await;
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        stdout(&out)
    );
    let out = db.cli(&["status", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["wal_slot"].is_null(), "{v}");
    assert!(!stdout(&db.cli(&["status"]).await).contains("WAL source"));

    let out = db.cli(&["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("created replication slot {slot}")));
    let out = db.cli(&["slot", "create", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({ "slot": slot, "created": false, "handed_to_table": 0 })
    );

    let out = db.cli(&["slot", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        slot.as_str(),
        "pgoutput",
        "reserved",
        "no relay reads it",
        "lag",
        "retained",
        "restart_lsn",
    ] {
        assert!(text.contains(want), "{want} missing: {text}");
    }
    let out = db.cli(&["slot", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["slot"], slot);
    assert_eq!(v["plugin"], "pgoutput");
    assert_eq!(v["active"], false);
    assert!(v["reader_pid"].is_null(), "{v}");
    assert!(v["confirmed_flush_lsn"].as_str().unwrap().contains('/'));
    assert!(v["lag_bytes"].as_i64().unwrap() >= 0);
    assert!(v["restart_lsn"].as_str().unwrap().contains('/'), "{v}");
    assert!(
        v["retained_bytes"].as_i64().unwrap() >= v["lag_bytes"].as_i64().unwrap(),
        "{v}"
    );

    let out = db.cli(&["status"]).await;
    let text = stdout(&out);
    assert!(text.contains("WAL source"), "{text}");
    assert!(text.contains(&slot), "{text}");
    let out = db.cli(&["status", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wal_slot"]["slot"], slot, "{v}");
    assert_eq!(v["wal_slot"]["wal_status"], "reserved", "{v}");

    let out = db.cli(&["slot", "drop"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("dropped replication slot {slot}")));
    let out = db.cli(&["slot", "drop"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no replication slot"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .await,
        0
    );

    // Another name, given by flag and by environment.
    let other = unique("txo_cli_slot");
    let out = db.cli(&["slot", "create", "--slot", &other]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_with(
        &db,
        &[("TXOUTBOX_SLOT", &other)],
        &["slot", "list", "--json"],
    )
    .await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["slot"], other);
    let out = db.cli(&["status", "--slot", &other, "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wal_slot"]["slot"], other);
    let out = db.cli(&["slot", "drop", "--slot", &other, "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({ "slot": other, "dropped": true }));
    db.cleanup().await;
}

/// While a relay reads the slot: `slot list` and `/api/v1/status` name its reader, and
/// `slot drop` refuses; once it stopped, the drop goes through.
#[tokio::test(flavor = "multi_thread")]
async fn slot_drop_is_refused_while_a_relay_reads() {
    let db = TestSchema::migrated().await;
    let slot = slot_of(&db).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = db.spawn(&[
        "relay",
        "--source",
        "wal",
        "--publisher",
        "null:",
        "--admin-addr",
        &addr,
        "--metrics-interval",
        "200ms",
    ]);
    let reader = || async {
        let out = db.cli(&["slot", "list", "--json"]).await;
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .is_some_and(|v| v["reader_pid"].is_i64())
    };
    wait_until(60, "the relay to hold the slot", reader).await;

    let out = db.cli(&["slot", "drop"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("in use by a relay"), "{err}");
    assert!(err.contains("stop"), "names the fix: {err}");

    // The admin API's status carries the slot too (from the sampler's reading).
    let mut body = Value::Null;
    for _ in 0..100 {
        let (status, b) = http(port, "GET", "/api/v1/status", None, "").await;
        if status == 200 {
            body = serde_json::from_str(&b).unwrap();
            if body["wal_slot"]["reader_pid"].is_i64() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(body["wal_slot"]["slot"], slot, "{body}");
    assert!(body["wal_slot"]["reader_pid"].is_i64(), "{body}");
    assert!(body["wal_slot"]["retained_bytes"].is_i64(), "{body}");

    // The slot's gauges, the WAL kept for it among them.
    let mut metrics = String::new();
    for _ in 0..100 {
        let (_, b) = http(port, "GET", "/metrics", None, "").await;
        metrics = b;
        if metrics.contains("outbox_wal_slot_retained_bytes ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for gauge in [
        "outbox_wal_slot_retained_bytes ",
        "outbox_wal_slot_lag_bytes ",
        "outbox_wal_slot_active 1",
    ] {
        assert!(metrics.contains(gauge), "{gauge} missing: {metrics}");
    }

    stop(relay).await;
    let out = db.cli(&["slot", "drop"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    db.cleanup().await;
}

/// A role that may migrate but not create the publication (it does not own the table): migrate
/// succeeds and warns, naming what `--source wal` needs.
#[tokio::test]
async fn migrate_warns_when_it_cannot_create_the_publication() {
    let db = TestSchema::migrated().await;
    let publication = txoutbox::store::postgres::wal::publication_name(&db.table);
    let role = unique("txo_cli_role");
    for sql in [
        format!("DROP PUBLICATION \"{publication}\""),
        format!("CREATE ROLE {role} LOGIN"),
        format!(
            "GRANT CREATE ON DATABASE \"{}\" TO {role}",
            db_name(&db).await
        ),
        format!("GRANT USAGE, CREATE ON SCHEMA \"{}\" TO {role}", db.schema),
        format!(
            "GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA \"{}\" TO {role}",
            db.schema
        ),
    ] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
    let mut url = url::Url::parse(&database_url()).unwrap();
    url.set_username(&role).unwrap();
    url.set_password(None).unwrap();
    let out = run_with(&db, &[("DATABASE_URL", url.as_str())], &["migrate"]).await;
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(&sql).execute(&db.pool).await.unwrap();
    }
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("up to date"), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("WARN"), "{err}");
    assert!(err.contains("must be owner"), "the reason: {err}");
    assert!(err.contains("--source wal"), "what needs it: {err}");
    assert!(err.contains("CREATE PUBLICATION"), "the fix: {err}");
    db.cleanup().await;
}

async fn db_name(db: &TestSchema) -> String {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}
