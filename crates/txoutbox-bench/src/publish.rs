//! `publish`: each publisher alone, without the database: the same messages a drain sends,
//! through txoutbox's own publisher, with as many acknowledgements outstanding as the relay's
//! default `--max-in-flight`. The broker's ceiling through our client, the denominator of a
//! drain's ratio.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
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

pub async fn run_once(env: &Env, url: &str) -> anyhow::Result<RunResult> {
    env.status(&format!("publishing to {}", super::short_url(url)));
    let publisher = crate::open_publisher(url).await?;
    let now = chrono::Utc::now();
    let messages: Vec<Message> = (1..=env.events)
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
        .collect();
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
