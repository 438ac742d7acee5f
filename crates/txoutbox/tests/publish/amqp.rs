//! The AMQP publisher against a real RabbitMQ (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).
#![cfg(feature = "amqp")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

fn server() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// An exchange and queue of our own (so tests run in parallel), plus an admin channel.
struct Scope {
    exchange: String,
    queue: String,
    connection: Connection,
    channel: Channel,
}

impl Scope {
    async fn new() -> anyhow::Result<Self> {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let connection = Connection::connect(&server(), ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let scope = Self {
            exchange: format!("txo_test_{suffix}"),
            queue: format!("txo_test_q_{suffix}"),
            connection,
            channel,
        };
        scope.declare_exchange().await?;
        scope
            .channel
            .queue_declare(
                scope.queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(scope)
    }

    /// The same declaration the publisher makes.
    async fn declare_exchange(&self) -> anyhow::Result<()> {
        self.channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    async fn bind(&self, pattern: &str) -> anyhow::Result<()> {
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    fn url(&self, extra: &str) -> String {
        format!(
            "{}?exchange={}&routing_key=test.{{aggregate_type}}.{{event_type}}{extra}",
            server(),
            self.exchange
        )
    }

    /// Poll the queue until `n` messages arrived (or fail after a deadline).
    async fn take(&self, n: usize) -> anyhow::Result<Vec<lapin::message::Delivery>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n {
            match self
                .channel
                .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await?
            {
                Some(m) => got.push(m.delivery),
                None if Instant::now() > deadline => {
                    bail!("queue gave {} messages, expected {n}", got.len())
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        Ok(got)
    }

    async fn cleanup(self) {
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.connection.close(200, "test done".into()).await;
    }
}

fn message(n: usize) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: format!("o-{n}"),
        event_type: "created".into(),
        body: serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

async fn publisher(url: &str) -> anyhow::Result<Box<dyn Publisher>> {
    publish::connect(url)
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e}"))
}

fn header(d: &lapin::message::Delivery, name: &str) -> Option<String> {
    match d.properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn publishes_in_order_with_confirms() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.#").await?;
        let p = publisher(&scope.url("")).await?;
        assert_eq!(p.kind(), "amqp");
        p.check().await?;
        let messages: Vec<Message> = (0..25).map(message).collect();
        let mut acks = Vec::new();
        for m in &messages {
            acks.push(p.send(m).await?);
        }
        for ack in acks {
            ack.await?;
        }
        let got = scope.take(messages.len()).await?;
        for (i, (m, d)) in messages.iter().zip(&got).enumerate() {
            assert_eq!(d.data, m.body, "message {i} in order");
            assert_eq!(d.routing_key.as_str(), "test.order.created");
            assert_eq!(d.exchange.as_str(), scope.exchange);
            let props = &d.properties;
            assert_eq!(
                props.message_id().as_ref().map(|s| s.to_string()),
                Some(m.id.to_string())
            );
            assert_eq!(props.delivery_mode(), &Some(2), "persistent");
            assert_eq!(
                props.kind().as_ref().map(|s| s.to_string()),
                Some("created".into())
            );
            assert_eq!(
                props.content_type().as_ref().map(|s| s.to_string()),
                Some("application/json".into())
            );
            assert_eq!(props.timestamp(), &Some(m.created_at.timestamp() as u64));
            for (name, value) in m.contract_headers() {
                assert_eq!(header(d, name), Some(value), "{name}");
            }
            assert_eq!(header(d, "traceparent"), Some(format!("00-trace-{i}-01")));
        }
        p.close().await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn unroutable_is_unavailable_and_long_keys_permanent() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.order.routed").await?;
        let p = publisher(&scope.url("&confirm_timeout=5s")).await?;

        let mut m = message(1);
        m.event_type = "nobody-listens".into();
        let e = p
            .send(&m)
            .await?
            .await
            .err()
            .context("unroutable must fail")?;
        // No queue takes it right now (a consumer not yet deployed): unavailable, so an
        // outage longer than the retry budget does not dead-letter every event.
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        let text = e.to_string();
        assert!(text.contains("unroutable"), "{text}");
        assert!(text.contains(&scope.exchange), "{text}");
        assert!(text.contains("test.order.nobody-listens"), "{text}");
        eprintln!("unroutable: {}", e.chain());

        let mut m = message(2);
        m.event_type = "x".repeat(300);
        let e = p.send(&m).await.err().context("routing key too long")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

        // The channel is still fine.
        let mut m = message(3);
        m.event_type = "routed".into();
        p.send(&m).await?.await?;
        let got = scope.take(1).await?;
        assert_eq!(
            got[0]
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string()),
            Some(m.id.to_string())
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn recovers_after_the_broker_closes_the_channel() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.#").await?;
        let p = publisher(&scope.url("")).await?;
        p.send(&message(0)).await?.await?;

        // Publishing to a missing exchange makes RabbitMQ close the channel (404).
        scope
            .channel
            .exchange_delete(
                scope.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        let e = match p.send(&message(1)).await {
            Ok(ack) => ack.await.err().context("exchange is gone")?,
            Err(e) => e,
        };
        assert_ne!(e.kind(), ErrorKind::Permanent, "{e}");
        eprintln!("channel closed: {} ({})", e.chain(), e.kind());

        // The next send reopens the channel (and re-declares the exchange).
        scope.declare_exchange().await?;
        scope.bind("test.#").await?;
        let m = message(2);
        p.send(&m).await?.await?;
        let got = scope.take(2).await?;
        assert_eq!(
            got[1]
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string()),
            Some(m.id.to_string())
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

/// RabbitMQ refuses messages over `max_message_size` (128 MiB by default) by closing the
/// channel: that message is permanent, the next one goes through on a new channel. (RabbitMQ
/// judges the size from the content header, so this is quick despite the size.)
/// `TXOUTBOX_SKIP_BIG_TESTS=1` skips it on small machines.
#[tokio::test]
async fn oversized_message_is_permanent_and_the_next_one_works() -> anyhow::Result<()> {
    if std::env::var_os("TXOUTBOX_SKIP_BIG_TESTS").is_some() {
        eprintln!("skipped: TXOUTBOX_SKIP_BIG_TESTS is set");
        return Ok(());
    }
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.#").await?;
        let p = publisher(&scope.url("&confirm_timeout=60s")).await?;
        let mut big = message(1);
        big.body = vec![b'x'; 128 * 1024 * 1024 + 1];
        let e = match p.send(&big).await {
            Ok(ack) => ack.await.err().context("oversized message must fail")?,
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Permanent, "{}", e.chain());
        eprintln!("oversized: {}", e.chain());
        drop(big);
        let m = message(2);
        p.send(&m).await?.await?;
        let got = scope.take(1).await?;
        assert_eq!(
            got[0]
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string()),
            Some(m.id.to_string())
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn unreachable_broker_is_unavailable_quickly() {
    let started = Instant::now();
    let e = publish::connect("amqp://guest:hunter2secret@127.0.0.1:1/%2f?connect_timeout=3s")
        .await
        .err()
        .expect("port 1 must refuse");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match &e {
        ConnectError::Publish(p) => {
            assert_eq!(p.kind(), ErrorKind::Unavailable, "{e}");
            let chain = p.chain();
            assert!(!chain.contains("hunter2secret"), "{chain}");
            assert!(chain.contains("127.0.0.1:1"), "{chain}");
        }
        other => panic!("expected an unavailable error, got {other:?}"),
    }
    assert!(!format!("{e} {e:?}").contains("hunter2secret"));
}

#[tokio::test]
async fn wrong_password_is_unavailable_and_not_printed() {
    let url = server().replacen("guest:guest@", "guest:wr0ngpassw0rd@", 1);
    if !url.contains("wr0ngpassw0rd") {
        eprintln!("skipped: AMQP_URL has no guest:guest credentials");
        return;
    }
    let e = publish::connect(&url).await.err().expect("bad password");
    match &e {
        ConnectError::Publish(p) => {
            assert_eq!(p.kind(), ErrorKind::Unavailable, "{e}");
            assert!(!p.chain().contains("wr0ngpassw0rd"), "{}", p.chain());
        }
        other => panic!("expected an unavailable error, got {other:?}"),
    }
    assert!(!format!("{e} {e:?}").contains("wr0ngpassw0rd"));
}

#[tokio::test]
async fn bad_parameters_are_config_errors() {
    for extra in [
        "exchange=x&nope=1",
        "routing_key={evnt}",
        "confirm_timeout=whenever",
        "exchange=has%20space",
        "declare=maybe",
    ] {
        let url = format!("{}?{extra}", server());
        match publish::connect(&url).await {
            Err(ConnectError::Config(e)) => {
                assert!(!e.to_string().contains("guest:guest"), "{e}");
            }
            Err(other) => panic!("{extra}: expected a config error, got {other}"),
            Ok(_) => panic!("{extra}: expected a config error"),
        }
    }
}

/// RabbitMQ acks many messages with one frame; lapin attaches a returned message to any
/// confirm of that frame. Exactly the unroutable messages must fail, however the frame is cut.
#[tokio::test]
async fn unroutable_messages_among_many_are_told_apart() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.order.routed").await?;
        let p = publisher(&scope.url("&confirm_timeout=10s")).await?;
        let mut routed = 0;
        for round in 0..5 {
            let mut acks = Vec::new();
            for i in 0..300 {
                let mut m = message(round * 1000 + i);
                let poison = i % 37 == 5;
                m.event_type = if poison { "nobody-listens" } else { "routed" }.into();
                routed += usize::from(!poison);
                acks.push((poison, m.id, p.send(&m).await?));
            }
            for (poison, id, ack) in acks {
                let r = ack.await;
                assert_eq!(
                    r.is_err(),
                    poison,
                    "event {id} (unroutable: {poison}) got {r:?}"
                );
            }
        }
        assert_eq!(scope.take(routed).await?.len(), routed);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

/// `unroutable=permanent`: a message no queue is bound for is dead-lettered at once.
#[tokio::test]
async fn unroutable_can_be_made_permanent() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        scope.bind("test.order.routed").await?;
        let p = publisher(&scope.url("&unroutable=permanent")).await?;
        let mut m = message(1);
        m.event_type = "nobody-listens".into();
        let e = p.send(&m).await?.await.err().context("unroutable")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        let mut m = message(2);
        m.event_type = "routed".into();
        p.send(&m).await?.await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

/// Publishing to an exchange that does not exist (not declared by us: `declare=false`) makes
/// RabbitMQ close the channel with NOT_FOUND: unavailable by default (it may be created by a
/// deploy in progress), permanent with `unroutable=permanent`.
#[tokio::test]
async fn missing_exchange_is_unavailable_unless_the_url_says_permanent() -> anyhow::Result<()> {
    let scope = Scope::new().await?;
    let result = async {
        let missing = format!("{}_missing", scope.exchange);
        let url = |extra: &str| {
            format!(
                "{}?exchange={missing}&declare=false&routing_key=k{extra}",
                server()
            )
        };
        let attempt = |p: Box<dyn Publisher>| async move {
            let e = match p.send(&message(1)).await {
                Ok(ack) => ack.await.err().context("the exchange is missing")?,
                Err(e) => e,
            };
            let _ = p.close().await;
            Ok::<_, anyhow::Error>(e)
        };
        let e = attempt(publisher(&url("")).await?).await?;
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
        assert!(e.to_string().contains("404"), "{e}");
        let e = attempt(publisher(&url("&unroutable=permanent")).await?).await?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{}", e.chain());

        match publish::connect(&url("&unroutable=sometimes")).await {
            Err(ConnectError::Config(e)) => {
                let e = e.to_string();
                assert!(e.contains("unroutable") && e.contains("permanent"), "{e}");
            }
            Err(e) => bail!("expected a config error, got {e}"),
            Ok(_) => bail!("unroutable=sometimes accepted"),
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}
