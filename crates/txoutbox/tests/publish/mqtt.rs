#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
//! The MQTT publisher against a real broker (`MQTT_URL`, default `mqtt://127.0.0.1:1883`,
//! anonymous).
#![cfg(feature = "mqtt")]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

fn server() -> String {
    std::env::var("MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

/// A consumer subscribed at QoS 1 to `<prefix>/#`, recording what it receives.
struct Consumer {
    client: AsyncClient,
    got: Arc<Mutex<Vec<Publish>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    async fn start(prefix: &str) -> Self {
        let u = url::Url::parse(&server()).unwrap();
        let mut options = MqttOptions::new(
            format!("txotest-consumer-{}", uuid::Uuid::new_v4().simple()),
            u.host_str().unwrap(),
            u.port().unwrap_or(1883),
        );
        options.set_clean_start(true);
        let (client, mut eventloop) = AsyncClient::new(options, 100);
        client
            .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
            .await
            .unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (subscribed_tx, subscribed_rx) = tokio::sync::oneshot::channel();
        let mut subscribed_tx = Some(subscribed_tx);
        let sink = got.clone();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => sink.lock().unwrap().push(p),
                    Ok(_) => {}
                    Err(e) => panic!("consumer: {e}"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), subscribed_rx)
            .await
            .unwrap()
            .unwrap();
        Self { client, got, task }
    }

    async fn wait_for(&self, n: usize) -> Vec<Publish> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let have = self.got.lock().unwrap().clone();
            if have.len() >= n {
                return have;
            }
            assert!(Instant::now() < deadline, "{} of {n} messages", have.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        let _ = self.client.disconnect().await;
        self.task.abort();
    }
}

fn prefix() -> String {
    format!(
        "txotest/{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
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

fn props(p: &Publish) -> HashMap<String, String> {
    p.properties
        .as_ref()
        .map(|p| p.user_properties.iter().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn delivers_in_order_with_user_properties() {
    let prefix = prefix();
    let consumer = Consumer::start(&prefix).await;
    let url = format!(
        "{}?topic={prefix}/{{aggregate_type}}/{{event_type}}&qos=1",
        server()
    );
    let p = publisher(&url).await;
    assert_eq!(p.kind(), "mqtt");
    let sent: Vec<Message> = (0..30).map(message).collect();
    let mut acks = Vec::new();
    for m in &sent {
        acks.push(p.send(m).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let got = consumer.wait_for(sent.len()).await;
    assert_eq!(got.len(), sent.len());
    for (m, g) in sent.iter().zip(&got) {
        assert_eq!(
            g.topic.as_ref(),
            format!("{prefix}/order/created").as_bytes()
        );
        assert_eq!(g.payload.as_ref(), m.body.as_slice());
        let pr = props(g);
        assert_eq!(pr["outbox-event-id"], m.id.to_string());
        assert_eq!(pr["outbox-event-type"], "created");
        assert_eq!(pr["outbox-aggregate-type"], "order");
        assert_eq!(pr["outbox-aggregate-id"], m.aggregate_id);
        assert!(pr.contains_key("outbox-created-at"));
        assert_eq!(pr["traceparent"], m.headers["traceparent"]);
        assert!(!pr.contains_key("specversion"));
        let ct = g.properties.as_ref().and_then(|p| p.content_type.clone());
        assert_eq!(ct.as_deref(), Some("application/json"));
    }
    p.check().await.unwrap();
    p.close().await.unwrap();
    consumer.stop().await;
}

#[tokio::test]
async fn cloudevents_user_properties() {
    let prefix = prefix();
    let consumer = Consumer::start(&prefix).await;
    let url = format!(
        "{}?topic={prefix}/{{event_type}}&cloudevents=true&ce_source=/orders",
        server()
    );
    let p = publisher(&url).await;
    let m = message(3);
    p.send(&m).await.unwrap().await.unwrap();
    let got = consumer.wait_for(1).await;
    let pr = props(&got[0]);
    assert_eq!(pr["specversion"], "1.0");
    assert_eq!(pr["id"], m.id.to_string());
    assert_eq!(pr["source"], "/orders");
    assert_eq!(pr["type"], "created");
    assert_eq!(pr["subject"], "o-3");
    assert!(chrono::DateTime::parse_from_rfc3339(&pr["time"]).is_ok());
    p.close().await.unwrap();
    consumer.stop().await;
}

#[tokio::test]
async fn bad_topics_are_permanent() {
    let prefix = prefix();
    let p = publisher(&format!("{}?topic={prefix}/{{aggregate_id}}", server())).await;
    for id in ["a+b", "a/#"] {
        let mut m = message(1);
        m.aggregate_id = id.into();
        let e = p.send(&m).await.err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    }
    let p = publisher(&format!("{}?topic={{aggregate_id}}", server())).await;
    let mut m = message(1);
    m.aggregate_id = String::new();
    assert_eq!(p.send(&m).await.err().unwrap().kind(), ErrorKind::Permanent);
    let mut m = message(1);
    m.aggregate_id = "x".repeat(70_000);
    assert_eq!(p.send(&m).await.err().unwrap().kind(), ErrorKind::Permanent);
}

#[tokio::test]
async fn qos0_is_refused() {
    match publish::connect(&format!("{}?qos=0", server())).await {
        Err(ConnectError::Config(e)) => {
            assert!(e.to_string().contains("acknowledgement"), "{e}")
        }
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("qos=0 accepted"),
    }
}

#[tokio::test]
async fn unreachable_broker_is_unavailable_quickly_and_hides_the_password() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let url = format!("mqtt://someone:s3cret-pw@127.0.0.1:{port}?connect_timeout=2s");
    let e = match publish::connect(&url).await {
        Err(ConnectError::Publish(e)) => e,
        Err(other) => panic!("expected a publish error, got {other}"),
        Ok(_) => panic!("connected to a closed port?"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!e.chain().contains("s3cret-pw"), "{}", e.chain());
    assert!(!format!("{e:?}").contains("s3cret-pw"), "{e:?}");
}

/// Mosquitto answers a QoS 1 PUBLISH that no subscription matches with the MQTT 5 reason code
/// `NoMatchingSubscribers` (16): nobody took the event, so it is not delivered. By default that
/// is *unavailable* (a consumer outage must not turn events into dead letters); the URL may
/// make it permanent, or count it as delivered.
#[tokio::test]
async fn no_matching_subscribers_is_unavailable_unless_the_url_says_otherwise() {
    let prefix = prefix();
    let topic = format!("{}?topic={prefix}/{{aggregate_id}}", server());
    let p = publisher(&topic).await;
    let e = p.send(&message(1)).await.unwrap().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("NoMatchingSubscribers"), "{e}");

    // Once a consumer subscribes, the same publish is delivered.
    let consumer = Consumer::start(&prefix).await;
    p.send(&message(2)).await.unwrap().await.unwrap();
    consumer.wait_for(1).await;
    consumer.stop().await;
    p.close().await.unwrap();

    let other = prefix_url_without_subscribers();
    let p = publisher(&format!("{other}&no_subscribers=permanent")).await;
    let e = p.send(&message(3)).await.unwrap().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    p.close().await.unwrap();
    let p = publisher(&format!("{other}&no_subscribers=delivered")).await;
    p.send(&message(4)).await.unwrap().await.unwrap();
    p.close().await.unwrap();

    match publish::connect(&format!("{other}&no_subscribers=drop")).await {
        Err(ConnectError::Config(e)) => {
            let e = e.to_string();
            assert!(
                e.contains("no_subscribers")
                    && e.contains("unavailable")
                    && e.contains("permanent"),
                "{e}"
            );
        }
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("no_subscribers=drop accepted"),
    }
}

/// A publisher URL whose topic no one subscribes to.
fn prefix_url_without_subscribers() -> String {
    format!("{}?topic={}/{{aggregate_id}}", server(), prefix())
}
