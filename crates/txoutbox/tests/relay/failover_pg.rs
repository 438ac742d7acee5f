//! Failover of the WAL source, against a real primary and a physical standby of its own
//! (`PG_BIN`'s PostgreSQL, see `failover_pg/cluster.rs`): writers commit events through a URL
//! that names both hosts (`target_session_attrs=read-write`), the relay streams them; the
//! primary is killed (an immediate stop) and the standby promoted. The relay, restarted as its
//! supervisor would, finds the new primary through the same URL.
//!
//! - PostgreSQL 17+: the relay's slot is a failover slot, synchronized to the standby; on the
//!   promoted standby it streams on from that copy.
//! - Before 17 (or a slot made without failover): the new primary has no slot; the relay
//!   creates it and the table path delivers what the lost slot held.
//!
//! Both: every event the new primary holds is delivered (lost 0), nothing else is (phantom
//! 0), in `seq` order per aggregate; duplicates are counted and printed, as is the time from
//! the promotion to the first delivery after it.
#![allow(clippy::unwrap_used)]

mod cluster;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use txoutbox::relay::Source;
use txoutbox::store::postgres::hosts::{follow_primary, HostList};
use txoutbox::store::postgres::wal::{self, stream::ReplicationConfig};
use txoutbox::store::postgres::{relay_connect_options, PgStore};
use txoutbox::{NewEvent, Outbox, OutboxTable};
use uuid::Uuid;

use self::cluster::{Pair, STANDBY_SLOT};
use crate::common::*;
use crate::wal_ownership_pg::config;

/// How the slot is made before the failover.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    /// By the relay: on 17+, a failover slot.
    ByRelay,
    /// By hand, without failover, as before 17: the standby has no copy.
    WithoutFailover,
}

/// What the check read.
#[derive(Debug)]
struct Outcome {
    committed: usize,
    delivered: usize,
    lost: usize,
    phantom: usize,
    duplicates: usize,
    order_violations: usize,
    /// From the promotion to the first delivery of an event committed after it (on the new
    /// primary): when delivery resumed, writers' reconnection included.
    resumed_after: Duration,
    /// From the promotion to the first delivery of any event (one the old primary's stream
    /// had read may still go out then).
    first_after: Duration,
    relay_runs: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_17_the_relay_streams_on_from_the_slot_synchronized_to_the_promoted_standby() {
    let major = cluster::major();
    if major < 17 {
        eprintln!("PostgreSQL {major} has no failover slots: the table path's test covers it");
        return;
    }
    let (o, slot) = failover(Slot::ByRelay).await;
    let synced = slot.synced;
    assert_eq!(
        slot.failover,
        Some(true),
        "the relay's slot is a failover slot"
    );
    assert_eq!(
        synced,
        Some(true),
        "the new primary's slot is the copy synchronized from the old (not created again)"
    );
    assert!(
        o.resumed_after <= Duration::from_secs(10),
        "delivery resumed {:?} after the promotion: {o:?}",
        o.resumed_after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_failover_slot_the_table_path_delivers_what_the_lost_slot_held() {
    let (o, slot) = failover(Slot::WithoutFailover).await;
    assert!(
        o.resumed_after <= Duration::from_secs(10),
        "delivery resumed {:?} after the promotion: {o:?}",
        o.resumed_after
    );
    assert_ne!(
        slot.synced,
        Some(true),
        "the new primary's slot was created there, not synchronized"
    );
}

/// The scenario; asserts lost 0, phantom 0, order violations 0, and returns the check's
/// figures and the new primary's slot.
async fn failover(how: Slot) -> (Outcome, wal::SlotInfo) {
    let t0 = Instant::now();
    let mut pair = Pair::start().await;
    eprintln!("{:>6} ms: primary and standby up", t0.elapsed().as_millis());
    let url = pair.url();
    let hosts = HostList::from_url(&url)
        .unwrap()
        .map_options(relay_connect_options);
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(hosts.find().await.unwrap());
    tokio::spawn(follow_primary(pool.clone(), hosts));
    let table = OutboxTable::default();
    txoutbox::migrate(&pool, &table).await.unwrap();
    let slot = wal::default_slot(&pool, &table).await.unwrap();
    if how == Slot::WithoutFailover {
        // As the relay does before it creates a slot: the slot decodes for the publication.
        wal::ensure_publication(&pool, &table).await.unwrap();
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&slot)
            .execute(&pool)
            .await
            .unwrap();
    }
    let rcfg = ReplicationConfig::from_options(&pool.connect_options())
        .unwrap()
        .follow_pool()
        .with_read_timeout(Duration::from_secs(5));

    // The relay, restarted as a supervisor restarts the daemon when it exits.
    let publisher = RecordingPublisher::new();
    let stop_relay = CancellationToken::new();
    let supervisor = {
        let (pool, table, rcfg, p, stop) = (
            pool.clone(),
            table.clone(),
            rcfg.clone(),
            publisher.clone(),
            stop_relay.clone(),
        );
        tokio::spawn(async move {
            let mut runs = 0u32;
            while !stop.is_cancelled() {
                runs += 1;
                let store =
                    PgStore::new(pool.clone(), table.clone()).with_replication(rcfg.clone());
                let cfg = config(&format!("failover-{runs}"), Source::Wal);
                let relay = txoutbox::testing::postgres::relay(store, p.boxed(), cfg);
                let r = relay.run(stop.clone()).await;
                eprintln!("{:>6} ms: relay run {runs} ended", t0.elapsed().as_millis());
                if let Err(e) = r {
                    eprintln!("relay run {runs}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            runs
        })
    };

    // Writers: one per aggregate, each commit after the last (order per aggregate is theirs).
    let stop_writers = CancellationToken::new();
    let confirmed: Arc<Mutex<Vec<(Uuid, Instant)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let (pool, table, stop, confirmed) = (
            pool.clone(),
            table.clone(),
            stop_writers.clone(),
            confirmed.clone(),
        );
        writers.push(tokio::spawn(async move {
            let outbox = Outbox::new(table);
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let e = NewEvent::new(
                    "order",
                    format!("a{w}"),
                    "placed",
                    &serde_json::json!({ "n": n }),
                )
                .unwrap();
                match outbox.enqueue(&pool, &e).await {
                    Ok(id) => {
                        confirmed.lock().unwrap().push((id, Instant::now()));
                        n += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    // The primary is gone: try again (through the pool, which follows it).
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }));
    }

    wait_until_for("events flowing", Duration::from_secs(60), || async {
        publisher.acked_count() >= 200
    })
    .await;
    if how == Slot::ByRelay {
        // The slot synchronized to the standby, and usable there once promoted (no longer
        // temporary). The copy becomes usable once the primary's slot moves past a record of
        // the running transactions, which the server writes every 15 s: written here at once.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let mut p = pair.primary.connect().await;
            sqlx::query("SELECT pg_log_standby_snapshot()")
                .execute(&mut p)
                .await
                .unwrap();
            let mut c = pair.standby.connect().await;
            let ready: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT FROM pg_replication_slots \
                 WHERE slot_name = $1 AND synced AND NOT temporary)",
            )
            .bind(&slot)
            .fetch_one(&mut c)
            .await
            .unwrap();
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the standby's copy of the slot is not ready after 90 s:\n{}",
                pair.standby.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    eprintln!(
        "{:>6} ms: events flowing, slot ready",
        t0.elapsed().as_millis()
    );
    let before = publisher.acked_count();
    wait_until_for(
        "more events after the sync",
        Duration::from_secs(30),
        || async { publisher.acked_count() >= before + 100 },
    )
    .await;

    pair.primary.kill();
    eprintln!("{:>6} ms: primary killed", t0.elapsed().as_millis());
    pair.standby.promote();
    let promoted = Instant::now();
    eprintln!("{:>6} ms: standby promoted", t0.elapsed().as_millis());
    let at_promotion = publisher.acked_count();
    wait_until_for(
        "a delivery after the promotion",
        Duration::from_secs(60),
        || async { publisher.acked_count() > at_promotion },
    )
    .await;
    let first_after = promoted.elapsed();
    eprintln!(
        "{:>6} ms: first delivery after the promotion",
        t0.elapsed().as_millis()
    );
    let resumed_at = publisher.acked_count();
    wait_until_for(
        "events from the new primary",
        Duration::from_secs(60),
        || async { publisher.acked_count() >= resumed_at + 200 },
    )
    .await;
    stop_writers.cancel();
    for w in writers {
        w.await.unwrap();
    }

    // Everything the new primary holds is published, and the broker has it.
    let mut c = pair.standby.connect().await;
    let committed: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM outbox_events ORDER BY seq")
        .fetch_all(&mut c)
        .await
        .unwrap();
    let committed_set: HashSet<Uuid> = committed.iter().copied().collect();
    wait_until_for(
        "every committed event delivered",
        Duration::from_secs(90),
        || {
            let acked: HashSet<Uuid> = publisher.acked_ids().into_iter().collect();
            let done = committed_set.is_subset(&acked);
            async move { done }
        },
    )
    .await;
    stop_relay.cancel();
    let relay_runs = supervisor.await.unwrap();
    let slot_now = wal::slot_info(
        &sqlx::PgPool::connect(&pair.standby.url()).await.unwrap(),
        &slot,
    )
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("no slot {slot} on the new primary"));

    let acked = publisher.acked();
    let acked_ids: HashSet<Uuid> = acked.iter().map(|m| m.id).collect();
    // Per aggregate, a first delivery after one of a higher seq is out of order.
    let mut order_violations = 0;
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let mut seen: HashSet<Uuid> = HashSet::new();
    for m in &acked {
        let first = seen.insert(m.id);
        let top = highest.entry(m.aggregate_id.as_str()).or_insert(i64::MIN);
        if first && m.seq < *top {
            order_violations += 1;
            eprintln!(
                "order violation: {} seq {} after seq {top} of {}",
                m.id, m.seq, m.aggregate_id
            );
        }
        *top = (*top).max(m.seq);
    }
    let writer_saw: Vec<(Uuid, Instant)> = confirmed.lock().unwrap().clone();
    // Delivery resumed: the first send of an event whose commit returned after the promotion.
    let resumed_after = writer_saw
        .iter()
        .filter(|(_, at)| *at > promoted)
        .filter_map(|(id, _)| publisher.send_times(*id).first().copied())
        .min()
        .map(|t| t.saturating_duration_since(promoted))
        .expect("an event committed after the promotion was delivered");
    let outcome = Outcome {
        committed: committed.len(),
        delivered: acked.len(),
        lost: committed_set.difference(&acked_ids).count(),
        phantom: acked_ids.difference(&committed_set).count(),
        duplicates: acked.len() - acked_ids.len(),
        order_violations,
        resumed_after,
        first_after,
        relay_runs,
    };
    eprintln!(
        "failover on PostgreSQL {} ({how:?}, slot failover={:?} synced={:?}): committed {}, \
         delivered {}, lost {}, phantom {}, duplicates {}, order violations {}; after the \
         promotion: first delivery {} ms, first delivery of an event committed on the new \
         primary {} ms; relay runs {}",
        pair.major,
        slot_now.failover,
        slot_now.synced,
        outcome.committed,
        outcome.delivered,
        outcome.lost,
        outcome.phantom,
        outcome.duplicates,
        outcome.order_violations,
        outcome.first_after.as_millis(),
        outcome.resumed_after.as_millis(),
        outcome.relay_runs
    );
    let writer_lost = writer_saw
        .iter()
        .map(|(id, _)| id)
        .filter(|id| !committed_set.contains(*id))
        .count();
    assert_eq!(
        writer_lost, 0,
        "commits the writers saw are on the new primary (synchronous standby)"
    );
    assert_eq!(outcome.lost, 0, "{outcome:?}\n{}", pair.standby.log_tail());
    assert_eq!(outcome.phantom, 0, "{outcome:?}");
    assert_eq!(outcome.order_violations, 0, "{outcome:?}");
    assert!(
        STANDBY_SLOT != slot,
        "the standby's physical slot and the relay's are different slots"
    );
    (outcome, slot_now)
}
