//! The WAL source's ownership rules through the real binary: `slot` commands act on this
//! database's slot only, and a WAL relay beside a table relay of the same table exits 2 on
//! one line naming it.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Output;
use std::time::Duration;

use crate::common::*;

/// The binary against the database at `url` (the test's schema).
async fn in_database(db: &TestSchema, url: &str, args: &[&str]) -> Output {
    let mut c = db.command(args);
    c.env("DATABASE_URL", url);
    tokio::time::timeout(Duration::from_secs(60), c.output())
        .await
        .expect("command timed out")
        .expect("run txoutbox")
}

/// `slot create` in the test database, then `slot drop --slot <that name>` from a second
/// database of the server with the same schema: refused, naming the slot's database, and the
/// first database's slot is still there.
#[tokio::test]
async fn slot_drop_from_another_database_never_drops_this_databases_slot() {
    let db = TestSchema::migrated().await;
    let out = db.cli(&["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let slot = db.slot().await;

    let other = unique("txo_db");
    sqlx::query(&format!("CREATE DATABASE \"{other}\""))
        .execute(&db.pool)
        .await
        .unwrap();
    let mut url = url::Url::parse(&database_url()).unwrap();
    url.set_path(&other);
    let url = url.to_string();
    let out = in_database(&db, &url, &["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // Its own slot has another name: dropping "the table's slot" there finds none.
    let out = in_database(&db, &url, &["slot", "drop"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no replication slot"),
        "{}",
        stderr(&out)
    );
    // Named explicitly: refused, naming the database it belongs to.
    let out = in_database(&db, &url, &["slot", "drop", "--slot", &slot]).await;
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("belongs to database"), "{err}");
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 \
         AND database = current_database()",
    )
    .bind(&slot)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(exists, 1, "the first database's slot was dropped");

    let _ = sqlx::query(&format!("DROP DATABASE \"{other}\" WITH (FORCE)"))
        .execute(&db.pool)
        .await;
    db.cleanup().await;
}

/// A WAL relay started beside a running table relay of the same table exits 2 at once, its
/// last line naming the other relay; the table relay runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_wal_relay_beside_a_table_relay_exits_2_naming_it() {
    let db = TestSchema::migrated().await;
    let table = db.spawn(&["relay", "--publisher", "null:", "--relay-id", "tbl-ops"]);
    let relays = format!(
        "SELECT count(*) FROM \"{}\".outbox_relays \
         WHERE relay_id = 'tbl-ops' AND alive_until > now()",
        db.schema
    );
    wait_until(60, "the table relay registered", || async {
        sqlx::query_scalar::<_, i64>(&relays)
            .fetch_one(&db.pool)
            .await
            .unwrap_or(0)
            == 1
    })
    .await;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        db.command(&[
            "relay",
            "--source",
            "wal",
            "--publisher",
            "null:",
            "--drain",
        ])
        .output(),
    )
    .await
    .expect("the WAL relay ran on")
    .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: relay tbl-ops already reads"),
        "{err}"
    );
    assert!(last.contains("--source table"), "{err}");
    stop(table).await;
    db.cleanup().await;
}

/// The replication connection reads the database URL as the pool does (libpq's rules, in one
/// place): a URL with neither user nor database takes them from `PGUSER` and `PGDATABASE`.
/// The slot is created through the pool; the stream then reads the events committed after it
/// over the replication connection, which finds the slot only in the same database.
#[tokio::test(flavor = "multi_thread")]
async fn the_stream_reads_the_url_and_the_pg_variables_as_the_pool_does() {
    let db = TestSchema::migrated().await;
    let full = url::Url::parse(&database_url()).unwrap();
    let database = full.path().trim_start_matches('/').to_string();
    let user = full.username().to_string();
    assert!(!database.is_empty() && !user.is_empty(), "{full}");
    let bare = format!(
        "postgres://{}:{}",
        full.host_str().unwrap(),
        full.port().unwrap_or(5432)
    );
    let run = |args: &'static [&'static str]| {
        let mut c = db.command(args);
        c.env("DATABASE_URL", &bare)
            .env("PGUSER", &user)
            .env("PGDATABASE", &database);
        async move {
            tokio::time::timeout(Duration::from_secs(120), c.output())
                .await
                .expect("command timed out")
                .expect("run txoutbox")
        }
    };
    let out = run(&["slot", "create"]).await;
    assert!(out.status.success(), "slot create: {}", stderr(&out));
    db.insert_events(20, 4).await;
    let out = run(&[
        "relay",
        "--source",
        "wal",
        "--publisher",
        "null:",
        "--drain",
        "--retention-period",
        "1d",
    ])
    .await;
    assert!(out.status.success(), "relay: {}", stderr(&out));
    let streamed = db
        .scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL AND handed_off_at IS NULL")
        .await;
    assert_eq!(
        streamed,
        20,
        "all 20 read from the stream: {}",
        stderr(&out)
    );
    db.cleanup().await;
}

/// `migrate --source wal` gives the table the lean write path and says so; a plain `migrate`
/// leaves it; a table relay on it warns and still drains; `--source table` puts it back.
#[tokio::test]
async fn migrate_source_wal_makes_the_write_path_lean_and_source_table_puts_it_back() {
    use txoutbox::store::postgres::wal::{write_path, WritePath};
    let db = TestSchema::new().await;
    let out = db.cli(&["migrate", "--source", "wal"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("write path now lean"),
        "{}",
        stdout(&out)
    );
    let path = || async { write_path(&db.pool, &db.table).await.unwrap().path() };
    assert_eq!(path().await, Some(WritePath::Lean));
    let out = db
        .cli_env(&[("TXOUTBOX_SOURCE", "wal")], &["migrate"])
        .await;
    assert!(
        stdout(&out).contains("write path already lean"),
        "{}",
        stdout(&out)
    );
    let out = db.cli(&["migrate"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("write path"), "{}", stdout(&out));
    assert_eq!(path().await, Some(WritePath::Lean));

    db.insert_events(20, 3).await;
    let out = db
        .cli(&[
            "relay",
            "--publisher",
            "null:",
            "--drain",
            "--mode",
            "ordered",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("lean write path"), "{}", stderr(&out));
    assert_eq!(db.pending().await, 0);

    let out = db.cli(&["migrate", "--source", "table"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("write path now full"),
        "{}",
        stdout(&out)
    );
    assert_eq!(path().await, Some(WritePath::Full));
    db.cleanup().await;
}

/// A URL of several hosts (libpq's form, `target_session_attrs=read-write`) whose first host
/// refuses: `slot create` and `slot list` reach the one that serves; with no host that serves,
/// the error names each host and why, never the password.
#[tokio::test]
async fn a_url_of_several_hosts_reaches_the_host_that_serves() {
    let db = TestSchema::migrated().await;
    let u = url::Url::parse(&database_url()).unwrap();
    let (host, port) = (u.host_str().unwrap(), u.port().unwrap_or(5432));
    let user = u.username();
    let listed = format!(
        "postgres://{user}:hunter2secret@127.0.0.1:1,{host}:{port}{}?target_session_attrs=read-write",
        u.path()
    );
    let out = in_database(&db, &listed, &["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = in_database(&db, &listed, &["slot", "list", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let listed_slot: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed_slot["slot"], db.slot().await);

    let none = format!(
        "postgres://{user}:hunter2secret@127.0.0.1:1,127.0.0.1:2{}?target_session_attrs=read-write",
        u.path()
    );
    let out = in_database(&db, &none, &["slot", "list"]).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("127.0.0.1:1") && err.contains("127.0.0.1:2"),
        "{err}"
    );
    assert!(!err.contains("hunter2secret"), "{err}");
}
