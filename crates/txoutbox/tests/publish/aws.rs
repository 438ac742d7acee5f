//! `sqs://` and `sns://` against moto's SQS and SNS (started by scripts/services.sh at
//! `SQS_ENDPOINT`, default http://127.0.0.1:4566), read back with the SDK's own
//! `ReceiveMessage`: attributes, message group and dedup ids, CloudEvents, the 10-attribute
//! limit, batches judged entry by entry. The conformance suite runs both too (conformance.rs).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
#![cfg(all(feature = "sqs", feature = "sns"))]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use txoutbox::publish::{self, ErrorKind, Message, Publisher};

use crate::moto::sdk_config;
pub use crate::moto::{address, credentials, endpoint, REGION};
/// moto's account id.
pub const ACCOUNT: &str = "123456789012";

pub async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&sdk_config().await)
}

pub async fn sns() -> aws_sdk_sns::Client {
    aws_sdk_sns::Client::new(&sdk_config().await)
}

pub fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// Create a queue (FIFO when the name ends in `.fifo`); its URL.
pub async fn create_queue(c: &aws_sdk_sqs::Client, name: &str) -> String {
    let mut req = c.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        req = req.attributes(QueueAttributeName::FifoQueue, "true");
    }
    req.send().await.unwrap().queue_url().unwrap().to_string()
}

/// One message read back with `ReceiveMessage`.
#[derive(Debug, Clone)]
pub struct Got {
    pub body: String,
    pub attributes: HashMap<String, String>,
    pub group_id: Option<String>,
    pub dedup_id: Option<String>,
}

/// Reads a queue in the background (and deletes what it read), keeping every message in the
/// order received.
pub struct Reader {
    pub got: Arc<Mutex<Vec<Got>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    pub fn start(c: aws_sdk_sqs::Client, queue_url: String) -> Self {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let task = tokio::spawn(async move {
            loop {
                let out = c
                    .receive_message()
                    .queue_url(&queue_url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .message_system_attribute_names(MessageSystemAttributeName::All)
                    .message_attribute_names("All")
                    .send()
                    .await;
                let Ok(out) = out else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                for m in out.messages() {
                    let attributes = m
                        .message_attributes()
                        .map(|a| {
                            a.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.string_value().unwrap_or_default().to_string())
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let system = m.attributes();
                    let sys =
                        |n: MessageSystemAttributeName| system.and_then(|s| s.get(&n)).cloned();
                    sink.lock().unwrap().push(Got {
                        body: m.body().unwrap_or_default().to_string(),
                        attributes,
                        group_id: sys(MessageSystemAttributeName::MessageGroupId),
                        dedup_id: sys(MessageSystemAttributeName::MessageDeduplicationId),
                    });
                    if let Some(h) = m.receipt_handle() {
                        let _ = c
                            .delete_message()
                            .queue_url(&queue_url)
                            .receipt_handle(h)
                            .send()
                            .await;
                    }
                }
            }
        });
        Self { got, task }
    }

    pub fn all(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    pub async fn wait(&self, n: usize) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.all();
            if got.len() >= n {
                return got;
            }
            assert!(Instant::now() < deadline, "{} of {n} received", got.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A FIFO topic with a FIFO queue subscribed to it (raw delivery, so the queue's messages
/// are the published ones with their attributes): (topic ARN, queue URL).
pub async fn topic_with_queue(name: &str) -> (String, String) {
    let sns = sns().await;
    let sqs = sqs().await;
    let fifo = name.ends_with(".fifo");
    let mut req = sns.create_topic().name(name);
    if fifo {
        req = req.attributes("FifoTopic", "true");
    }
    let arn = req.send().await.unwrap().topic_arn().unwrap().to_string();
    let queue_name = if fifo {
        format!("{}-sub.fifo", name.trim_end_matches(".fifo"))
    } else {
        format!("{name}-sub")
    };
    let queue_url = create_queue(&sqs, &queue_name).await;
    let queue_arn = format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_name}");
    sns.subscribe()
        .topic_arn(&arn)
        .protocol("sqs")
        .endpoint(queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .unwrap();
    (arn, queue_url)
}

pub async fn delete_queue(url: &str) {
    let _ = sqs().await.delete_queue().queue_url(url).send().await;
}

pub async fn delete_topic(arn: &str) {
    let _ = sns().await.delete_topic().topic_arn(arn).send().await;
}

fn message(n: usize, aggregate: &str) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: aggregate.into(),
        event_type: "created".into(),
        body: serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

async fn connect(url: &str) -> Box<dyn Publisher> {
    credentials();
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

fn params() -> String {
    format!("endpoint={}&region={REGION}", endpoint())
}

/// Send every message, then wait for every acknowledgement (all outstanding at once).
async fn send_all(p: &dyn Publisher, sent: &[Message]) {
    let mut acks = Vec::new();
    for m in sent {
        acks.push(p.send(m).await.unwrap());
    }
    for a in acks {
        a.await.unwrap();
    }
}

/// Close the publisher, stop the reader, and delete the topic (if any) and the queue.
async fn teardown(p: Box<dyn Publisher>, reader: Reader, topic: Option<&str>, queue_url: &str) {
    p.close().await.unwrap();
    drop(reader);
    if let Some(arn) = topic {
        delete_topic(arn).await;
    }
    delete_queue(queue_url).await;
}

/// A FIFO queue by name: group id = aggregate id, dedup id = event id, every contract
/// header and user header as a message attribute; a batch call's entries are judged one by
/// one (an oversized message fails alone, for good).
#[tokio::test]
async fn fifo_queue_attributes_group_and_dedup_ids() {
    let name = format!("txo-fifo-{}.fifo", suffix());
    let c = sqs().await;
    let queue_url = create_queue(&c, &name).await;
    let reader = Reader::start(c.clone(), queue_url.clone());
    let p = connect(&format!("sqs://{name}?{}", params())).await;
    assert!(p.keeps_key_order());
    assert_eq!(p.kind(), "sqs");
    let mut sent: Vec<Message> = (0..25)
        .map(|n| message(n, &format!("o-{}", n % 4)))
        .collect();
    // An aggregate id that is no valid group id still keeps one group.
    sent.push(message(25, "a b ä"));
    sent.push(message(26, "a b ä"));
    send_all(&*p, &sent).await;
    let got = reader.wait(sent.len()).await;
    for m in &sent {
        let g = got
            .iter()
            .find(|g| g.attributes.get("outbox-event-id") == Some(&m.id.to_string()))
            .unwrap_or_else(|| panic!("{} not received", m.id));
        assert_eq!(g.body.as_bytes(), m.body.as_slice());
        assert_eq!(g.dedup_id.as_deref(), Some(m.id.to_string().as_str()));
        let want_group = if m.aggregate_id == "a b ä" {
            txoutbox::publish::aws::group_id("a b ä")
        } else {
            m.aggregate_id.clone()
        };
        assert_eq!(g.group_id.as_deref(), Some(want_group.as_str()));
        for (h, v) in m.contract_headers() {
            assert_eq!(g.attributes.get(h), Some(&v), "{h}");
        }
        assert_eq!(
            g.attributes.get("traceparent"),
            m.headers.get("traceparent")
        );
        assert_eq!(g.attributes["content-type"], "application/json");
        assert_eq!(g.attributes.len(), 7, "{:?}", g.attributes);
    }
    // Per aggregate, the order sent.
    for key in ["o-0", "o-1", "o-2", "o-3", "a b ä"] {
        let sent_ids: Vec<String> = sent
            .iter()
            .filter(|m| m.aggregate_id == key)
            .map(|m| m.id.to_string())
            .collect();
        let got_ids: Vec<String> = got
            .iter()
            .filter(|g| g.attributes.get("outbox-aggregate-id").map(String::as_str) == Some(key))
            .map(|g| g.attributes["outbox-event-id"].clone())
            .collect();
        assert_eq!(got_ids, sent_ids, "order of {key}");
    }

    // Pipelined with an oversized message in the middle: it alone fails, permanently.
    let before = reader.all().len();
    let mut big = message(100, "o-9");
    big.body = format!("\"{}\"", "x".repeat(300 * 1024)).into_bytes();
    let small = [message(101, "o-8"), message(102, "o-7")];
    let a1 = p.send(&small[0]).await.unwrap();
    let e = match p.send(&big).await {
        Err(e) => e,
        Ok(a) => a.await.unwrap_err(),
    };
    let a2 = p.send(&small[1]).await.unwrap();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(e.to_string().contains("262144"), "{e}");
    a1.await.unwrap();
    a2.await.unwrap();
    reader.wait(before + 2).await;
    teardown(p, reader, None, &queue_url).await;
}

/// A standard queue by URL: no group or dedup id, and keeps no order (the relay waits for
/// each acknowledgement in ordered mode). More than 10 attributes: nine of their own, the
/// rest in `outbox-headers`; CloudEvents attributes come first.
#[tokio::test]
async fn standard_queue_by_url_ten_attributes_and_cloudevents() {
    let name = format!("txo-std-{}", suffix());
    let c = sqs().await;
    let queue_url = create_queue(&c, &name).await;
    let reader = Reader::start(c.clone(), queue_url.clone());
    let url = format!("sqs://{}/{ACCOUNT}/{name}?{}", address(), params());
    let p = connect(&url).await;
    assert!(!p.keeps_key_order());

    let mut m = message(1, "o-1");
    for (k, v) in [
        ("h1", "1"),
        ("h2", "2"),
        ("h3", "3"),
        ("h4", "4"),
        ("h5", "5"),
        ("bad name", "6"),
    ] {
        m.headers.insert(k.into(), v.into());
    }
    p.send(&m).await.unwrap().await.unwrap();
    let got = reader.wait(1).await;
    let g = &got[0];
    assert_eq!(g.group_id, None);
    assert_eq!(g.dedup_id, None);
    assert_eq!(g.attributes.len(), 10, "{:?}", g.attributes);
    for (h, v) in m.contract_headers() {
        assert_eq!(g.attributes.get(h), Some(&v), "{h}");
    }
    assert_eq!(g.attributes["content-type"], "application/json");
    // The user headers in name order: `bad name` (no attribute name), then h1.. h5,
    // traceparent: after content-type and the contract headers h1 to h3 fit, the rest is in
    // outbox-headers.
    let rest: BTreeMap<String, String> =
        serde_json::from_str(&g.attributes[publish::aws::OVERFLOW_ATTRIBUTE]).unwrap();
    assert_eq!(
        rest.keys().map(String::as_str).collect::<Vec<_>>(),
        ["bad name", "h4", "h5", "traceparent"]
    );
    for k in ["h1", "h2", "h3"] {
        assert!(g.attributes.contains_key(k), "{k}");
    }
    p.close().await.unwrap();

    // CloudEvents: the binding attributes first.
    let p = connect(&format!("{url}&cloudevents=true&ce_source=/shop")).await;
    let m = message(2, "o-2");
    p.send(&m).await.unwrap().await.unwrap();
    let got = reader.wait(2).await;
    let g = &got[1];
    let a = &g.attributes;
    assert_eq!(a["ce-specversion"], "1.0");
    assert_eq!(a["ce-id"], m.id.to_string());
    assert_eq!(a["ce-source"], "/shop");
    assert_eq!(a["ce-type"], "created");
    assert_eq!(a["ce-subject"], "o-2");
    assert_eq!(
        a["ce-time"],
        m.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    );
    assert_eq!(a["content-type"], "application/json");
    assert_eq!(a["outbox-event-id"], m.id.to_string());
    let rest: BTreeMap<String, String> =
        serde_json::from_str(&a[publish::aws::OVERFLOW_ATTRIBUTE]).unwrap();
    assert_eq!(rest["outbox-aggregate-id"], "o-2");
    assert_eq!(rest["traceparent"], "00-trace-2-01");
    teardown(p, reader, None, &queue_url).await;
}

/// What cannot work is said at connect time: a missing queue or topic (unavailable: the
/// operator's to fix, not the events'), a bad URL (a config error).
#[tokio::test]
async fn missing_queue_and_topic_and_bad_urls() {
    credentials();
    for url in [
        format!("sqs://txo-missing-{}?{}", suffix(), params()),
        format!(
            "sns://arn:aws:sns:{REGION}:{ACCOUNT}:txo-missing-{}?{}",
            suffix(),
            params()
        ),
    ] {
        match publish::connect(&url).await {
            Err(publish::ConnectError::Publish(e)) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}")
            }
            Err(e) => panic!("{url}: {e}"),
            Ok(_) => panic!("{url}: connected to a missing destination"),
        }
    }
    for url in [
        "sqs://bad.name",
        "sqs://q?nope=1",
        "sqs://q?endpoint=ftp://x",
        "sqs://q?region=EU%20West",
        "sqs://q?max_message_bytes=10",
        "sqs://AKIA:secret@q",
        "sns://arn:aws:sqs:us-east-1:1:q",
        "sns:orders",
    ] {
        match publish::connect(url).await {
            Err(publish::ConnectError::Config(e)) => {
                assert!(!e.to_string().contains("secret"), "{e}")
            }
            Err(e) => panic!("{url}: expected a config error, got {e}"),
            Ok(_) => panic!("{url} accepted"),
        }
    }
}

/// A FIFO topic, read through a FIFO queue subscribed to it: attributes, group and dedup ids
/// reach the subscriber; per-aggregate order.
#[tokio::test]
async fn fifo_topic_to_subscribed_queue() {
    let name = format!("txo-topic-{}.fifo", suffix());
    let (arn, queue_url) = topic_with_queue(&name).await;
    let reader = Reader::start(sqs().await, queue_url.clone());
    let p = connect(&format!("sns://{arn}?{}&cloudevents=true", params())).await;
    assert!(p.keeps_key_order());
    assert_eq!(p.kind(), "sns");
    let sent: Vec<Message> = (0..12)
        .map(|n| message(n, &format!("o-{}", n % 2)))
        .collect();
    send_all(&*p, &sent).await;
    let got = reader.wait(sent.len()).await;
    for m in &sent {
        let g = got
            .iter()
            .find(|g| g.attributes.get("ce-id") == Some(&m.id.to_string()))
            .unwrap_or_else(|| panic!("{} not received", m.id));
        assert_eq!(g.body.as_bytes(), m.body.as_slice());
        assert_eq!(g.group_id.as_deref(), Some(m.aggregate_id.as_str()));
        assert_eq!(g.attributes["ce-type"], "created");
        assert_eq!(g.attributes["outbox-event-id"], m.id.to_string());
    }
    for key in ["o-0", "o-1"] {
        let sent_ids: Vec<String> = sent
            .iter()
            .filter(|m| m.aggregate_id == key)
            .map(|m| m.id.to_string())
            .collect();
        let got_ids: Vec<String> = got
            .iter()
            .filter(|g| g.attributes.get("ce-subject").map(String::as_str) == Some(key))
            .map(|g| g.attributes["ce-id"].clone())
            .collect();
        assert_eq!(got_ids, sent_ids, "order of {key}");
    }
    teardown(p, reader, Some(&arn), &queue_url).await;
}

/// A standard topic (no FIFO), read through a standard queue subscribed to it: every message
/// arrives with its body and contract attributes, without a group or deduplication id (SNS
/// refuses them on a standard topic), and the relay is told to wait for each acknowledgement
/// before an aggregate's next event (a standard topic keeps no order).
#[tokio::test]
async fn standard_topic_to_subscribed_queue() {
    let name = format!("txo-topic-{}", suffix());
    let (arn, queue_url) = topic_with_queue(&name).await;
    let reader = Reader::start(sqs().await, queue_url.clone());
    let p = connect(&format!("sns://{arn}?{}", params())).await;
    assert!(!p.keeps_key_order(), "a standard topic keeps no order");
    assert_eq!(
        p.destination(&message(0, "o-0")).as_deref(),
        Some(arn.as_str())
    );
    let sent: Vec<Message> = (0..13)
        .map(|n| message(n, &format!("o-{}", n % 3)))
        .collect();
    send_all(&*p, &sent).await;
    let got = reader.wait(sent.len()).await;
    for m in &sent {
        let g = got
            .iter()
            .find(|g| g.attributes.get("outbox-event-id") == Some(&m.id.to_string()))
            .unwrap_or_else(|| panic!("{} not received", m.id));
        assert_eq!(g.body.as_bytes(), m.body.as_slice());
        assert_eq!(g.group_id, None);
        assert_eq!(g.dedup_id, None);
        assert_eq!(g.attributes["outbox-event-type"], "created");
        assert_eq!(g.attributes["outbox-aggregate-id"], m.aggregate_id);
        assert_eq!(g.attributes["traceparent"], m.headers["traceparent"]);
    }
    teardown(p, reader, Some(&arn), &queue_url).await;
}

/// What boto3 reads from a FIFO queue (`scripts/clients/sqs_cloudevents.py`) is a CloudEvent
/// for the CloudEvents SDK (the attributes as HTTP binary-mode headers), with our group and
/// dedup ids and the contract headers.
#[tokio::test]
async fn boto3_reads_cloudevents_group_and_dedup_ids() {
    use chrono::SubsecRound as _;
    let Some(python) = crate::clients_python() else {
        return;
    };
    let name = format!("txo-boto-{}.fifo", suffix());
    let c = sqs().await;
    let queue_url = create_queue(&c, &name).await;
    let p = connect(&format!(
        "sqs://{name}?{}&cloudevents=true&ce_source=/shop",
        params()
    ))
    .await;
    let sent: Vec<Message> = (0..4).map(|n| message(n, &format!("o-{n}"))).collect();
    for m in &sent {
        p.send(m).await.unwrap().await.unwrap();
    }
    p.close().await.unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/clients/sqs_cloudevents.py"
    );
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(endpoint())
        .arg(&queue_url)
        .arg(sent.len().to_string())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_DEFAULT_REGION", REGION)
        .output()
        .await
        .unwrap();
    delete_queue(&queue_url).await;
    assert!(
        out.status.success(),
        "boto3 or the CloudEvents SDK refused the messages: {}",
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
        let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
        assert_eq!(time, m.created_at.trunc_subsecs(6));
        assert_eq!(e["data"]["n"], m.seq);
        assert_eq!(e["group_id"], m.aggregate_id);
        assert_eq!(e["dedup_id"], m.id.to_string());
        assert_eq!(e["message_attributes"]["outbox-event-id"], m.id.to_string());
    }
}
