//! The NATS JetStream publisher against a real server (`NATS_URL`, default
//! `nats://127.0.0.1:4222`, with JetStream enabled).
#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

fn server() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A stream name and subject prefix of our own, so tests run in parallel.
struct Scope {
    stream: String,
    prefix: String,
}

impl Scope {
    fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self {
            stream: format!("TXO_TEST_{}", suffix.to_uppercase()),
            prefix: format!("txotest{suffix}"),
        }
    }

    fn url(&self, extra: &str) -> String {
        format!(
            "{}?stream={}&subject={}.{{aggregate_type}}.{{event_type}}{extra}",
            server(),
            self.stream,
            self.prefix
        )
    }

    async fn cleanup(&self) {
        if let Ok(client) = async_nats::connect(server()).await {
            let js = async_nats::jetstream::new(client);
            let _ = js.delete_stream(&self.stream).await;
        }
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
        .map_err(|e| anyhow::anyhow!("connect {url}: {e}"))
}

async fn stream(scope: &Scope) -> anyhow::Result<async_nats::jetstream::stream::Stream> {
    let client = async_nats::connect(server()).await?;
    let js = async_nats::jetstream::new(client);
    Ok(js.get_stream(&scope.stream).await?)
}

/// Poll the stream until it holds `n` messages (or fail after a deadline).
async fn wait_for_count(s: &async_nats::jetstream::stream::Stream, n: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let have = s.get_info().await?.state.messages;
        if have == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("stream holds {have} messages, expected {n}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn publishes_in_order_with_headers() -> anyhow::Result<()> {
    let scope = Scope::new();
    let result = async {
        let p = publisher(&scope.url("")).await?;
        assert_eq!(p.kind(), "nats");
        p.check().await?;
        let messages: Vec<Message> = (0..25).map(message).collect();
        let mut acks = Vec::new();
        for m in &messages {
            acks.push(p.send(m).await?);
        }
        for ack in acks {
            ack.await?;
        }
        let s = stream(&scope).await?;
        wait_for_count(&s, messages.len() as u64).await?;
        let first = s.get_info().await?.state.first_sequence;
        for (i, m) in messages.iter().enumerate() {
            let got = s.get_raw_message(first + i as u64).await?;
            assert_eq!(
                got.subject.as_str(),
                format!("{}.order.created", scope.prefix)
            );
            assert_eq!(
                got.payload.as_ref(),
                m.body.as_slice(),
                "message {i} in order"
            );
            let h = |name: &str| got.headers.get(name).map(|v| v.as_str().to_string());
            assert_eq!(h("Nats-Msg-Id"), Some(m.id.to_string()));
            for (name, value) in m.contract_headers() {
                assert_eq!(h(name), Some(value), "{name}");
            }
            assert_eq!(h("traceparent"), Some(format!("00-trace-{i}-01")));
        }
        p.close().await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn same_id_is_stored_once() -> anyhow::Result<()> {
    let scope = Scope::new();
    let result = async {
        let p = publisher(&scope.url("&ack_timeout=5s")).await?;
        let m = message(1);
        p.send(&m).await?.await?;
        let mut again = m.clone();
        again.attempt = 2;
        p.send(&again)
            .await?
            .await
            .context("duplicate must be acked")?;
        let other = message(2);
        p.send(&other).await?.await?;
        let s = stream(&scope).await?;
        wait_for_count(&s, 2).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn invalid_subjects_and_oversized_bodies_are_permanent() -> anyhow::Result<()> {
    let scope = Scope::new();
    let result = async {
        let p = publisher(&scope.url("")).await?;

        let mut m = message(1);
        m.event_type = "has space".into();
        let e = p.send(&m).await.err().context("space in subject")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        eprintln!("space: {}", e.chain());

        let mut m = message(2);
        m.aggregate_type = String::new(); // renders `prefix..created`
        let e = p.send(&m).await.err().context("empty token")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

        let mut m = message(3);
        m.event_type = "created.>".into();
        let e = p.send(&m).await.err().context("wildcard")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

        let client = async_nats::connect(server()).await?;
        let max = client.server_info().max_payload;
        let mut m = message(4);
        m.body = vec![b'x'; max + 1];
        let e = p.send(&m).await.err().context("oversized body")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        eprintln!("oversized: {}", e.chain());

        // Body just under the limit, but headers push it over: still permanent.
        let mut m = message(5);
        m.body = vec![b'x'; max - 10];
        let e = match p.send(&m).await {
            Ok(ack) => ack.await.err().context("body+headers over max_payload")?,
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
        eprintln!("headers push over max_payload: {}", e.chain());

        let mut m = message(6);
        m.headers.insert("bad header".into(), "x".into());
        let e = p.send(&m).await.err().context("bad header name")?;
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

        // The publisher still works afterwards, and nothing invalid was stored.
        p.send(&message(7)).await?.await?;
        let s = stream(&scope).await?;
        wait_for_count(&s, 1).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn deleted_stream_is_unavailable_and_check_recreates_it() -> anyhow::Result<()> {
    let scope = Scope::new();
    let result = async {
        let p = publisher(&scope.url("&ack_timeout=3s")).await?;
        p.send(&message(1)).await?.await?;
        let client = async_nats::connect(server()).await?;
        async_nats::jetstream::new(client)
            .delete_stream(&scope.stream)
            .await?;
        let e = match p.send(&message(2)).await {
            Ok(ack) => ack.await.err().context("stream is gone")?,
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
        eprintln!("stream gone: {}", e.chain());
        p.check().await?;
        p.send(&message(3)).await?.await?;
        wait_for_count(&stream(&scope).await?, 1).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}

#[tokio::test]
async fn unreachable_server_is_unavailable_quickly() {
    let started = Instant::now();
    let e = publish::connect("nats://user:hunter2secret@127.0.0.1:1?connect_timeout=2s")
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
            eprintln!("unreachable: {chain}");
        }
        other => panic!("expected an unavailable error, got {other:?}"),
    }
    assert!(!format!("{e} {e:?}").contains("hunter2secret"));
}

#[tokio::test]
async fn bad_parameters_are_config_errors() {
    for url in [
        format!("{}?stream=S&nope=1", server()),
        format!("{}?subject=a.{{evnt}}", server()),
        format!("{}?ack_timeout=whenever", server()),
        format!("{}?stream=has.dot", server()),
        format!("{}?create_stream=maybe", server()),
    ] {
        match publish::connect(&url).await {
            Err(ConnectError::Config(_)) => {}
            Err(other) => panic!("{url}: expected a config error, got {other}"),
            Ok(_) => panic!("{url}: expected a config error"),
        }
    }
    let e = publish::connect("nats://u:s3cr3tpw@127.0.0.1:4222?bogus=1")
        .await
        .err()
        .expect("unknown param");
    assert!(matches!(e, ConnectError::Config(_)), "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cr3tpw"));
}

#[tokio::test]
async fn missing_stream_without_create_is_refused() {
    let scope = Scope::new();
    let e = publish::connect(&scope.url("&create_stream=false"))
        .await
        .err()
        .expect("stream does not exist");
    match e {
        ConnectError::Publish(p) => assert_eq!(p.kind(), ErrorKind::Unavailable, "{p}"),
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn cloudevents_binary_mode_headers() -> anyhow::Result<()> {
    let scope = Scope::new();
    let result = async {
        let p = publisher(&scope.url("&cloudevents=true&ce_source=/shop")).await?;
        let m = message(7);
        p.send(&m).await?.await?;
        let s = stream(&scope).await?;
        wait_for_count(&s, 1).await?;
        let first = s.get_info().await?.state.first_sequence;
        let got = s.get_raw_message(first).await?;
        let h = |name: &str| got.headers.get(name).map(|v| v.as_str().to_string());
        assert_eq!(h("ce-id"), Some(m.id.to_string()));
        assert_eq!(h("ce-type").as_deref(), Some("created"));
        assert_eq!(h("ce-source").as_deref(), Some("/shop"));
        assert_eq!(h("ce-subject").as_deref(), Some("o-7"));
        assert_eq!(h("ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(h("content-type").as_deref(), Some("application/json"));
        assert!(h("ce-time").is_some());
        assert_eq!(
            got.payload.as_ref(),
            m.body.as_slice(),
            "the body stays the payload"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    scope.cleanup().await;
    result
}
