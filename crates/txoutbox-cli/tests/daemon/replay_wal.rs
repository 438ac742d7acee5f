//! Replay after `relay --source wal`: with the WAL source's default (each row deleted as it
//! settles) nothing is kept and replay says so; with a retention period, what the WAL relay
//! sent to JetStream is sent again as it was.
#![allow(clippy::unwrap_used)]

use crate::common::*;
use crate::replay_nats::{messages, rows};

/// `relay --source wal --drain` to `stream`, with `extra` options.
async fn drain(db: &TestSchema, stream: &TestStream, extra: &[&str]) {
    let url = stream.publisher_url();
    let mut args = vec![
        "relay",
        "--source",
        "wal",
        "--publisher",
        &url,
        "--drain",
        "--poll-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let out = db.cli(&args).await;
    assert!(out.status.success(), "relay failed: {}", stderr(&out));
}

#[tokio::test]
async fn replay_after_the_wal_source_needs_a_retention_period() {
    let db = TestSchema::migrated().await;
    let out = db.cli(&["slot", "create"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let (first, second) = (TestStream::new().await, TestStream::new().await);

    // The default: deleted on settle, nothing to replay, and it says why.
    db.insert_events(12, 3).await;
    drain(&db, &first, &[]).await;
    assert_eq!(db.scalar("SELECT count(*) FROM {t}").await, 0);
    let out = db.cli(&["replay", "--dry-run", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (v["replayed"].as_u64(), v["retained"].as_bool()),
        (Some(0), Some(false))
    );
    assert!(
        stderr(&out).contains("keeps no published events"),
        "{}",
        stderr(&out)
    );

    // With a period the rows are kept, and the replay sends what the WAL relay sent.
    db.insert_events(12, 3).await;
    drain(&db, &first, &["--retention-period", "1h"]).await;
    let before = rows(&db).await;
    assert_eq!(before.len(), 12);
    let out = db
        .cli(&["replay", "--publisher", &second.publisher_url()])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed 12 event(s)"),
        "{}",
        stdout(&out)
    );
    let replayed = messages(&second).await;
    let ids: Vec<&String> = replayed
        .iter()
        .map(|m| &m.headers["Nats-Msg-Id"][0])
        .collect();
    let mut sent: Vec<_> = messages(&first)
        .await
        .into_iter()
        .filter(|m| ids.contains(&&m.headers["Nats-Msg-Id"][0]))
        .collect();
    let mut again = replayed.clone();
    sent.sort();
    again.sort();
    assert_eq!(sent.len(), 12);
    assert_eq!(
        sent, again,
        "the WAL relay's messages, sent again as they were"
    );
    assert_eq!(rows(&db).await, before, "replay changes no row");
    first.cleanup().await;
    second.cleanup().await;
    db.cleanup().await;
}
