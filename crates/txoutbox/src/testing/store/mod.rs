//! The checks every store passes. Each takes a fresh, migrated outbox.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::{wait_for, Harness, RowState};
use crate::store::{
    Claim, ClaimParams, EventFilter, Failure, Operator, Ordering, Page, RebalanceParams,
    ReleaseParams, Retention, SettleParams, Store,
};
use crate::EventState;

pub use super::operator::{
    operator_filters_by_every_field_and_state, operator_gets_one_event_by_id,
    operator_pages_through_events_with_a_cursor, purge_deletes_published_rows_in_batches,
};
use crate::NewEvent;

mod bytes;
mod ordered;
mod retry;
mod undecodable;
pub use bytes::*;
pub use ordered::*;
pub use retry::*;
pub use undecodable::*;

const LEASE: Duration = Duration::from_secs(30);

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        format!("o-{}", i % 7),
        "order.created",
        &serde_json::json!({ "i": i }),
    )
    .unwrap()
}

fn claim(relay_id: &str, token: Uuid, limit: usize, lease: Duration) -> ClaimParams<'_> {
    ClaimParams {
        relay_id,
        token,
        limit,
        bytes: crate::store::ClaimBytes::UNLIMITED,
        lease,
        ordering: Ordering::Unordered,
        in_flight: &[],
        metric_labels: crate::metrics::MetricLabels::none(),
    }
}

/// A row-lease claim under `token`, for a settle or release fenced by that token alone.
fn leased(token: Uuid) -> Claim {
    Claim::leased(token, Vec::new(), std::time::Instant::now() + LEASE)
}

fn fail(id: Uuid, error: &str, retry_in: Duration, dead: bool) -> Failure {
    Failure {
        id,
        error: error.into(),
        retry_in,
        dead,
        unavailable: false,
    }
}

fn ids_of(events: &[crate::OutboxEvent]) -> Vec<Uuid> {
    events.iter().map(|e| e.id).collect()
}

async fn enqueue_n<H: Harness>(h: &H, n: usize) -> Vec<Uuid> {
    let events: Vec<NewEvent> = (0..n).map(event).collect();
    h.enqueue(&events).await
}

async fn count<H: Harness>(h: &H, f: impl Fn(&RowState) -> bool) -> usize {
    h.rows().await.iter().filter(|r| f(r)).count()
}

/// `enqueue_many` keeps slice order in `seq`; payload and headers come back as written; an
/// empty slice writes nothing; a rolled-back (or dropped) transaction leaves nothing.
pub async fn enqueue_keeps_slice_order_and_rollback_leaves_nothing<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    // Ids in random (v4) order, so an order by id could not pass by accident.
    let events: Vec<NewEvent> = (0..50)
        .map(|i| event(i).with_id(Uuid::new_v4()).header("n", i.to_string()))
        .collect();
    let ids = h.enqueue(&events).await;
    assert_eq!(ids, events.iter().map(|e| e.id()).collect::<Vec<_>>());
    let by_seq: Vec<Uuid> = h.rows().await.iter().map(|r| r.id).collect();
    assert_eq!(by_seq, ids, "seq follows slice order");
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&claimed), ids);
    for (i, e) in claimed.iter().enumerate() {
        assert_eq!(e.payload, serde_json::json!({ "i": i }));
        assert_eq!(e.headers.get("n"), Some(&i.to_string()));
        assert_eq!(e.aggregate_type, "order");
        assert_eq!(e.event_type, "order.created");
        assert_eq!(e.attempts, 0);
    }
    let before = h.rows().await.len();
    assert!(h.enqueue(&[]).await.is_empty(), "ids for an empty slice");
    assert_eq!(h.rows().await.len(), before, "an empty slice wrote rows");
    h.enqueue_rolled_back(&(0..10).map(event).collect::<Vec<_>>())
        .await;
    assert_eq!(
        h.rows().await.len(),
        before,
        "a rolled-back enqueue left rows"
    );
}

/// A claim leases in seq order up to its limit; nobody else gets leased rows; expired
/// leases are claimable again; a stale token changes nothing.
pub async fn claims_are_leased_fenced_and_expire<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let ids = enqueue_n(h, 5).await;
    let token_a = Uuid::new_v4();
    let short = Duration::from_secs(1);
    let a = store
        .claim(claim("relay-a", token_a, 3, short))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&a), ids[..3], "limit and seq order");
    for e in &a {
        assert_eq!(e.locked_by.as_deref(), Some("relay-a"));
        assert!(e.locked_until.is_some());
    }
    let rest = store
        .claim(claim("relay-a", token_a, 10, short))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&rest), ids[3..]);
    for r in h.rows().await {
        assert_eq!(r.locked_by.as_deref(), Some("relay-a"));
        assert_eq!(r.lock_token, Some(token_a));
        assert!(r.locked_until.unwrap() > r.db_now);
    }
    // A second relay (its own pool) gets nothing while the lease holds.
    let other = h.store(Retention::Mark).await;
    let token_b = Uuid::new_v4();
    let b = other
        .claim(claim("relay-b", token_b, 10, LEASE))
        .await
        .unwrap()
        .events;
    assert!(b.is_empty(), "leased rows were claimed twice: {b:?}");

    // Once the 1 s leases run out, the second relay gets them all, each once.
    let got = Mutex::new(Vec::<Uuid>::new());
    wait_for("relay-b claims the expired rows", || async {
        let c = other
            .claim(claim("relay-b", token_b, 10, LEASE))
            .await
            .unwrap()
            .events;
        let mut got = got.lock().unwrap();
        got.extend(c.iter().map(|e| e.id));
        (got.len() >= 5).then_some(())
    })
    .await;
    let mut got = got.into_inner().unwrap();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want, "each expired row claimed once");
    let held_by_b: Vec<RowState> = h.rows().await.iter().map(RowState::without_now).collect();

    // Relay A comes back and settles or releases with its old token: nothing changes.
    let failed: Vec<Failure> = ids[3..]
        .iter()
        .map(|&id| fail(id, "late", Duration::from_secs(60), true))
        .collect();
    let out = store
        .settle(SettleParams {
            claim: &leased(token_a),
            published: &ids[..3],
            failed: &failed,
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (0, 0));
    let released = store
        .release(ReleaseParams {
            claim: &leased(token_a),
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(released, 0);
    let after: Vec<RowState> = h.rows().await.iter().map(RowState::without_now).collect();
    assert_eq!(after, held_by_b, "a stale token changed rows");

    // The holder's token works.
    let out = other
        .settle(SettleParams {
            claim: &leased(token_b),
            published: &ids,
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (5, 0));
    assert_eq!(count(h, |r| r.processed_at.is_some()).await, 5);
    assert_eq!(
        count(h, holds_a_lease).await,
        0,
        "a settle clears the lease"
    );
}

/// A settle with the claim the store returned (which carries its events, as the relay's
/// does) marks, or deletes, exactly the published ones, backs off the failed one, leaves the
/// rest leased, and is fenced by the claim like any other; published ids the claim does not
/// hold change nothing.
pub async fn a_settle_with_its_claim_changes_exactly_its_rows<H: Harness>(h: &H) {
    settle_with_its_claim(h, Retention::Mark).await;
}

/// As [`a_settle_with_its_claim_changes_exactly_its_rows`], deleting on settle.
pub async fn a_deleting_settle_with_its_claim_changes_exactly_its_rows<H: Harness>(h: &H) {
    settle_with_its_claim(h, Retention::Delete).await;
}

async fn settle_with_its_claim<H: Harness>(h: &H, retention: Retention) {
    {
        let store = h.store(retention).await;
        let ids = enqueue_n(h, 6).await;
        let token = Uuid::new_v4();
        let got = store.claim(claim("r", token, 5, LEASE)).await.unwrap();
        assert_eq!(ids_of(&got.events), ids[..5].to_vec());
        // A stale token changes nothing, with the events or without.
        let stale = Claim::leased(Uuid::new_v4(), got.events.clone(), got.expires);
        let out = store
            .settle(SettleParams {
                claim: &stale,
                published: &ids[..2],
                failed: &[],
            })
            .await
            .unwrap();
        assert_eq!((out.published, out.failed), (0, 0), "{retention:?}");
        let out = store
            .settle(SettleParams {
                claim: &got,
                // ids[5] was not claimed: not changed whatever the caller says.
                published: &[ids[3], ids[1], ids[5]],
                failed: &[fail(ids[4], "later", Duration::from_secs(60), false)],
            })
            .await
            .unwrap();
        assert_eq!((out.published, out.failed), (2, 1), "{retention:?}");
        let rows = h.rows().await;
        let row = |id: Uuid| rows.iter().find(|r| r.id == id);
        for id in [ids[1], ids[3]] {
            match retention {
                Retention::Mark => assert!(row(id).is_some_and(|r| r.processed_at.is_some())),
                Retention::Delete => assert!(row(id).is_none(), "{retention:?}: not deleted"),
            }
        }
        for id in [ids[0], ids[2]] {
            let r = row(id).unwrap();
            assert!(
                r.processed_at.is_none() && holds_a_lease(r),
                "{retention:?}: {r:?}"
            );
        }
        let r = row(ids[4]).unwrap();
        assert!(r.processed_at.is_none() && r.attempts == 1 && !holds_a_lease(r));
        let r = row(ids[5]).unwrap();
        assert!(
            r.processed_at.is_none() && !holds_a_lease(r),
            "{retention:?}: {r:?}"
        );
    }
}

/// Any of the row lease's columns is set.
fn holds_a_lease(r: &RowState) -> bool {
    r.locked_by.is_some() || r.locked_until.is_some() || r.lock_token.is_some()
}

/// Released rows are claimable at once and keep their attempt count; a deregister gives back
/// the rows an unordered claim of the relay leased.
pub async fn release_gives_rows_back_unattempted<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let ids = enqueue_n(h, 3).await;
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 10, LEASE)).await.unwrap();
    let n = store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(n, 3);
    for r in h.rows().await {
        assert!(!holds_a_lease(&r), "released, yet leased: {r:?}");
        assert_eq!(r.attempts, 0);
    }
    let again = store
        .claim(claim("other", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(again.len(), 3, "released rows are claimable at once");
    let freed = store
        .deregister(crate::store::DeregisterParams {
            relay_id: "other",
            instance: Uuid::nil(),
        })
        .await
        .unwrap();
    assert_eq!(freed, 3, "deregister gives back the relay's leased rows");
    assert_eq!(count(h, holds_a_lease).await, 0);
}

/// One settle: published rows are marked, failures back off (counting `unavailable` apart)
/// or become dead letters; leases are cleared; a backoff runs out.
pub async fn settle_marks_published_and_backs_off_or_buries_failures<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let ids = enqueue_n(h, 4).await;
    let token = Uuid::new_v4();
    assert_eq!(
        store
            .claim(claim("r", token, 10, LEASE))
            .await
            .unwrap()
            .events
            .len(),
        4
    );
    let failed = vec![
        fail(ids[1], "broker said no", Duration::from_secs(60), false),
        fail(ids[2], "too large", Duration::ZERO, true),
        Failure {
            unavailable: true,
            ..fail(ids[3], "try again soon", Duration::from_millis(300), false)
        },
    ];
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..1],
            failed: &failed,
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (1, 3));
    let rows = h.rows().await;
    let (ok, backoff, dead, soon) = (&rows[0], &rows[1], &rows[2], &rows[3]);
    assert!(ok.processed_at.is_some() && ok.dead_at.is_none());
    assert_eq!(ok.attempts, 0);
    assert!(backoff.processed_at.is_none() && backoff.dead_at.is_none());
    assert_eq!(backoff.attempts, 1);
    assert_eq!(backoff.last_error.as_deref(), Some("broker said no"));
    assert!(
        backoff.available_at > backoff.db_now + chrono::Duration::seconds(50),
        "available_at {} not ~60 s after {}",
        backoff.available_at,
        backoff.db_now
    );
    assert!(dead.dead_at.is_some() && dead.processed_at.is_none());
    assert_eq!(dead.attempts, 1);
    assert_eq!(dead.last_error.as_deref(), Some("too large"));
    assert_eq!(soon.attempts, 1);
    let unavailable: Vec<i32> = rows.iter().map(|r| r.attempts_unavailable).collect();
    assert_eq!(
        unavailable,
        vec![0, 0, 0, 1],
        "only the unavailable failure counts as such"
    );
    for r in &rows {
        assert_eq!(
            (r.locked_by.as_ref(), r.locked_until, r.lock_token),
            (None, None, None)
        );
    }
    let none = store
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert!(
        none.is_empty(),
        "published, dead or backing off, yet claimed: {none:?}"
    );
    let again = wait_for("the 300 ms backoff to pass", || async {
        let got = store
            .claim(claim("r", Uuid::new_v4(), 10, LEASE))
            .await
            .unwrap()
            .events;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(ids_of(&again), vec![ids[3]]);
    assert_eq!(again[0].attempts, 1);
    assert_eq!(again[0].last_error.as_deref(), Some("try again soon"));
}

/// With `Retention::Delete`, published rows go on settle; fenced like everything else.
pub async fn delete_retention_deletes_on_settle<H: Harness>(h: &H) {
    let store = h.store(Retention::Delete).await;
    let ids = enqueue_n(h, 3).await;
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 10, LEASE)).await.unwrap();
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..2],
            failed: &[fail(ids[2], "nope", Duration::from_secs(60), false)],
        })
        .await
        .unwrap();
    assert_eq!((out.published, out.failed), (2, 1));
    let rows = h.rows().await;
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[2]]);
    assert_eq!(rows[0].attempts, 1);
    // A stale token deletes nothing.
    h.make_available().await;
    let token2 = Uuid::new_v4();
    assert_eq!(
        store
            .claim(claim("r", token2, 10, LEASE))
            .await
            .unwrap()
            .events
            .len(),
        1
    );
    let out = store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[2..],
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(out.published, 0);
    assert_eq!(h.rows().await.len(), 1);
}

/// Dead-letter rows by claiming them and settling them as dead.
pub async fn bury<H: Harness>(h: &H, store: &H::Store, ids: &[Uuid]) {
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 1000, LEASE)).await.unwrap();
    let failed: Vec<Failure> = ids
        .iter()
        .map(|&id| fail(id, "poison", Duration::ZERO, true))
        .collect();
    store
        .settle(SettleParams {
            claim: &leased(token),
            published: &[],
            failed: &failed,
        })
        .await
        .unwrap();
    let all: Vec<Uuid> = h.rows().await.iter().map(|r| r.id).collect();
    store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &all,
        })
        .await
        .unwrap();
}

/// Dead letters can be listed and filtered, retried (back in line, attempts reset, available
/// now) and discarded by any filter, touching nothing else.
pub async fn dead_letters_list_retry_and_discard<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let mk = |t: &str, i: usize| {
        NewEvent::new("order", format!("o-{i}"), t, &serde_json::json!({ "i": i })).unwrap()
    };
    let events = vec![
        mk("order.created", 0),
        mk("order.paid", 1),
        mk("order.paid", 2),
        mk("order.shipped", 3),
        mk("order.created", 4),
    ];
    let ids = h.enqueue(&events).await;
    bury(h, &store, &ids[..4]).await; // ids[4] stays pending
    assert_eq!(
        ids_of(&dead(&store, EventFilter::default()).await),
        ids[..4]
    );
    let paid = EventFilter {
        event_type: Some("order.paid".into()),
        ..Default::default()
    };
    assert_eq!(ids_of(&dead(&store, paid.clone()).await), ids[1..3]);
    let limited = store
        .list_events(
            &EventFilter {
                state: Some(EventState::Dead),
                ..Default::default()
            },
            Page {
                after_seq: None,
                limit: 1,
            },
        )
        .await
        .unwrap();
    assert_eq!(ids_of(&limited.events), ids[..1]);

    // A filter that names a pending event touches nothing: only dead letters are retried.
    let pending = EventFilter {
        id: Some(ids[4]),
        state: Some(EventState::Pending),
        ..Default::default()
    };
    assert_eq!(store.retry_dead(&pending).await.unwrap(), 0);
    assert_eq!(store.discard_dead(&pending).await.unwrap(), 0);

    assert_eq!(store.retry_dead(&paid).await.unwrap(), 2);
    for r in h.rows().await.iter().filter(|r| ids[1..3].contains(&r.id)) {
        assert!(r.dead_at.is_none());
        assert_eq!((r.attempts, r.attempts_unavailable), (0, 0));
        assert!(r.last_error.is_none());
        assert!(r.available_at <= r.db_now, "available now: {r:?}");
    }
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    let mut got = ids_of(&claimed);
    got.sort();
    let mut want = vec![ids[1], ids[2], ids[4]];
    want.sort();
    assert_eq!(
        got, want,
        "retried dead letters and the pending one are claimable"
    );

    let by_id = EventFilter {
        id: Some(ids[3]),
        ..Default::default()
    };
    assert_eq!(store.retry_dead(&by_id).await.unwrap(), 1);
    assert_eq!(store.retry_dead(&by_id).await.unwrap(), 0);

    let created = EventFilter {
        event_type: Some("order.created".into()),
        ..Default::default()
    };
    assert_eq!(store.discard_dead(&created).await.unwrap(), 1); // ids[0]; ids[4] is not dead
    let rows = h.rows().await;
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.id != ids[0]));
    assert!(dead(&store, EventFilter::default()).await.is_empty());
}

/// The dead letters matching `f` (its state set to dead), one page of the most.
async fn dead<S: Operator>(store: &S, f: EventFilter) -> Vec<crate::OutboxEvent> {
    let f = EventFilter {
        state: Some(EventState::Dead),
        ..f
    };
    let page = Page {
        after_seq: None,
        limit: crate::store::operator::MAX_PAGE,
    };
    store.list_events(&f, page).await.unwrap().events
}

/// `counts` and `has_unfinished` follow every state.
pub async fn counts_reflect_every_state<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let c = store.counts().await.unwrap();
    assert_eq!((c.pending, c.leased, c.dead, c.processed), (0, 0, 0, 0));
    assert_eq!(c.oldest_pending_age_secs, None);
    assert!(!store.has_unfinished(Ordering::Ordered).await.unwrap());

    let ids = enqueue_n(h, 8).await;
    // 3 published, 1 dead, 1 backing off, 2 leased, 1 untouched.
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 6, LEASE)).await.unwrap();
    store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..3],
            failed: &[
                fail(ids[3], "dead", Duration::ZERO, true),
                fail(ids[4], "later", Duration::from_secs(60), false),
            ],
        })
        .await
        .unwrap();
    store
        .release(ReleaseParams {
            claim: &leased(token),
            ids: &ids[5..6],
        })
        .await
        .unwrap();
    let leased = store
        .claim(claim("r2", Uuid::new_v4(), 2, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&leased), ids[5..7]);
    let c = store.counts().await.unwrap();
    assert_eq!(c.pending, 2, "{c:?}"); // ids[4] (backing off) and ids[7]
    assert_eq!(c.leased, 2, "{c:?}");
    assert_eq!(c.dead, 1, "{c:?}");
    assert_eq!(c.processed, 3, "{c:?}");
    assert!(c.oldest_pending_age_secs.unwrap() >= 0.0);
    assert!(store.has_unfinished(Ordering::Ordered).await.unwrap());
}

async fn join<S: Store>(store: &S, relay_id: &str, ordering: Ordering) {
    store
        .rebalance(RebalanceParams {
            relay_id,
            instance: uuid::Uuid::nil(),
            ordering,
            lease: Duration::from_secs(10),
            may_release: true,
        })
        .await
        .unwrap();
}

fn ordered(relay_id: &str, token: Uuid, ordering: Ordering) -> ClaimParams<'_> {
    ClaimParams {
        ordering,
        ..claim(relay_id, token, 100, LEASE)
    }
}

/// Events of bytes ([`NewEvent::bytes`]) come back as written, beside JSON ones: the bytes
/// exactly (a NUL, bytes that are not UTF-8, none at all), their content type, a JSON `null`
/// payload; one alone (the single insert) and several together (the set-based insert); from a
/// claim, from the operator, and as the message a publisher gets.
pub async fn byte_payloads_round_trip_beside_json_ones<H: Harness>(h: &H) {
    use crate::publish::Message;
    let store = h.store(Retention::Mark).await;
    let proto = vec![0x08, 0x96, 0x01, 0x00, 0xff, 0x80, 0x12, 0x02, b'h', b'i'];
    let bytes = |data: Vec<u8>, ct: &str| {
        NewEvent::bytes("order", "o-1", "order.created", data, ct).unwrap()
    };
    let alone = h
        .enqueue(&[bytes(proto.clone(), "application/x-protobuf")])
        .await;
    let mixed = h
        .enqueue(&[
            event(1),
            bytes(proto.clone(), "application/x-protobuf"),
            bytes(Vec::new(), "application/octet-stream"),
            event(2),
        ])
        .await;
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&claimed), [alone, mixed].concat());
    let expect: [(Option<&[u8]>, Option<&str>); 5] = [
        (Some(&proto), Some("application/x-protobuf")),
        (None, None),
        (Some(&proto), Some("application/x-protobuf")),
        (Some(&[]), Some("application/octet-stream")),
        (None, None),
    ];
    for (e, (data, ct)) in claimed.iter().zip(expect) {
        assert_eq!(e.payload_bytes.as_deref(), data, "seq {}", e.seq);
        assert_eq!(e.content_type.as_deref(), ct, "seq {}", e.seq);
        let m = Message::from_event(e);
        match data {
            Some(data) => {
                assert_eq!(e.payload, serde_json::Value::Null);
                assert_eq!(m.body, data);
                assert_eq!(Some(m.content_type.as_str()), ct);
            }
            None => {
                assert!(e.payload.to_value().unwrap().is_object(), "{}", e.payload);
                assert_eq!(m.body, e.payload.as_bytes());
                assert_eq!(m.content_type, crate::event::JSON_CONTENT_TYPE);
            }
        }
    }
    let got = store
        .get_event(claimed[0].id)
        .await
        .unwrap()
        .expect("a hit");
    assert_eq!(got.payload_bytes.as_deref(), Some(&proto[..]));
    assert_eq!(got.content_type.as_deref(), Some("application/x-protobuf"));
    let shown = serde_json::to_value(&got).unwrap();
    assert_eq!(shown["payload_base64"], "CJYBAP+AEgJoaQ==");
    assert_eq!(shown["content_type"], "application/x-protobuf");
    let json = serde_json::to_value(&claimed[1]).unwrap();
    assert!(json.get("payload_base64").is_none() && json.get("content_type").is_none());
}

/// JSON text with numbers no `f64` holds: every digit must reach the message body.
pub const EXACT_JSON: &str = r#"{"amount": 12345678901234567.89, "id": 123456789012345678901234567890, "rate": 0.1000000000000000000000000000001, "neg": -98765432109876543210, "big": 1e400, "tiny": 1e-400, "nested": {"deep": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}}"#;

/// Does `body` (a message body of [`EXACT_JSON`] after a database round trip) hold every
/// number digit for digit? Databases may respace the text (PostgreSQL's `jsonb` writes `": "`)
/// and write `1e400` out in full: both are the same number; a rounded or refused one is not.
pub fn holds_exact_json(body: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let big_in_full = format!("\"big\":1{}", "0".repeat(400));
    let tiny_in_full = format!("\"tiny\":0.{}1", "0".repeat(399));
    let wanted: [&[&str]; 7] = [
        &["\"amount\":12345678901234567.89"],
        &["\"id\":123456789012345678901234567890"],
        &["\"rate\":0.1000000000000000000000000000001"],
        &["\"neg\":-98765432109876543210"],
        &["\"big\":1e400", &big_in_full],
        &["\"tiny\":1e-400", &tiny_in_full],
        &["[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]"],
    ];
    for forms in wanted {
        if !forms.iter().any(|f| squeezed.contains(f)) {
            return Err(format!("{} is not in the body: {text}", forms[0]));
        }
    }
    Ok(())
}

/// A JSON payload comes back as the database holds it: numbers past `f64` (money, 30-digit
/// ids, `1e400`) keep every digit from the write through the claim to the message body, and
/// none is refused as undecodable.
pub async fn json_payloads_keep_every_digit<H: Harness>(h: &H) {
    use crate::publish::Message;
    let store = h.store(Retention::Mark).await;
    let payload = crate::JsonPayload::from_text(EXACT_JSON).unwrap();
    let one = NewEvent::from_payload("order", "o-1", "order.paid", payload.clone());
    let two = NewEvent::from_payload("order", "o-2", "order.paid", payload);
    let alone = h.enqueue(&[one]).await;
    let together = h.enqueue(&[two, event(3)]).await;
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&claimed), [alone, together.clone()].concat());
    for e in &claimed[..2] {
        let m = Message::from_event(e);
        holds_exact_json(&m.body).unwrap();
        holds_exact_json(e.payload.as_bytes()).unwrap();
    }
    let shown = store.get_event(together[0]).await.unwrap().unwrap();
    holds_exact_json(shown.payload.as_bytes()).unwrap();
    assert_eq!(
        count(h, |r| r.dead_at.is_some()).await,
        0,
        "nothing dead-lettered"
    );
}
