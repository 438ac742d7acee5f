//! Who may read an outbox through the WAL: a replication slot belongs to one database (slot
//! names are the server's, shared by all its databases), and one table has one source (a WAL
//! relay beside a table relay, or beside a WAL relay of another slot, would deliver every
//! event twice). Against the real server; each test has a schema (and, for two databases, a
//! database) of its own.
#![allow(clippy::unwrap_used)]

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use txoutbox::relay::{RelayConfig, RelayError, RelayHandle, Source};
use txoutbox::store::postgres::wal::{self, stream::ReplicationConfig};
use txoutbox::store::postgres::{relay_connect_options, PgStore};
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

use crate::common::*;

pub(crate) fn config(relay_id: &str, source: Source) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.source = source;
    c.relay_id = relay_id.to_string();
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(200);
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

fn event(i: usize) -> NewEvent {
    NewEvent::new("order", "a", "order.placed", &serde_json::json!({ "i": i })).unwrap()
}

/// A second database on the same server, with the harness's schema and table migrated in
/// it: same schema, same table, same default publication name.
pub(crate) struct OtherDatabase {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl OtherDatabase {
    async fn new(h: &PgHarness) -> Self {
        let db = Self::create(h, None).await;
        txoutbox::migrate(&db.pool, &h.table).await.unwrap();
        db
    }

    /// The database made, not migrated; with `encoding`, in that server encoding (C locale).
    pub(crate) async fn create(h: &PgHarness, encoding: Option<&str>) -> Self {
        let name = format!(
            "txo_db_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let with = encoding.map_or_else(String::new, |e| {
            format!(" WITH ENCODING '{e}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        });
        sqlx::query(&format!("CREATE DATABASE \"{name}\"{with}"))
            .execute(&h.pool)
            .await
            .unwrap();
        let mut url = url::Url::parse(&database_url()).unwrap();
        url.set_path(&name);
        let url = url.to_string();
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(relay_connect_options(
                PgConnectOptions::from_str(&url).unwrap(),
            ))
            .await
            .unwrap();
        Self { name, url, pool }
    }

    pub(crate) fn store(&self, h: &PgHarness) -> PgStore {
        PgStore::new(self.pool.clone(), h.table.clone())
            .with_replication(ReplicationConfig::from_url(&self.url).unwrap())
    }

    /// Drop the database and the slots of it (a slot keeps the server's WAL).
    pub(crate) async fn drop(self, h: &PgHarness) {
        self.pool.close().await;
        for _ in 0..50 {
            let _ = sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE database = $1 AND active_pid IS NOT NULL",
            )
            .bind(&self.name)
            .execute(&h.pool)
            .await;
            let dropped = sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = $1",
            )
            .bind(&self.name)
            .execute(&h.pool)
            .await;
            if dropped.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = sqlx::query(&sql).execute(&h.pool).await {
            eprintln!("cleanup of database {} failed: {e}", self.name);
        }
    }
}

async fn shutdown(handle: RelayHandle) {
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay failed");
}

/// The slots of the server that belong to database `db` (by name of the database).
async fn slots_of(pool: &PgPool, db: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT slot_name::text FROM pg_replication_slots WHERE database = $1 ORDER BY 1",
    )
    .bind(db)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn current_database(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_databases_with_the_same_table_each_deliver_their_own_events_from_their_own_slot() {
    let h = PgHarness::new().await;
    let other = OtherDatabase::new(&h).await;
    let (pa, pb) = (RecordingPublisher::new(), RecordingPublisher::new());
    let a = txoutbox::testing::postgres::relay(
        h.pool_store(),
        pa.boxed(),
        config("wal-db-a", Source::Wal),
    )
    .spawn();
    let b = txoutbox::testing::postgres::relay(
        other.store(&h),
        pb.boxed(),
        config("wal-db-b", Source::Wal),
    )
    .spawn();
    // Each relay has a slot of its own database, named for it: the second did not take the
    // first's.
    let here = current_database(&h.pool).await;
    let sa = wal::slot_name(&here, &h.table);
    let sb = wal::slot_name(&other.name, &h.table);
    assert_ne!(sa, sb);
    wait_until("a slot in each database", || async {
        slots_of(&h.pool, &here).await.contains(&sa)
            && slots_of(&h.pool, &other.name).await == [sb.clone()]
    })
    .await;

    let outbox = h.outbox();
    for i in 0..10 {
        outbox.enqueue(&h.pool, &event(i)).await.unwrap();
        outbox.enqueue(&other.pool, &event(100 + i)).await.unwrap();
    }
    wait_until("each relay delivered its database's 10 events", || async {
        pa.acked_ids().len() >= 10 && pb.acked_ids().len() >= 10
    })
    .await;
    shutdown(a).await;
    shutdown(b).await;
    let payload_i = |p: &RecordingPublisher| -> Vec<i64> {
        let mut v: Vec<i64> = p
            .acked()
            .iter()
            .map(|m| {
                serde_json::from_slice::<serde_json::Value>(&m.body).unwrap()["i"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    assert_eq!(payload_i(&pa), (0..10).collect::<Vec<_>>());
    assert_eq!(payload_i(&pb), (100..110).collect::<Vec<_>>());
    other.drop(&h).await;
    h.cleanup().await;
}

/// Start `relay` and expect it to refuse at once, naming why: a membership conflict.
async fn refused(relay: RelayHandle, what: &str) -> String {
    let r = tokio::time::timeout(Duration::from_secs(20), relay.join()).await;
    match r {
        Ok(Err(RelayError::Store(e @ txoutbox::Error::SourceConflict { .. }))) => e.to_string(),
        Ok(other) => panic!("{what}: expected a refusal, got {other:?}"),
        Err(_) => panic!("{what}: the relay started and ran on"),
    }
}

/// Wait until a relay of the table is registered as alive.
async fn registered(h: &PgHarness, relay_id: &str) {
    let sql = format!(
        "SELECT count(*) FROM \"{}\".outbox_relays WHERE relay_id = $1 AND alive_until > now()",
        h.schema
    );
    wait_until("the relay registered", || async {
        sqlx::query_scalar::<_, i64>(&sql)
            .bind(relay_id)
            .fetch_one(&h.pool)
            .await
            .unwrap_or(0)
            == 1
    })
    .await;
}

#[tokio::test]
async fn a_wal_relay_refuses_to_start_beside_a_table_relay_of_the_same_table() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let table = txoutbox::testing::postgres::relay(
        h.pool_store(),
        p.boxed(),
        config("tbl-1", Source::Table),
    )
    .spawn();
    registered(&h, "tbl-1").await;
    let wal =
        txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), config("wal-1", Source::Wal))
            .spawn();
    let e = refused(wal, "a WAL relay beside a table relay").await;
    assert!(e.contains("tbl-1"), "names the other relay: {e}");
    shutdown(table).await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_table_relay_refuses_to_start_beside_a_running_wal_relay() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let wal =
        txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), config("wal-2", Source::Wal))
            .spawn();
    // The WAL relay delivers: it runs.
    let first = h.outbox().enqueue(&h.pool, &event(1)).await.unwrap();
    wait_until("the WAL relay delivered", || async {
        p.acked_ids().contains(&first)
    })
    .await;
    let table = txoutbox::testing::postgres::relay(
        h.pool_store(),
        p.boxed(),
        config("tbl-2", Source::Table),
    )
    .spawn();
    let e = refused(table, "a table relay beside a WAL relay").await;
    assert!(e.contains("wal-2"), "names the other relay: {e}");
    shutdown(wal).await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_second_wal_relay_with_another_slot_refuses_to_start() {
    let h = PgHarness::new().await;
    let p = RecordingPublisher::new();
    let first =
        txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), config("wal-3", Source::Wal))
            .spawn();
    let e1 = h.outbox().enqueue(&h.pool, &event(1)).await.unwrap();
    wait_until("the first WAL relay delivered", || async {
        p.acked_ids().contains(&e1)
    })
    .await;
    let slot = format!(
        "txo_other_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let mut cfg = config("wal-4", Source::Wal);
    cfg.slot = Some(slot.clone());
    let second = txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), cfg).spawn();
    let e = refused(second, "a second WAL relay of another slot").await;
    assert!(e.contains("wal-3"), "names the other relay: {e}");
    shutdown(first).await;
    let _ = sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1",
    )
    .bind(&slot)
    .execute(&h.pool)
    .await;
    h.cleanup().await;
}
