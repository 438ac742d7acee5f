#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
//! The Kafka publisher against a real broker (`KAFKA_BROKERS`, default `127.0.0.1:9092`;
//! `scripts/kafka.sh` starts one). Every test uses topics of its own and deletes them at the
//! end, so tests run in parallel.
#![cfg(feature = "kafka")]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message as _, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use txoutbox::publish::{self, Ack, ConnectError, ErrorKind, Message, Publisher};

fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// A topic-name prefix of our own; the topics under it are deleted at the end.
struct Scope {
    prefix: String,
    topics: Vec<String>,
}

impl Scope {
    fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self {
            prefix: format!("txotest-{suffix}"),
            topics: Vec::new(),
        }
    }

    /// A topic name under our prefix, remembered for cleanup.
    fn topic(&mut self, name: &str) -> String {
        let t = format!("{}.{name}", self.prefix);
        self.topics.push(t.clone());
        t
    }

    /// A publisher URL with `topic` and `extra` (`&k=v...`).
    fn url(&self, topic: &str, extra: &str) -> String {
        format!("kafka://{}?topic={topic}{extra}", brokers())
    }

    async fn cleanup(self) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .unwrap();
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
        // Best effort: a broker without DeleteTopics keeps them (they are uniquely named).
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            admin.delete_topics(&names, &options),
        )
        .await;
    }
}

fn message(n: usize, aggregate_id: &str) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    // Tries to forge a contract header: must be dropped.
    headers.insert("outbox-event-id".to_string(), "forged".to_string());
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: aggregate_id.into(),
        event_type: "created".into(),
        body: serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

async fn publisher(url: &str) -> Box<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

/// A consumer reading every partition of `topic` from the beginning (assigned, not
/// subscribed: no group rebalance to wait for).
fn consumer(topic: &str, partitions: i32) -> StreamConsumer {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("txotest-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    c
}

/// Read `n` messages, failing the test if they do not all arrive within `within`.
async fn consume(c: &StreamConsumer, n: usize, within: Duration) -> Vec<OwnedMessage> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, c.recv()).await {
            Ok(Ok(m)) => out.push(m.detach()),
            Ok(Err(e)) => panic!("consume: {e}"),
            Err(_) => panic!("only {} of {n} messages within {within:?}", out.len()),
        }
    }
    out
}

fn header(m: &OwnedMessage, name: &str) -> Vec<String> {
    let Some(headers) = m.headers() else {
        return Vec::new();
    };
    headers
        .iter()
        .filter(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
        .collect()
}

async fn ack_error(p: &dyn Publisher, m: &Message) -> publish::PublishError {
    match p.send(m).await {
        Err(e) => e,
        Ok(ack) => ack.await.unwrap_err(),
    }
}

#[tokio::test]
async fn delivers_with_key_headers_and_body() {
    let mut scope = Scope::new();
    let topic = scope.topic("order");
    // A template with a placeholder: the topic is created on the first send.
    let url = scope.url(
        &format!("{}.{{aggregate_type}}", scope.prefix),
        "&create_topic=true&partitions=3&compression=lz4",
    );
    let p = publisher(&url).await;
    assert_eq!(p.kind(), "kafka");
    assert!(p.keeps_key_order());
    p.check().await.unwrap();
    let sent: Vec<Message> = (0..20).map(|n| message(n, &format!("o-{n}"))).collect();
    for m in &sent {
        p.send(m).await.unwrap().await.unwrap();
    }

    let c = consumer(&topic, 3);
    let got = consume(&c, sent.len(), Duration::from_secs(30)).await;
    let by_id: HashMap<String, &OwnedMessage> = got
        .iter()
        .map(|r| (header(r, "outbox-event-id").concat(), r))
        .collect();
    for m in &sent {
        let r = by_id
            .get(&m.id.to_string())
            .unwrap_or_else(|| panic!("event {} not delivered", m.id));
        assert_eq!(r.key(), Some(m.aggregate_id.as_bytes()));
        assert_eq!(r.payload(), Some(m.body.as_slice()));
        assert_eq!(header(r, "outbox-event-id"), [m.id.to_string()]);
        assert_eq!(header(r, "outbox-event-type"), ["created"]);
        assert_eq!(header(r, "outbox-aggregate-type"), ["order"]);
        assert_eq!(header(r, "outbox-aggregate-id"), [m.aggregate_id.as_str()]);
        assert_eq!(
            header(r, "outbox-created-at"),
            [m.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)]
        );
        assert_eq!(header(r, "traceparent"), [format!("00-trace-{}-01", m.seq)]);
    }
    p.close().await.unwrap();
    scope.cleanup().await;
}

#[tokio::test]
async fn keeps_per_key_order_when_pipelined() {
    const KEYS: usize = 30;
    const N: usize = 3_000;
    let mut scope = Scope::new();
    let topic = scope.topic("ordered");
    // A literal topic: created at connect time.
    let p = publisher(&scope.url(&topic, "&create_topic=true&partitions=3&linger_ms=2")).await;
    let sent: Vec<Message> = (0..N)
        .map(|n| message(n, &format!("k-{}", n % KEYS)))
        .collect();
    // All sends first, then all acknowledgements.
    let mut acks: Vec<Ack> = Vec::with_capacity(N);
    for m in &sent {
        acks.push(p.send(m).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }

    let c = consumer(&topic, 3);
    let got = consume(&c, N, Duration::from_secs(60)).await;
    let mut by_key: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
    let mut partitions: HashMap<Vec<u8>, i32> = HashMap::new();
    for r in &got {
        let key = r.key().unwrap().to_vec();
        let body: serde_json::Value = serde_json::from_slice(r.payload().unwrap()).unwrap();
        by_key
            .entry(key.clone())
            .or_default()
            .push(body["n"].as_i64().unwrap());
        let first = *partitions.entry(key).or_insert(r.partition());
        assert_eq!(first, r.partition(), "one key, one partition");
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, seqs) in &by_key {
        let k: usize = String::from_utf8_lossy(key)[2..].parse().unwrap();
        let expected: Vec<i64> = (0..N).filter(|n| n % KEYS == k).map(|n| n as i64).collect();
        assert_eq!(seqs, &expected, "key {}", String::from_utf8_lossy(key));
    }
    let used: std::collections::HashSet<i32> = partitions.values().copied().collect();
    assert!(used.len() > 1, "30 keys should spread over partitions");
    scope.cleanup().await;
}

#[tokio::test]
async fn oversize_message_is_permanent() {
    let mut scope = Scope::new();
    let topic = scope.topic("big");
    let p = publisher(&scope.url(&topic, "&create_topic=true")).await;
    let mut m = message(1, "o-1");
    m.body = vec![b'x'; 2 * 1024 * 1024];
    let e = ack_error(p.as_ref(), &m).await;
    assert_eq!(e.kind(), ErrorKind::Permanent, "{}", e.chain());
    // The producer still works afterwards.
    p.send(&message(2, "o-2")).await.unwrap().await.unwrap();
    scope.cleanup().await;
}

#[tokio::test]
async fn invalid_topic_name_is_permanent_before_sending() {
    // Nothing listens on port 1: the error must come from the name alone.
    let p = publisher("kafka://127.0.0.1:1?topic=t.{aggregate_type}").await;
    let mut m = message(1, "o-1");
    for bad in ["has space", "a/b", "ümlaut", &"x".repeat(300)] {
        m.aggregate_type = bad.into();
        let started = Instant::now();
        let e = match p.send(&m).await {
            Err(e) => e,
            Ok(_) => panic!("topic t.{bad} should be refused before sending"),
        };
        assert_eq!(e.kind(), ErrorKind::Permanent, "{}", e.chain());
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    // A literal invalid topic stops start-up.
    match publish::connect("kafka://127.0.0.1:1?topic=..").await {
        Err(ConnectError::Config(_)) => {}
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("topic `..` should be refused"),
    }
}

#[tokio::test]
async fn unreachable_broker_is_unavailable() {
    let p = publisher(
        "kafka://127.0.0.1:1?topic=t&message_timeout_ms=1500&connect_timeout=1s&reconnect_backoff_max_ms=200",
    )
    .await;
    let started = Instant::now();
    let ack = p.send(&message(1, "o-1")).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(15), ack)
        .await
        .expect("the ack should fail within message.timeout.ms")
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Transient),
        "{}",
        e.chain()
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    let e = p.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
}

#[tokio::test]
async fn bad_params_are_config_errors() {
    for bad in [
        "kafka://127.0.0.1:1?partitions=0",
        "kafka://127.0.0.1:1?replication=-1",
        "kafka://127.0.0.1:1?create_topic=maybe",
        "kafka://127.0.0.1:1?ce_source=/only-with-cloudevents",
        "kafka://127.0.0.1:1?cloudevents=maybe",
        "kafka://127.0.0.1:1?connect_timeout=soon",
        "kafka://127.0.0.1:1?topic={nope}",
        "kafka://127.0.0.1:1?compression=zzz",
        "kafka://127.0.0.1:1?no_such_setting=1",
        "kafka://127.0.0.1:1?acks=1",
        "kafka://127.0.0.1:1?enable_idempotence=false",
        "kafka://127.0.0.1:1?message_timeout_ms=soon",
        "kafka://",
    ] {
        match publish::connect(bad).await {
            Err(ConnectError::Config(e)) => {
                assert!(!e.to_string().is_empty());
            }
            Err(e) => panic!("{bad}: expected a config error, got {e}"),
            Ok(_) => panic!("{bad} should be refused"),
        }
    }
}

#[tokio::test]
async fn password_is_not_in_errors() {
    for url in [
        "kafka://alice:s3cr3t-pw@127.0.0.1:1?compression=zzz",
        "kafka://alice:s3cr3t-pw@127.0.0.1:1?sasl_mechanism=NOPE",
        "kafka://alice:s3cr3t-pw@127.0.0.1:1?sasl_password=s3cr3t-pw&linger_ms=x",
        "kafka://alice:s3cr3t-pw@127.0.0.1:1?partitions=0",
    ] {
        let e = match publish::connect(url).await {
            Err(e) => e,
            Ok(_) => panic!("{url} should be refused"),
        };
        let text = format!("{e} {e:?}");
        assert!(!text.contains("s3cr3t"), "{text}");
    }
    // Runtime errors neither.
    let p = publisher("kafka://alice:s3cr3t-pw@127.0.0.1:1?topic=t&message_timeout_ms=500").await;
    let e = ack_error(p.as_ref(), &message(1, "o-1")).await;
    let text = format!("{} {e:?}", e.chain());
    assert!(!text.contains("s3cr3t"), "{text}");
}

/// A broker-side permanent failure of one ProduceRequest, on librdkafka's mock cluster (a
/// Kafka-protocol broker inside librdkafka, listening on loopback, that can inject errors;
/// the broker under `KAFKA_BROKERS` cannot be told to fail one request).
///
/// With `enable.gapless.guarantee` (which txoutbox always sets), librdkafka turns such an
/// error into a fatal error instead of bumping the producer epoch and going on: so a message
/// of the same partition produced after the failed one is *not* delivered past the gap (the
/// relay would otherwise see the successor delivered ahead of its failed predecessor). A
/// fatal producer can produce nothing more: the publisher must rebuild it, and the next event
/// goes through.
///
/// Ignored in the main run, run on its own by `scripts/test.sh` (up to three tries): the mock
/// broker writes a successor that is already in flight (it checks sequence numbers only for
/// transactional producers), so the test depends on librdkafka's timing, and in two of four
/// full suite runs on the 2-core CI machine the successor got through on the mock; alone it
/// passed every one of 29 runs, also under CPU load.
#[tokio::test]
#[ignore = "timing-dependent on librdkafka's mock broker; scripts/test.sh runs it on its own"]
async fn a_fatal_producer_error_keeps_the_gap_closed_and_the_producer_is_rebuilt() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("fatal", 1, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let first = bootstrap.split(',').next().unwrap();
    // One message per request and one request in flight, so the successor is still queued
    // when the failure comes back. (The mock broker checks sequence numbers only for
    // transactional producers: a successor already in flight would be written, where a real
    // broker refuses it as out of order.)
    let url = format!(
        "kafka://{first}?topic=fatal&batch_num_messages=1&max_in_flight=1&message_timeout_ms=10000"
    );
    let p = publisher(&url).await;
    p.send(&message(0, "k")).await.unwrap().await.unwrap();

    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let failed = p.send(&message(1, "k")).await.unwrap();
    let successor = p.send(&message(2, "k")).await;
    let e = failed.await.unwrap_err();
    assert_ne!(e.kind(), ErrorKind::Permanent, "{}", e.chain());
    let successor = match successor {
        Ok(ack) => ack.await,
        Err(e) => Err(e),
    };
    let e = successor.expect_err(
        "the successor of a failed message was delivered past the gap \
         (enable.gapless.guarantee not in force)",
    );
    assert_ne!(e.kind(), ErrorKind::Permanent, "{}", e.chain());

    // The producer is fatal now: the publisher replaces it.
    let next = message(3, "k");
    let ack = p
        .send(&next)
        .await
        .unwrap_or_else(|e| panic!("send after a fatal error: {}", e.chain()));
    ack.await
        .unwrap_or_else(|e| panic!("ack after a fatal error: {}", e.chain()));
    p.check().await.unwrap();

    // On the broker: the first and the last message, nothing between them.
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "txotest-fatal")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("fatal", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let got = consume(&c, 2, Duration::from_secs(20)).await;
    let seqs: Vec<i64> = got
        .iter()
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(r.payload().unwrap()).unwrap();
            body["n"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(seqs, [0, 3]);
    p.close().await.unwrap();
}

/// `enable.gapless.guarantee` is one of the settings the delivery guarantee rests on.
#[tokio::test]
async fn gapless_guarantee_cannot_be_turned_off() {
    match publish::connect("kafka://127.0.0.1:1?enable_gapless_guarantee=false").await {
        Err(ConnectError::Config(e)) => {
            assert!(e.to_string().contains("enable_gapless_guarantee"), "{e}")
        }
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("enable_gapless_guarantee=false accepted"),
    }
}

/// `cloudevents=true` adds the CloudEvents Kafka protocol binding's binary-mode headers; the
/// records parse as CloudEvents with the CloudEvents SDK, read by confluent-kafka.
#[tokio::test]
async fn cloudevents_binary_mode_headers() {
    use chrono::SubsecRound as _;
    let mut scope = Scope::new();
    let topic = scope.topic("ce");
    let p = publisher(&scope.url(
        &topic,
        "&create_topic=true&partitions=1&cloudevents=true&ce_source=/shop",
    ))
    .await;
    let sent: Vec<Message> = (0..5)
        .map(|n| {
            let mut m = message(n, &format!("o-{n}"));
            // A user header named like a binding header is dropped, not sent twice.
            m.headers.insert("ce_type".into(), "forged".into());
            m.headers.insert("content-type".into(), "text/plain".into());
            m
        })
        .collect();
    for m in &sent {
        p.send(m).await.unwrap().await.unwrap();
    }
    let c = consumer(&topic, 1);
    let got = consume(&c, sent.len(), Duration::from_secs(30)).await;
    for (m, r) in sent.iter().zip(&got) {
        assert_eq!(header(r, "ce_specversion"), ["1.0"]);
        assert_eq!(header(r, "ce_id"), [m.id.to_string()]);
        assert_eq!(header(r, "ce_source"), ["/shop"]);
        assert_eq!(header(r, "ce_type"), ["created"]);
        assert_eq!(header(r, "ce_subject"), [m.aggregate_id.as_str()]);
        assert_eq!(
            header(r, "ce_time"),
            [m.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)]
        );
        assert_eq!(header(r, "content-type"), ["application/json"]);
        assert_eq!(header(r, "outbox-event-id"), [m.id.to_string()]);
        assert_eq!(header(r, "traceparent"), [format!("00-trace-{}-01", m.seq)]);
    }
    // Our clients are closed first: with them open, tansu's answers to the Python client's
    // metadata requests crash librdkafka's metadata cache in this process (a SIGSEGV in
    // rd_kafka_metadata_cache_find, seen with tansu 0.6.0 and librdkafka 2.x).
    p.close().await.unwrap();
    drop(p);
    drop(c);
    if let Some(python) = crate::clients_python() {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/clients/kafka_cloudevents.py"
        );
        let out = tokio::process::Command::new(&python)
            .arg(script)
            .arg(brokers())
            .arg(&topic)
            .arg(sent.len().to_string())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "the CloudEvents SDK refused the records: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), sent.len());
        for (m, e) in sent.iter().zip(&events) {
            let a = &e["attributes"];
            assert_eq!(a["specversion"], "1.0");
            assert_eq!(a["id"], m.id.to_string());
            assert_eq!(a["source"], "/shop");
            assert_eq!(a["type"], "created");
            assert_eq!(a["subject"], m.aggregate_id);
            assert_eq!(a["datacontenttype"], "application/json");
            let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
            assert_eq!(time, m.created_at.trunc_subsecs(6));
            assert_eq!(e["data"]["n"], m.seq);
            assert_eq!(e["key"], m.aggregate_id);
        }
    }
    scope.cleanup().await;
}
