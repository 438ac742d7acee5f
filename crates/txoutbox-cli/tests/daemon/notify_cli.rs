//! systemd readiness (`Type=notify`): the relay sends `READY=1` to the datagram socket named
//! by `NOTIFY_SOCKET` once it relays and its admin listener answers, and `STOPPING=1` when a
//! SIGTERM begins its shutdown; a relay of one table and one of `[[outbox]]` entries alike.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::net::UnixDatagram;

use crate::common::*;

/// The next datagram on `sock`, as text (60 s at most: a relay that never says it is ready
/// fails the test).
async fn next_message(sock: &UnixDatagram, waiting_for: &str) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(60), sock.recv(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no {waiting_for} within 60 s"))
        .unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// Start `args` with `NOTIFY_SOCKET` set, check READY=1 (with the admin listener answering
/// by then, and `/readyz` once the outboxes connect), SIGTERM it, check STOPPING=1 and a clean
/// exit.
async fn ready_then_stopping(db: &TestSchema, dir: &Path, args: &[&str], port: u16) {
    let path = dir.join(unique("notify"));
    let sock = UnixDatagram::bind(&path).unwrap();
    let log = dir.join(unique("relay")).with_extension("log");
    let child = db
        .command(args)
        .env("NOTIFY_SOCKET", &path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ready = next_message(&sock, "READY=1").await;
    let lines: Vec<&str> = ready.lines().collect();
    assert!(lines.contains(&"READY=1"), "{ready:?}");
    assert!(lines.contains(&"STATUS=relaying"), "{ready:?}");
    // The listener answers at once; each outbox connects its database in the background (one
    // whose database is down must not hold the others back), so /readyz follows.
    assert_eq!(http(port, "GET", "/healthz", None, "").await.0, 200);
    wait_until(30, "/readyz 200", || async {
        http(port, "GET", "/readyz", None, "").await.0 == 200
    })
    .await;
    signal(&child, "TERM");
    let stopping = next_message(&sock, "STOPPING=1").await;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    stop_waited(child, &log).await;
}

async fn stop_waited(mut child: tokio::process::Child, log: &Path) {
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("relay exits after SIGTERM")
        .unwrap();
    let logs = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "relay exit: {status}\n{logs}");
}

#[tokio::test]
async fn relay_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let db = TestSchema::migrated().await;
    let dir = std::env::temp_dir().join(unique("txoutbox-notify"));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    ready_then_stopping(
        &db,
        &dir,
        &["relay", "--publisher", "stdout:", "--admin-addr", &addr],
        port,
    )
    .await;

    // The same through [[outbox]] entries (cmd::many).
    let config = dir.join("outboxes.toml");
    std::fs::write(
        &config,
        format!(
            "[[outbox]]\nname = \"orders\"\nschema = \"{}\"\npublisher = \"stdout:\"\n",
            db.schema
        ),
    )
    .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = config.display().to_string();
    ready_then_stopping(
        &db,
        &dir,
        &["--config", &config, "relay", "--admin-addr", &addr],
        port,
    )
    .await;

    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}
