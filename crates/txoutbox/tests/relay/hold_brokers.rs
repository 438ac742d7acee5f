//! `hold` on a dead letter with the real publishers that keep key order (SQS FIFO on moto at
//! `SQS_ENDPOINT`, Kafka on librdkafka's mock cluster): when the broker refuses an event for
//! good after the relay handed it over, no later event of its aggregate may reach the broker
//! while the table holds it back behind the dead letter. Real PostgreSQL (`DATABASE_URL`).
// The helpers serve the broker tests only: unused when their features are off.
#![cfg_attr(
    not(any(feature = "sqs", feature = "kafka")),
    allow(dead_code, unused_imports)
)]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use crate::common::*;
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::Ordering;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

fn config(relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.relay_id = relay_id.to_string();
    c.ordering = Ordering::OrderedHold;
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(100);
    c.lease = Duration::from_secs(10);
    c.partition_lease = Duration::from_secs(2);
    c.backoff = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(50),
        jitter: false,
    };
    c.exit_when_drained = true;
    c
}

/// A1, A2 (whose payload is `big` bytes long), A3, A4 and B1, committed together so that one
/// claim takes them all; without B1 unless `with_b`.
async fn write(db: &PgHarness, big: usize, with_b: bool) -> Vec<Uuid> {
    let event = |agg: &str, n: usize, payload: serde_json::Value| {
        NewEvent::new("account", agg, format!("account.e{n}"), &payload).unwrap()
    };
    let events = [
        event("a", 1, serde_json::json!({ "n": 1 })),
        event(
            "a",
            2,
            serde_json::json!({ "n": 2, "pad": "x".repeat(big) }),
        ),
        event("a", 3, serde_json::json!({ "n": 3 })),
        event("a", 4, serde_json::json!({ "n": 4 })),
        event("b", 1, serde_json::json!({ "n": 1 })),
    ];
    let events = if with_b { &events[..] } else { &events[..4] };
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db.outbox().enqueue_many(&mut *tx, events).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

/// Drain with `publisher`, then check the table: A1 and B1 published, A2 dead, A3 and A4
/// pending behind it.
async fn drain_and_check(
    db: &PgHarness,
    ids: &[Uuid],
    publisher: Box<dyn txoutbox::publish::Publisher>,
    id: &str,
) {
    let stats = tokio::time::timeout(
        DEADLINE,
        Relay::new(db.pool_store(), publisher, config(id))
            .spawn()
            .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert_eq!(stats.dead, 1, "A2 refused for good: {stats:?}");
    assert!(db.row(ids[0]).await.processed_at.is_some(), "A1");
    let a2 = db.row(ids[1]).await;
    assert!(
        a2.dead_at.is_some(),
        "A2 is a dead letter: {:?}",
        a2.last_error
    );
    for (name, id) in [("A3", ids[2]), ("A4", ids[3])] {
        let r = db.row(id).await;
        assert!(
            r.processed_at.is_none() && r.dead_at.is_none(),
            "{name} is pending behind the dead letter"
        );
    }
    assert!(db.row(ids[4]).await.processed_at.is_some(), "B1");
}

/// SQS FIFO: moto refuses a message over the queue's `MaximumMessageSize` (here 1024 bytes,
/// under the publisher's own limit), a permanent error that comes back only after the later
/// messages of the group were handed to the publisher.
#[cfg(feature = "sqs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_hold_mode_delivers_nothing_past_a_refused_message() {
    use aws_sdk_sqs::types::QueueAttributeName;

    let endpoint = std::env::var("SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ] {
        assert!(
            std::env::var_os(k).is_some(),
            "{k} must be set (scripts/test.sh sets {k}={v})"
        );
    }
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let name = format!(
        "txo-hold-{}.fifo",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let queue_url = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();

    let db = PgHarness::new().await;
    let ids = write(&db, 2000, true).await;
    let publisher = txoutbox::publish::connect(&format!(
        "sqs://{name}?endpoint={endpoint}&region=us-east-1"
    ))
    .await
    .unwrap();
    assert!(publisher.keeps_key_order());
    drain_and_check(&db, &ids, publisher, "hold-sqs").await;

    // What reached the queue: read (and delete) until it is empty.
    let mut got = Vec::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(&queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        if out.messages().is_empty() {
            break;
        }
        for m in out.messages() {
            let id = m
                .message_attributes()
                .and_then(|a| a.get("outbox-event-id"))
                .and_then(|v| v.string_value())
                .map(|v| v.parse::<Uuid>().unwrap())
                .unwrap();
            got.push(id);
            sqs.delete_message()
                .queue_url(&queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    let named: Vec<&str> = got
        .iter()
        .map(|g| ["A1", "A2", "A3", "A4", "B1"][ids.iter().position(|i| i == g).unwrap()])
        .collect();
    assert_eq!(
        named.len(),
        2,
        "only A1 and B1 may reach the queue, got {named:?}"
    );
    assert!(named.contains(&"A1") && named.contains(&"B1"), "{named:?}");
    let _ = sqs.delete_queue().queue_url(&queue_url).send().await;
    db.cleanup().await;
}

/// Kafka: one record per ProduceRequest, and the mock cluster refuses the second, A2's, as
/// too large (a permanent error, reported through A2's delivery report). Aggregate A only,
/// so that the second request is A2's whether the relay pipelines or not.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_hold_mode_delivers_nothing_past_a_refused_record() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message as _};
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let db = PgHarness::new().await;
    let ids = write(&db, 10, false).await;
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("outbox.account", 1, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let first = bootstrap.split(',').next().unwrap();
    let url = format!("kafka://{first}?batch_num_messages=1");
    let publisher = txoutbox::publish::connect(&url).await.unwrap();
    assert!(publisher.keeps_key_order());
    // A1 goes through on its own first, so that the refusal hits A2.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ],
    );
    let stats = tokio::time::timeout(
        DEADLINE,
        Relay::new(db.pool_store(), publisher, config("hold-kafka"))
            .spawn()
            .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert_eq!(stats.dead, 1, "the refusal happened: {stats:?}");
    let dead: Vec<usize> = {
        let mut d = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if db.row(*id).await.dead_at.is_some() {
                d.push(i);
            }
        }
        d
    };
    assert_eq!(dead, [1], "A2, and only A2, is a dead letter");
    let first_dead = 1;

    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "txotest-relay-hold")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (_, high) = c
        .fetch_watermarks("outbox.account", 0, Duration::from_secs(5))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("outbox.account", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    while (got.len() as i64) < high {
        let m = tokio::time::timeout(DEADLINE, c.recv())
            .await
            .expect("the topic's records")
            .unwrap();
        let id = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "outbox-event-id"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).parse::<Uuid>().unwrap())
            .unwrap();
        got.push(ids.iter().position(|i| *i == id).unwrap());
    }
    let past: Vec<usize> = got
        .iter()
        .copied()
        .filter(|i| *i > first_dead && *i < 4)
        .collect();
    assert!(
        past.is_empty(),
        "A{} was refused for good, yet A's events {past:?} (0-based) reached the topic: {got:?}",
        first_dead + 1
    );
    for id in &ids[first_dead + 1..] {
        let r = db.row(*id).await;
        assert!(r.processed_at.is_none() && r.dead_at.is_none(), "held");
    }
    db.cleanup().await;
}
