//! Making backing-off events due at once, when the outage they failed for has ended.

use super::*;
use crate::store::RetryNowParams;

/// `retry_now` makes events that back off due at once and leaves every other row as it is:
/// published, dead and leased ones, and ids it does not know.
pub async fn retry_now_makes_only_backing_off_events_due<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let ids = enqueue_n(h, 4).await;
    let token = Uuid::new_v4();
    store.claim(claim("r", token, 10, LEASE)).await.unwrap();
    let failed = vec![
        Failure {
            unavailable: true,
            ..fail(ids[1], "broker down", Duration::from_secs(600), false)
        },
        fail(ids[2], "too large", Duration::ZERO, true),
        Failure {
            unavailable: true,
            ..fail(ids[3], "broker down", Duration::from_secs(600), false)
        },
    ];
    store
        .settle(SettleParams {
            claim: &leased(token),
            published: &ids[..1],
            failed: &failed,
        })
        .await
        .unwrap();
    let leased_id = enqueue_n(h, 1).await[0];
    let other = Uuid::new_v4();
    assert_eq!(
        store
            .claim(claim("other", other, 10, LEASE))
            .await
            .unwrap()
            .events
            .len(),
        1,
        "only the new event is due"
    );
    let before = h.rows().await;

    let mut asked = ids.clone();
    asked.extend([leased_id, Uuid::new_v4()]);
    let n = store
        .retry_now(RetryNowParams { ids: &asked })
        .await
        .unwrap();
    assert_eq!(n, 2, "the two events backing off");
    let after = h.rows().await;
    for (b, a) in before.iter().zip(&after) {
        if a.id == ids[1] || a.id == ids[3] {
            assert!(a.available_at <= a.db_now, "due now: {a:?}");
            assert_eq!(a.attempts, b.attempts, "no attempt counted");
        } else {
            assert_eq!(a.without_now(), b.without_now(), "untouched");
        }
    }
    let again = store
        .claim(claim("r", Uuid::new_v4(), 10, LEASE))
        .await
        .unwrap()
        .events;
    let mut got: Vec<Uuid> = again.iter().map(|e| e.id).collect();
    got.sort();
    let mut want = vec![ids[1], ids[3]];
    want.sort();
    assert_eq!(got, want, "claimable at once");
}
