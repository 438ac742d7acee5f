//! Regression test for a bug txoutbox-chaos found: a message handed to the NATS client while it
//! was reconnecting was buffered and sent after the reconnect, seconds after the relay had
//! given it up (and after its lease could have passed to another relay). Now the publisher
//! refuses it as *unavailable* and nothing reaches the broker behind the relay's back.
#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use txoutbox::publish::{self, ErrorKind, Message};

fn server() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A TCP proxy to NATS that the test can cut (live connections dropped, new ones refused).
struct Proxy {
    port: u16,
    cut: Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(tokio::sync::watch::Sender::new(false));
        let state = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *state.borrow() {
                    continue; // refused while cut
                }
                let mut rx = state.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { port, cut, task }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut.send_replace(true);
    }
}

fn message(n: i64) -> Message {
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n,
        aggregate_type: "order".into(),
        aggregate_id: n.to_string(),
        event_type: "created".into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

#[tokio::test]
async fn nothing_is_sent_behind_the_relays_back_after_a_reconnect() {
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let stream_name = format!("TXO_RECONNECT_{}", suffix.to_uppercase());
    let target = server().trim_start_matches("nats://").to_string();
    let proxy = Proxy::start(target).await;
    let url = format!(
        "nats://127.0.0.1:{}?stream={stream_name}&subject=txoreconnect{suffix}.{{event_type}}&ack_timeout=1s",
        proxy.port
    );
    let p = publish::connect(&url).await.unwrap();
    let first = message(1);
    p.send(&first).await.unwrap().await.unwrap();

    // Cut the network: the client notices and starts reconnecting.
    proxy.cut.send_replace(true);
    let mut n = 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (during, refused) = loop {
        n += 1;
        let m = message(n);
        // Until the client has noticed, a send may still be accepted and then fail.
        match p.send(&m).await {
            Err(e) => break (m, e),
            Ok(ack) => assert!(ack.await.is_err(), "no ack through a cut network"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the publisher never refused a message while reconnecting"
        );
    };
    assert_eq!(refused.kind(), ErrorKind::Unavailable, "{refused}");

    // Back: the publisher recovers by itself.
    proxy.cut.send_replace(false);
    let after = message(1000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ack) = p.send(&after).await {
            if ack.await.is_ok() {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no recovery after the reconnect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = p.close().await;

    // The refused message did not reach the stream after the reconnect.
    let client = async_nats::connect(server()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(&stream_name).await.unwrap();
    let last = stream.cached_info().state.last_sequence;
    let mut ids = Vec::new();
    for seq in 1..=last {
        if let Ok(m) = stream.get_raw_message(seq).await {
            ids.push(m.headers.get("Nats-Msg-Id").unwrap().to_string());
        }
    }
    let _ = js.delete_stream(&stream_name).await;
    assert_eq!(ids.first(), Some(&first.id.to_string()));
    assert_eq!(ids.last(), Some(&after.id.to_string()));
    assert!(
        !ids.contains(&during.id.to_string()),
        "a message the publisher refused while reconnecting reached the broker: {ids:?}"
    );
}
