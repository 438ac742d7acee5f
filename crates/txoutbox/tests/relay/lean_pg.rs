//! A table relay on a table with the WAL source's lean write path (`migrate --source wal`:
//! no wake-up trigger, no partition index) still delivers everything, in order per
//! aggregate: it wakes by its poll interval and claims through the pending index. (The WAL
//! source on a lean table: the differential suite.)
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::postgres::wal::{self, WritePath};
use txoutbox::store::Ordering;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use crate::common::*;

#[tokio::test]
async fn a_table_relay_on_a_lean_table_delivers_everything_in_order() {
    let h = PgHarness::new().await;
    assert!(wal::set_write_path(&h.pool, &h.table, WritePath::Lean)
        .await
        .unwrap());
    let p = RecordingPublisher::new();
    let mut c = RelayConfig::default();
    c.ordering = Ordering::Ordered;
    c.relay_id = "lean-table".into();
    c.batch_size = 50;
    c.poll_interval = Duration::from_millis(200);
    c.backoff = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        jitter: true,
    };
    let handle = Relay::new(h.pool_store(), p.boxed(), c).spawn();
    // Written while the relay waits: with no trigger to wake it, its poll interval does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for chunk in 0..6 {
        let events: Vec<NewEvent> = (0..50)
            .map(|i| {
                let n = chunk * 50 + i;
                NewEvent::new("order", format!("o-{}", n % 7), "order.placed", &n).unwrap()
            })
            .collect();
        let mut tx = h.pool.begin().await.unwrap();
        h.outbox().enqueue_many(&mut *tx, &events).await.unwrap();
        tx.commit().await.unwrap();
    }
    wait_until("300 events published", || async {
        h.processed().await == 300
    })
    .await;
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .unwrap()
        .unwrap();
    let acked = p.acked();
    assert_eq!(acked.len(), 300);
    let ids: HashSet<_> = acked.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 300, "no duplicates");
    let mut last: HashMap<String, u64> = HashMap::new();
    for m in &acked {
        let n: u64 = serde_json::from_slice(&m.body).unwrap();
        if let Some(prev) = last.insert(m.aggregate_id.clone(), n) {
            assert!(prev < n, "{}: {n} after {prev}", m.aggregate_id);
        }
    }
    h.cleanup().await;
}
