//! The operator checks every store passes ([`Operator`]): paging, every filter and state,
//! one event by id, dead letters by filter, and the purge. Registered in
//! [`store_conformance!`](crate::store_conformance) beside the relay's checks.

use std::time::Duration;

use uuid::Uuid;

use super::store::bury;
use super::{wait_for, Harness};
use crate::store::{
    ClaimParams, EventFilter, Operator, Ordering, Page, Retention, SettleParams, Store,
};
use crate::{EventState, NewEvent, OutboxEvent};

const LEASE: Duration = Duration::from_secs(30);

fn ev(event_type: &str, aggregate_id: &str, i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate_id,
        event_type,
        &serde_json::json!({ "i": i }),
    )
    .unwrap()
}

fn ids(events: &[OutboxEvent]) -> Vec<Uuid> {
    events.iter().map(|e| e.id).collect()
}

fn page(after_seq: Option<i64>, limit: i64) -> Page {
    Page { after_seq, limit }
}

/// Every event matching `f`, on one page.
async fn all<S: Operator>(store: &S, f: &EventFilter) -> Vec<Uuid> {
    let got = store.list_events(f, page(None, 1000)).await.unwrap();
    assert_eq!(got.next_after_seq, None);
    ids(&got.events)
}

/// Publish `ids` (claimed unordered, settled as published); the other claimed rows go back.
async fn publish<S: Store>(store: &S, ids: &[Uuid]) {
    let token = Uuid::new_v4();
    let claimed = store
        .claim(ClaimParams {
            relay_id: "r-publish",
            token,
            limit: 1000,
            bytes: crate::store::ClaimBytes::UNLIMITED,
            lease: LEASE,
            ordering: Ordering::Unordered,
            in_flight: &[],
            metric_labels: crate::metrics::MetricLabels::none(),
        })
        .await
        .unwrap();
    store
        .settle(SettleParams {
            claim: &claimed,
            published: ids,
            failed: &[],
        })
        .await
        .unwrap();
    let rest: Vec<Uuid> = claimed
        .events
        .iter()
        .map(|e| e.id)
        .filter(|id| !ids.contains(id))
        .collect();
    store
        .release(crate::store::ReleaseParams {
            claim: &claimed,
            ids: &rest,
        })
        .await
        .unwrap();
}

/// Lease `n` pending events to another relay; returns them.
async fn lease<S: Store>(store: &S, n: usize) -> Vec<Uuid> {
    let claimed = store
        .claim(ClaimParams {
            relay_id: "r-lease",
            token: Uuid::new_v4(),
            limit: n,
            bytes: crate::store::ClaimBytes::UNLIMITED,
            lease: LEASE,
            ordering: Ordering::Unordered,
            in_flight: &[],
            metric_labels: crate::metrics::MetricLabels::none(),
        })
        .await
        .unwrap();
    ids(&claimed.events)
}

/// Pages of any size walk every event once, in `seq` order, and the last page says so (also
/// when it is exactly full); with a state, pages stay within it.
pub async fn operator_pages_through_events_with_a_cursor<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let written = h
        .enqueue(&(0..23).map(|i| ev("t", "a", i)).collect::<Vec<_>>())
        .await;
    bury(h, &store, &written[3..9]).await; // dead letters amid pending rows
    publish(&store, &written[15..20]).await;
    for limit in [1, 5, 10, 23, 1000] {
        let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let p = store
                .list_events(&EventFilter::default(), page(after, limit))
                .await
                .unwrap();
            assert!(p.events.len() as i64 <= limit);
            pages += 1;
            seen.extend(ids(&p.events));
            match p.next_after_seq {
                Some(n) => {
                    assert_eq!(Some(n), p.events.last().map(|e| e.seq), "the cursor");
                    after = Some(n);
                }
                None => break,
            }
            assert!(pages <= 23, "limit {limit}: the pages never end");
        }
        assert_eq!(seen, written, "limit {limit}");
        assert_eq!(pages, 23usize.div_ceil(limit as usize), "limit {limit}");
    }
    let dead = EventFilter {
        state: Some(EventState::Dead),
        ..Default::default()
    };
    let first = store.list_events(&dead, page(None, 4)).await.unwrap();
    assert_eq!(ids(&first.events), written[3..7]);
    let second = store
        .list_events(&dead, page(first.next_after_seq, 4))
        .await
        .unwrap();
    assert_eq!(ids(&second.events), written[7..9]);
    assert_eq!(second.next_after_seq, None);
    // A cursor past the end: an empty last page.
    let past = store
        .list_events(&EventFilter::default(), page(Some(i64::MAX), 10))
        .await
        .unwrap();
    assert!(past.events.is_empty() && past.next_after_seq.is_none());
}

/// Each filter narrows the listing as its name says; the states are disjoint and cover every
/// event; a filter on a state and fields at once is their conjunction.
pub async fn operator_filters_by_every_field_and_state<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let first = h
        .enqueue(&[
            ev("order.created", "a", 0),
            ev("order.paid", "a", 1),
            ev("order.created", "b", 2),
        ])
        .await;
    // A second batch strictly later by the database's clock, for the time filters.
    let newest_first = store
        .get_event(first[2])
        .await
        .unwrap()
        .unwrap()
        .created_at
        .max(store.get_event(first[0]).await.unwrap().unwrap().created_at);
    wait_for("the database clock to move on", || async {
        let now = h.rows().await[0].db_now;
        (now > newest_first + chrono::Duration::milliseconds(3)).then_some(())
    })
    .await;
    let second = h
        .enqueue(&[
            ev("order.paid", "b", 3),
            ev("order.shipped", "c", 4),
            ev("order.created", "c", 5),
            NewEvent::new("invoice", "a", "invoice.sent", &serde_json::json!({})).unwrap(),
        ])
        .await;
    let mut every = first.clone();
    every.extend_from_slice(&second);
    // States: first[0] published, first[1] dead, second[0] leased, the rest pending.
    publish(&store, &first[..1]).await;
    bury(h, &store, &first[1..2]).await;
    let leased = lease(&store, 1).await;
    assert_eq!(leased, first[2..3], "the oldest pending event is leased");
    let leased_id = first[2];

    let by = |f: EventFilter| {
        let store = &store;
        async move { all(store, &f).await }
    };
    let state = |s| EventFilter {
        state: Some(s),
        ..Default::default()
    };
    assert_eq!(by(state(EventState::Published)).await, first[..1]);
    assert_eq!(by(state(EventState::Dead)).await, first[1..2]);
    assert_eq!(by(state(EventState::Leased)).await, vec![leased_id]);
    assert_eq!(by(state(EventState::Pending)).await, second);
    assert_eq!(by(EventFilter::default()).await, every);

    let f = |g: fn(&mut EventFilter)| {
        let mut f = EventFilter::default();
        g(&mut f);
        f
    };
    assert_eq!(
        by(f(|f| f.event_type = Some("order.created".into()))).await,
        vec![first[0], first[2], second[2]]
    );
    assert_eq!(
        by(f(|f| f.aggregate_type = Some("invoice".into()))).await,
        second[3..]
    );
    assert_eq!(
        by(f(|f| f.aggregate_id = Some("a".into()))).await,
        vec![first[0], first[1], second[3]]
    );
    assert_eq!(
        by(EventFilter {
            id: Some(second[1]),
            ..Default::default()
        })
        .await,
        second[1..2]
    );
    assert!(by(EventFilter {
        id: Some(Uuid::new_v4()),
        ..Default::default()
    })
    .await
    .is_empty());
    let t = newest_first + chrono::Duration::milliseconds(1);
    assert_eq!(
        by(EventFilter {
            created_after: Some(t),
            ..Default::default()
        })
        .await,
        second
    );
    assert_eq!(
        by(EventFilter {
            created_before: Some(t),
            ..Default::default()
        })
        .await,
        first
    );
    // Conjunctions.
    assert_eq!(
        by(EventFilter {
            state: Some(EventState::Pending),
            event_type: Some("order.created".into()),
            aggregate_id: Some("c".into()),
            created_after: Some(t),
            ..Default::default()
        })
        .await,
        second[2..3]
    );
    assert!(by(EventFilter {
        state: Some(EventState::Dead),
        event_type: Some("order.created".into()),
        ..Default::default()
    })
    .await
    .is_empty());
}

/// One event by id, in whatever state, with what was written; an unknown id is `None`.
pub async fn operator_gets_one_event_by_id<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let event = ev("order.created", "a-1", 7).header("trace", "x");
    let written = h.enqueue(&[event, ev("order.paid", "a-1", 8)]).await;
    bury(h, &store, &written[1..]).await;
    let got = store.get_event(written[0]).await.unwrap().expect("a hit");
    assert_eq!(got.id, written[0]);
    assert_eq!(
        (
            got.aggregate_type.as_str(),
            got.aggregate_id.as_str(),
            got.event_type.as_str()
        ),
        ("order", "a-1", "order.created")
    );
    assert_eq!(got.payload, serde_json::json!({ "i": 7 }));
    assert_eq!(got.headers.get("trace").map(String::as_str), Some("x"));
    assert_eq!(got.state(chrono::Utc::now()), EventState::Pending);
    let dead = store.get_event(written[1]).await.unwrap().expect("a hit");
    assert_eq!(dead.state(chrono::Utc::now()), EventState::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("poison"));
    assert_eq!(store.get_event(Uuid::new_v4()).await.unwrap(), None);
    store.ping().await.unwrap();
}

/// The purge deletes published rows older than the cut, at most a batch per call, and never
/// a dead letter or an unpublished row.
pub async fn purge_deletes_published_rows_in_batches<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let written = h
        .enqueue(&(0..8).map(|i| ev("t", "a", i)).collect::<Vec<_>>())
        .await;
    publish(&store, &written[..5]).await;
    bury(h, &store, &written[5..6]).await;
    let leased = lease(&store, 1).await; // written[6]; written[7] stays pending
    assert_eq!(leased, written[6..7]);
    // Not old enough yet.
    assert_eq!(
        store
            .purge_processed(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    // Wait until the database clock is past every processed_at (millisecond clocks).
    wait_for("the database clock to pass processed_at", || async {
        let rows = h.rows().await;
        let newest = rows.iter().filter_map(|r| r.processed_at).max()?;
        (rows[0].db_now > newest + chrono::Duration::milliseconds(2)).then_some(())
    })
    .await;
    let mut batches = Vec::new();
    loop {
        let n = store.purge_processed(Duration::ZERO, 2).await.unwrap();
        batches.push(n);
        if n < 2 {
            break;
        }
        assert!(batches.len() < 10, "{batches:?}");
    }
    assert_eq!(batches, [2, 2, 1]);
    let left: Vec<Uuid> = h.rows().await.iter().map(|r| r.id).collect();
    assert_eq!(left, written[5..], "dead, leased and pending rows stay");
    assert_eq!(store.purge_processed(Duration::ZERO, 2).await.unwrap(), 0);
    let c = store.counts().await.unwrap();
    assert_eq!((c.processed, c.dead, c.leased, c.pending), (0, 1, 1, 1));
}
