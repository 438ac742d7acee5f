//! A dependency down when the daemon starts (docs/operations.md, "Dependencies down at
//! start-up"): a relay service comes up, says on `/readyz` what is down, and delivers once it
//! answers; a route whose broker is down holds back only that route; a `--drain` job that
//! cannot reach its broker says so and fails. Brokers that are down are loopback ports
//! nothing listens on; one comes up as a `nats-server` of the test's own.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Stdio;

use crate::common::*;

/// `/readyz`, or `None` while nothing listens on `port` (the relay not up yet).
async fn readyz(port: u16) -> Option<(u16, String)> {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    Some(http(port, "GET", "/readyz", None, "").await)
}

/// Fail at once if the relay has exited.
fn still_running(relay: &mut tokio::process::Child) {
    if let Ok(Some(status)) = relay.try_wait() {
        panic!("the relay exited ({status}) instead of waiting for what it depends on");
    }
}

#[tokio::test]
async fn a_route_whose_broker_is_down_at_start_holds_back_only_that_route() {
    let db = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txoutbox-startup"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("orders.jsonl");
    let config = dir.join("txoutbox.toml");
    let down = free_port();
    std::fs::write(
        &config,
        format!(
            r#"
[relay]
poll_interval = "100ms"

[[route]]
name = "payments"
event_type = "payment.*"
publisher = "nats://127.0.0.1:{down}?connect_timeout=1s"

[[route]]
name = "orders"
event_type = "order.*"
publisher = "file:{}"
"#,
            file.display()
        ),
    )
    .unwrap();
    db.insert_events(5, 5).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut relay = db.spawn(&[
        "--config",
        config.to_str().unwrap(),
        "relay",
        "--admin-addr",
        &addr,
    ]);
    wait_until(60, "the healthy route delivers its 5 events", || {
        still_running(&mut relay);
        let db = &db;
        async move {
            db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                .await
                == 5
        }
    })
    .await;
    let lines = std::fs::read_to_string(&file).unwrap_or_default();
    assert_eq!(lines.lines().count(), 5, "{lines}");
    let (status, body) = readyz(port).await.expect("the admin listener is up");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("payments"),
        "readiness names the route: {body}"
    );
    stop(relay).await;
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn a_broker_down_at_start_the_relay_comes_up_not_ready_and_delivers_once_it_answers() {
    let db = TestSchema::migrated().await;
    let nats_port = free_port();
    let store = std::env::temp_dir().join(unique("txoutbox-startup-nats"));
    std::fs::create_dir_all(&store).unwrap();
    let publisher = format!(
        "nats://127.0.0.1:{nats_port}?stream={}&subject=startup.{{event_type}}&connect_timeout=1s",
        unique("TXO").to_uppercase()
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut relay = db.spawn(&[
        "relay",
        "--publisher",
        &publisher,
        "--poll-interval",
        "100ms",
        "--admin-addr",
        &addr,
    ]);
    wait_until(30, "/readyz answers 503 naming the broker", || {
        still_running(&mut relay);
        async move {
            matches!(readyz(port).await, Some((503, body)) if body.contains(&nats_port.to_string()))
        }
    })
    .await;
    db.insert_events(3, 3).await;

    let mut nats = tokio::process::Command::new("nats-server")
        .args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &nats_port.to_string(),
            "-sd",
        ])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server on PATH");
    wait_until(60, "the 3 events delivered once the broker answers", || {
        still_running(&mut relay);
        let db = &db;
        async move {
            db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                .await
                == 3
        }
    })
    .await;
    wait_until(30, "/readyz answers 200", || async move {
        matches!(readyz(port).await, Some((200, _)))
    })
    .await;
    stop(relay).await;
    let _ = nats.kill().await;
    let _ = std::fs::remove_dir_all(&store);
    db.cleanup().await;
}

#[tokio::test]
async fn a_drain_whose_broker_is_down_says_why_and_fails() {
    let db = TestSchema::migrated().await;
    db.insert_events(2, 2).await;
    let down = free_port();
    let out = db
        .cli(&[
            "relay",
            "--drain",
            "--publisher",
            &format!("nats://127.0.0.1:{down}?connect_timeout=1s"),
        ])
        .await;
    assert!(!out.status.success(), "a drain that cannot run succeeded");
    let err = stderr(&out);
    assert!(
        err.contains("cannot reach the broker") && err.contains(&down.to_string()),
        "{err}"
    );
    db.cleanup().await;
}

/// The database is down when the relay starts: it keeps trying (and says so in its log), and
/// delivers once the database answers. Here the database is reached through a port the test
/// opens (a TCP relay to the real server) only after the relay has reported it unreachable.
#[tokio::test]
async fn a_database_down_at_start_the_relay_waits_for_it_and_delivers() {
    let db = TestSchema::migrated().await;
    let real = database_url();
    let target = real
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_string();
    let port = free_port();
    let url = real.replace(&target, &format!("127.0.0.1:{port}"));
    assert_ne!(url, real);
    let dir = std::env::temp_dir().join(unique("txoutbox-startup-db"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("out.jsonl");
    let log = dir.join("relay.log");
    let mut relay = db
        .command(&[
            "relay",
            "--publisher",
            &format!("file:{}", file.display()),
            "--poll-interval",
            "100ms",
        ])
        .env("DATABASE_URL", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    wait_until(30, "the relay reports the database unreachable", || {
        still_running(&mut relay);
        let log = log.clone();
        async move {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("database not reachable")
        }
    })
    .await;
    still_running(&mut relay);

    // The database comes up at that address.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let proxy = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    db.insert_events(3, 3).await;
    wait_until(
        60,
        "the 3 events delivered once the database answers",
        || {
            still_running(&mut relay);
            let db = &db;
            async move {
                db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
                    .await
                    == 3
            }
        },
    )
    .await;
    stop(relay).await;
    proxy.abort();
    let _ = std::fs::remove_dir_all(&dir);
    db.cleanup().await;
}
