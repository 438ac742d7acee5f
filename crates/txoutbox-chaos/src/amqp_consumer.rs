//! The consumer of a RabbitMQ run: reads the queue while the run goes on, with manual acks,
//! and reconnects whenever the broker goes away. A message delivered but not acked when the
//! connection dropped comes again: a duplicate, counted as such.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::rabbit::declare_queue;

/// Unacked deliveries at most: small, so that a paused consumer leaves the messages ready in
/// the queue (where a broker restart must keep them) rather than in its own buffer.
const PREFETCH: u16 = 50;

struct Shared {
    url: String,
    queue: String,
    /// Event ids in the order received, duplicates included.
    ids: Mutex<Vec<Uuid>>,
    /// Consuming sessions that ended in an error (the broker restarted, ...), each followed
    /// by a reconnect.
    reconnects: AtomicU32,
    stop: CancellationToken,
    /// While true, the consumer takes nothing (its connection stays): the queue fills up.
    paused: watch::Sender<bool>,
}

pub struct Consumer {
    shared: Arc<Shared>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Consumer {
    pub fn start(url: &str, queue: &str) -> Self {
        let shared = Arc::new(Shared {
            url: url.to_string(),
            queue: queue.to_string(),
            ids: Mutex::new(Vec::new()),
            reconnects: AtomicU32::new(0),
            stop: CancellationToken::new(),
            paused: watch::Sender::new(false),
        });
        let task = tokio::spawn(consume(shared.clone()));
        Self { shared, task }
    }

    /// Take nothing until `resume`, so that the queue holds messages (e.g. across a broker
    /// restart).
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Stop consuming (what was delivered but not recorded goes back to the queue), then take
    /// what is left with `basic.get` until the queue is empty. Call once no relay publishes.
    /// Returns the event ids in the order they were first received, duplicates included, and
    /// the number of reconnects.
    pub async fn finish(self) -> anyhow::Result<(Vec<Uuid>, u32)> {
        let s = self.shared;
        s.paused.send_replace(false);
        s.stop.cancel();
        self.task.await.context("the consumer task")??;
        let conn = Connection::connect(&s.url, ConnectionProperties::default())
            .await
            .context("connect to RabbitMQ to empty the queue")?;
        let ch = conn.create_channel().await.context("open a channel")?;
        let mut ids = std::mem::take(&mut *s.ids.lock().unwrap_or_else(|p| p.into_inner()));
        while let Some(m) = ch
            .basic_get(s.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .context("basic.get")?
        {
            ids.push(event_id(&m.delivery)?);
        }
        let _ = conn.close(200, "done".into()).await;
        Ok((ids, s.reconnects.load(Ordering::Relaxed)))
    }
}

fn event_id(d: &lapin::message::Delivery) -> anyhow::Result<Uuid> {
    d.properties
        .message_id()
        .as_ref()
        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        .context("a message without a valid message_id in the queue")
}

/// A message the checker cannot place: the run fails rather than guess.
#[derive(Debug)]
struct BadMessage(String);

impl std::fmt::Display for BadMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadMessage {}

async fn consume(s: Arc<Shared>) -> anyhow::Result<()> {
    while !s.stop.is_cancelled() {
        let mut consuming = false;
        match session(&s, &mut consuming).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is::<BadMessage>() => return Err(e),
            Err(e) => {
                // One line per lost session; the failed connects while the broker is down
                // are not worth one each.
                if consuming {
                    s.reconnects.fetch_add(1, Ordering::Relaxed);
                    eprintln!("chaos: consumer: {e:#}; reconnecting");
                }
                tokio::select! {
                    _ = s.stop.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        }
    }
    Ok(())
}

/// One connection: consume until stopped (Ok) or the connection fails (Err).
async fn session(s: &Shared, consuming: &mut bool) -> anyhow::Result<()> {
    let conn = tokio::select! {
        _ = s.stop.cancelled() => return Ok(()),
        c = Connection::connect(&s.url, ConnectionProperties::default()) => c.context("connect")?,
    };
    let ch = conn.create_channel().await.context("open a channel")?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .context("basic.qos")?;
    declare_queue(&ch, &s.queue).await?;
    let mut deliveries = ch
        .basic_consume(
            s.queue.as_str().into(),
            "chaos-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .context("basic.consume")?;
    *consuming = true;
    let mut paused = s.paused.subscribe();
    loop {
        // Stop only between messages: one recorded is also acked, so the final sweep does
        // not read it again.
        let next = tokio::select! {
            _ = s.stop.cancelled() => {
                let _ = conn.close(200, "done".into()).await;
                return Ok(());
            }
            n = async {
                let _ = paused.wait_for(|p| !*p).await;
                deliveries.next().await
            } => n,
        };
        let delivery = match next {
            Some(Ok(d)) => d,
            Some(Err(e)) => return Err(e).context("the consumer failed"),
            None => bail!("the broker ended the consumer"),
        };
        let id = event_id(&delivery).map_err(|e| BadMessage(format!("{e:#}")))?;
        s.ids.lock().unwrap_or_else(|p| p.into_inner()).push(id);
        delivery
            .ack(BasicAckOptions::default())
            .await
            .context("ack")?;
    }
}
