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
mod dead;
mod ordered;
mod payload;
mod retry;
mod undecodable;
pub use bytes::*;
pub use dead::*;
pub use ordered::*;
pub use payload::*;
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
