//! The ordered cases: per-aggregate order, hold mode, membership and the claim as a value.

use super::*;

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
                bytes: crate::store::ClaimBytes::UNLIMITED,
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
                metric_labels: crate::metrics::MetricLabels::none(),
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
            metric_labels: crate::metrics::MetricLabels::none(),
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
            bytes: crate::store::ClaimBytes::UNLIMITED,
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
            bytes: crate::store::ClaimBytes::UNLIMITED,
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
