//! Rows plain SQL wrote that the relay cannot read: dead-lettered with a last error that says
//! what is wrong, while the rest flows.

use super::*;

/// The row as the raw read has it: panics naming `what` if it is not there.
fn raw<'a>(rows: &'a [crate::testing::RawRow], seq: i64, what: &str) -> &'a crate::testing::RawRow {
    rows.iter()
        .find(|r| r.seq == seq)
        .unwrap_or_else(|| panic!("row {seq} ({what}) is gone"))
}

/// Each malformed row is dead, not leased, with a last error that says what is wrong.
fn assert_buried(rows: &[crate::testing::RawRow], bad: &[crate::testing::Malformed]) {
    for b in bad {
        let r = raw(rows, b.seq, b.what);
        let err = r.last_error.as_deref().unwrap_or("");
        assert!(
            r.dead && !r.processed && !r.leased,
            "{}: not dead-lettered: {r:?}",
            b.what
        );
        assert!(
            err.starts_with("undecodable row: ") && err.contains(b.expect),
            "{}: last_error {err:?} does not say {:?}",
            b.what,
            b.expect
        );
    }
}

/// A row that plain SQL could write but the store cannot decode (a non-UUID id, a timestamp
/// out of range, headers that are not an object, ...) does not fail the claim: it is
/// dead-lettered with a last error naming the column, and every other event is claimed. The
/// operator commands show it; retried, it is dead-lettered again, by an ordered claim too.
pub async fn undecodable_rows_are_dead_lettered_and_the_rest_flow<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let mut good = h.enqueue(&[event(0), event(1)]).await;
    let bad = h.insert_malformed("bad").await;
    good.extend(h.enqueue(&[event(2), event(3)]).await);
    // `txoutbox status` works while they are still pending.
    let c = store
        .counts()
        .await
        .unwrap_or_else(|e| panic!("counts failed on a pending undecodable row: {e}"));
    assert_eq!(c.pending, (good.len() + bad.len()) as i64, "{c:?}");
    store
        .wait_for_work(crate::store::WaitParams {
            relay_id: "r",
            ordering: Ordering::Unordered,
            max: Duration::from_millis(20),
        })
        .await
        .unwrap_or_else(|e| panic!("waiting for work failed on a pending undecodable row: {e}"));
    let token = Uuid::new_v4();
    let claimed = store
        .claim(claim("r", token, 100, LEASE))
        .await
        .unwrap_or_else(|e| panic!("an undecodable row failed the claim: {e}"));
    assert_eq!(
        ids_of(&claimed.events),
        good,
        "the good events, in seq order"
    );
    assert_buried(&h.raw_rows().await, &bad);
    let settled = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &good,
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(settled.published, good.len() as u64);

    // `txoutbox dlq list` and `status` show them rather than failing.
    let dead = store
        .list_events(
            &EventFilter {
                state: Some(EventState::Dead),
                ..Default::default()
            },
            Page::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("listing dead letters failed on an undecodable row: {e}"))
        .events;
    assert_eq!(dead.len(), bad.len(), "{dead:?}");
    for (d, b) in dead.iter().zip(&bad) {
        assert_eq!(d.seq, b.seq);
        assert!(
            d.last_error.as_deref().unwrap_or("").contains(b.expect),
            "{}: {d:?}",
            b.what
        );
    }
    let c = store
        .counts()
        .await
        .unwrap_or_else(|e| panic!("counts failed on an undecodable row: {e}"));
    assert_eq!(
        (c.pending, c.leased, c.dead),
        (0, 0, bad.len() as i64),
        "{c:?}"
    );
    assert!(!store.has_unfinished(Ordering::Ordered).await.unwrap());

    // Retried as they are, an ordered claim buries them again (but those the retry repaired)
    // and hands out the rest.
    assert_eq!(
        store.retry_dead(&EventFilter::default()).await.unwrap(),
        bad.len() as u64
    );
    join(&store, "r", Ordering::Ordered).await;
    let later = h.enqueue(&[event(4)]).await;
    let ordered_token = Uuid::new_v4();
    let claimed = store
        .claim(ordered("r", ordered_token, Ordering::Ordered))
        .await
        .unwrap_or_else(|e| panic!("an undecodable row failed the ordered claim: {e}"));
    let (repaired, still_bad): (Vec<_>, Vec<_>) = bad.into_iter().partition(|b| b.retry_resets);
    let mut want: Vec<i64> = repaired.iter().map(|b| b.seq).collect();
    want.extend(
        claimed
            .events
            .iter()
            .filter(|e| later.contains(&e.id))
            .map(|e| e.seq),
    );
    assert_eq!(
        claimed.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        want
    );
    assert!(claimed.events.iter().any(|e| later.contains(&e.id)));
    assert_buried(&h.raw_rows().await, &still_bad);

    // A row that is never due does not break the wait for work (nor `status`).
    store
        .settle(SettleParams {
            claim: &claimed,
            published: &ids_of(&claimed.events),
            failed: &[],
        })
        .await
        .unwrap();
    let never = h.insert_never_due().await;
    store
        .wait_for_work(crate::store::WaitParams {
            relay_id: "r",
            ordering: Ordering::Ordered,
            max: Duration::from_millis(20),
        })
        .await
        .unwrap_or_else(|e| panic!("waiting for work failed on a never-due row: {e}"));
    store
        .counts()
        .await
        .unwrap_or_else(|e| panic!("counts failed on a never-due row: {e}"));
    assert!(!raw(&h.raw_rows().await, never, "never due").dead);
}

/// With `OrderedHold`, an undecodable row is a dead letter like any other: it holds its
/// aggregate's later events (also those of the same claim), and other aggregates go on.
pub async fn hold_mode_keeps_an_aggregate_behind_an_undecodable_row<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    join(&store, "r", Ordering::OrderedHold).await;
    let mk = |agg: &str, i: usize| {
        NewEvent::new("bad", agg, "order.changed", &serde_json::json!({ "i": i })).unwrap()
    };
    let bad = h.insert_malformed("a").await;
    let ids = h.enqueue(&[mk("a", 2), mk("b", 1)]).await;
    let token = Uuid::new_v4();
    let first = store
        .claim(ordered("r", token, Ordering::OrderedHold))
        .await
        .unwrap_or_else(|e| panic!("an undecodable row failed the claim: {e}"));
    assert_eq!(
        ids_of(&first.events),
        vec![ids[1]],
        "a2 went past its undecodable a1"
    );
    let rows = h.raw_rows().await;
    assert_buried(&rows, &bad);
    let a2 = rows
        .iter()
        .find(|r| r.id == ids[0].hyphenated().to_string())
        .unwrap();
    assert!(
        !a2.leased && !a2.dead,
        "a2 was held, not given back: {a2:?}"
    );
    store
        .settle(SettleParams {
            claim: &first,
            published: &ids[1..],
            failed: &[],
        })
        .await
        .unwrap();
    let held = store
        .claim(ordered("r", Uuid::new_v4(), Ordering::OrderedHold))
        .await
        .unwrap()
        .events;
    assert!(held.is_empty(), "a2 went past its undecodable a1: {held:?}");
    assert!(!store.has_unfinished(Ordering::OrderedHold).await.unwrap());
    let skip = store
        .claim(ordered("r", Uuid::new_v4(), Ordering::Ordered))
        .await
        .unwrap()
        .events;
    assert_eq!(
        ids_of(&skip),
        vec![ids[0]],
        "skip mode goes past the dead letter"
    );
}

/// Records what it is sent; acknowledges everything.
#[derive(Default)]
struct Recorder(Mutex<Vec<Uuid>>);

#[async_trait::async_trait]
impl crate::publish::Publisher for Recorder {
    fn kind(&self) -> &'static str {
        "recorder"
    }
    async fn send(
        &self,
        message: &crate::publish::Message,
    ) -> Result<crate::publish::Ack, crate::publish::PublishError> {
        self.0.lock().unwrap().push(message.id);
        Ok(crate::publish::ready_ack(Ok(())))
    }
}

/// A relay meets undecodable rows and a row that is never due among good events: it
/// dead-letters the undecodable ones, delivers every good event, and keeps running (it
/// still delivers an event written afterwards).
pub async fn relay_keeps_running_past_undecodable_rows<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let mut good = h.enqueue(&[event(0), event(1)]).await;
    let bad = h.insert_malformed("bad").await;
    let never = h.insert_never_due().await;
    good.extend(h.enqueue(&[event(2)]).await);
    let sent = std::sync::Arc::new(Recorder::default());
    let cfg = crate::relay::RelayConfig {
        relay_id: "relay".into(),
        poll_interval: Duration::from_millis(50),
        partition_lease: Duration::from_secs(3),
        ..Default::default()
    };
    let handle = crate::relay::Relay::new(store, Box::new(sent.clone()), cfg).spawn();
    let delivered = |want: Vec<Uuid>| {
        let sent = sent.clone();
        async move {
            let got = sent.0.lock().unwrap().clone();
            want.iter().all(|id| got.contains(id)).then_some(got)
        }
    };
    wait_for(
        "the good events delivered past the undecodable rows",
        || delivered(good.clone()),
    )
    .await;
    wait_for("the undecodable rows dead-lettered", || async {
        let rows = h.raw_rows().await;
        bad.iter()
            .all(|b| raw(&rows, b.seq, b.what).dead)
            .then_some(())
    })
    .await;
    assert_buried(&h.raw_rows().await, &bad);
    // Still running: an event written now is delivered too (after the relay went idle with
    // the never-due row pending).
    let next = h.enqueue(&[event(3)]).await;
    let got = wait_for("an event written afterwards delivered", || {
        delivered(next.clone())
    })
    .await;
    assert_eq!(got.len(), good.len() + 1, "sent: {got:?}");
    let rows = h.raw_rows().await;
    let n = raw(&rows, never, "never due");
    assert!(
        !n.dead && !n.processed,
        "the never-due row was touched: {n:?}"
    );
    handle
        .shutdown()
        .await
        .unwrap_or_else(|e| panic!("the relay stopped with an error: {e}"));
}
