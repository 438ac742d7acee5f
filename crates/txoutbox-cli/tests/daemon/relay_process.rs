//! The daemon as a real child process against real PostgreSQL and NATS: crashes, signals,
//! wake-ups.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::*;

/// A relay SIGKILLed in the middle of a batch loses nothing: once its lease expires, a second
/// relay delivers everything.
#[tokio::test(flavor = "multi_thread")]
async fn relay_killed_mid_batch_loses_nothing() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let n = 20_000;
    let ids = db.insert_events(n, 500).await;
    let url = stream.publisher_url();
    let args = [
        "relay",
        "--publisher",
        &url,
        "--batch-size",
        "1000",
        "--lease",
        "3s",
    ];
    let mut first = db.spawn(&args);
    // Kill it once it has published some, while a batch is in flight.
    wait_until(60, "first messages in the stream", || async {
        stream.count().await > 0
    })
    .await;
    first.start_kill().expect("SIGKILL");
    let _ = first.wait().await;
    let leased = db
        .scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL AND locked_by IS NOT NULL")
        .await;
    let processed = db
        .scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
        .await;
    assert!(
        processed < n,
        "the relay finished before it was killed; the test proves nothing"
    );
    // Mid-batch: events the broker has that were never settled (an ordered relay holds its
    // batch by partition, not by row lease), or rows still leased.
    let in_stream = stream.count().await as i64;
    assert!(
        in_stream > processed || leased > 0,
        "nothing published-but-unsettled nor leased at the kill ({in_stream} in the stream, {processed} settled): not mid-batch"
    );

    // A second relay, run to completion.
    let started = Instant::now();
    let out = db
        .cli(&[
            "relay",
            "--publisher",
            &url,
            "--drain",
            "--lease",
            "3s",
            "--poll-interval",
            "200ms",
        ])
        .await;
    assert!(
        out.status.success(),
        "second relay failed: {}",
        stderr(&out)
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL")
            .await,
        n,
        "not every event was settled as published"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let got: HashSet<String> = stream.ids().await.into_iter().collect();
    let want: HashSet<String> = ids.iter().map(|u| u.to_string()).collect();
    let missing = want.difference(&got).count();
    assert_eq!(
        missing, 0,
        "{missing} committed events never reached the broker"
    );
    stream.cleanup().await;
    db.cleanup().await;
}

/// SIGTERM during a drain: exit promptly with the status of an interrupted drain (75: not
/// 0, which a scheduler reads as "drained"), no lease left behind, nothing lost.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_drain_exits_cleanly() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let n = 20_000;
    db.insert_events(n, 100).await;
    let url = stream.publisher_url();
    let mut relay = db.spawn(&[
        "relay",
        "--publisher",
        &url,
        "--drain",
        "--batch-size",
        "500",
    ]);
    wait_until(60, "first messages in the stream", || async {
        stream.count().await > 0
    })
    .await;
    signal(&relay, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), relay.wait())
        .await
        .expect("relay did not exit within 20 s of SIGTERM")
        .expect("wait");
    assert_eq!(status.code(), Some(75), "exit status {status:?}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE locked_by IS NOT NULL OR locked_until IS NOT NULL OR lock_token IS NOT NULL")
            .await,
        0,
        "a lease was left held after shutdown"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NOT NULL OR (processed_at IS NULL AND dead_at IS NULL)")
            .await,
        n,
        "events went missing"
    );
    // Everything marked published is really in the broker.
    let got: HashSet<String> = stream.ids().await.into_iter().collect();
    let published: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM {} WHERE processed_at IS NOT NULL",
        db.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!published.is_empty());
    for id in &published {
        assert!(
            got.contains(&id.to_string()),
            "{id} marked published but not in the stream"
        );
    }
    // The rest drains afterwards.
    let out = db.cli(&["relay", "--publisher", &url, "--drain"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stream.ids().await.into_iter().collect::<HashSet<_>>().len() as i64,
        n
    );
    stream.cleanup().await;
    db.cleanup().await;
}

/// With a 60 s poll, an event committed while the relay idles arrives at once: the NOTIFY
/// wake-up works, through the daemon.
#[tokio::test(flavor = "multi_thread")]
async fn idle_relay_wakes_on_commit() {
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let url = stream.publisher_url();
    let mut relay = db.spawn(&["relay", "--publisher", &url, "--poll-interval", "60s"]);
    // Idle = registered as waiting.
    wait_until(30, "the relay to wait", || async {
        db.scalar(&format!(
            "SELECT count(*) FROM \"{}\".outbox_waiters WHERE waiting_until > now()",
            db.schema
        ))
        .await
            > 0
    })
    .await;
    let started = Instant::now();
    let out = db
        .cli(&[
            "enqueue",
            "--aggregate-type",
            "order",
            "--aggregate-id",
            "1",
            "--event-type",
            "order.created",
            "--payload",
            r#"{"total": 5}"#,
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(10, "the event in the stream", || async {
        stream.count().await == 1
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: the poll, not a wake-up, delivered it"
    );
    signal(&relay, "TERM");
    let status = relay.wait().await.unwrap();
    assert!(status.success());
    stream.cleanup().await;
    db.cleanup().await;
}

/// `txoutbox status` shows the live relays and the partitions each owns; a second relay
/// takes half within seconds, and a stopped one leaves the list.
#[tokio::test(flavor = "multi_thread")]
async fn status_shows_relays_and_their_partitions() {
    let db = TestSchema::migrated().await;
    let args = ["relay", "--publisher", "null:", "--partition-lease", "3s"];
    let owned = || async {
        let out = db.cli(&["status", "--json"]).await;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut counts: Vec<usize> = v["relays"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["alive"] == true)
            .map(|r| r["partitions"].as_array().unwrap().len())
            .collect();
        counts.sort_unstable();
        counts
    };
    let mut a = db.spawn(&args);
    wait_until(30, "one relay owning all 64", || async {
        owned().await == [64]
    })
    .await;
    let mut b = db.spawn(&args);
    wait_until(30, "two relays owning 32 each", || async {
        owned().await == [32, 32]
    })
    .await;
    let out = db.cli(&["status"]).await;
    assert!(
        stdout(&out).contains("relays     2 live"),
        "{}",
        stdout(&out)
    );
    signal(&b, "TERM");
    assert!(b.wait().await.unwrap().success());
    wait_until(30, "the survivor owning all 64", || async {
        owned().await == [64]
    })
    .await;
    signal(&a, "TERM");
    assert!(a.wait().await.unwrap().success());
    db.cleanup().await;
}
