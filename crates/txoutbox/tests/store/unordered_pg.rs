//! PostgreSQL's unordered claim: read-only from the partitions the relay owns, like the ordered
//! claim, and the row-lease claim only for a relay that owns none.

use std::sync::Arc;
use std::time::Duration;

use txoutbox::store::{
    Claim, ClaimParams, Fence, Ordering, RebalanceParams, SettleParams, Store, WaitParams, Wake,
};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(30);

fn unordered<'a>(relay_id: &'a str, in_flight: &'a [Arc<Claim>]) -> ClaimParams<'a> {
    ClaimParams {
        relay_id,
        token: Uuid::new_v4(),
        limit: 100,
        bytes: txoutbox::store::ClaimBytes::UNLIMITED,
        lease: LEASE,
        ordering: Ordering::Unordered,
        in_flight,
        metric_labels: txoutbox::metrics::MetricLabels::none(),
    }
}

/// A heartbeat of relay `relay_id`, one process per relay id (`instance`: its number).
fn join(relay_id: &str) -> RebalanceParams<'_> {
    RebalanceParams {
        relay_id,
        instance: Uuid::from_u128(relay_id.bytes().map(u128::from).sum()),
        ordering: Ordering::Unordered,
        lease: LEASE,
        may_release: true,
    }
}

/// Event `i` of a test: aggregate `o-{i}`, so each is an aggregate of its own.
fn numbered(i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        format!("o-{i}"),
        "e",
        &serde_json::json!({ "i": i }),
    )
    .expect("a numbered event")
}

/// Each row's version: a claim that wrote to a row would give it a new one.
async fn versions(db: &PgHarness) -> Vec<(String, String)> {
    let sql = format!(
        "SELECT xmin::text, ctid::text FROM {} ORDER BY seq",
        db.table.qualified()
    );
    sqlx::query_as(&sql)
        .fetch_all(&db.pool)
        .await
        .expect("read the row versions")
}

/// An unordered relay that owns partitions claims without writing a row version (no lease:
/// the rows keep their `xmin` and `ctid`), holds its claim by partition, and its next claim
/// skips what it has in flight; another live relay gets none of it, neither by its
/// partitions nor by leasing rows; the settle is fenced by partition ownership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unordered_claim_on_owned_partitions_writes_no_row_version() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    let m = store.rebalance(join("u1")).await.unwrap();
    assert_eq!(
        m.owned.len(),
        m.partitions,
        "a lone unordered relay owns every partition"
    );
    let events: Vec<NewEvent> = (0..20)
        .map(|i| {
            NewEvent::new(
                "order",
                format!("o-{}", i % 3),
                "e",
                &serde_json::json!({ "i": i }),
            )
            .unwrap()
        })
        .collect();
    let ids = db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    let before = versions(&db).await;

    let first = Arc::new(store.claim(unordered("u1", &[])).await.unwrap());
    assert_eq!(
        first.ids(),
        ids,
        "every event, in seq order, whatever its aggregate"
    );
    assert!(
        matches!(first.fence, Fence::Partitions(_)),
        "{:?}",
        first.fence
    );
    assert_eq!(versions(&db).await, before, "the claim wrote row versions");
    assert_eq!(db.count_where("locked_until IS NOT NULL").await, 0);

    // Its next claim skips its claim in flight.
    let again = store
        .claim(unordered("u1", std::slice::from_ref(&first)))
        .await
        .unwrap();
    assert!(again.events.is_empty(), "claimed twice: {:?}", again.ids());

    // A second relay, live beside it: the first owns every partition, so it gets none, and
    // its row-lease claim leaves the first relay's partitions alone.
    let other = db.pool_store();
    let m = other.rebalance(join("u2")).await.unwrap();
    assert!(m.owned.is_empty(), "{m:?}");
    let got = other.claim(unordered("u2", &[])).await.unwrap();
    assert!(got.events.is_empty(), "claimed twice: {:?}", got.ids());
    assert_eq!(versions(&db).await, before);
    // Nor does it take them for work it could do: it sleeps out its wait.
    let wait = WaitParams {
        relay_id: "u2",
        ordering: Ordering::Unordered,
        max: Duration::from_millis(300),
    };
    assert_eq!(other.wait_for_work(wait).await.unwrap(), Wake::Timeout);

    let out = store
        .settle(SettleParams {
            claim: &first,
            published: &ids,
            failed: &[],
        })
        .await
        .unwrap();
    assert_eq!(out.published, 20);
    assert_eq!(db.processed().await, 20);
    db.cleanup().await;
}

/// Two unordered relays that share the partitions claim disjoint events, each from its own
/// partitions, and together all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_relays_sharing_partitions_claim_disjoint_events() {
    let db = PgHarness::new().await;
    let (a, b) = (db.pool_store(), db.pool_store());
    a.rebalance(join("a")).await.unwrap();
    b.rebalance(join("b")).await.unwrap();
    // `a` gives up the half over its share; `b` takes it.
    a.rebalance(join("a")).await.unwrap();
    let mb = b.rebalance(join("b")).await.unwrap();
    assert_eq!(mb.owned.len(), mb.partitions / 2, "{mb:?}");
    let events: Vec<NewEvent> = (0..200).map(numbered).collect();
    let ids = db.outbox().enqueue_many(&db.pool, &events).await.unwrap();
    let mut params = unordered("a", &[]);
    params.limit = 1000;
    let from_a = a.claim(params).await.unwrap();
    let mut params = unordered("b", &[]);
    params.limit = 1000;
    let from_b = b.claim(params).await.unwrap();
    assert!(!from_a.events.is_empty() && !from_b.events.is_empty());
    let mut all: Vec<Uuid> = from_a.ids().into_iter().chain(from_b.ids()).collect();
    all.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(all, want, "each event claimed once, by one relay");
    db.cleanup().await;
}

/// A claim past the cursor that comes back short looks behind the cursor in a second
/// statement, and what it finds there goes out in the same claim (both statements read the
/// same partitions at the same epochs; each reads its own lease left, and the claim keeps the
/// shorter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_claim_past_the_cursor_takes_what_is_behind_it_at_once() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    store.rebalance(join("u1")).await.unwrap();
    // A transaction takes its seq first and commits after the cursor went past it.
    let mut late = db.pool.begin().await.unwrap();
    let late_id = db.outbox().enqueue(&mut *late, &numbered(0)).await.unwrap();
    let ids = db
        .outbox()
        .enqueue_many(&db.pool, &(1..=25).map(numbered).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut in_flight: Vec<Arc<Claim>> = Vec::new();
    for expected in [&ids[..10], &ids[10..20]] {
        let c = store
            .claim(ClaimParams {
                limit: 10,
                ..unordered("u1", &in_flight)
            })
            .await
            .unwrap();
        assert_eq!(c.ids(), expected, "a full claim past the cursor");
        in_flight.push(Arc::new(c));
    }
    late.commit().await.unwrap();
    let started = std::time::Instant::now();
    let short = store
        .claim(ClaimParams {
            limit: 10,
            ..unordered("u1", &in_flight)
        })
        .await
        .unwrap();
    let mut want = vec![late_id];
    want.extend_from_slice(&ids[20..]);
    assert_eq!(
        short.ids(),
        want,
        "the rows behind the cursor come in the short claim itself, in seq order"
    );
    assert!(
        short.expires <= started + LEASE,
        "the claim outlives its partitions' lease"
    );
    db.cleanup().await;
}

/// Both read-only claims (ordered, and unordered on owned partitions) keep their byte limits
/// whichever of their two forms serves them: small events come from the fast form, and a
/// candidate too large for it (over the budget's share of one event, or compressed) sends the
/// claim to the full statement, which stops at the budget, takes the first event whatever its
/// size, and dead-letters an event over the per-event ceiling unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_claims_keep_their_byte_limits_in_both_forms() {
    use txoutbox::store::ClaimBytes;
    // A JSON string of `n` times `c`: `n + 2` bytes as text.
    let sized = |i: usize, n: usize, c: char| {
        let text = serde_json::Value::String(std::iter::repeat_n(c, n).collect());
        NewEvent::new("order", format!("o-{i}"), "e", &text).unwrap()
    };
    for ordering in [Ordering::Ordered, Ordering::Unordered] {
        let db = PgHarness::new().await;
        let store = db.pool_store();
        store
            .rebalance(RebalanceParams {
                ordering,
                ..join("r1")
            })
            .await
            .unwrap();
        let claim = |batch: u64, event: u64| ClaimParams {
            bytes: ClaimBytes { batch, event },
            ordering,
            ..unordered("r1", &[])
        };
        let take = async |batch: u64, event: u64| {
            let c = store.claim(claim(batch, event)).await.unwrap();
            let ids = c.ids();
            let keep = Arc::new(c);
            // Settle what was claimed, so the next claim goes on past it.
            store
                .settle(SettleParams {
                    claim: &keep,
                    published: &ids,
                    failed: &[],
                })
                .await
                .unwrap();
            ids
        };
        let enqueue =
            async |events: &[NewEvent]| db.outbox().enqueue_many(&db.pool, events).await.unwrap();
        // Five 1 KB events: the fast form's share of a 100 KB budget is 1 KB (100 events), so
        // they come from it, all five.
        let small = enqueue(&(0..5).map(|i| sized(i, 900, 'x')).collect::<Vec<_>>()).await;
        assert_eq!(take(100_000, u64::MAX).await, small, "{ordering:?}");
        // Five more, under a budget of 2,500 bytes: the full statement, two by two, then the
        // first alone whatever its size under a budget of one byte.
        let more = enqueue(&(0..5).map(|i| sized(i, 1000, 'x')).collect::<Vec<_>>()).await;
        assert_eq!(take(2_500, u64::MAX).await, more[..2], "{ordering:?}");
        assert_eq!(take(1, u64::MAX).await, more[2..3], "{ordering:?}");
        assert_eq!(take(2_500, u64::MAX).await, more[3..], "{ordering:?}");
        // 200 KB of one letter (stored compressed, in far fewer bytes) and two small ones:
        // a budget of 100 KB takes the large one alone, whole.
        let mixed = enqueue(&[
            sized(10, 200_000, 'a'),
            sized(11, 10, 'b'),
            sized(12, 10, 'c'),
        ])
        .await;
        let c = store.claim(claim(100_000, u64::MAX)).await.unwrap();
        assert_eq!(c.ids(), mixed[..1], "{ordering:?}");
        assert_eq!(
            c.events[0].payload.as_bytes().len(),
            200_002,
            "{ordering:?}"
        );
        let c = Arc::new(c);
        store
            .settle(SettleParams {
                claim: &c,
                published: &mixed[..1],
                failed: &[],
            })
            .await
            .unwrap();
        assert_eq!(take(100_000, u64::MAX).await, mixed[1..], "{ordering:?}");
        // An event over the per-event ceiling is dead-lettered unread; the one beside it flows.
        let over = enqueue(&[sized(20, 50_000, 'z'), sized(21, 10, 'y')]).await;
        // Incompressible, so its stored size says what it is.
        db.exec(&format!(
            "UPDATE {} SET payload = to_jsonb((SELECT string_agg(md5(g::text), '') FROM generate_series(1, 1600) g)) WHERE id = '{}'",
            db.table.qualified(),
            over[0]
        ))
        .await;
        assert_eq!(take(u64::MAX, 10_000).await, over[1..], "{ordering:?}");
        assert_eq!(db.dead().await, 1, "{ordering:?}");
        db.cleanup().await;
    }
}

/// What a short claim finds behind its cursor joins it only within what is left of its byte
/// budget: an event there too large for it (which a claim of its own would take whatever its
/// size) waits for the next claim, which it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_behind_the_cursor_joins_a_claim_only_within_its_budget() {
    let db = PgHarness::new().await;
    let store = db.pool_store();
    store.rebalance(join("u1")).await.unwrap();
    // A 5 KB event whose transaction takes its seq first and commits after the cursor went
    // past it.
    let big = NewEvent::new(
        "order",
        "big",
        "e",
        &serde_json::Value::String("x".repeat(5_000)),
    )
    .unwrap();
    let mut late = db.pool.begin().await.unwrap();
    let late_id = db.outbox().enqueue(&mut *late, &big).await.unwrap();
    let ids = db
        .outbox()
        .enqueue_many(&db.pool, &(1..=25).map(numbered).collect::<Vec<_>>())
        .await
        .unwrap();
    fn budget(in_flight: &[Arc<Claim>]) -> ClaimParams<'_> {
        ClaimParams {
            limit: 10,
            bytes: txoutbox::store::ClaimBytes {
                batch: 1_000,
                event: u64::MAX,
            },
            ..unordered("u1", in_flight)
        }
    }
    let mut in_flight: Vec<Arc<Claim>> = Vec::new();
    for expected in [&ids[..10], &ids[10..20]] {
        let c = store.claim(budget(&in_flight)).await.unwrap();
        assert_eq!(c.ids(), expected, "a full claim past the cursor");
        in_flight.push(Arc::new(c));
    }
    late.commit().await.unwrap();
    let short = store.claim(budget(&in_flight)).await.unwrap();
    assert_eq!(
        short.ids(),
        ids[20..],
        "the large event would pass the budget"
    );
    in_flight.push(Arc::new(short));
    let next = store.claim(budget(&in_flight)).await.unwrap();
    assert_eq!(next.ids(), [late_id], "it opens the next claim, alone");
    db.cleanup().await;
}
