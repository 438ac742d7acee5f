//! The claim's byte limits: a batch stops at its byte budget, and an event over the
//! per-event ceiling is dead-lettered without being read.

use super::*;
use crate::store::ClaimBytes;

/// An event whose payload is a JSON string of `n` times `c`: `n + 2` bytes as text.
fn sized(i: usize, n: usize, c: char) -> NewEvent {
    let text = serde_json::Value::String(std::iter::repeat_n(c, n).collect());
    NewEvent::new("order", format!("o-{i}"), "order.sized", &text).unwrap()
}

fn within(relay_id: &str, token: Uuid, bytes: ClaimBytes) -> ClaimParams<'_> {
    ClaimParams {
        bytes,
        ..claim(relay_id, token, 100, LEASE)
    }
}

/// A claim takes events in `seq` order while their payloads fit its byte budget, and the
/// first whatever its size. A payload that compresses well counts at its full size (on
/// PostgreSQL a stored `jsonb` may be a hundredth of it).
pub async fn claims_stop_at_the_byte_budget<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let small: Vec<NewEvent> = (0..5).map(|i| sized(i, 1000, 'x')).collect();
    let ids = h.enqueue(&small).await;
    let budget = |batch| ClaimBytes {
        batch,
        event: u64::MAX,
    };
    let got = store
        .claim(within("r", Uuid::new_v4(), budget(2500)))
        .await
        .unwrap()
        .events;
    assert_eq!(
        ids_of(&got),
        ids[..2],
        "two 1 KB payloads fit 2500 bytes, three do not"
    );
    let got = store
        .claim(within("r", Uuid::new_v4(), budget(1)))
        .await
        .unwrap()
        .events;
    assert_eq!(
        ids_of(&got),
        ids[2..3],
        "the first event goes whatever its size"
    );
    let got = store
        .claim(within("r", Uuid::new_v4(), budget(2500)))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&got), ids[3..]);
    // 200 KB of one letter, then two small ones: the budget of 100 KB takes the large one
    // alone, though it is stored in far fewer bytes.
    let mixed = [
        sized(10, 200_000, 'a'),
        sized(11, 10, 'b'),
        sized(12, 10, 'c'),
    ];
    let more = h.enqueue(&mixed).await;
    let got = store
        .claim(within("r", Uuid::new_v4(), budget(100_000)))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&got), more[..1], "the large one alone");
    assert_eq!(
        got[0].payload.as_bytes().len(),
        200_002,
        "the payload whole"
    );
    let got = store
        .claim(within("r", Uuid::new_v4(), budget(100_000)))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&got), more[1..]);
}

/// An event over the per-event ceiling is not handed out: the claim dead-letters it at once,
/// its size in the last error, its row as written, and the events beside it flow.
pub async fn an_event_over_the_ceiling_is_dead_lettered_unread<H: Harness>(h: &H) {
    let store = h.store(Retention::Mark).await;
    let ids = h
        .enqueue(&[sized(1, 50_000, 'z'), sized(2, 10, 'y'), event(3)])
        .await;
    let limits = ClaimBytes {
        batch: u64::MAX,
        event: 10_000,
    };
    let got = store
        .claim(within("r", Uuid::new_v4(), limits))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&got), ids[1..], "the events beside it flow");
    let dead = store.get_event(ids[0]).await.unwrap().unwrap();
    assert!(dead.dead_at.is_some(), "dead-lettered at once: {dead:?}");
    let error = dead.last_error.unwrap_or_default();
    assert!(
        error.contains("bytes is over the relay's max_event_bytes (10000 bytes)")
            && error.contains("payload of 500"),
        "{error}"
    );
    assert_eq!(
        dead.payload.as_bytes().len(),
        50_002,
        "the row is as written"
    );
}
