#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
//! The Redis Streams publisher against a real server (`REDIS_URL`, default
//! `redis://127.0.0.1:6379`).
#![cfg(feature = "redis")]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

fn server() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A stream key prefix of our own, deleted at the end, so tests run in parallel.
struct Scope {
    prefix: String,
}

impl Scope {
    fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self {
            prefix: format!("txotest.{suffix}"),
        }
    }

    /// A publisher URL writing to `<prefix>.{aggregate_type}`.
    fn url(&self, extra: &str) -> String {
        format!(
            "{}?stream={}.{{aggregate_type}}{extra}",
            server(),
            self.prefix
        )
    }

    fn key(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.prefix)
    }

    async fn cleanup(&self) {
        let mut c = conn().await;
        let keys: Vec<String> = c.keys(format!("{}*", self.prefix)).await.unwrap();
        for k in keys {
            let _: () = c.del(k).await.unwrap();
        }
    }
}

async fn conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(server())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
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

async fn publisher(url: &str) -> Box<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

type Entry = (String, HashMap<String, String>);

async fn entries(key: &str) -> Vec<Entry> {
    let mut c = conn().await;
    let reply: redis::streams::StreamRangeReply = c.xrange_all(key).await.unwrap();
    reply
        .ids
        .into_iter()
        .map(|e| {
            let fields = e
                .map
                .iter()
                .map(|(k, v)| (k.clone(), redis::from_redis_value::<String>(v).unwrap()))
                .collect();
            (e.id, fields)
        })
        .collect()
}

#[tokio::test]
async fn delivers_in_order_with_the_contract_fields() {
    let scope = Scope::new();
    let p = publisher(&scope.url("")).await;
    assert_eq!(p.kind(), "redis");
    let sent: Vec<Message> = (0..50).map(message).collect();
    // Hand every message over first (pipelined), then wait for the replies.
    let mut acks = Vec::new();
    for m in &sent {
        acks.push(p.send(m).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let got = entries(&scope.key("order")).await;
    assert_eq!(got.len(), sent.len());
    for (m, (_, f)) in sent.iter().zip(&got) {
        assert_eq!(f["id"], m.id.to_string());
        assert_eq!(f["payload"].as_bytes(), m.body.as_slice());
        assert_eq!(f["outbox-event-id"], m.id.to_string());
        assert_eq!(f["outbox-event-type"], "created");
        assert_eq!(f["outbox-aggregate-type"], "order");
        assert_eq!(f["outbox-aggregate-id"], m.aggregate_id);
        assert!(f.contains_key("outbox-created-at"));
        assert_eq!(f["traceparent"], m.headers["traceparent"]);
        assert!(!f.contains_key("ce_id"));
    }
    p.check().await.unwrap();
    p.close().await.unwrap();
    scope.cleanup().await;
}

#[tokio::test]
async fn ack_comes_from_the_server_reply() {
    let scope = Scope::new();
    let p = publisher(&scope.url("")).await;
    // The key exists but is not a stream: only the server's reply can tell.
    let mut c = conn().await;
    let _: () = c.set(scope.key("order"), "not a stream").await.unwrap();
    let ack = p.send(&message(1)).await.unwrap();
    let e = ack.await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    // The connection is still good afterwards.
    let _: () = c.del(scope.key("order")).await.unwrap();
    p.send(&message(2)).await.unwrap().await.unwrap();
    assert_eq!(entries(&scope.key("order")).await.len(), 1);
    scope.cleanup().await;
}

#[tokio::test]
async fn empty_stream_name_is_permanent() {
    let p = publisher(&format!("{}?stream={{aggregate_id}}", server())).await;
    let mut m = message(1);
    m.aggregate_id = String::new();
    let e = match p.send(&m).await {
        Err(e) => e,
        Ok(ack) => ack.await.unwrap_err(),
    };
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
}

#[tokio::test]
async fn maxlen_trims_the_stream() {
    let scope = Scope::new();
    let p = publisher(&scope.url("&maxlen=10")).await;
    let mut acks = Vec::new();
    for n in 0..600 {
        acks.push(p.send(&message(n)).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let mut c = conn().await;
    let len: usize = c.xlen(scope.key("order")).await.unwrap();
    // `MAXLEN ~` trims whole macro nodes (100 entries by default): about 10, never all 600.
    assert!((10..=200).contains(&len), "XLEN {len}");
    scope.cleanup().await;
}

#[tokio::test]
async fn cloudevents_fields() {
    let scope = Scope::new();
    let p = publisher(&scope.url("&cloudevents=true&ce_source=/orders")).await;
    let m = message(7);
    p.send(&m).await.unwrap().await.unwrap();
    let got = entries(&scope.key("order")).await;
    let f = &got[0].1;
    assert_eq!(f["ce_specversion"], "1.0");
    assert_eq!(f["ce_id"], m.id.to_string());
    assert_eq!(f["ce_source"], "/orders");
    assert_eq!(f["ce_type"], "created");
    assert_eq!(f["ce_subject"], "o-7");
    assert_eq!(f["ce_datacontenttype"], "application/json");
    assert!(chrono::DateTime::parse_from_rfc3339(&f["ce_time"]).is_ok());
    assert_eq!(f["id"], m.id.to_string());
    scope.cleanup().await;
}

#[tokio::test]
async fn unreachable_server_is_unavailable_quickly_and_hides_the_password() {
    let started = Instant::now();
    let url = "redis://someone:s3cret-pw@127.0.0.1:1?connect_timeout=2s";
    let e = match publish::connect(url).await {
        Err(ConnectError::Publish(e)) => e,
        Err(other) => panic!("expected a publish error, got {other}"),
        Ok(_) => panic!("connected to port 1?"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!e.chain().contains("s3cret-pw"), "{}", e.chain());
    assert!(!format!("{e:?}").contains("s3cret-pw"), "{e:?}");
}

#[tokio::test]
async fn wrong_password_is_refused_without_printing_it() {
    // The test server has no password, so AUTH with one fails.
    let base = server();
    let url = base.replacen("redis://", "redis://someone:s3cret-pw@", 1);
    match publish::connect(&url).await {
        Err(e) => {
            assert!(!e.to_string().contains("s3cret-pw"), "{e}");
            assert!(!format!("{e:?}").contains("s3cret-pw"), "{e:?}");
        }
        Ok(_) => panic!("AUTH as an unknown user should fail"),
    }
}

#[tokio::test]
async fn bad_urls_are_config_errors() {
    for bad in [
        "redis://127.0.0.1:6379?stream={nope}",
        "redis://127.0.0.1:6379?maxlen=0",
        "redis://127.0.0.1:6379?unknown=1",
    ] {
        match publish::connect(bad).await {
            Err(ConnectError::Config(_)) => {}
            Err(e) => panic!("{bad}: expected a config error, got {e}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
}
