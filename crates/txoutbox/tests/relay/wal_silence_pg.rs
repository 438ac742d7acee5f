//! A silent network: a proxy that stops moving bytes on the connections it has (new ones
//! still work), in front of the WAL relay's replication connection. The stream's read deadline
//! notices, the relay ends its own stale stream on the server and reads on over a new one.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use txoutbox::relay::Source;
use txoutbox::store::postgres::wal::stream::ReplicationConfig;
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use super::wal_ownership_pg::config;
use crate::common::*;

/// A TCP proxy to `upstream` whose [`Freezer::freeze`] stops every connection open at that
/// moment from moving bytes, in both directions, for ever (the sockets stay open: a
/// half-open path, as behind a NAT or load balancer that lost its state), while connections
/// made afterwards work.
struct Freezer {
    port: u16,
    generation: Arc<AtomicU64>,
}

impl Freezer {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let generation = Arc::new(AtomicU64::new(0));
        let gen = generation.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let born = gen.load(Ordering::SeqCst);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, gen.clone(), born));
                tokio::spawn(pipe(sr, cw, gen.clone(), born));
            }
        });
        Self { port, generation }
    }

    fn freeze(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    generation: Arc<AtomicU64>,
    born: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if generation.load(Ordering::SeqCst) != born {
            // Frozen: hold both sockets open, move nothing.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_replication_connection_is_noticed_and_delivery_resumes() {
    let h = PgHarness::new().await;
    let url = url::Url::parse(&database_url()).unwrap();
    let upstream = format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5432)
    );
    let proxy = Freezer::start(upstream).await;
    let mut through = url.clone();
    through.set_host(Some("127.0.0.1")).unwrap();
    through.set_port(Some(proxy.port)).unwrap();
    let replication = ReplicationConfig::from_url(through.as_str())
        .unwrap()
        .with_read_timeout(Duration::from_secs(2));
    let store = h
        .pool_store_sql(txoutbox::store::Retention::Mark)
        .with_replication(replication);
    let p = RecordingPublisher::new();
    let relay =
        txoutbox::testing::postgres::relay(store, p.boxed(), config("wal-silence", Source::Wal))
            .spawn();
    let slot = h.slot().await;
    let outbox = h.outbox();
    let event = |i: usize| {
        NewEvent::new("order", "a", "order.placed", &serde_json::json!({ "i": i })).unwrap()
    };
    let first = outbox.enqueue(&h.pool, &event(1)).await.unwrap();
    wait_until("delivered before the freeze", || async {
        p.was_acked(first)
    })
    .await;

    // Frozen while it streams (a walsender serves the slot).
    wait_until("the relay streams its slot", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s \
             JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)",
        )
        .bind(&slot)
        .fetch_one(&h.pool)
        .await
        .unwrap()
    })
    .await;
    proxy.freeze();
    let mut after = Vec::new();
    for i in 0..5 {
        after.push(outbox.enqueue(&h.pool, &event(10 + i)).await.unwrap());
    }
    // The deadline (2 s), a new stream, the stale one ended: well within 20 s, where the
    // server alone would hold the slot until its wal_sender_timeout (60 s) and a stream
    // without a deadline would wait for ever.
    wait_until_for(
        "all 5 delivered after the freeze",
        Duration::from_secs(20),
        || async { after.iter().all(|id| p.was_acked(*id)) },
    )
    .await;
    tokio::time::timeout(DEADLINE, relay.shutdown())
        .await
        .unwrap()
        .unwrap();
    h.cleanup().await;
}
