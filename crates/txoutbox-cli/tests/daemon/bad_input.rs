//! Bad input, through the real binary against real PostgreSQL and NATS: rows any service may
//! write with plain SQL that no broker can carry, malformed settings, identifiers that try SQL
//! injection, a schema of the wrong version, and credentials that are refused. (Cases already
//! covered elsewhere: commands.rs has the basic bad flags, identifiers and the unmigrated
//! schema; publish_*.rs check each publisher's permanent errors one message at a time.)
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;

use crate::common::*;

/// Insert one row the way a service in any language would.
async fn insert(
    db: &TestSchema,
    aggregate_id: &str,
    event_type: &str,
    payload: &str,
    headers: &str,
) -> uuid::Uuid {
    sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', $1, $2, $3::jsonb, $4::jsonb) RETURNING id",
        db.table()
    ))
    .bind(aggregate_id)
    .bind(event_type)
    .bind(payload)
    .bind(headers)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Rows no broker can carry are dead-lettered at their first attempt, with a reason; every
/// other row, odd but valid ones included, is delivered, and in order.
#[tokio::test(flavor = "multi_thread")]
async fn unpublishable_rows_are_dead_lettered_at_once_and_the_rest_flows() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let long_id = "x".repeat(10_000);
    let huge_id = "x".repeat(100_000);
    let big_payload = format!("{{\"blob\": \"{}\"}}", "y".repeat(2 * 1024 * 1024));
    let mut good = Vec::new();
    let mut bad: Vec<(uuid::Uuid, &str)> = Vec::new();
    good.push(insert(&db, "1", "order.created", "{}", "{}").await);
    // Over NATS's max_payload (1 MiB by default).
    bad.push((
        insert(&db, "1", "order.created", &big_payload, "{}").await,
        "",
    ));
    good.push(insert(&db, "1", "order.paid", "{}", "{}").await);
    // Event types that make invalid subjects: a space, a wildcard, an empty token.
    bad.push((
        insert(&db, "2", "order created", "{}", "{}").await,
        "subject",
    ));
    bad.push((insert(&db, "2", "order.*", "{}", "{}").await, "subject"));
    bad.push((insert(&db, "2", "order..x", "{}", "{}").await, "subject"));
    // Headers NATS cannot carry: CR/LF in a value, a colon in a name.
    bad.push((
        insert(&db, "3", "order.created", "{}", r#"{"x-note": "a\r\nb"}"#).await,
        "header",
    ));
    bad.push((
        insert(&db, "3", "order.created", "{}", r#"{"a:b": "v"}"#).await,
        "header",
    ));
    // Odd but valid: empty and huge aggregate ids, headers that are not strings, unicode.
    let empty_agg = insert(&db, "", "order.created", "{}", "{}").await;
    good.push(empty_agg);
    let long_agg = insert(&db, &long_id, "order.created", "{}", "{}").await;
    good.push(long_agg);
    // An aggregate id over NATS's 64 KiB header limit (it travels as a header).
    bad.push((
        insert(&db, &huge_id, "order.created", "{}", "{}").await,
        "header",
    ));
    good.push(
        insert(
            &db,
            "4",
            "order.created",
            "{}",
            r#"{"n": 5, "o": {"k": 1}, "t": true}"#,
        )
        .await,
    );
    // Headers that are not an object do not decode: dead-lettered by the claim, naming them
    // (their attempt count stays 0: no attempt was made).
    let array_headers = insert(&db, "4", "order.created", "{}", "[1, 2]").await;
    let unicode = insert(
        &db,
        "4",
        "order.created",
        r#"{"name": "Grüße ☃"}"#,
        r#"{"x-lang": "de"}"#,
    )
    .await;
    good.push(unicode);
    good.push(insert(&db, "3", "order.shipped", "{}", "{}").await);

    let url = stream.publisher_url();
    let out = db.cli(&["relay", "--publisher", &url, "--drain"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // Dead at once, each with a reason.
    for (id, needle) in &bad {
        let (attempts, dead, error): (i32, bool, Option<String>) = sqlx::query_as(&format!(
            "SELECT attempts, dead_at IS NOT NULL, last_error FROM {} WHERE id = $1",
            db.table()
        ))
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let error = error.unwrap_or_default();
        assert!(dead, "{id} is dead: {error}");
        assert_eq!(
            attempts, 1,
            "{id}: dead-lettered at its first attempt: {error}"
        );
        assert!(error.contains(needle), "{id}: {error}");
    }
    let (dead, error): (bool, Option<String>) = sqlx::query_as(&format!(
        "SELECT dead_at IS NOT NULL, last_error FROM {} WHERE id = $1",
        db.table()
    ))
    .bind(array_headers)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let error = error.unwrap_or_default();
    assert!(
        dead && error.contains("undecodable row") && error.contains("headers is a JSON array"),
        "headers [1, 2]: dead {dead}, {error}"
    );
    // Everything else delivered, once, each aggregate in insert order (aggregates are sent
    // concurrently, so only the per-aggregate order is defined).
    let arrived = stream.ids().await;
    let mut got = arrived.clone();
    got.sort();
    let mut want: Vec<String> = good.iter().map(|u| u.to_string()).collect();
    want.sort();
    assert_eq!(got, want, "the good rows, each once, and nothing else");
    let pos = |id: &uuid::Uuid| arrived.iter().position(|a| *a == id.to_string()).unwrap();
    assert!(pos(&good[0]) < pos(&good[1]), "aggregate 1 in order");
    assert!(pos(&good[4]) < pos(&unicode), "aggregate 4 in order");
    // The odd ones arrived intact.
    let s = stream.js.get_stream(&stream.name).await.unwrap();
    let mut by_id: HashMap<String, async_nats::jetstream::message::StreamMessage> = HashMap::new();
    for seq in 1..=arrived.len() as u64 {
        let m = s.get_raw_message(seq).await.unwrap();
        let id = m.headers.get("Nats-Msg-Id").unwrap().to_string();
        by_id.insert(id, m);
    }
    let agg = |id: &uuid::Uuid| {
        by_id[&id.to_string()]
            .headers
            .get("outbox-aggregate-id")
            .map(|v| v.to_string())
    };
    assert_eq!(agg(&empty_agg).as_deref(), Some(""));
    assert_eq!(agg(&long_agg), Some(long_id));
    let body: serde_json::Value =
        serde_json::from_slice(&by_id[&unicode.to_string()].payload).unwrap();
    assert_eq!(body["name"], "Grüße ☃");
    stream.cleanup().await;
    db.cleanup().await;
}

/// Malformed publisher URLs and durations: an `error:` naming the culprit, exit 2, before
/// anything is touched.
#[tokio::test]
async fn malformed_urls_and_durations_are_usage_errors() {
    let db = TestSchema::migrated().await;
    let cases: &[(&[&str], &str)] = &[
        (&["relay", "--publisher", "nats://"], "host"),
        (&["relay", "--publisher", "nats://127.0.0.1:99999"], "99999"),
        (&["relay", "--publisher", "not a url"], "publisher"),
        (
            &[
                "relay",
                "--publisher",
                "nats://127.0.0.1:4222?ack_timeout=soon",
            ],
            "ack_timeout",
        ),
        (
            &[
                "relay",
                "--publisher",
                "nats://127.0.0.1:4222?create_stream=maybe",
            ],
            "create_stream",
        ),
        (
            &[
                "relay",
                "--publisher",
                "amqp://guest:guest@127.0.0.1:5672/%2f?confirm_timeout=-1s",
            ],
            "confirm_timeout",
        ),
        (
            &["relay", "--publisher", "mqtt://127.0.0.1:1883?qos=7"],
            "qos",
        ),
        (
            &["relay", "--publisher", "null:", "--lease", "soon"],
            "lease",
        ),
        (&["relay", "--publisher", "null:", "--lease=-5s"], "lease"),
        (&["relay", "--publisher", "null:", "--lease", "0s"], "lease"),
        (
            &[
                "relay",
                "--publisher",
                "null:",
                "--backoff-base",
                "5s",
                "--backoff-max",
                "1s",
            ],
            "--backoff-base must not exceed --backoff-max",
        ),
        (
            &["relay", "--publisher", "null:", "--poll-interval", "0s"],
            "--poll-interval",
        ),
        (
            &["relay", "--publisher", "null:", "--partition-lease", "1ms"],
            "--partition-lease",
        ),
        (
            &["relay", "--publisher", "null:", "--inject-faults", "1.5"],
            "inject-faults",
        ),
        (
            &[
                "relay",
                "--publisher",
                "null:",
                "--retention-period",
                "7 fortnights",
            ],
            "retention-period",
        ),
    ];
    for (args, needle) in cases {
        let out = db.cli(args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
    db.cleanup().await;
}

/// Identifiers that try SQL injection are refused from every source (flag, environment,
/// config file) and by every command, and nothing is created or dropped.
#[tokio::test]
async fn injection_in_identifiers_is_refused_from_every_source() {
    let db = TestSchema::migrated().await;
    let evil = "outbox; DROP TABLE x";
    for (args, env) in [
        (vec!["status"], ("TXOUTBOX_TABLE", evil)),
        (
            vec!["relay", "--publisher", "null:", "--drain"],
            ("TXOUTBOX_TABLE", evil),
        ),
        (
            vec!["dlq", "list"],
            ("TXOUTBOX_SCHEMA", "public\"; DROP SCHEMA public; --"),
        ),
        (vec!["migrate"], ("TXOUTBOX_SCHEMA", "x' OR '1'='1")),
    ] {
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            db.command(&args).env(env.0, env.1).output(),
        )
        .await
        .unwrap()
        .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains("invalid"), "{err}");
    }
    let dir = std::env::temp_dir().join(unique("txo_bad_cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("txoutbox.toml");
    std::fs::write(&cfg, format!("table = {evil:?}\n")).unwrap();
    let out = db.cli(&["--config", cfg.to_str().unwrap(), "status"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
    // The table is still there and nothing else appeared in the schema.
    let tables = db
        .scalar(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = 'outbox_events'",
            db.schema
        ))
        .await;
    assert_eq!(tables, 1);
    db.cleanup().await;
}

/// A schema newer than the binary, or older, stops every command with a line that says what
/// to do.
#[tokio::test]
async fn wrong_schema_version_says_what_to_do() {
    let db = TestSchema::migrated().await;
    let versions = format!("\"{}\".txoutbox_migrations", db.schema);
    let max: i32 = sqlx::query_scalar(&format!("SELECT max(version) FROM {versions}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Newer: a later txoutbox migrated this table.
    let cols: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'txoutbox_migrations' ORDER BY ordinal_position",
    )
    .bind(&db.schema)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {versions} ({cols}) SELECT {vals} FROM {versions} WHERE version = $1",
        cols = cols.join(", "),
        vals = cols
            .iter()
            .map(|c| if c == "version" {
                "version + 90".to_string()
            } else {
                c.clone()
            })
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .bind(max)
    .execute(&db.pool)
    .await
    .unwrap();
    for args in [
        vec!["status"],
        vec!["relay", "--publisher", "null:", "--drain"],
    ] {
        let out = db.cli(&args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("newer") && err.contains("upgrade txoutbox"),
            "{args:?}: {err}"
        );
    }
    // Older: the last migration is missing.
    sqlx::query(&format!("DELETE FROM {versions} WHERE version >= $1"))
        .bind(max)
        .execute(&db.pool)
        .await
        .unwrap();
    for args in [
        vec!["status"],
        vec!["relay", "--publisher", "null:", "--drain"],
    ] {
        let out = db.cli(&args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("run `txoutbox migrate`"), "{args:?}: {err}");
    }
    db.cleanup().await;
}

/// A database or broker that refuses the credentials: exit 1, an error that says so, and the
/// password nowhere in it.
#[tokio::test]
async fn refused_credentials_are_clear_and_keep_the_password_out() {
    let db = TestSchema::migrated().await;
    let secret = "s3cr3t-Pw-42";
    // PostgreSQL: a role that does not exist.
    let base = url::Url::parse(&database_url()).unwrap();
    let mut bad_db = base.clone();
    bad_db.set_username("txoutbox_no_such_role").unwrap();
    bad_db.set_password(Some(secret)).unwrap();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        db.command(&["status"])
            .env("DATABASE_URL", bad_db.as_str())
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("txoutbox_no_such_role"),
        "says which role: {err}"
    );
    assert!(!err.contains(secret), "{err}");
    // RabbitMQ: a wrong password for a real user.
    let mut amqp = url::Url::parse(&amqp_url()).unwrap();
    amqp.set_password(Some(secret)).unwrap();
    // A drain job says why it cannot run (a service would start and keep trying).
    let out = db
        .cli(&["relay", "--drain", "--publisher", amqp.as_str()])
        .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.to_lowercase().contains("access")
            || err.to_lowercase().contains("auth")
            || err.to_lowercase().contains("refused"),
        "says the broker refused: {err}"
    );
    assert!(!err.contains(secret), "{err}");
    db.cleanup().await;
}

/// Headers given on the command line: malformed ones and non-UTF-8 bytes are usage errors.
#[tokio::test]
async fn odd_headers_and_ids_on_the_command_line() {
    let db = TestSchema::migrated().await;
    let enqueue = |extra: &'static [&'static str]| {
        let mut a = vec![
            "enqueue",
            "--aggregate-type",
            "order",
            "--event-type",
            "order.created",
            "--payload",
            "{}",
        ];
        a.extend_from_slice(extra);
        a
    };
    for (extra, needle) in [
        (&["--aggregate-id", "1", "--header", "novalue"][..], "K=V"),
        (&["--aggregate-id", "1", "--header", "=v"][..], "name"),
        (&["--aggregate-id", "1", "--id", "not-a-uuid"][..], "--id"),
    ] {
        let out = db.cli(&enqueue(extra)).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    // Non-UTF-8 bytes in a header.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let mut c = db.command(&enqueue(&["--aggregate-id", "1", "--header"]));
        c.arg(std::ffi::OsStr::from_bytes(b"k=\xff\xfe"));
        let out = c.output().await.unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    }
    // An empty aggregate id is a valid (if odd) value, kept as given.
    let out = db.cli(&enqueue(&["--aggregate-id", ""])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE aggregate_id = ''")
            .await,
        1
    );
    db.cleanup().await;
}
