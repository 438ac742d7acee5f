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
        lease,
        ordering: Ordering::Unordered,
        in_flight: &[],
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

/// `enqueue_many` keeps slice order in `seq`; payload and headers come back as written; a
/// rolled-back transaction leaves nothing.
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
    assert_eq!(count(h, |r| r.lock_token.is_some()).await, 0);
}

/// Released rows are claimable at once and keep their attempt count.
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
        assert_eq!(
            (r.locked_by, r.locked_until, r.lock_token),
            (None, None, None)
        );
        assert_eq!(r.attempts, 0);
    }
    let again = store
        .claim(claim("other", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(again.len(), 3, "released rows are claimable at once");
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

/// An ordered claim never hands out an event while an earlier event of its aggregate is
/// leased or backing off; other aggregates go on.
pub async fn ordered_claim_never_passes_a_blocked_aggregate<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    join(&store, "r", Ordering::Ordered).await;
    let mk = |agg: &str, i: usize| {
        NewEvent::new(
            "order",
            agg,
            "order.changed",
            &serde_json::json!({ "i": i }),
        )
        .unwrap()
    };
    // a1 b1 a2 b2
    let ids = h
        .enqueue(&[mk("a", 1), mk("b", 1), mk("a", 2), mk("b", 2)])
        .await;
    let token = Uuid::new_v4();
    let first = Arc::new(
        store
            .claim(ClaimParams {
                limit: 1,
                ..ordered("r", token, Ordering::Ordered)
            })
            .await
            .unwrap(),
    );
    assert_eq!(ids_of(&first.events), vec![ids[0]]);
    // a1 is in flight (leased, or on PostgreSQL held by partition and passed back by the
    // relay): a2 must wait; b1 and b2 may go.
    let second = Arc::new(
        store
            .claim(ClaimParams {
                in_flight: std::slice::from_ref(&first),
                ..ordered("r", Uuid::new_v4(), Ordering::Ordered)
            })
            .await
            .unwrap(),
    );
    assert_eq!(
        ids_of(&second.events),
        vec![ids[1], ids[3]],
        "passed a leased a1"
    );
    // a1 fails and backs off: a2 still waits (b's events are still in flight).
    store
        .settle(SettleParams {
            claim: &first,
            published: &[],
            failed: &[fail(ids[0], "later", Duration::from_secs(60), false)],
        })
        .await
        .unwrap();
    let none = store
        .claim(ClaimParams {
            in_flight: std::slice::from_ref(&second),
            ..ordered("r", Uuid::new_v4(), Ordering::Ordered)
        })
        .await
        .unwrap()
        .events;
    assert!(none.is_empty(), "passed a backing-off a1: {none:?}");
    store
        .settle(SettleParams {
            claim: &second,
            published: &[ids[1], ids[3]],
            failed: &[],
        })
        .await
        .unwrap();
    // Its backoff over, a1 comes first, and a2 only after it.
    h.make_available().await;
    let again = store
        .claim(ClaimParams {
            limit: 1,
            ..ordered("r", Uuid::new_v4(), Ordering::Ordered)
        })
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&again), vec![ids[0]]);
    // A relay that has not joined (no partitions, no lease) gets nothing ordered.
    let stranger = h.store(Retention::Mark).await;
    let got = stranger
        .claim(ordered("stranger", Uuid::new_v4(), Ordering::Ordered))
        .await
        .unwrap()
        .events;
    assert!(
        got.is_empty(),
        "an unregistered relay claimed in order: {got:?}"
    );
}

/// With `OrderedHold`, a dead letter holds its aggregate's later events (and they do not
/// count as unfinished); with `Ordered` they go on.
pub async fn hold_mode_keeps_an_aggregate_behind_its_dead_letter<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    join(&store, "r", Ordering::OrderedHold).await;
    let mk = |agg: &str, i: usize| {
        NewEvent::new(
            "order",
            agg,
            "order.changed",
            &serde_json::json!({ "i": i }),
        )
        .unwrap()
    };
    let ids = h.enqueue(&[mk("a", 1), mk("a", 2), mk("b", 1)]).await;
    let token = Uuid::new_v4();
    let first = store
        .claim(ClaimParams {
            limit: 1,
            ..ordered("r", token, Ordering::OrderedHold)
        })
        .await
        .unwrap();
    assert_eq!(ids_of(&first.events), vec![ids[0]]);
    store
        .settle(SettleParams {
            claim: &first,
            published: &[],
            failed: &[fail(ids[0], "poison", Duration::ZERO, true)],
        })
        .await
        .unwrap();
    let held_token = Uuid::new_v4();
    let held = store
        .claim(ordered("r", held_token, Ordering::OrderedHold))
        .await
        .unwrap();
    assert_eq!(
        ids_of(&held.events),
        vec![ids[2]],
        "a2 went past its dead a1"
    );
    assert!(store.has_unfinished(Ordering::OrderedHold).await.unwrap());
    store
        .settle(SettleParams {
            claim: &held,
            published: &ids[2..],
            failed: &[],
        })
        .await
        .unwrap();
    // Only a2 is left, held: nothing to wait for in hold mode, something in skip mode.
    assert!(!store.has_unfinished(Ordering::OrderedHold).await.unwrap());
    assert!(store.has_unfinished(Ordering::Ordered).await.unwrap());
    let skip = store
        .claim(ordered("r", Uuid::new_v4(), Ordering::Ordered))
        .await
        .unwrap()
        .events;
    assert_eq!(
        ids_of(&skip),
        vec![ids[1]],
        "skip mode goes past the dead letter"
    );
}

/// A claim is a value: the store remembers nothing of it, so another handle of the same store
/// (another pool, as after a reconnect) settles it, in both modes.
pub async fn a_claim_is_a_value_any_handle_of_the_store_settles<H: Harness>(h: &H) {
    let (claimer, settler) = (
        h.store(Retention::Mark).await,
        h.store(Retention::Mark).await,
    );
    join(&claimer, "r", Ordering::Ordered).await;
    // One mode at a time: on PostgreSQL an ordered claim leases no rows.
    for (n, params) in [
        (2, ordered("r", Uuid::new_v4(), Ordering::Ordered)),
        (3, claim("r", Uuid::new_v4(), 10, LEASE)),
    ] {
        let ids = enqueue_n(h, n).await;
        let c = claimer.claim(params).await.unwrap();
        assert_eq!(c.ids(), ids, "{:?}", c.fence);
        let out = settler
            .settle(SettleParams {
                claim: &c,
                published: &ids,
                failed: &[],
            })
            .await
            .unwrap();
        assert_eq!(out.published, n as u64, "{:?}", c.fence);
    }
    assert_eq!(count(h, |r| r.processed_at.is_some()).await, 5);
}

/// Deregistering releases the relay's leases at once.
pub async fn deregister_releases_and_forgets_the_relay<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    join(&store, "gone", Ordering::Ordered).await;
    enqueue_n(h, 3).await;
    let got = store
        .claim(ordered("gone", Uuid::new_v4(), Ordering::Ordered))
        .await
        .unwrap()
        .events;
    assert_eq!(got.len(), 3);
    // What deregister gives back is the rows it leased (none for PostgreSQL's ordered claims,
    // which hold their events by partition).
    let leased_rows = count(h, |r| r.lock_token.is_some()).await as u64;
    assert_eq!(
        store
            .deregister(crate::store::DeregisterParams {
                relay_id: "gone",
                instance: Uuid::nil()
            })
            .await
            .unwrap(),
        leased_rows
    );
    assert_eq!(count(h, |r| r.lock_token.is_some()).await, 0);
    assert!(store
        .relays()
        .await
        .unwrap()
        .iter()
        .all(|r| r.relay_id != "gone"));
    let again = store
        .claim(claim("next", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(again.len(), 3, "released at once, not after the lease");
}

/// A relay id that a live process holds is refused to another process (another instance),
/// and that process's deregister leaves the holder alone.
pub async fn a_relay_id_held_by_a_live_process_is_refused<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let other = h.store(Retention::Mark).await;
    let (holder, intruder) = (Uuid::new_v4(), Uuid::new_v4());
    let params = |instance| RebalanceParams {
        relay_id: "same",
        instance,
        ordering: Ordering::Ordered,
        lease: Duration::from_secs(10),
        may_release: true,
    };
    store.rebalance(params(holder)).await.unwrap();
    store.rebalance(params(holder)).await.unwrap();
    match other.rebalance(params(intruder)).await {
        Err(crate::Error::RelayIdInUse { relay_id, .. }) => assert_eq!(relay_id, "same"),
        other => panic!("expected RelayIdInUse, got {other:?}"),
    }
    let leaving = |instance| crate::store::DeregisterParams {
        relay_id: "same",
        instance,
    };
    other.deregister(leaving(intruder)).await.unwrap();
    let alive = |rs: &[crate::store::RelayInfo]| rs.iter().any(|r| r.relay_id == "same" && r.alive);
    assert!(
        alive(&store.relays().await.unwrap()),
        "the holder is still registered"
    );
    store.deregister(leaving(holder)).await.unwrap();
    assert!(
        !alive(&store.relays().await.unwrap()),
        "its own exit deregisters"
    );
    // Free again: another process may take the id now.
    other.rebalance(params(intruder)).await.unwrap();
}

/// The row as the raw read has it: panics naming `what` if it is not there.
fn raw<'a>(rows: &'a [super::RawRow], seq: i64, what: &str) -> &'a super::RawRow {
    rows.iter()
        .find(|r| r.seq == seq)
        .unwrap_or_else(|| panic!("row {seq} ({what}) is gone"))
}

/// Each malformed row is dead, not leased, with a last error that says what is wrong.
fn assert_buried(rows: &[super::RawRow], bad: &[super::Malformed]) {
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
impl crate::publish::Publisher for std::sync::Arc<Recorder> {
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
