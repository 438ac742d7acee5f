//! Ordered mode with a publisher that keeps key order (Kafka): the relay pipelines an
//! aggregate's events, and a failure of one of them — from `send` itself or later, through its
//! acknowledgement — must neither let a later event of the aggregate count as delivered ahead
//! of it nor let one be sent before it is settled. Real PostgreSQL (`DATABASE_URL`), a
//! scriptable publisher.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::Ordering;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

/// A [`RecordingPublisher`] that says it keeps key order (so the relay pipelines in ordered
/// mode, as for Kafka), logs every `send` call and can fail given events in `send` itself.
#[derive(Clone, Default)]
struct KeyOrdered {
    inner: RecordingPublisher,
    /// Every `send` call, in call order: event id and whether `send` failed.
    log: Arc<Mutex<Vec<(Uuid, bool)>>>,
    /// Fail `send` of these events this many more times.
    sync_failures: Arc<Mutex<HashMap<Uuid, u32>>>,
}

impl KeyOrdered {
    fn fail_send_once(&self, id: Uuid) {
        self.sync_failures.lock().unwrap().insert(id, 1);
    }
    /// Event ids of the `send` calls that did not fail, in call order.
    fn sent_ok(&self) -> Vec<Uuid> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|(_, f)| !f).map(|(id, _)| *id).collect()
    }
    fn all_sends(&self) -> Vec<(Uuid, bool)> {
        self.log.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Publisher for KeyOrdered {
    fn kind(&self) -> &'static str {
        "key-ordered"
    }
    fn keeps_key_order(&self) -> bool {
        true
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let fail = {
            let mut f = self.sync_failures.lock().unwrap();
            match f.get_mut(&message.id) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        self.log.lock().unwrap().push((message.id, fail));
        if fail {
            return Err(PublishError::transient(format!(
                "test: send of {} failed",
                message.id
            )));
        }
        self.inner.send(message).await
    }
}

fn config(relay_id: &str, ordering: Ordering) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.relay_id = relay_id.to_string();
    c.ordering = ordering;
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(100);
    c.lease = Duration::from_secs(5);
    c.partition_lease = Duration::from_secs(2);
    c.max_attempts = 100;
    c.backoff = Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(50),
        jitter: false,
    };
    c.shutdown_timeout = Duration::from_secs(5);
    c.exit_when_drained = true;
    c
}

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "account",
        aggregate,
        format!("account.e{n}"),
        &serde_json::json!({ "n": n }),
    )
    .unwrap()
}

/// X1, X2 (one aggregate) and Y1, committed together, so they are claimed in one batch.
async fn write(db: &PgHarness) -> (Uuid, Uuid, Uuid) {
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db
        .outbox()
        .enqueue_many(&mut *tx, &[event("x", 1), event("x", 2), event("y", 1)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (ids[0], ids[1], ids[2])
}

async fn drain(db: &PgHarness, p: &KeyOrdered, cfg: RelayConfig) {
    let stats = tokio::time::timeout(
        DEADLINE,
        Relay::new(db.pool_store(), Box::new(p.clone()), cfg)
            .spawn()
            .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert!(
        stats.failed >= 1,
        "the scripted failure happened: {stats:?}"
    );
}

fn position(sends: &[Uuid], id: Uuid) -> Vec<usize> {
    sends
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == id)
        .map(|(i, _)| i)
        .collect()
}

/// X1's delivery report fails after X2 was produced (and X2's succeeds): X2 must not be
/// settled as published ahead of X1, and must be sent again after X1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ack_holds_back_the_aggregates_later_acks() {
    let db = PgHarness::new().await;
    let (x1, x2, y1) = write(&db).await;
    let p = KeyOrdered::default();
    // Acks arrive later than the next sends, as Kafka's delivery reports do.
    p.inner.set_ack_delay(Duration::from_millis(100));
    p.inner.fail_id_times(x1, Fail::Transient, Some(1));
    drain(&db, &p, config("ack-fails", Ordering::Ordered)).await;

    let (r1, r2, ry) = (db.row(x1).await, db.row(x2).await, db.row(y1).await);
    let (t1, t2) = (r1.processed_at.unwrap(), r2.processed_at.unwrap());
    assert!(
        t2 >= t1,
        "X2 was settled as published at {t2} ahead of X1 (published at {t1}) after X1's ack failed"
    );
    assert!(ry.processed_at.is_some());
    assert_eq!(ry.attempts, 0, "another aggregate is not held back");
    // On the broker, X2's last copy comes after X1's successful one.
    let sent = p.sent_ok();
    let (s1, s2) = (position(&sent, x1), position(&sent, x2));
    assert_eq!(s1.len(), 2, "X1 failed once, then went through: {sent:?}");
    assert!(
        s2.last() > s1.last(),
        "X2 was not sent again after X1 went through: {sent:?}"
    );
    db.cleanup().await;
}

/// X1's `send` fails at once: X2 (same batch) must not be sent before X1 is settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_send_stops_the_aggregates_later_sends() {
    let db = PgHarness::new().await;
    let (x1, x2, y1) = write(&db).await;
    let p = KeyOrdered::default();
    p.fail_send_once(x1);
    drain(&db, &p, config("send-fails", Ordering::Ordered)).await;

    let sends = p.all_sends();
    let first_x2 = sends.iter().position(|(id, _)| *id == x2).unwrap();
    let x1_ok = sends
        .iter()
        .position(|(id, failed)| *id == x1 && !failed)
        .unwrap();
    assert!(
        first_x2 > x1_ok,
        "X2 was sent (call {first_x2}) before X1 went through (call {x1_ok}): {sends:?}"
    );
    assert_eq!(
        sends.iter().filter(|(id, _)| *id == x2).count(),
        1,
        "X2 sent once, after X1: {sends:?}"
    );
    let (t1, t2) = (
        db.row(x1).await.processed_at.unwrap(),
        db.row(x2).await.processed_at.unwrap(),
    );
    assert!(t2 >= t1);
    assert!(db.row(y1).await.processed_at.is_some());
    db.cleanup().await;
}

/// In `Ordered` (skip) mode a permanent failure dead-letters the event and the aggregate goes
/// on, in the same batch, as with per-aggregate chains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_mode_goes_on_past_a_permanent_failure() {
    let db = PgHarness::new().await;
    let (x1, x2, _) = write(&db).await;
    let p = KeyOrdered::default();
    p.inner.set_ack_delay(Duration::from_millis(50));
    p.inner.fail_id(x1, Fail::Permanent);
    drain(&db, &p, config("skip", Ordering::Ordered)).await;

    assert!(db.row(x1).await.dead_at.is_some());
    assert!(db.row(x2).await.processed_at.is_some());
    let sent = p.sent_ok();
    assert_eq!(position(&sent, x2).len(), 1, "X2 sent once: {sent:?}");
    db.cleanup().await;
}

/// In `OrderedHold` mode a permanent failure that comes back through the acknowledgement
/// (the broker refused X1 after X2 was already handed over, as SQS FIFO and Kafka do) must
/// not let X2 reach the broker: it stays pending behind the dead letter, and only X's
/// events are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_mode_sends_nothing_of_an_aggregate_past_a_refusal() {
    let db = PgHarness::new().await;
    let (x1, x2, y1) = write(&db).await;
    let p = KeyOrdered::default();
    p.inner.set_ack_delay(Duration::from_millis(100));
    p.inner.fail_id(x1, Fail::Permanent);
    drain(&db, &p, config("hold", Ordering::OrderedHold)).await;

    let sends = p.all_sends();
    assert!(
        !sends.iter().any(|(id, _)| *id == x2),
        "X2 reached the broker behind X1, which was dead-lettered: {sends:?}"
    );
    assert!(db.row(x1).await.dead_at.is_some());
    let r2 = db.row(x2).await;
    assert!(r2.processed_at.is_none() && r2.dead_at.is_none(), "X2 held");
    assert!(db.row(y1).await.processed_at.is_some(), "Y is not held");
    db.cleanup().await;
}

/// The relay with the real Kafka publisher, on librdkafka's mock cluster, whose first
/// ProduceRequest fails: with the gapless guarantee that is a fatal producer error, so every
/// later message of the batch fails too; the publisher builds a new producer and the relay
/// delivers everything, X1's first copy in the topic ahead of every copy of X2.
///
/// Ignored in the main run, run on its own by `scripts/test.sh` (up to three tries), for the
/// reason given at the publisher's gap test (`publish::kafka`): the mock broker writes a
/// successor already in flight, where a real broker refuses it as out of sequence. In a full
/// suite run on the 2-core CI machine X2 once got through on the mock ahead of X1's retry
/// (topic order X2, Y1, X1, X2).
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing-dependent on librdkafka's mock broker; scripts/test.sh runs it on its own"]
async fn kafka_relay_recovers_from_a_fatal_producer_error_in_order() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message as _};
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let db = PgHarness::new().await;
    let (x1, x2, y1) = write(&db).await;
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("outbox.account", 1, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let first = bootstrap.split(',').next().unwrap();
    let url = format!("kafka://{first}?batch_num_messages=1&max_in_flight=1");
    let publisher = txoutbox::publish::connect(&url).await.unwrap();
    assert!(publisher.keeps_key_order());
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let stats = tokio::time::timeout(
        DEADLINE,
        Relay::new(
            db.pool_store(),
            publisher,
            config("kafka", Ordering::Ordered),
        )
        .spawn()
        .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert!(
        stats.failed >= 1,
        "the injected failure happened: {stats:?}"
    );
    assert_eq!(db.processed().await, 3);
    let (t1, t2) = (
        db.row(x1).await.processed_at.unwrap(),
        db.row(x2).await.processed_at.unwrap(),
    );
    assert!(t2 >= t1, "X2 settled at {t2}, before X1 at {t1}");

    // Read the whole topic (up to its high watermark).
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "txotest-relay-fatal")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (_, high) = c
        .fetch_watermarks("outbox.account", 0, Duration::from_secs(5))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("outbox.account", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut ids = Vec::new();
    while (ids.len() as i64) < high {
        let m = tokio::time::timeout(DEADLINE, c.recv())
            .await
            .expect("the topic's records")
            .unwrap();
        let id = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "outbox-event-id"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).parse::<Uuid>().unwrap())
            .unwrap();
        ids.push(id);
    }
    let first_x1 = ids.iter().position(|id| *id == x1).expect("X1 delivered");
    let first_x2 = ids.iter().position(|id| *id == x2).expect("X2 delivered");
    assert!(first_x1 < first_x2, "X2 ahead of X1 in the topic: {ids:?}");
    assert!(ids.contains(&y1));
    db.cleanup().await;
}

/// Two routes, one aggregate: X1 and X3 go through route `odd`, X2 through route `even`, each
/// to its own publisher, both of which keep key order on their own. No broker orders across
/// another, so the router must not let the relay pipeline: X2 is sent only once X1 went
/// through (its first attempt fails through the ack), X3 only once X2 did. An event that
/// matches no route is dead-lettered, naming that, without holding anything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_keep_an_aggregates_order_across_publishers() {
    use std::collections::BTreeSet;
    use txoutbox::publish::{Matcher, Route, Router};

    let db = PgHarness::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    let ids = db
        .outbox()
        .enqueue_many(
            &mut *tx,
            &[
                event("x", 1),
                event("x", 2),
                event("x", 3),
                event("y", 1),
                NewEvent::new("audit", "z", "audit.login", &serde_json::json!({})).unwrap(),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (x1, x2, x3, y1, z1) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    let (odd, even) = (KeyOrdered::default(), KeyOrdered::default());
    odd.inner.set_ack_delay(Duration::from_millis(100));
    odd.inner.fail_id_times(x1, Fail::Transient, Some(1));
    let route = |name: &str, glob: &str, p: &KeyOrdered| {
        let p: Arc<dyn Publisher> = Arc::new(p.clone());
        Route::new(name, Matcher::any().event_type(glob).unwrap(), p).unwrap()
    };
    let router = Router::new(vec![
        route("odd", "account.e{1,3}", &odd),
        route("even", "account.e2", &even),
    ])
    .unwrap();
    assert!(!router.keeps_key_order());
    let stats = tokio::time::timeout(
        DEADLINE,
        Relay::new(
            db.pool_store(),
            Box::new(router),
            config("routes", Ordering::Ordered),
        )
        .spawn()
        .join(),
    )
    .await
    .expect("drained in time")
    .unwrap();
    assert!(
        stats.failed >= 1,
        "the scripted failure happened: {stats:?}"
    );

    // Each route got its own events, and only those.
    let distinct = |p: &KeyOrdered| p.sent_ok().into_iter().collect::<BTreeSet<_>>();
    assert_eq!(distinct(&odd), BTreeSet::from([x1, x3, y1]), "route odd");
    assert_eq!(even.sent_ok(), vec![x2], "route even");
    // Across the two publishers, each of X's events left only after the one before it was
    // through.
    let last = |p: &KeyOrdered, id| *p.inner.send_times(id).last().unwrap();
    let first = |p: &KeyOrdered, id| p.inner.send_times(id)[0];
    assert_eq!(
        odd.inner.send_times(x1).len(),
        2,
        "X1 failed once, then went through"
    );
    assert!(
        first(&even, x2) > last(&odd, x1) + Duration::from_millis(90),
        "X2 was sent through route even before X1 was acknowledged through route odd"
    );
    assert!(
        first(&odd, x3) > last(&even, x2),
        "X3 was sent before X2 was through"
    );
    for id in [x1, x2, x3, y1] {
        assert!(db.row(id).await.processed_at.is_some());
    }
    let z = db.row(z1).await;
    assert!(z.dead_at.is_some(), "the unmatched event is a dead letter");
    let why = z.last_error.unwrap_or_default();
    assert!(
        why.starts_with("no route matched event") && why.contains("`audit.login`"),
        "{why}"
    );
    db.cleanup().await;
}
