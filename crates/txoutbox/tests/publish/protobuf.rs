//! A real Protobuf message as an event of bytes: encoded with prost, written with
//! `NewEvent::bytes` and content type `application/x-protobuf`, delivered by the relay, read
//! back from the broker by a consumer that branches on the content type it received and
//! decodes the body with prost.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![cfg(all(
    feature = "nats",
    feature = "amqp",
    feature = "redis",
    feature = "mqtt",
    feature = "http",
    feature = "kafka"
))]

use prost::Message as _;
use txoutbox::publish;

use crate::conformance::{wait_received, Amqp, Broker, Kafka, Nats, Received};

const PROTOBUF: &str = "application/x-protobuf";

/// A message as `protoc` would generate it from
/// `message OrderPlaced { string order_id = 1; uint64 amount_cents = 2; repeated string items = 3;
/// bytes signature = 4; Customer customer = 5; sint32 delta = 6; }`.
#[derive(Clone, PartialEq, prost::Message)]
struct OrderPlaced {
    #[prost(string, tag = "1")]
    order_id: String,
    #[prost(uint64, tag = "2")]
    amount_cents: u64,
    #[prost(string, repeated, tag = "3")]
    items: Vec<String>,
    #[prost(bytes = "vec", tag = "4")]
    signature: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    customer: Option<Customer>,
    #[prost(sint32, tag = "6")]
    delta: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Customer {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(fixed64, tag = "2")]
    id: u64,
}

fn order(n: u64) -> OrderPlaced {
    OrderPlaced {
        order_id: format!("o-{n}"),
        amount_cents: 150_000 + n,
        items: vec!["café".into(), "crème brûlée".into()],
        signature: vec![0x00, 0xff, 0x80, 0xfe, 0x01],
        customer: Some(Customer {
            name: "Zoë".into(),
            id: u64::MAX - n,
        }),
        delta: -42,
    }
}

/// Three encoded orders as events of bytes (`NewEvent::bytes`), written to PostgreSQL and
/// delivered by the relay to `b`'s broker; read back and decoded there.
async fn round_trip(b: &dyn Broker) {
    use txoutbox::relay::{Relay, RelayConfig};
    use txoutbox::testing::postgres::PgHarness;
    use txoutbox::testing::Harness;
    let name = b.name();
    let p = match publish::connect(&b.url()).await {
        Ok(p) => p,
        Err(e) => panic!("{name}: connect: {e}"),
    };
    let orders: Vec<OrderPlaced> = (0..3).map(order).collect();
    let events: Vec<txoutbox::NewEvent> = orders
        .iter()
        .map(|o| {
            let body = o.encode_to_vec();
            assert!(std::str::from_utf8(&body).is_err(), "the body is no text");
            txoutbox::NewEvent::bytes("order", &o.order_id, "created", body, PROTOBUF).unwrap()
        })
        .collect();
    let h = PgHarness::new().await;
    let ids = h.outbox().enqueue_many(&h.pool, &events).await.unwrap();
    let mut cfg = RelayConfig::default();
    cfg.exit_when_drained = true;
    let stats = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        Relay::new(h.pool_store(), p, cfg).spawn().join(),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: the relay did not drain in time"))
    .unwrap();
    assert_eq!(stats.published, 3, "{name}: {stats:?}");
    h.cleanup().await;
    let sent: Vec<(OrderPlaced, uuid::Uuid)> = orders.into_iter().zip(ids).collect();
    let got = wait_received(b, sent.len()).await;
    for (o, id) in &sent {
        let r: &Received = got
            .iter()
            .find(|r| r.dedup_id == id.to_string())
            .unwrap_or_else(|| panic!("{name}: {id} not received"));
        // What a consumer does: branch on the content type, then decode.
        match r.content_type.as_deref() {
            Some(PROTOBUF) => {
                let decoded = OrderPlaced::decode(r.body.as_slice())
                    .unwrap_or_else(|e| panic!("{name}: does not decode: {e}"));
                assert_eq!(&decoded, o, "{name}");
            }
            other => panic!("{name}: content type {other:?}"),
        }
        assert_eq!(
            r.headers.get("outbox-event-type").map(String::as_str),
            Some("created")
        );
    }
    b.cleanup().await;
}

#[tokio::test]
async fn nats_consumer_decodes_protobuf() {
    round_trip(&Nats::new()).await;
}

#[tokio::test]
async fn kafka_consumer_decodes_protobuf() {
    round_trip(&Kafka::new().await).await;
}

#[tokio::test]
async fn amqp_consumer_decodes_protobuf() {
    let (b, conn) = Amqp::new().await;
    round_trip(&b).await;
    let _ = conn.close(200, "done".into()).await;
}
