//! `kinesis://` against moto's Kinesis (started by scripts/services.sh at `SQS_ENDPOINT`,
//! default http://127.0.0.1:4566), each test on a stream of its own, read back shard by shard
//! with `GetShardIterator` and `GetRecords`: the record as the event's JSON line, partition key
//! = aggregate id, each aggregate's order on its shard, an oversize record dead-lettered
//! without holding the others back, a missing stream; and the records read by boto3 and
//! parsed as CloudEvents by the CloudEvents SDK.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![cfg(feature = "kinesis")]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::types::ShardIteratorType;
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

use crate::moto::{endpoint, REGION};

async fn kinesis() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::new(&crate::moto::sdk_config().await)
}

/// A stream of its own for one test, removed by `delete`.
pub(crate) struct Stream {
    client: aws_sdk_kinesis::Client,
    pub(crate) name: String,
}

impl Stream {
    pub(crate) async fn create(test: &str, shards: i32) -> Self {
        let client = kinesis().await;
        let name = format!(
            "txo-{test}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        client
            .create_stream()
            .stream_name(&name)
            .shard_count(shards)
            .send()
            .await
            .unwrap();
        Self { client, name }
    }

    pub(crate) fn url(&self, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "&" };
        format!(
            "kinesis://{}?endpoint={}&region={REGION}{sep}{params}",
            self.name,
            endpoint()
        )
    }

    /// Every record of every shard, each shard's in its order: (shard, partition key, data).
    pub(crate) async fn records(&self) -> Vec<(String, String, Vec<u8>)> {
        let shards = self
            .client
            .list_shards()
            .stream_name(&self.name)
            .send()
            .await
            .unwrap();
        let mut out = Vec::new();
        for shard in shards.shards() {
            let it = self
                .client
                .get_shard_iterator()
                .stream_name(&self.name)
                .shard_id(shard.shard_id())
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .unwrap();
            let mut iterator = it.shard_iterator().map(str::to_string);
            while let Some(i) = iterator.take() {
                let got = self
                    .client
                    .get_records()
                    .shard_iterator(i)
                    .limit(1000)
                    .send()
                    .await
                    .unwrap();
                for r in got.records() {
                    out.push((
                        shard.shard_id().to_string(),
                        r.partition_key().to_string(),
                        r.data().as_ref().to_vec(),
                    ));
                }
                if !got.records().is_empty() {
                    iterator = got.next_shard_iterator().map(str::to_string);
                }
            }
        }
        out
    }

    /// The records, once there are at least `n`.
    async fn wait(&self, n: usize) -> Vec<(String, String, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.records().await;
            if got.len() >= n {
                return got;
            }
            assert!(Instant::now() < deadline, "{} of {n} records", got.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn delete(&self) {
        let _ = self
            .client
            .delete_stream()
            .stream_name(&self.name)
            .send()
            .await;
    }
}

async fn connect(url: &str) -> Box<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

fn message(n: usize, aggregate: &str) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    headers.insert("x-tenant".to_string(), "t 1".to_string());
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: aggregate.into(),
        event_type: "created".into(),
        // Numbers no f64 holds: a publisher that parsed the body would change them.
        body: format!(r#"{{"n":{n},"text":"héllo","amount":12345678901234567.89,"id":123456789012345678901234567890}}"#)
            .into_bytes(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

/// Each record is the event's JSON line, keyed by its aggregate id, and each aggregate's
/// records are on one shard in the order sent, though sent pipelined over several
/// aggregates.
#[tokio::test]
async fn records_are_json_lines_keyed_and_ordered_by_aggregate() {
    let stream = Stream::create("lines", 2).await;
    let p = connect(&stream.url("")).await;
    assert!(p.keeps_key_order());
    let aggregates = ["order-1", "order-2", "order-3", "zakaz ü 4"];
    let sent: Vec<Message> = (0..80)
        .map(|n| message(n, aggregates[n % aggregates.len()]))
        .collect();
    let mut acks = Vec::new();
    for m in &sent {
        acks.push(p.send(m).await.unwrap());
    }
    for a in acks {
        a.await.unwrap();
    }
    let mut bytes = message(1000, "order-1");
    bytes.body = vec![0x08, 0x96, 0x01, 0x00, 0xff];
    bytes.content_type = "application/x-protobuf".into();
    p.send(&bytes).await.unwrap().await.unwrap();
    p.close().await.unwrap();

    let got = stream.wait(sent.len() + 1).await;
    assert_eq!(got.len(), sent.len() + 1, "each event once");
    let mut shard_of: HashMap<String, String> = HashMap::new();
    let mut seqs: HashMap<String, Vec<i64>> = HashMap::new();
    for (shard, key, data) in &got {
        assert_eq!(data.last(), Some(&b'\n'), "a JSON line");
        let text = std::str::from_utf8(data).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
        let v: serde_json::Value = serde_json::from_slice(data).unwrap();
        let id = v["id"].as_str().unwrap();
        let m = sent
            .iter()
            .chain([&bytes])
            .find(|m| m.id.to_string() == id)
            .unwrap();
        assert_eq!(key, &m.aggregate_id, "partition key = aggregate id");
        assert_eq!(v["aggregate_id"], m.aggregate_id.as_str());
        assert_eq!(v["aggregate_type"], "order");
        assert_eq!(v["event_type"], "created");
        assert_eq!(v["seq"], m.seq);
        assert_eq!(
            v["created_at"],
            m.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        );
        assert_eq!(
            v["headers"]["traceparent"],
            m.headers["traceparent"].as_str()
        );
        assert_eq!(v["headers"]["x-tenant"], "t 1");
        assert_eq!(v["content_type"], m.content_type.as_str());
        if m.id == bytes.id {
            use base64::Engine as _;
            let b64 = v["payload_base64"].as_str().unwrap();
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            assert_eq!(decoded, bytes.body, "the bytes as written");
        } else {
            // The payload as stored, digit for digit.
            let body = std::str::from_utf8(&m.body).unwrap();
            assert!(
                text.contains(&format!(r#""payload":{body}"#)),
                "{text} holds {body}"
            );
        }
        let previous = shard_of.insert(key.clone(), shard.clone());
        assert!(
            previous.is_none_or(|s| &s == shard),
            "{key}: one aggregate, one shard"
        );
        seqs.entry(key.clone()).or_default().push(m.seq);
    }
    for (key, s) in &seqs {
        let mut sorted = s.clone();
        sorted.sort_unstable();
        assert_eq!(s, &sorted, "{key}: records in the order sent");
    }
    stream.delete().await;
}

/// A record over `max_message_bytes` fails for good at once; a record the service refuses
/// (over its 1 MiB, with the limit raised here) makes it refuse the whole call, which is sent
/// again record by record, so only the guilty one fails for good. The others, sent with them,
/// are delivered either way.
#[tokio::test(flavor = "current_thread")]
async fn an_oversize_record_is_dead_lettered_without_blocking_others() {
    let stream = Stream::create("oversize", 1).await;
    let huge = |n: usize| Message {
        body: format!(r#"{{"blob":"{}"}}"#, "x".repeat(1_100_000)).into_bytes(),
        ..message(n, &format!("big-{n}"))
    };
    for (url, refused_by) in [
        (stream.url(""), "txoutbox"),
        (stream.url("max_message_bytes=2097152"), "Kinesis"),
    ] {
        let p = connect(&url).await;
        let before = stream.records().await.len();
        let sent: Vec<Message> = (0..6)
            .map(|n| {
                if n == 2 {
                    huge(n)
                } else {
                    message(n, &format!("small-{n}"))
                }
            })
            .collect();
        // All handed over before the sender runs (one thread): one call holds them all.
        let mut acks = Vec::new();
        for m in &sent {
            acks.push(p.send(m).await);
        }
        for (m, a) in sent.iter().zip(acks) {
            let result = match a {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            if m.seq == 2 {
                let e = result.expect_err("the oversize record must fail");
                assert_eq!(e.kind(), ErrorKind::Permanent, "{refused_by}: {e}");
                // Refused by whom it should be: the publisher's limit, or the service.
                let says = match refused_by {
                    "txoutbox" => "max_message_bytes",
                    _ => "ValidationException",
                };
                assert!(e.to_string().contains(says), "{refused_by}: {e}");
            } else {
                result.unwrap_or_else(|e| panic!("{refused_by}: event {}: {e}", m.seq));
            }
        }
        p.close().await.unwrap();
        let got = stream.wait(before + 5).await;
        assert_eq!(got.len(), before + 5, "{refused_by}: the five others");
        assert!(got.iter().all(|(_, key, _)| !key.starts_with("big-")));
    }
    stream.delete().await;
}

/// A stream that does not exist stops `connect` with one line naming it and Kinesis's code,
/// as *unavailable* (the operator's to fix, never an event's dead letter); so does an
/// endpoint that does not answer.
#[tokio::test]
async fn a_missing_stream_is_a_clear_error() {
    crate::moto::credentials();
    let name = format!(
        "txo-missing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = format!("kinesis://{name}?endpoint={}&region={REGION}", endpoint());
    let e = match publish::connect(&url).await {
        Err(ConnectError::Publish(e)) => e,
        Err(e) => panic!("a config error: {e}"),
        Ok(_) => panic!("connected to a missing stream"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let text = e.to_string();
    assert!(text.contains(&name), "{text}");
    assert!(text.contains("ResourceNotFoundException"), "{text}");
    assert!(!text.contains('\n') && !text.contains('{'), "{text}");

    let url = format!("kinesis://{name}?endpoint=http://127.0.0.1:1&region={REGION}&timeout=2s");
    match publish::connect(&url).await {
        Err(ConnectError::Publish(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        Err(e) => panic!("a config error: {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
    // A parameter no AWS publisher knows stops start-up.
    let url = format!("kinesis://{name}?shards=2");
    assert!(matches!(
        publish::connect(&url).await,
        Err(ConnectError::Config(_))
    ));
}

/// With `cloudevents=true` each record is an event in the CloudEvents JSON format, as the
/// official clients read it: boto3 reads the stream and the CloudEvents SDK parses each record.
#[tokio::test]
async fn cloudevents_records_read_by_boto3_and_the_cloudevents_sdk() {
    let stream = Stream::create("ce", 1).await;
    let p = connect(&stream.url("cloudevents=true&ce_source=/shop")).await;
    let sent: Vec<Message> = (0..4).map(|n| message(n, &format!("o-{n}"))).collect();
    for m in &sent {
        p.send(m).await.unwrap().await.unwrap();
    }
    p.close().await.unwrap();
    // Our own reading first, so that the test checks something without the clients too.
    let got = stream.wait(sent.len()).await;
    for (_, key, data) in &got {
        let v: serde_json::Value = serde_json::from_slice(data).unwrap();
        let m = sent.iter().find(|m| v["id"] == m.id.to_string()).unwrap();
        assert_eq!(key, &m.aggregate_id);
        assert_eq!(v["aggregatetype"], "order");
        assert_eq!(v["traceparent"], m.headers["traceparent"].as_str());
        let rest: BTreeMap<String, String> =
            serde_json::from_str(v["outboxheaders"].as_str().unwrap()).unwrap();
        assert_eq!(rest["x-tenant"], "t 1");
    }
    let Some(python) = crate::clients_python() else {
        stream.delete().await;
        return;
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/clients/kinesis_cloudevents.py"
    );
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(endpoint())
        .arg(&stream.name)
        .arg(sent.len().to_string())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_DEFAULT_REGION", REGION)
        .output()
        .await
        .unwrap();
    stream.delete().await;
    assert!(
        out.status.success(),
        "boto3 or the CloudEvents SDK refused the records: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), sent.len());
    for e in &events {
        let a = &e["attributes"];
        let m = sent
            .iter()
            .find(|m| a["id"] == m.id.to_string())
            .unwrap_or_else(|| panic!("unknown event {e}"));
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["source"], "/shop");
        assert_eq!(a["type"], "created");
        assert_eq!(a["subject"], m.aggregate_id);
        assert_eq!(a["datacontenttype"], "application/json");
        assert_eq!(a["aggregatetype"], "order");
        assert_eq!(a["traceparent"], m.headers["traceparent"].as_str());
        assert_eq!(e["data"]["n"], m.seq);
        assert_eq!(e["partition_key"], m.aggregate_id);
    }
}
