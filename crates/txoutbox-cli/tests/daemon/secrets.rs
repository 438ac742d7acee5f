//! Secrets from files (`--database-url-file`, `--publisher-file`, `--admin-token-file` and
//! their `*_FILE` variables) through the real binary, and that no secret is ever echoed: not
//! in logs, errors, `--help` or `status`.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A temporary directory of secret files, removed on drop.
struct Secrets(PathBuf);

impl Secrets {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("txoutbox-secrets"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    /// Write `content` plus a trailing newline (as `echo` and most secret stores do).
    fn file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, format!("{content}\n")).unwrap();
        p
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test database URL with a password in it (the test server trusts loopback, so any
/// password works: what matters is that it never shows up).
fn url_with_password(pw: &str) -> String {
    database_url().replacen("postgres@", &format!("postgres:{pw}@"), 1)
}

fn all_output(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

async fn run(mut c: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(120), c.output())
        .await
        .expect("command timed out")
        .unwrap()
}

#[tokio::test]
async fn database_url_from_a_file_works_and_is_never_echoed() {
    const PW: &str = "db-Pw-1f9e";
    let db = TestSchema::new().await;
    let secrets = Secrets::new();
    let good = secrets.file("db-url", &url_with_password(PW));
    assert!(
        url_with_password(PW).contains(PW),
        "the test URL has no user"
    );

    // The env var form (DATABASE_URL_FILE), trailing newline and all.
    let mut c = db.command(&["migrate"]);
    c.env_remove("DATABASE_URL").env("DATABASE_URL_FILE", &good);
    let out = run(c).await;
    assert!(out.status.success(), "{}", stderr(&out));
    // The flag form; `status` prints no URL, let alone its password.
    let mut c = db.command(&["status", "--database-url-file"]);
    c.arg(&good).env_remove("DATABASE_URL");
    let out = run(c).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("pending"), "{}", stdout(&out));
    assert!(!all_output(&out).contains(PW), "{}", all_output(&out));
    let mut c = db.command(&["status", "--json", "--database-url-file"]);
    c.arg(&good).env_remove("DATABASE_URL");
    let out = run(c).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!all_output(&out).contains(PW), "{}", all_output(&out));

    // An unreachable server: the error names the (redacted) URL, not the password.
    let bad = secrets.file(
        "bad-url",
        &format!("postgres://postgres:{PW}@127.0.0.1:1/test"),
    );
    let mut c = db.command(&["status"]);
    c.env_remove("DATABASE_URL").env("DATABASE_URL_FILE", &bad);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
    assert!(!all_output(&out).contains(PW), "{}", all_output(&out));

    // The binary speaks TLS to PostgreSQL (the test server has `ssl = on`).
    let require = secrets.file(
        "require-url",
        &format!("{}?sslmode=require", url_with_password(PW)),
    );
    let mut c = db.command(&["status"]);
    c.env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &require);
    let out = run(c).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // TLS demanded with a CA file that is not there: a clear error, still no password.
    let tls = secrets.file(
        "tls-url",
        &format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            url_with_password(PW),
            secrets.0.join("no-such-ca.pem").display()
        ),
    );
    let mut c = db.command(&["status"]);
    c.env_remove("DATABASE_URL").env("DATABASE_URL_FILE", &tls);
    let out = run(c).await;
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-such-ca.pem"), "{}", stderr(&out));
    assert!(!all_output(&out).contains(PW), "{}", all_output(&out));
    db.cleanup().await;
}

#[tokio::test]
async fn unreadable_empty_or_doubled_secret_files_are_usage_errors() {
    const PW: &str = "dbl-Pw-77c1";
    let db = TestSchema::new().await;
    let secrets = Secrets::new();
    let missing = secrets.0.join("missing-url");
    let mut c = db.command(&["status"]);
    c.env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &missing);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--database-url-file") && err.contains("missing-url"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let empty = secrets.file("empty", "");
    let mut c = db.command(&["status"]);
    c.env_remove("DATABASE_URL")
        .env("DATABASE_URL_FILE", &empty);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is empty"), "{}", stderr(&out));

    // The plain variable and the file at once: refused, naming both, echoing neither.
    let good = secrets.file("db-url", &url_with_password(PW));
    let mut c = db.command(&["status"]);
    c.env("DATABASE_URL", url_with_password(PW))
        .env("DATABASE_URL_FILE", &good);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--database-url-file") && err.contains("--database-url"),
        "{err}"
    );
    assert!(!err.contains(PW), "{err}");

    let mut c = db.command(&["relay", "--publisher", "null:", "--publisher-file"]);
    c.arg(&good);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--publisher-file"),
        "{}",
        stderr(&out)
    );

    let mut c = db.command(&["relay", "--publisher", "null:", "--admin-token", "x"]);
    c.env("TXOUTBOX_ADMIN_TOKEN_FILE", &good);
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--admin-token"), "{}", stderr(&out));
    db.cleanup().await;
}

#[tokio::test]
async fn publisher_from_a_file_delivers_and_its_password_stays_hidden() {
    const PW: &str = "redis-Pw-3c0d";
    let db = TestSchema::migrated().await;
    db.insert_events(5, 5).await;
    let secrets = Secrets::new();
    let sink = secrets.0.join("events.jsonl");
    let publisher = secrets.file("publisher", &format!("file:{}", sink.display()));
    let mut c = db.command(&["relay", "--drain"]);
    c.env("TXOUTBOX_PUBLISHER_FILE", &publisher);
    let out = run(c).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let delivered = std::fs::read_to_string(&sink).unwrap();
    assert_eq!(delivered.lines().count(), 5, "{delivered}");

    // A broker that refuses the credentials (this Redis has no password set): the relay
    // stops with an error that names the broker and not the password, even in debug logs.
    let publisher = secrets.file(
        "redis-publisher",
        &format!("redis://:{PW}@127.0.0.1:6379?stream=txo_secret_test"),
    );
    let mut c = db.command(&["relay", "--drain", "--publisher-file"]);
    c.arg(&publisher).env("TXOUTBOX_LOG", "debug");
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("Redis"), "{}", stderr(&out));
    assert!(!all_output(&out).contains(PW), "{}", all_output(&out));
    // A NATS token is a user name without a password: hidden as well.
    let publisher = secrets.file("nats-publisher", "nats://nats-Tok-8a1b@127.0.0.1:1");
    let mut c = db.command(&["relay", "--drain", "--publisher-file"]);
    c.arg(&publisher).env("TXOUTBOX_LOG", "debug");
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
    assert!(
        !all_output(&out).contains("nats-Tok-8a1b"),
        "{}",
        all_output(&out)
    );
    db.cleanup().await;
}

/// One HTTP/1.1 request; the status code.
async fn http_status(port: u16, method: &str, path: &str, token: Option<&str>) -> u16 {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{auth}Content-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn admin_token_from_a_file_guards_changes() {
    const TOKEN: &str = "adm-Tok-5e21";
    let db = TestSchema::migrated().await;
    let secrets = Secrets::new();
    let token = secrets.file("token", TOKEN);
    let dead = db.insert_events(1, 1).await[0];
    sqlx::query(&format!(
        "UPDATE {} SET dead_at = now(), attempts = 10, last_error = 'x' WHERE id = $1",
        db.table()
    ))
    .bind(dead)
    .execute(&db.pool)
    .await
    .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let log = secrets.0.join("relay.log");
    let mut relay = db
        .command(&["relay", "--publisher", "null:", "--admin-addr", &addr])
        .env("TXOUTBOX_ADMIN_TOKEN_FILE", &token)
        .env("TXOUTBOX_LOG", "debug,sqlx=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    wait_connected(port).await;
    let retry = format!("/api/v1/dead-letters/{dead}/retry");
    assert_eq!(http_status(port, "POST", &retry, None).await, 401);
    assert_eq!(http_status(port, "POST", &retry, Some("wrong")).await, 401);
    // The file ends with a newline; the token is what comes before it.
    assert_eq!(http_status(port, "POST", &retry, Some(TOKEN)).await, 200);
    signal(&relay, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(!logs.contains(TOKEN), "{logs}");
    db.cleanup().await;
}

#[tokio::test]
async fn help_shows_no_secret_from_the_environment() {
    let secrets = [
        ("DATABASE_URL", "postgres://u:help-Db-Pw@h/db"),
        ("TXOUTBOX_PUBLISHER", "nats://u:help-Pub-Pw@h:4222"),
        ("TXOUTBOX_ADMIN_TOKEN", "help-Admin-Tok"),
    ];
    for args in [&["--help"][..], &["relay", "--help"], &["demo", "--help"]] {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_txoutbox"));
        c.args(args);
        for (k, v) in secrets {
            c.env(k, v);
        }
        let out = run(c).await;
        assert!(out.status.success(), "{}", stderr(&out));
        let text = all_output(&out);
        for secret in ["help-Db-Pw", "help-Pub-Pw", "help-Admin-Tok"] {
            assert!(!text.contains(secret), "{args:?} shows {secret}:\n{text}");
        }
    }
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_txoutbox"));
    c.args(["relay", "--help"]);
    let text = stdout(&run(c).await);
    for flag in [
        "--database-url-file",
        "--publisher-file",
        "--admin-token-file",
    ] {
        assert!(text.contains(flag), "{flag} missing from relay --help");
    }
}

/// One HTTP/1.1 request: (status, body).
async fn http_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Secrets in URL query strings (a PostgreSQL `password=`, Kafka's `sasl_password` and
/// `ssl.key.password`, a webhook's `token`, `api_key`, `Secret`) appear nowhere the relay
/// shows anything: its log (debug), `last_error` (and so the API and the dashboard), the
/// unauthenticated `/readyz` body, CLI errors.
#[tokio::test]
async fn secrets_in_url_query_strings_are_never_shown() {
    const DB_PW: &str = "dbq-Pw-4d2a";
    const TOKEN: &str = "adm-Tok-q7c3";
    let sep = if database_url().contains('?') {
        '&'
    } else {
        '?'
    };
    let db_url = format!(
        "{}{sep}password={DB_PW}&application_name=txo-secret",
        database_url()
    );
    let cases: [(&str, String, &[&str]); 2] = [
        (
            "kafka",
            "kafka://127.0.0.1:1?topic=txo.secret&sasl_password=kq-Pw-71e0\
             &ssl_key_password=kq-Key-9b3f&message_timeout_ms=300&connect_timeout=300ms"
                .into(),
            &["kq-Pw-71e0", "kq-Key-9b3f"],
        ),
        (
            "webhook",
            "http://127.0.0.1:1/hook?token=wh-Tok-5c11&api_key=wh-Key-e7d0&Secret=wh-Sec-3f9a\
             &timeout=300ms"
                .into(),
            &["wh-Tok-5c11", "wh-Key-e7d0", "wh-Sec-3f9a"],
        ),
    ];
    for (kind, publisher, publisher_secrets) in cases {
        let db = TestSchema::migrated().await;
        db.insert_events(2, 2).await;
        let dir = Secrets::new();
        let log = dir.0.join("relay.log");
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let relay = db
            .command(&["relay", "--publisher", &publisher, "--admin-addr", &addr])
            .args(["--metrics-interval", "100ms", "--max-attempts", "100"])
            .env("DATABASE_URL", &db_url)
            .env("TXOUTBOX_ADMIN_TOKEN", TOKEN)
            .env("TXOUTBOX_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        wait_connected(port).await;
        wait_until(60, "a failed publish", || async {
            db.scalar("SELECT count(*) FROM {t} WHERE last_error IS NOT NULL")
                .await
                > 0
        })
        .await;
        let (code, ready) = http_get(port, "/readyz", None).await;
        let (_, events) = http_get(port, "/api/v1/events?limit=10", Some(TOKEN)).await;
        let (_, status) = http_get(port, "/api/v1/status", Some(TOKEN)).await;
        let (_, page) = http_get(port, "/", None).await;
        signal(&relay, "TERM");
        let mut relay = relay;
        let _ = tokio::time::timeout(Duration::from_secs(60), relay.wait()).await;
        let errors: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT last_error FROM {} WHERE last_error IS NOT NULL",
            db.table()
        ))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let logs = std::fs::read_to_string(&log).unwrap();
        eprintln!("{kind}: last_error {errors:?}");
        assert!(
            logs.contains("password=***"),
            "{kind}: the start-up log shows the database URL redacted:\n{logs}"
        );
        assert!(events.contains("last_error"), "{kind}: {events}");
        for secret in publisher_secrets.iter().chain(&[DB_PW, TOKEN]) {
            for (what, text) in [
                ("log", &logs),
                ("/readyz", &ready),
                ("/api/v1/events", &events),
                ("/api/v1/status", &status),
                ("the page", &page),
                ("last_error", &errors.join("\n")),
            ] {
                assert!(
                    !text.contains(secret),
                    "{kind}: {what} shows {secret}:\n{text}"
                );
            }
        }
        if kind == "kafka" {
            assert_eq!(code, 503, "{ready}");
            assert!(ready.contains("sasl_password=***"), "{ready}");
        }
        db.cleanup().await;
    }

    // CLI errors: an unreachable database, a malformed publisher URL.
    let db = TestSchema::migrated().await;
    let out = db
        .command(&["status"])
        .env(
            "DATABASE_URL",
            format!("postgres://postgres@127.0.0.1:1/test?password={DB_PW}"),
        )
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
    assert!(!all_output(&out).contains(DB_PW), "{}", all_output(&out));
    for publisher in [
        "kafka://[bad?sasl_password=kq-Bad-11aa",
        "http://127.0.0.1:1/h?token=kq-Bad-11aa&timeout=soon",
    ] {
        let out = db
            .command(&["relay", "--drain", "--publisher", publisher])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            !all_output(&out).contains("kq-Bad-11aa"),
            "{}",
            all_output(&out)
        );
    }
    db.cleanup().await;
}
