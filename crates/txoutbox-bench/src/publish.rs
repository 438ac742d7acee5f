//! `publish`: each publisher alone, without the database: the same messages a drain sends,
//! through txoutbox's own publisher, with as many acknowledgements outstanding as the relay's
//! default `--max-in-flight`. The broker's ceiling through our client, the denominator of a
//! drain's ratio.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use std::future::IntoFuture;

use futures::stream::{FuturesUnordered, StreamExt};
use txoutbox::publish::Message;
use uuid::Uuid;

use crate::report::{col, Column, RunResult};
use crate::Env;

/// Acknowledgements outstanding at once: the relay's default `--max-in-flight`.
fn window() -> usize {
    txoutbox::relay::RelayConfig::default().max_in_flight
}

pub const COLUMNS: &[Column] = &[
    col("messages_per_s", "messages/s", ""),
    col("seconds", "time", "s"),
];

pub fn measures(events: u64, aggregates: u64) -> String {
    format!(
        "{events} messages shaped like the drain's events ({aggregates} aggregates, ~200-byte JSON \
         body, the outbox-* headers) sent through txoutbox's publisher for the URL, no \
         database, up to {} acknowledgements outstanding (the relay's default \
         --max-in-flight), in this process. messages/s = messages / wall-clock from the first \
         send to the last acknowledgement (the connection is opened before). A run fails if any \
         message is not acknowledged. The ceiling a drain to the same broker is compared with.",
        window()
    )
}

/// `async-nats:` before a `nats://HOST:PORT?stream=NAME&subject=PREFIX` URL: the same messages
/// published with async-nats alone (JetStream, the same headers, the same window), the
/// reference txoutbox's NATS publisher is measured against. Publish scenario only.
pub const ASYNC_NATS_PREFIX: &str = "async-nats:";

/// The messages a drain of `env.events` events would send.
fn messages(env: &Env) -> Vec<Message> {
    let now = chrono::Utc::now();
    (1..=env.events)
        .map(|g| Message {
            id: Uuid::now_v7(),
            seq: i64::try_from(g).unwrap_or(i64::MAX),
            aggregate_type: "order".into(),
            aggregate_id: (g % env.aggregates).to_string(),
            event_type: "order.created".into(),
            body: serde_json::to_vec(&serde_json::json!({
                "order_id": g, "customer_id": format!("c-{}", g % 97),
                "total": g as f64 * 1.5, "note": "x".repeat(100),
            }))
            .unwrap_or_default(),
            content_type: "application/json".into(),
            headers: BTreeMap::new(),
            created_at: now,
            attempt: 1,
        })
        .collect()
}

pub async fn run_once(env: &Env, url: &str) -> anyhow::Result<RunResult> {
    if let Some(nats) = url.strip_prefix(ASYNC_NATS_PREFIX) {
        return async_nats_alone(env, nats).await;
    }
    env.status(&format!("publishing to {}", super::short_url(url)));
    let publisher = crate::open_publisher(url).await?;
    let messages = messages(env);
    let window = window();
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut failed = 0u64;
    let mut first_error = None;
    for m in &messages {
        while in_flight.len() >= window {
            if let Some(Err(e)) = in_flight.next().await {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
        in_flight.push(
            publisher
                .send(m)
                .await
                .with_context(|| format!("sending to {}", super::short_url(url)))?,
        );
    }
    while let Some(r) = in_flight.next().await {
        if let Err(e) = r {
            failed += 1;
            first_error.get_or_insert(e);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let _ = publisher.close().await;
    if let Some(e) = first_error {
        anyhow::bail!("{failed} message(s) not acknowledged; the first: {e}");
    }
    Ok(RunResult::default()
        .value("messages_per_s", env.events as f64 / elapsed)
        .value("seconds", elapsed))
}

/// `stream` and `subject` of an `async-nats:` URL, and the server part.
pub fn async_nats_target(url: &str) -> anyhow::Result<(String, String, String)> {
    let (server, query) = url
        .split_once('?')
        .context("async-nats: needs ?stream=NAME&subject=PREFIX")?;
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
            .with_context(|| format!("async-nats: needs the parameter {name}"))
    };
    Ok((server.to_string(), param("stream")?, param("subject")?))
}

/// The baseline: async-nats alone, the messages' headers built per message as txoutbox's
/// publisher builds them (`Nats-Msg-Id`, the `outbox-*` contract, `content-type`), the subject
/// `PREFIX.<aggregate_type>.<event_type>`, at most [`window`] acknowledgements outstanding.
async fn async_nats_alone(env: &Env, url: &str) -> anyhow::Result<RunResult> {
    use async_nats::jetstream;
    let (server, stream, prefix) = async_nats_target(url)?;
    env.status(&format!("publishing to {server} with async-nats alone"));
    let client = async_nats::connect(&server)
        .await
        .with_context(|| format!("async-nats: cannot connect to {server}"))?;
    let js = jetstream::new(client.clone());
    js.get_or_create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        ..Default::default()
    })
    .await
    .with_context(|| format!("async-nats: stream {stream}"))?;
    let messages = messages(env);
    let window = window();
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut failed = 0u64;
    for m in &messages {
        while in_flight.len() >= window {
            if let Some(Err(_)) = in_flight.next().await {
                failed += 1;
            }
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", m.id.to_string().as_str());
        for (name, value) in m.contract_headers() {
            headers.insert(name, value.as_str());
        }
        headers.insert("content-type", m.content_type.as_str());
        let subject = format!("{prefix}.{}.{}", m.aggregate_type, m.event_type);
        let ack = js
            .publish_with_headers(subject, headers, m.body.clone().into())
            .await
            .context("async-nats: publish")?;
        in_flight.push(ack.into_future());
    }
    while let Some(r) = in_flight.next().await {
        if r.is_err() {
            failed += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // The stream is kept, as txoutbox's publisher keeps its own: runs of both see streams
    // that grow alike.
    if failed > 0 {
        anyhow::bail!("async-nats: {failed} message(s) not acknowledged");
    }
    Ok(RunResult::default()
        .value("messages_per_s", env.events as f64 / elapsed)
        .value("seconds", elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_nats_urls_name_their_stream_and_subject() {
        let (server, stream, subject) =
            async_nats_target("nats://127.0.0.1:4222?stream=RAW&subject=raw").unwrap();
        assert_eq!(
            (server.as_str(), stream.as_str(), subject.as_str()),
            ("nats://127.0.0.1:4222", "RAW", "raw")
        );
        let e = async_nats_target("nats://127.0.0.1:4222").unwrap_err();
        assert!(format!("{e:#}").contains("stream=NAME"), "{e:#}");
        let e = async_nats_target("nats://h?stream=S").unwrap_err();
        assert!(format!("{e:#}").contains("subject"), "{e:#}");
    }
}
