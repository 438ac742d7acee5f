//! The daemon against the real RabbitMQ: delivery per the contract, and the dead-letter
//! workflow (an unroutable event, with `unroutable=transient`, dies after its attempts while
//! others flow; `dlq retry` brings it back once a queue is bound).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::*;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

async fn queue(ch: &Channel, exchange: &str, name: &str, key: &str) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        name.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

async fn take(ch: &Channel, q: &str, n: usize) -> Vec<lapin::message::Delivery> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < n {
        match ch
            .basic_get(q.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            Some(m) => got.push(m.delivery),
            None => {
                assert!(
                    Instant::now() < deadline,
                    "queue {q} gave {} of {n}",
                    got.len()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_event_dead_letters_and_dlq_retry_delivers_it() {
    let db = TestSchema::migrated().await;
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let exchange = unique("txo_x");
    ch.exchange_declare(
        exchange.as_str().into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let created_q = unique("txo_q_created");
    queue(&ch, &exchange, &created_q, "order.created").await;

    let created = db.insert_events(50, 10).await;
    let poison: uuid::Uuid = sqlx::query_scalar(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', '3', 'order.shipped', '{{}}') RETURNING id",
        db.table()
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();

    let url = format!(
        "{}?exchange={exchange}&routing_key={{event_type}}&unroutable=transient",
        amqp_url()
    );
    let relay = [
        "relay",
        "--publisher",
        &url,
        "--drain",
        "--max-attempts",
        "2",
        "--backoff-base",
        "50ms",
        "--backoff-max",
        "100ms",
        "--poll-interval",
        "100ms",
    ];
    let out = db.cli(&relay).await;
    assert!(out.status.success(), "{}", stderr(&out));

    // Every healthy event arrived, with the contract's fields.
    let got = take(&ch, &created_q, 50).await;
    let ids: HashSet<String> = got
        .iter()
        .map(|d| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    assert_eq!(ids, created.iter().map(|u| u.to_string()).collect());
    assert!(got
        .iter()
        .all(|d| d.routing_key.as_str() == "order.created"));
    assert!(got.iter().all(|d| d.properties.delivery_mode() == &Some(2)));

    // The unroutable one is a dead letter with its reason.
    let out = db.cli(&["dlq", "list", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{}", stdout(&out));
    assert_eq!(lines[0]["id"], poison.to_string());
    assert_eq!(lines[0]["attempts"], 2);
    let err = lines[0]["last_error"].as_str().unwrap();
    assert!(err.contains("unroutable"), "{err}");
    let out = db.cli(&["status", "--json"]).await;
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (s["dead"].as_i64(), s["processed"].as_i64()),
        (Some(1), Some(50))
    );

    // The operator fixes the routing and retries it.
    let shipped_q = unique("txo_q_shipped");
    queue(&ch, &exchange, &shipped_q, "order.shipped").await;
    let id = poison.to_string();
    let out = db.cli(&["dlq", "retry", &id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("retried 1"), "{}", stdout(&out));
    let out = db.cli(&relay).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let got = take(&ch, &shipped_q, 1).await;
    assert_eq!(
        got[0].properties.message_id().as_ref().unwrap().as_str(),
        id
    );
    let out = db.cli(&["status", "--json"]).await;
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (s["dead"].as_i64(), s["processed"].as_i64()),
        (Some(0), Some(51))
    );

    // A retry of an id that is not dead says so.
    let out = db.cli(&["dlq", "retry", &id]).await;
    assert_eq!(out.status.code(), Some(1));

    for q in [&created_q, &shipped_q] {
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
    db.cleanup().await;
}
