//! A broker outage ends: what failed because the publisher was *unavailable* goes at once, not
//! after its backoff. A NATS server of the test's own (JetStream, a free port, its own store
//! directory), stopped and started again; real PostgreSQL (`DATABASE_URL`).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

/// `nats-server` with JetStream on `port`, storing under `dir`; killed when dropped.
struct NatsServer(Child);

impl NatsServer {
    async fn start(port: u16, dir: &Path) -> Self {
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server on PATH (scripts/services.sh installs it)");
        wait_until("nats-server listens", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Self(child)
    }

    fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test's own handle on the relay's publisher: it forwards everything.
struct Lent(Arc<dyn Publisher>);

#[async_trait::async_trait]
impl Publisher for Lent {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.0.send(message).await
    }
    async fn check(&self) -> Result<(), PublishError> {
        self.0.check().await
    }
    async fn close(&self) -> Result<(), PublishError> {
        self.0.close().await
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The event goes out within seconds of the broker answering again, though its backoff
/// (30 s) has far to run.
#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_what_failed_for_it_goes_when_the_broker_answers() {
    let dir = std::env::temp_dir().join(format!("txo-outage-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let server = NatsServer::start(port, &dir).await;
    let url = format!(
        "nats://127.0.0.1:{port}?stream=TXO_OUTAGE&subject=outage.{{event_type}}&ack_timeout=1s"
    );
    let publisher: Arc<dyn Publisher> = Arc::from(txoutbox::publish::connect(&url).await.unwrap());

    let db = PgHarness::new().await;
    let mut cfg = RelayConfig::default();
    cfg.relay_id = "outage".into();
    cfg.poll_interval = Duration::from_millis(200);
    cfg.partition_lease = Duration::from_secs(2);
    cfg.backoff = Backoff {
        base: Duration::from_secs(30),
        max: Duration::from_secs(30),
        jitter: false,
    };
    let relay = Relay::new(db.pool_store(), Box::new(Lent(publisher.clone())), cfg).spawn();

    server.stop();
    let mut tx = db.pool.begin().await.unwrap();
    let id = db
        .outbox()
        .enqueue(
            &mut *tx,
            &NewEvent::new("order", "1", "order.created", &serde_json::json!({})).unwrap(),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until("the event failed as unavailable", || {
        let db = &db;
        async move { db.row(id).await.attempts_unavailable >= 1 }
    })
    .await;

    // The outage lasts until its client sees the broker gone (not only the failed send).
    wait_until("the publisher's check fails", || {
        let p = publisher.clone();
        async move { p.check().await.is_err() }
    })
    .await;
    let _server = NatsServer::start(port, &dir).await;
    let back = Instant::now();
    wait_until_for(
        "the event delivered well before its 30 s backoff ran out",
        Duration::from_secs(12),
        || {
            let db = &db;
            async move { db.row(id).await.processed_at.is_some() }
        },
    )
    .await;
    assert!(back.elapsed() < Duration::from_secs(12));
    relay.shutdown().await.unwrap();
    db.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}
