//! Dead letters: burying rows, and listing, retrying and discarding them.

use super::*;

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
