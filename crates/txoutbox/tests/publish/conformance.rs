//! One conformance suite that every publisher passes, against its real broker on loopback:
//! the delivered fields of the message contract, the dedup id, the order of one key's
//! messages sent pipelined, permanent versus transient classification, and an unreachable
//! broker. Each broker only says how to read back what it received (`Broker`).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![cfg(all(
    feature = "nats",
    feature = "amqp",
    feature = "redis",
    feature = "mqtt",
    feature = "http",
    feature = "kafka"
))]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txoutbox::publish::{self, ConnectError, Message, PublishError, Publisher};

/// What a broker received, mapped onto the contract: the broker's dedup field, the metadata
/// (by the contract's header names), the body (as a consumer gets it: decoded where the
/// broker needed an encoding) and the content type where the broker delivers it (its own
/// field, else the `content-type` header).
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) dedup_id: String,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
    pub(crate) content_type: Option<String>,
}

#[async_trait::async_trait]
pub(crate) trait Broker: Send + Sync {
    fn name(&self) -> &'static str;
    /// The publisher URL for this test's own destination.
    fn url(&self) -> String {
        self.url_at(&self.address())
    }
    /// The same URL, but reaching the broker at `addr` (`host:port`): through a proxy.
    fn url_at(&self, addr: &str) -> String;
    /// Where the broker listens (`host:port`); `None` for a publisher without a network.
    fn address(&self) -> String;
    fn networked(&self) -> bool {
        true
    }
    /// Can a proxy in front of `address()` cut the publisher off? Not for Kafka: its
    /// clients reconnect to the address the broker advertises, past any proxy.
    fn proxyable(&self) -> bool {
        self.networked()
    }
    /// A publisher URL whose broker does not answer.
    fn unreachable_url(&self) -> String;
    /// A URL and a message this broker must refuse for good, if it has such a thing.
    fn poison(&self, m: Message) -> Option<(String, Message)>;
    /// Does the broker receive one publisher's messages in the order they were sent, even
    /// when they are sent without waiting for acknowledgements?
    fn keeps_send_order(&self) -> bool {
        true
    }
    /// Everything received so far, in the broker's order.
    async fn received(&self) -> Vec<Received>;
    async fn cleanup(&self);
}

pub(crate) fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// Bytes that are no UTF-8 (NUL, 0xff, a lone continuation byte), as a Protobuf body might be.
pub(crate) const NOT_UTF8: &[u8] = &[0x08, 0x96, 0x01, 0x00, 0xff, 0x80, 0x0a, 0x7f, 0xc3];

/// A byte event: `body` with `content_type`.
pub(crate) fn bytes_message(n: usize, body: &[u8], content_type: &str) -> Message {
    Message {
        aggregate_id: "o-bytes".into(),
        body: body.to_vec(),
        content_type: content_type.into(),
        ..message(n, 0)
    }
}

fn message(n: usize, aggregate: usize) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: format!("o-{aggregate}"),
        event_type: "created".into(),
        // Numbers no f64 holds, as the database gives them back: a publisher that parsed the
        // body on its way would change them.
        body: format!(
            r#"{{"n":{n},"text":"héllo","amount":12345678901234567.89,"id":123456789012345678901234567890,"big":1{}}}"#,
            "0".repeat(400)
        )
        .into_bytes(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

async fn connect(url: &str) -> Box<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

pub(crate) async fn wait_received(b: &dyn Broker, n: usize) -> Vec<Received> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = b.received().await;
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {} of {n} received",
            b.name(),
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Send and wait for the broker's verdict.
async fn publish_one(p: &dyn Publisher, m: &Message) -> Result<(), PublishError> {
    p.send(m).await?.await
}

async fn suite(b: &dyn Broker) {
    let name = b.name();
    let p = connect(&b.url()).await;

    // 1. Delivered fields, sent pipelined over three keys: all sends first, then all acks.
    let messages: Vec<Message> = (0..60).map(|n| message(n, n % 3)).collect();
    let mut acks = Vec::new();
    for m in &messages {
        acks.push(
            p.send(m)
                .await
                .unwrap_or_else(|e| panic!("{name}: send: {e}")),
        );
    }
    for a in acks {
        a.await.unwrap_or_else(|e| panic!("{name}: ack: {e}"));
    }
    let got = wait_received(b, messages.len()).await;
    let by_id: HashMap<&str, &Received> = got.iter().map(|r| (r.dedup_id.as_str(), r)).collect();
    for m in &messages {
        let id = m.id.to_string();
        let r = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("{name}: event {id} not received under its dedup id"));
        assert_eq!(r.body, m.body, "{name}: the body is the payload");
        for (h, v) in m.contract_headers() {
            assert_eq!(r.headers.get(h), Some(&v), "{name}: header {h}");
        }
        assert_eq!(
            r.headers.get("traceparent").map(String::as_str),
            m.headers.get("traceparent").map(String::as_str),
            "{name}: user header"
        );
    }

    // 1b. The content type reaches the consumer: JSON ones say so, and a byte body arrives
    // byte for byte (as the consumer reads it) with its own content type.
    for m in &messages {
        assert_eq!(
            by_id[m.id.to_string().as_str()].content_type.as_deref(),
            Some("application/json"),
            "{name}: content type of a JSON event"
        );
    }
    let bytes = bytes_message(500, NOT_UTF8, "application/x-protobuf");
    assert!(std::str::from_utf8(&bytes.body).is_err());
    publish_one(p.as_ref(), &bytes)
        .await
        .unwrap_or_else(|e| panic!("{name}: a byte event: {e}"));
    let got_bytes = wait_received(b, messages.len() + 1).await;
    let r = got_bytes
        .iter()
        .find(|r| r.dedup_id == bytes.id.to_string())
        .unwrap_or_else(|| panic!("{name}: the byte event was not received"));
    assert_eq!(r.body, NOT_UTF8, "{name}: the bytes as they were written");
    assert_eq!(
        r.content_type.as_deref(),
        Some("application/x-protobuf"),
        "{name}: content type of a byte event"
    );
    for (h, v) in bytes.contract_headers() {
        assert_eq!(
            r.headers.get(h),
            Some(&v),
            "{name}: header {h} of a byte event"
        );
    }

    // 2. One key's messages arrive in the order they were sent.
    if b.keeps_send_order() {
        for key in 0..3 {
            let aggregate = format!("o-{key}");
            let sent: Vec<String> = messages
                .iter()
                .filter(|m| m.aggregate_id == aggregate)
                .map(|m| m.id.to_string())
                .collect();
            let arrived: Vec<String> = got
                .iter()
                .filter(|r| r.headers.get("outbox-aggregate-id") == Some(&aggregate))
                .map(|r| r.dedup_id.clone())
                .collect();
            assert_eq!(arrived, sent, "{name}: order of key {aggregate}");
        }
    }

    // 3. A redelivery carries the same dedup id (or the broker drops it itself).
    publish_one(p.as_ref(), &messages[0]).await.unwrap();
    let again = b.received().await;
    let copies = again
        .iter()
        .filter(|r| r.dedup_id == messages[0].id.to_string())
        .count();
    assert!((1..=2).contains(&copies), "{name}: {copies} copies");

    // 4. What the broker can never take is permanent.
    if let Some((url, poison)) = b.poison(message(999, 9)) {
        let pp = connect(&url).await;
        let e = publish_one(pp.as_ref(), &poison)
            .await
            .expect_err("the poison message must fail");
        assert!(e.is_permanent(), "{name}: {e} should be permanent");
        // ...and the publisher goes on working.
        publish_one(pp.as_ref(), &message(1000, 9))
            .await
            .unwrap_or_else(|e| panic!("{name}: after a permanent failure: {e}"));
        pp.close().await.unwrap();
    }
    p.close().await.unwrap();

    // 5. An unreachable broker is not permanent, and says so quickly.
    let started = Instant::now();
    let result = match tokio::time::timeout(
        Duration::from_secs(30),
        publish::connect(&b.unreachable_url()),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: connect to an unreachable broker hangs"))
    {
        Err(ConnectError::Publish(e)) => Err(e),
        Err(ConnectError::Config(e)) => panic!("{name}: {e}"),
        Ok(p) => tokio::time::timeout(
            Duration::from_secs(30),
            publish_one(p.as_ref(), &message(1, 1)),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: a publish to an unreachable broker hangs")),
    };
    let e = result.expect_err("nothing answers there");
    assert!(
        !e.is_permanent(),
        "{name}: {e} must be retried, not dead-lettered"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    // 6. The broker goes away mid-batch (the connection is cut by a proxy): every
    // acknowledgement still resolves, none is permanent, none claims a message the broker
    // does not have; once the broker is back the same publisher delivers again.
    if b.proxyable() {
        broker_goes_away(b).await;
    }

    // 7. Through a relay reading PostgreSQL's WAL (`--source wal`): committed events reach
    // the broker under their ids, each aggregate's in commit order.
    #[cfg(all(feature = "testing", feature = "postgres"))]
    through_the_wal_relay(b).await;
    b.cleanup().await;
}

#[cfg(all(feature = "testing", feature = "postgres"))]
async fn through_the_wal_relay(b: &dyn Broker) {
    use txoutbox::relay::{RelayConfig, Source};
    use txoutbox::testing::postgres::PgHarness;
    use txoutbox::testing::Harness;
    let name = b.name();
    let h = PgHarness::new().await;
    let mut cfg = RelayConfig::default();
    cfg.source = Source::Wal;
    cfg.poll_interval = Duration::from_millis(200);
    let before: std::collections::HashSet<String> =
        b.received().await.into_iter().map(|r| r.dedup_id).collect();
    let relay =
        txoutbox::testing::postgres::relay(h.pool_store(), connect(&b.url()).await, cfg).spawn();
    let outbox = h.outbox();
    let mut ids = Vec::new();
    for n in 0..30 {
        let event = txoutbox::NewEvent::new(
            "order",
            format!("w-{}", n % 3),
            "created",
            &serde_json::json!({ "n": n }),
        )
        .unwrap();
        ids.push(outbox.enqueue(&h.pool, &event).await.unwrap().to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        let got: Vec<Received> = b
            .received()
            .await
            .into_iter()
            .filter(|r| !before.contains(&r.dedup_id))
            .collect();
        if ids.iter().all(|id| got.iter().any(|r| &r.dedup_id == id)) {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the WAL relay delivered {} of 30",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if b.keeps_send_order() {
        for key in 0..3 {
            let aggregate = format!("w-{key}");
            let mut seen = std::collections::HashSet::new();
            let arrived: Vec<&String> = got
                .iter()
                .filter(|r| r.headers.get("outbox-aggregate-id") == Some(&aggregate))
                .map(|r| &r.dedup_id)
                .filter(|id| seen.insert(*id))
                .collect();
            let committed: Vec<&String> = ids.iter().skip(key).step_by(3).collect();
            assert_eq!(arrived, committed, "{name}: WAL relay order of {aggregate}");
        }
    }
    tokio::time::timeout(Duration::from_secs(30), relay.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{name}: the WAL relay did not stop"))
        .unwrap_or_else(|e| panic!("{name}: the WAL relay failed: {e}"));
    h.cleanup().await;
}

async fn broker_goes_away(b: &dyn Broker) {
    let name = b.name();
    let proxy = Proxy::start(b.address()).await;
    let p = connect(&b.url_at(&proxy.addr)).await;
    let batch: Vec<Message> = (0..40).map(|n| message(2000 + n, 7)).collect();
    let mut acks = Vec::new();
    for (i, m) in batch.iter().enumerate() {
        if i == 15 {
            proxy.cut();
        }
        match p.send(m).await {
            Ok(a) => acks.push((m.id, a)),
            Err(e) => assert!(!e.is_permanent(), "{name}: send while cut: {e}"),
        }
    }
    let mut confirmed = Vec::new();
    for (id, a) in acks {
        match tokio::time::timeout(Duration::from_secs(40), a).await {
            Err(_) => panic!("{name}: an acknowledgement hung after the broker went away"),
            Ok(Ok(())) => confirmed.push(id.to_string()),
            Ok(Err(e)) => assert!(
                !e.is_permanent(),
                "{name}: {e} after a cut is not permanent"
            ),
        }
    }
    let received: Vec<String> = b.received().await.into_iter().map(|r| r.dedup_id).collect();
    for id in &confirmed {
        assert!(
            received.contains(id),
            "{name}: {id} acknowledged but not received"
        );
    }
    proxy.restore();
    let again = message(3000, 7);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match publish_one(p.as_ref(), &again).await {
            Ok(()) => break,
            Err(e) => {
                assert!(!e.is_permanent(), "{name}: {e}");
                assert!(
                    Instant::now() < deadline,
                    "{name}: no recovery after the cut: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let _ = p.close().await;
}

/// A TCP proxy the test can cut: `cut` drops every connection and refuses new ones until
/// `restore`.
struct Proxy {
    addr: String,
    cut: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(tokio::sync::watch::Sender::new(false));
        let state = cut.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *state.borrow() {
                    continue; // dropped: refused while cut
                }
                let mut rx = state.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { addr, cut, task }
    }
    fn cut(&self) {
        self.cut.send_replace(true);
    }
    fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.send_replace(true);
    }
}

// --- NATS JetStream ---------------------------------------------------------------------

pub(crate) struct Nats {
    stream: String,
    prefix: String,
}

impl Nats {
    /// A stream and subject prefix of this test's own (the publisher creates the stream).
    pub(crate) fn new() -> Self {
        let s = suffix();
        Self {
            stream: format!("TXO_CONF_{}", s.to_uppercase()),
            prefix: format!("txoconf{s}"),
        }
    }
}

#[async_trait::async_trait]
impl Broker for Nats {
    fn name(&self) -> &'static str {
        "nats"
    }
    fn address(&self) -> String {
        "127.0.0.1:4222".into()
    }
    fn url_at(&self, addr: &str) -> String {
        format!(
            "nats://{addr}?stream={}&subject={}.{{aggregate_type}}.{{event_type}}&ack_timeout=5s",
            self.stream, self.prefix
        )
    }
    fn unreachable_url(&self) -> String {
        "nats://127.0.0.1:1?connect_timeout=2s".into()
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        m.event_type = "has space".into();
        Some((self.url(), m))
    }
    async fn received(&self) -> Vec<Received> {
        let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await.unwrap());
        let Ok(mut stream) = js.get_stream(&self.stream).await else {
            return Vec::new();
        };
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            if let Ok(m) = stream.get_raw_message(seq).await {
                let headers: HashMap<String, String> = m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v[0].as_str().to_string()))
                    .collect();
                out.push(Received {
                    dedup_id: headers.get("Nats-Msg-Id").cloned().unwrap_or_default(),
                    content_type: headers.get("content-type").cloned(),
                    headers,
                    body: m.payload.to_vec(),
                });
            }
        }
        out
    }
    async fn cleanup(&self) {
        let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await.unwrap());
        let _ = js.delete_stream(&self.stream).await;
    }
}

#[tokio::test]
async fn nats_conforms() {
    suite(&Nats::new()).await;
}

// --- RabbitMQ ----------------------------------------------------------------------------

pub(crate) struct Amqp {
    exchange: String,
    channel: lapin::Channel,
    queue: String,
}

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[async_trait::async_trait]
impl Broker for Amqp {
    fn name(&self) -> &'static str {
        "amqp"
    }
    fn address(&self) -> String {
        "127.0.0.1:5672".into()
    }
    fn url_at(&self, addr: &str) -> String {
        format!(
            "amqp://guest:guest@{addr}/%2f?exchange={}&routing_key={{event_type}}&confirm_timeout=5s",
            self.exchange
        )
    }
    fn unreachable_url(&self) -> String {
        "amqp://guest:guest@127.0.0.1:1/%2f?connect_timeout=2s".into()
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        m.event_type = "k".repeat(300); // routing key over AMQP's 255 bytes
        Some((self.url(), m))
    }
    async fn received(&self) -> Vec<Received> {
        // basic_get consumes: keep what was read so far.
        static SEEN: Mutex<Vec<(String, Received)>> = Mutex::new(Vec::new());
        loop {
            let got = self
                .channel
                .basic_get(
                    self.queue.as_str().into(),
                    lapin::options::BasicGetOptions { no_ack: true },
                )
                .await
                .unwrap();
            let Some(m) = got else { break };
            let d = m.delivery;
            let mut headers = HashMap::new();
            if let Some(h) = d.properties.headers() {
                for (k, v) in h.inner() {
                    if let lapin::types::AMQPValue::LongString(s) = v {
                        headers.insert(
                            k.to_string(),
                            String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        );
                    }
                }
            }
            let r = Received {
                dedup_id: d
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                headers,
                body: d.data,
                content_type: d.properties.content_type().as_ref().map(|s| s.to_string()),
            };
            SEEN.lock().unwrap().push((self.queue.clone(), r));
        }
        SEEN.lock()
            .unwrap()
            .iter()
            .filter(|(q, _)| *q == self.queue)
            .map(|(_, r)| r.clone())
            .collect()
    }
    async fn cleanup(&self) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
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
    }
}

impl Amqp {
    /// A topic exchange and a queue bound to it with `#` (every routing key), of this test's
    /// own; the connection must stay open while the broker is read.
    pub(crate) async fn new() -> (Self, lapin::Connection) {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        let s = suffix();
        let conn = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let b = Amqp {
            exchange: format!("txo_conf_{s}"),
            queue: format!("txo_conf_q_{s}"),
            channel,
        };
        b.channel
            .exchange_declare(
                b.exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        b.channel
            .queue_declare(
                b.queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        b.channel
            .queue_bind(
                b.queue.as_str().into(),
                b.exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (b, conn)
    }
}

#[tokio::test]
async fn amqp_conforms() {
    let (b, conn) = Amqp::new().await;
    suite(&b).await;
    let _ = conn.close(200, "done".into()).await;
}

// --- Redis Streams -----------------------------------------------------------------------

struct Redis {
    prefix: String,
}

#[async_trait::async_trait]
impl Broker for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn address(&self) -> String {
        "127.0.0.1:6379".into()
    }
    fn url_at(&self, addr: &str) -> String {
        format!("redis://{addr}?stream={}&ack_timeout=5s", self.key())
    }
    fn unreachable_url(&self) -> String {
        "redis://127.0.0.1:1?connect_timeout=2s".into()
    }
    fn poison(&self, m: Message) -> Option<(String, Message)> {
        // The key exists but is not a stream: WRONGTYPE, which no retry will fix.
        Some((
            format!(
                "redis://127.0.0.1:6379?stream={}:{{event_type}}",
                self.prefix
            ),
            Message {
                event_type: "not-a-stream".into(),
                ..m
            },
        ))
    }
    async fn received(&self) -> Vec<Received> {
        let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let reply: redis::streams::StreamRangeReply =
            redis::AsyncCommands::xrange_all(&mut c, self.key())
                .await
                .unwrap();
        reply
            .ids
            .into_iter()
            .map(|e| {
                // The payload as bytes (it need not be UTF-8), the other fields as text.
                let body = e
                    .map
                    .get("payload")
                    .map(|v| redis::from_redis_value::<Vec<u8>>(v).unwrap())
                    .unwrap_or_default();
                let headers: HashMap<String, String> = e
                    .map
                    .iter()
                    .filter(|(k, _)| *k != "payload")
                    .map(|(k, v)| (k.clone(), redis::from_redis_value::<String>(v).unwrap()))
                    .collect();
                Received {
                    dedup_id: headers.get("id").cloned().unwrap_or_default(),
                    content_type: headers.get("content-type").cloned(),
                    headers,
                    body,
                }
            })
            .collect()
    }
    async fn cleanup(&self) {
        let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: Result<(), _> = redis::AsyncCommands::del(
            &mut c,
            &[self.key(), format!("{}:not-a-stream", self.prefix)],
        )
        .await;
    }
}

impl Redis {
    fn key(&self) -> String {
        format!("{}:events", self.prefix)
    }
}

#[tokio::test]
async fn redis_conforms() {
    let b = Redis {
        prefix: format!("txo_conf_{}", suffix()),
    };
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::AsyncCommands::set(&mut c, format!("{}:not-a-stream", b.prefix), "x")
        .await
        .unwrap();
    suite(&b).await;
}

// --- MQTT 5 ------------------------------------------------------------------------------

struct Mqtt {
    prefix: String,
    got: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

#[async_trait::async_trait]
impl Broker for Mqtt {
    fn name(&self) -> &'static str {
        "mqtt"
    }
    fn address(&self) -> String {
        "127.0.0.1:1883".into()
    }
    fn url_at(&self, addr: &str) -> String {
        format!(
            "mqtt://{addr}?topic={}/{{aggregate_type}}/{{event_type}}&qos=1&ack_timeout=5s",
            self.prefix
        )
    }
    fn unreachable_url(&self) -> String {
        "mqtt://127.0.0.1:1?qos=1&connect_timeout=2s".into()
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        m.event_type = "wild+card".into(); // a wildcard in a topic name
        Some((self.url(), m))
    }
    async fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
    async fn cleanup(&self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn mqtt_conforms() {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let prefix = format!("txoconf/{}", suffix());
    let mut options = MqttOptions::new(format!("txoconf-{}", suffix()), "127.0.0.1", 1883);
    options.set_clean_start(true);
    let (client, mut eventloop) = AsyncClient::new(options, 200);
    client
        .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mut ready_tx = Some(ready_tx);
    let sink = got.clone();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let headers: HashMap<String, String> = p
                        .properties
                        .as_ref()
                        .map(|pr| pr.user_properties.iter().cloned().collect())
                        .unwrap_or_default();
                    sink.lock().unwrap().push(Received {
                        dedup_id: headers.get("outbox-event-id").cloned().unwrap_or_default(),
                        headers,
                        body: p.payload.to_vec(),
                        content_type: p.properties.as_ref().and_then(|pr| pr.content_type.clone()),
                    });
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), ready_rx)
        .await
        .unwrap()
        .unwrap();
    suite(&Mqtt { prefix, got, task }).await;
}

// --- HTTP webhooks -----------------------------------------------------------------------

struct Http {
    base: String,
    got: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

#[async_trait::async_trait]
impl Broker for Http {
    fn name(&self) -> &'static str {
        "http"
    }
    fn address(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }
    fn url_at(&self, addr: &str) -> String {
        format!("http://{addr}/hook?timeout=5s")
    }
    fn unreachable_url(&self) -> String {
        "http://127.0.0.1:1/hook?timeout=2s".into()
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        m.event_type = "poison".into(); // the receiver answers 400 to it
        Some((self.url(), m))
    }
    /// Requests overlap: the relay's ordered mode waits for each answer instead.
    fn keeps_send_order(&self) -> bool {
        false
    }
    async fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
    async fn cleanup(&self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn http_conforms() {
    use axum::http::{HeaderMap, StatusCode};
    let got: Arc<Mutex<Vec<Received>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let sink = sink.clone();
        async move {
            let h: HashMap<String, String> = headers
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            if h.get("outbox-event-type").map(String::as_str) == Some("poison") {
                return StatusCode::BAD_REQUEST;
            }
            sink.lock().unwrap().push(Received {
                dedup_id: h.get("webhook-id").cloned().unwrap_or_default(),
                content_type: h.get("content-type").cloned(),
                headers: h,
                body: body.to_vec(),
            });
            StatusCode::NO_CONTENT
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    suite(&Http { base, got, task }).await;
}

// --- file: (JSON lines) ------------------------------------------------------------------

struct File {
    path: std::path::PathBuf,
}

#[async_trait::async_trait]
impl Broker for File {
    fn name(&self) -> &'static str {
        "file"
    }
    fn address(&self) -> String {
        String::new()
    }
    fn url_at(&self, _addr: &str) -> String {
        format!("file:{}", self.path.display())
    }
    fn networked(&self) -> bool {
        false
    }
    fn unreachable_url(&self) -> String {
        "file:/nonexistent-directory-of-txoutbox/events.jsonl".into()
    }
    fn poison(&self, _m: Message) -> Option<(String, Message)> {
        None // a file takes anything
    }
    async fn received(&self) -> Vec<Received> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        text.lines()
            .map(|l| {
                // The payload raw (its numbers are past f64), the rest as values.
                let fields: HashMap<String, Box<serde_json::value::RawValue>> =
                    serde_json::from_str(l).unwrap();
                let v: serde_json::Value = fields
                    .iter()
                    .filter(|(k, _)| k.as_str() != "payload")
                    .map(|(k, raw)| (k.clone(), serde_json::from_str(raw.get()).unwrap()))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
                let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                let mut headers: HashMap<String, String> = v["headers"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                headers.insert("outbox-event-id".into(), s("id"));
                headers.insert("outbox-event-type".into(), s("event_type"));
                headers.insert("outbox-aggregate-type".into(), s("aggregate_type"));
                headers.insert("outbox-aggregate-id".into(), s("aggregate_id"));
                headers.insert("outbox-created-at".into(), s("created_at"));
                // A JSON body is `payload`, any other `payload_base64`.
                let body = match v["payload_base64"].as_str() {
                    Some(b64) => {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .unwrap()
                    }
                    None => fields["payload"].get().as_bytes().to_vec(),
                };
                Received {
                    dedup_id: s("id"),
                    headers,
                    body,
                    content_type: v["content_type"].as_str().map(str::to_string),
                }
            })
            .collect()
    }
    async fn cleanup(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test]
async fn file_conforms() {
    let path = std::env::temp_dir().join(format!("txo-conf-{}.jsonl", suffix()));
    suite(&File { path }).await;
}

// --- Kafka (tansu) -----------------------------------------------------------------------

pub(crate) struct Kafka {
    prefix: String,
    got: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

pub(crate) fn kafka_brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

#[async_trait::async_trait]
impl Broker for Kafka {
    fn name(&self) -> &'static str {
        "kafka"
    }
    fn address(&self) -> String {
        kafka_brokers()
    }
    fn url_at(&self, addr: &str) -> String {
        format!("kafka://{addr}?topic={}.{{event_type}}", self.prefix)
    }
    fn unreachable_url(&self) -> String {
        "kafka://127.0.0.1:1?topic=nowhere&message_timeout_ms=3000".into()
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        m.event_type = "not a topic!".into(); // an invalid topic name
        Some((self.url(), m))
    }
    fn proxyable(&self) -> bool {
        false
    }
    async fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
    async fn cleanup(&self) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        self.task.abort();
        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .create()
            .unwrap();
        let topic = format!("{}.created", self.prefix);
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            admin.delete_topics(&[topic.as_str()], &options),
        )
        .await;
    }
}

impl Kafka {
    /// A topic `PREFIX.created` (3 partitions) of this test's own, read from the start by a
    /// consumer task into `received()`.
    pub(crate) async fn new() -> Self {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::consumer::{Consumer, StreamConsumer};
        use rdkafka::message::{Headers, Message as _};
        use rdkafka::{ClientConfig, Offset, TopicPartitionList};
        let prefix = format!("txoconf.{}", suffix());
        let topic = format!("{prefix}.created");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .create()
            .unwrap();
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        let created = admin
            .create_topics(
                &[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
                &options,
            )
            .await
            .unwrap();
        assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .set("group.id", format!("txoconf-{}", suffix()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..3 {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok(m) = consumer.recv().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for header in h.iter() {
                        if let Some(v) = header.value {
                            headers.insert(
                                header.key.to_string(),
                                String::from_utf8_lossy(v).into_owned(),
                            );
                        }
                    }
                }
                sink.lock().unwrap().push(Received {
                    dedup_id: headers.get("outbox-event-id").cloned().unwrap_or_default(),
                    content_type: headers.get("content-type").cloned(),
                    headers,
                    body: m.payload().unwrap_or_default().to_vec(),
                });
            }
        });
        Kafka { prefix, got, task }
    }

    /// The topic every message goes to.
    pub(crate) fn topic(&self) -> String {
        format!("{}.created", self.prefix)
    }
}

#[tokio::test]
async fn kafka_conforms() {
    suite(&Kafka::new().await).await;
}

// --- Amazon SQS and SNS (moto) -----------------------------------------------------------

/// A FIFO queue (`sqs://NAME`), or a FIFO topic (`sns://ARN`) read through a FIFO queue
/// subscribed to it; the dedup id is the queue's `MessageDeduplicationId` for the queue, the
/// `outbox-event-id` attribute for the topic.
#[cfg(all(feature = "sqs", feature = "sns"))]
struct Aws {
    /// `sqs://NAME` or `sns://ARN`, without parameters.
    target: String,
    topic_arn: Option<String>,
    queue_url: String,
    reader: crate::aws::Reader,
}

#[cfg(all(feature = "sqs", feature = "sns"))]
#[async_trait::async_trait]
impl Broker for Aws {
    fn name(&self) -> &'static str {
        if self.topic_arn.is_some() {
            "sns"
        } else {
            "sqs"
        }
    }
    fn address(&self) -> String {
        crate::aws::address()
    }
    fn url_at(&self, addr: &str) -> String {
        format!(
            "{}?endpoint=http://{addr}&region={}&timeout=5s",
            self.target,
            crate::aws::REGION
        )
    }
    fn unreachable_url(&self) -> String {
        format!(
            "{}?endpoint=http://127.0.0.1:1&region={}&timeout=2s",
            self.target,
            crate::aws::REGION
        )
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        // Over the 256 KiB the services take.
        m.body = format!("\"{}\"", "x".repeat(300 * 1024)).into_bytes();
        Some((self.url(), m))
    }
    async fn received(&self) -> Vec<Received> {
        let sns = self.topic_arn.is_some();
        self.reader
            .all()
            .into_iter()
            .map(|g| {
                // A body that is not text comes base64-encoded, and says so.
                let body = match g.attributes.get(publish::aws::ENCODING_ATTRIBUTE) {
                    Some(e) if e == publish::aws::BASE64_ENCODING => {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD
                            .decode(&g.body)
                            .unwrap()
                    }
                    _ => g.body.into_bytes(),
                };
                Received {
                    dedup_id: if sns {
                        g.attributes
                            .get("outbox-event-id")
                            .cloned()
                            .unwrap_or_default()
                    } else {
                        g.dedup_id.clone().unwrap_or_default()
                    },
                    content_type: g
                        .attributes
                        .get(publish::aws::CONTENT_TYPE_ATTRIBUTE)
                        .cloned(),
                    headers: g.attributes,
                    body,
                }
            })
            .collect()
    }
    async fn cleanup(&self) {
        if let Some(arn) = &self.topic_arn {
            crate::aws::delete_topic(arn).await;
        }
        crate::aws::delete_queue(&self.queue_url).await;
    }
}

#[cfg(all(feature = "sqs", feature = "sns"))]
#[tokio::test]
async fn sqs_conforms() {
    let name = format!("txo-conf-{}.fifo", suffix());
    let c = crate::aws::sqs().await;
    let queue_url = crate::aws::create_queue(&c, &name).await;
    let reader = crate::aws::Reader::start(c, queue_url.clone());
    suite(&Aws {
        target: format!("sqs://{name}"),
        topic_arn: None,
        queue_url,
        reader,
    })
    .await;
}

#[cfg(all(feature = "sqs", feature = "sns"))]
#[tokio::test]
async fn sns_conforms() {
    let name = format!("txo-conf-{}.fifo", suffix());
    let (arn, queue_url) = crate::aws::topic_with_queue(&name).await;
    let reader = crate::aws::Reader::start(crate::aws::sqs().await, queue_url.clone());
    suite(&Aws {
        target: format!("sns://{arn}"),
        topic_arn: Some(arn),
        queue_url,
        reader,
    })
    .await;
}

// --- Amazon Kinesis Data Streams (moto) -------------------------------------------------------

/// A stream of two shards, read back shard by shard. A record has no headers: its data is the
/// event's JSON line, mapped back onto the contract here (the `outbox-*` headers from its
/// fields, the body from `payload` or `payload_base64`); the dedup id is its `id`.
#[cfg(feature = "kinesis")]
struct Kinesis(crate::kinesis::Stream);

#[cfg(feature = "kinesis")]
#[async_trait::async_trait]
impl Broker for Kinesis {
    fn name(&self) -> &'static str {
        "kinesis"
    }
    fn address(&self) -> String {
        crate::moto::address()
    }
    fn url_at(&self, addr: &str) -> String {
        let region = crate::moto::REGION;
        format!(
            "kinesis://{}?endpoint=http://{addr}&region={region}&timeout=5s",
            self.0.name
        )
    }
    fn unreachable_url(&self) -> String {
        self.url_at("127.0.0.1:1")
            .replace("timeout=5s", "timeout=2s")
    }
    fn poison(&self, mut m: Message) -> Option<(String, Message)> {
        // Over a stream's 1 MiB a record.
        m.body = format!("\"{}\"", "k".repeat(1100 * 1024)).into_bytes();
        Some((self.url(), m))
    }
    async fn received(&self) -> Vec<Received> {
        let mut out = Vec::new();
        for (_, _, data) in self.0.records().await {
            // Each field as its text: the payload is read as it stands in the line, since a
            // number in it may be out of any float's range.
            let line: HashMap<String, Box<serde_json::value::RawValue>> =
                serde_json::from_slice(&data).unwrap();
            let field = |name: &str| -> String {
                line.get(name)
                    .map(|v| serde_json::from_str(v.get()).unwrap())
                    .unwrap_or_default()
            };
            let mut headers: HashMap<String, String> =
                serde_json::from_str(line["headers"].get()).unwrap();
            for (header, name) in [
                ("outbox-event-id", "id"),
                ("outbox-event-type", "event_type"),
                ("outbox-aggregate-type", "aggregate_type"),
                ("outbox-aggregate-id", "aggregate_id"),
                ("outbox-created-at", "created_at"),
            ] {
                headers.insert(header.to_string(), field(name));
            }
            let body = match line.get("payload") {
                Some(payload) => payload.get().as_bytes().to_vec(),
                None => {
                    use base64::Engine as _;
                    let b64 = field("payload_base64");
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .unwrap()
                }
            };
            out.push(Received {
                dedup_id: field("id"),
                content_type: Some(field("content_type")),
                headers,
                body,
            });
        }
        out
    }
    async fn cleanup(&self) {
        self.0.delete().await;
    }
}

#[cfg(feature = "kinesis")]
#[tokio::test]
async fn kinesis_conforms() {
    suite(&Kinesis(crate::kinesis::Stream::create("conf", 2).await)).await;
}
