//! Regression test: in ordered mode, an aggregate's chain that waits for a slot of the
//! `max_in_flight` window must not send once its batch's deadline has passed (the deadline was
//! checked before the wait only, and a send is polled before its timeout, so the wait could
//! end past the lease and the event went out anyway, while another relay could hold it).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use crate::common::*;
use tokio_util::sync::CancellationToken;
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::store::{Ordering, RebalanceParams, Store};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_waiting_for_the_window_does_not_send_past_the_deadline() {
    let db = PgHarness::new().await;
    let events: Vec<NewEvent> = (0..10)
        .map(|i| {
            NewEvent::new(
                "order",
                format!("o-{i}"),
                "order.created",
                &serde_json::json!({ "i": i }),
            )
            .unwrap()
        })
        .collect();
    db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    let mut cfg = RelayConfig::default();
    cfg.relay_id = "deadline".into();
    cfg.ordering = Ordering::Ordered;
    cfg.lease = Duration::from_secs(2);
    cfg.partition_lease = Duration::from_secs(10);
    cfg.max_in_flight = 1; // ten chains, one slot
    let store = db.pool_store();
    store
        .rebalance(RebalanceParams {
            relay_id: "deadline",
            instance: uuid::Uuid::nil(),
            ordering: Ordering::Ordered,
            lease: Duration::from_secs(10),
            may_release: true,
        })
        .await
        .unwrap();
    // The first chain's acknowledgement never comes in time: it holds the only slot until the
    // deadline; the nine others wait for it.
    let hanging = RecordingPublisher::new();
    hanging.set_ack_delay(Duration::from_secs(30));
    let relay = Relay::new(store, hanging.boxed(), cfg);
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        relay.run_once(&CancellationToken::new()),
    )
    .await
    .expect("the batch gives up at its deadline")
    .unwrap();
    assert_eq!(report.claimed, 10);
    assert_eq!(
        hanging.sent_count(),
        1,
        "only the chain that had the slot before the deadline sent anything"
    );
    assert_eq!(report.released, 10, "{report:?}");
    db.cleanup().await;
}
