//! A broker outage ends: what failed because the publisher was *unavailable* goes at once, not
//! after its backoff. A NATS server of the test's own (JetStream, a free port, its own store
//! directory), stopped and started again; real PostgreSQL (`DATABASE_URL`).
// The helpers serve the broker tests only: unused when their features are off.
#![cfg_attr(not(feature = "nats"), allow(dead_code, unused_imports))]
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
    let relay = Relay::new(db.pool_store(), Box::new(publisher.clone()), cfg).spawn();

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
    // 20 s: well before the 30 s backoff, with room for the NATS client's reconnect delay
    // on a loaded 2-core machine (12 s was missed once in a full CI run).
    wait_until_for(
        "the event delivered well before its 30 s backoff ran out",
        Duration::from_secs(20),
        || {
            let db = &db;
            async move { db.row(id).await.processed_at.is_some() }
        },
    )
    .await;
    assert!(back.elapsed() < Duration::from_secs(20));
    relay.shutdown().await.unwrap();
    db.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A [`RecordingPublisher`] whose broker can be taken down and brought back: while down, its
/// sends fail as unavailable and its check says so.
#[derive(Clone, Default)]
struct Switch {
    inner: RecordingPublisher,
    down: Arc<std::sync::atomic::AtomicBool>,
    /// Checks that found it down.
    seen_down: Arc<std::sync::atomic::AtomicUsize>,
}

impl Switch {
    fn set_down(&self, down: bool) {
        self.inner.set_down(down);
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Publisher for Switch {
    fn kind(&self) -> &'static str {
        "switch"
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.inner.send(message).await
    }
    async fn check(&self) -> Result<(), PublishError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            self.seen_down
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(PublishError::unavailable("test: broker is down"))
        } else {
            Ok(())
        }
    }
}

/// Two routes, both brokers down; only route `x`'s comes back: its event goes at once, route
/// `y`'s waits (its broker still does not answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_broker_answers_again_goes_at_once_and_only_it() {
    use txoutbox::publish::{Matcher, Route, Router};

    let db = PgHarness::new().await;
    let (x, y) = (Switch::default(), Switch::default());
    x.set_down(true);
    y.set_down(true);
    let route = |name: &str, glob: &str, p: &Switch| {
        let p: Arc<dyn Publisher> = Arc::new(p.clone());
        Route::new(name, Matcher::any().event_type(glob).unwrap(), p).unwrap()
    };
    let router = Router::new(vec![route("x", "x.*", &x), route("y", "y.*", &y)]).unwrap();
    let mut cfg = RelayConfig::default();
    cfg.relay_id = "outage-routes".into();
    cfg.poll_interval = Duration::from_millis(100);
    cfg.partition_lease = Duration::from_secs(2);
    cfg.backoff = Backoff {
        base: Duration::from_secs(30),
        max: Duration::from_secs(30),
        jitter: false,
    };
    let relay = Relay::new(db.pool_store(), Box::new(router), cfg).spawn();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db
        .outbox()
        .enqueue_many(
            &mut *tx,
            &[
                NewEvent::new("a", "1", "x.created", &serde_json::json!({})).unwrap(),
                NewEvent::new("b", "1", "y.created", &serde_json::json!({})).unwrap(),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait_until("both events failed as unavailable", || {
        let db = &db;
        let ids = ids.clone();
        async move {
            db.row(ids[0]).await.attempts_unavailable >= 1
                && db.row(ids[1]).await.attempts_unavailable >= 1
        }
    })
    .await;

    // The outage lasts until the relay has seen route x's broker down (a broker back before
    // the relay's first look leaves the event to its backoff: docs/relay.md).
    wait_until("the relay saw route x's broker down", || {
        let n = x.seen_down.load(std::sync::atomic::Ordering::SeqCst);
        async move { n > 0 }
    })
    .await;
    x.set_down(false);
    wait_until_for(
        "route x's event delivered well before its 30 s backoff ran out",
        Duration::from_secs(10),
        || {
            let db = &db;
            let id = ids[0];
            async move { db.row(id).await.processed_at.is_some() }
        },
    )
    .await;
    let y_row = db.row(ids[1]).await;
    assert!(
        y_row.processed_at.is_none(),
        "route y's broker is still down"
    );
    assert_eq!(y_row.attempts, 1, "route y's event was not sent again");
    relay.shutdown().await.unwrap();
    db.cleanup().await;
}
