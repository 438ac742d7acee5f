//! A row written by plain SQL that the relay cannot decode (here `created_at = '-infinity'`
//! and `'infinity'` on PostgreSQL) through the real binary: the relay dead-letters it and
//! delivers the rest, and the operator commands (`status`, `dlq list/show`, `events
//! list/show`) show it rather than failing.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use crate::common::*;
use serde_json::Value;

#[tokio::test]
async fn relay_and_operator_commands_get_past_an_undecodable_row() {
    let db = TestSchema::migrated().await;
    let good = db.insert_events(3, 3).await;
    let bad: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, created_at)
         VALUES ('bad', '1', 'bad.row', '{{}}', '-infinity'), ('bad', '2', 'bad.row', '{{}}', 'infinity')
         RETURNING id",
        db.table()
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let lines = |o: &std::process::Output| -> Vec<Value> {
        stdout(o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };

    let out = db.cli(&["status", "--json"]).await;
    assert!(out.status.success(), "status: {}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pending"], 5, "{v}");

    let dir = std::env::temp_dir().join(unique("txo_bad_rows"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("events.jsonl");
    let url = format!("file:{}", path.display());
    let out = db.cli(&["relay", "--publisher", &url, "--drain"]).await;
    assert!(out.status.success(), "relay: {}", stderr(&out));
    let sent: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let want: Vec<String> = good.iter().map(|id| id.to_string()).collect();
    assert_eq!(sent, want, "the good events, and only them");

    let out = db.cli(&["dlq", "list", "--json"]).await;
    assert!(out.status.success(), "dlq list: {}", stderr(&out));
    let dead = lines(&out);
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (d, (id, what)) in dead.iter().zip(bad.iter().zip(["-infinity", "infinity"])) {
        assert_eq!(d["id"], id.to_string());
        assert_eq!(
            d["last_error"],
            format!("undecodable row: created_at is {what}"),
            "{d}"
        );
    }
    for args in [
        vec!["dlq", "show", &bad[0].to_string(), "--json"],
        vec!["events", "show", &bad[1].to_string(), "--json"],
        vec!["events", "list", "--json", "--state", "dead"],
    ] {
        let out = db.cli(&args).await;
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("undecodable row"),
            "{args:?}: {}",
            stdout(&out)
        );
    }
    let out = db.cli(&["status", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["pending"].as_i64(), v["dead"].as_i64()),
        (Some(0), Some(2)),
        "{v}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    db.cleanup().await;
}
