//! Routes against the real brokers: one relay, one outbox, mixed events sent by a
//! [`Router`] to NATS JetStream, RabbitMQ and Kafka, each event to the broker of the first
//! route that matches it, in order per aggregate; an event no route takes is dead-lettered.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![cfg(all(feature = "nats", feature = "amqp", feature = "kafka"))]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use txoutbox::publish::{self, Matcher, Publisher, Route, Router};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use crate::conformance::{kafka_brokers, wait_received, Amqp, Broker, Kafka, Nats, Received};

async fn shared(url: &str) -> Arc<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => Arc::from(p),
        Err(e) => panic!("connect {url}: {e}"),
    }
}

/// The ids a broker received, first copies only, in the broker's order, and the aggregate of
/// each.
fn arrivals(got: &[Received]) -> Vec<(String, String)> {
    let mut seen = HashSet::new();
    got.iter()
        .filter(|r| seen.insert(r.dedup_id.clone()))
        .map(|r| {
            let aggregate = r
                .headers
                .get("outbox-aggregate-id")
                .cloned()
                .unwrap_or_default();
            (r.dedup_id.clone(), aggregate)
        })
        .collect()
}

/// `expected` (id, aggregate) in commit order: the broker got exactly these, each aggregate's
/// in that order.
fn assert_delivered(broker: &str, got: &[Received], expected: &[(String, String)]) {
    let arrived = arrivals(got);
    let ids = |v: &[(String, String)]| v.iter().map(|(id, _)| id.clone()).collect::<HashSet<_>>();
    assert_eq!(
        ids(&arrived),
        ids(expected),
        "{broker}: which events arrived"
    );
    let by_aggregate = |v: &[(String, String)]| {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, aggregate) in v {
            m.entry(aggregate.clone()).or_default().push(id.clone());
        }
        m
    };
    assert_eq!(
        by_aggregate(&arrived),
        by_aggregate(expected),
        "{broker}: order per aggregate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_relay_routes_mixed_events_to_nats_rabbitmq_and_kafka() {
    let nats = Nats::new();
    let (amqp, amqp_conn) = Amqp::new().await;
    let kafka = Kafka::new().await;
    let kafka_url = format!("kafka://{}?topic={}", kafka_brokers(), kafka.topic());
    let to_kafka = shared(&kafka_url).await;
    let router = Router::new(vec![
        Route::new(
            "orders",
            Matcher::any().event_type("order.*").unwrap(),
            to_kafka.clone(),
        )
        .unwrap(),
        // A second route to the same Kafka producer: one connection for both.
        Route::new(
            "refunds",
            Matcher::any().aggregate_type("refund").unwrap(),
            to_kafka,
        )
        .unwrap(),
        Route::new(
            "email",
            Matcher::any().event_type("email.*").unwrap(),
            shared(&amqp.url()).await,
        )
        .unwrap(),
        Route::new(
            "audit",
            Matcher::any().header("audit", "yes").unwrap(),
            shared(&nats.url()).await,
        )
        .unwrap(),
    ])
    .unwrap();

    let h = PgHarness::new().await;
    let mut events = Vec::new();
    let mut expect: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for n in 0..12 {
        let (aggregate_type, event_type, route) = match n % 4 {
            0 => (
                "order",
                ["order.created", "order.paid", "order.shipped"][n / 4],
                "orders",
            ),
            1 => ("user", "email.sent", "email"),
            2 => ("user", "user.login", "audit"),
            _ => ("refund", "refund.issued", "refunds"),
        };
        let aggregate_id = format!("a{}", n % 2);
        let mut e = NewEvent::new(
            aggregate_type,
            aggregate_id,
            event_type,
            &serde_json::json!({ "n": n }),
        )
        .unwrap();
        // Every event says audit=yes: only those no earlier route took go to NATS.
        e = e.header("audit", "yes");
        expect.entry(route).or_default().push(n);
        events.push(e);
    }
    let unmatched = NewEvent::new("user", "a9", "user.deleted", &serde_json::json!({})).unwrap();
    events.push(unmatched);
    let mut tx = h.pool.begin().await.unwrap();
    let ids = h.outbox().enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let lost = ids[12];
    let aggregate = |n: usize| format!("a{}", n % 2);
    let expected = |route: &str| -> Vec<(String, String)> {
        expect[route]
            .iter()
            .map(|&n| (ids[n].to_string(), aggregate(n)))
            .collect()
    };

    let mut cfg = RelayConfig::default();
    cfg.exit_when_drained = true;
    cfg.poll_interval = Duration::from_millis(100);
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        Relay::new(h.pool_store(), Box::new(router), cfg)
            .spawn()
            .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert_eq!((stats.published, stats.dead), (12, 1), "{stats:?}");

    let mut kafka_expected = expected("orders");
    kafka_expected.extend(expected("refunds"));
    kafka_expected.sort_by_key(|(id, _)| ids.iter().position(|i| i.to_string() == *id));
    assert_delivered(
        "kafka",
        &wait_received(&kafka, kafka_expected.len()).await,
        &kafka_expected,
    );
    let email = expected("email");
    assert_delivered("rabbitmq", &wait_received(&amqp, email.len()).await, &email);
    let audit = expected("audit");
    assert_delivered("nats", &wait_received(&nats, audit.len()).await, &audit);

    let row = h.row(lost).await;
    assert!(
        row.dead_at.is_some(),
        "the unmatched event is a dead letter"
    );
    let why = row.last_error.unwrap_or_default();
    assert!(
        why.contains("no route matched") && why.contains("`user.deleted`"),
        "{why}"
    );
    h.cleanup().await;
    nats.cleanup().await;
    amqp.cleanup().await;
    kafka.cleanup().await;
    let _ = amqp_conn.close(200, "done".into()).await;
}
