//! The relay on MySQL/MariaDB and SQLite end to end: every committed event delivered in
//! order per aggregate, nothing from a rolled-back transaction, and an idle relay woken at
//! once by a writer of its own process (not a poll later). Real databases: a database of its
//! own on `MYSQL_URL`'s server, a file of its own for SQLite.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use txoutbox::publish::{ready_ack, Ack, Message, PublishError, Publisher};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::store::{Retention, Store};
use txoutbox::testing::Harness;
use txoutbox::{NewEvent, Outbox};
use uuid::Uuid;

/// Sends every published message's (aggregate id, id) to a channel; acks at once.
struct Channel(mpsc::UnboundedSender<(String, Uuid)>);

#[async_trait::async_trait]
impl Publisher for Channel {
    fn kind(&self) -> &'static str {
        "channel"
    }
    async fn send(&self, m: &Message) -> Result<Ack, PublishError> {
        let _ = self.0.send((m.aggregate_id.clone(), m.id));
        Ok(ready_ack(Ok(())))
    }
}

fn config() -> RelayConfig {
    let mut c = RelayConfig::default();
    // Far longer than the test waits: only a wake-up can explain a fast delivery.
    c.poll_interval = Duration::from_secs(30);
    c.batch_size = 50;
    c
}

async fn next(rx: &mut mpsc::UnboundedReceiver<(String, Uuid)>) -> (String, Uuid) {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .expect("no delivery within 15 s")
        .unwrap()
}

fn events(n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| NewEvent::new("order", format!("o-{}", i % 5), "order.changed", &i).unwrap())
        .collect()
}

/// Deliver a backlog in per-aggregate order, then, idle, an event within a fraction of the
/// poll interval after its commit.
async fn delivers_in_order_and_wakes_at_once<S: Store>(
    store: S,
    enqueue: impl Fn(Vec<NewEvent>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let backlog = events(200);
    let mut want: std::collections::HashMap<String, Vec<Uuid>> = Default::default();
    for e in &backlog {
        want.entry(e.aggregate_id().to_string())
            .or_default()
            .push(e.id());
    }
    enqueue(backlog).await;
    let relay = Relay::new(store, Box::new(Channel(tx)), config()).spawn();
    let mut got: std::collections::HashMap<String, Vec<Uuid>> = Default::default();
    for _ in 0..200 {
        let (agg, id) = next(&mut rx).await;
        got.entry(agg).or_default().push(id);
    }
    assert_eq!(got, want, "per-aggregate order");
    // Idle long enough for the adaptive poll to back off well past the wait below.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..3 {
        let one = events(1);
        let id = one[0].id();
        let t0 = Instant::now();
        enqueue(one).await;
        let (_, got) = next(&mut rx).await;
        let took = t0.elapsed();
        assert_eq!(got, id);
        assert!(took < Duration::from_millis(500), "woken after {took:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    relay.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relay_delivers_in_order_and_wakes_at_once() {
    use txoutbox::store::sqlite::SqliteStore;
    let h = txoutbox::testing::sqlite::SqliteHarness::new().await;
    // The relay's store and the writers share one pool: its commit hooks wake the relay.
    let store = SqliteStore::open(&h.url, h.table.clone(), 5, Retention::Mark)
        .await
        .unwrap();
    let pool = store.pool().clone();
    let table = h.table.clone();
    delivers_in_order_and_wakes_at_once(store, move |evs| {
        let (pool, table) = (pool.clone(), table.clone());
        Box::pin(async move {
            let mut tx = pool.begin().await.unwrap();
            let outbox = Outbox::new(table);
            outbox.enqueue_many(&mut *tx, &evs).await.unwrap();
            // A rolled-back event in the same breath must never arrive.
            let mut rb = pool.begin().await.unwrap();
            tx.commit().await.unwrap();
            outbox.enqueue_many(&mut *rb, &events(1)).await.unwrap();
            rb.rollback().await.unwrap();
        })
    })
    .await;
    h.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_relay_delivers_in_order_and_wakes_at_once() {
    use txoutbox::store::mysql::{MySqlStore, Wakeup};
    let h = txoutbox::testing::mysql::MySqlHarness::new().await;
    let wakeup = Wakeup::default();
    let store = MySqlStore::new(h.pool.clone(), h.table.clone(), wakeup.clone());
    let pool = h.pool.clone();
    let outbox = Outbox::new(h.table.clone()).with_wakeup(wakeup);
    delivers_in_order_and_wakes_at_once(store, move |evs| {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        Box::pin(async move {
            let mut tx = pool.begin().await.unwrap();
            outbox.enqueue_many(&mut *tx, &evs).await.unwrap();
            tx.commit().await.unwrap();
            let mut rb = pool.begin().await.unwrap();
            outbox.enqueue_many(&mut *rb, &events(1)).await.unwrap();
            rb.rollback().await.unwrap();
        })
    })
    .await;
    h.cleanup().await;
}
