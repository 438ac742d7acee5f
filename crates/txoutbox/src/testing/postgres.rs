//! The conformance harness for PostgreSQL: a schema of its own per test in the database at
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), dropped at the end.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Row;
use uuid::Uuid;

use super::{Harness, Malformed, RawRow, RowState};
use crate::store::postgres::{relay_connect_options, PgStore};
use crate::store::Retention;
use crate::{migrate, NewEvent, Outbox, OutboxTable};

/// The server the PostgreSQL harness uses: `DATABASE_URL`, or
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn pool(max: u32) -> PgPool {
    let opts = PgConnectOptions::from_str(&database_url())
        .unwrap_or_else(|e| panic!("invalid DATABASE_URL {}: {e}", database_url()));
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(relay_connect_options(opts))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", database_url()))
}

/// A fresh PostgreSQL schema per test (`txo_conf_<random>`), migrated; dropped by
/// [`Harness::cleanup`], or on drop if the test panicked first. Beside the suite's
/// [`Harness`], it serves the PostgreSQL-only tests (see its inherent methods).
pub struct PgHarness {
    /// A pool on the server, with the relay's connection options.
    pub pool: PgPool,
    /// The test's schema name.
    pub schema: String,
    /// `outbox_events` in the test's schema.
    pub table: OutboxTable,
    cleaned: bool,
}

async fn drop_schema(pool: &PgPool, schema: &str) {
    // The WAL source's slot and publication of the test's table are objects of the database,
    // not of the schema: a slot left behind would keep the server's WAL for ever.
    #[cfg(feature = "wal")]
    if let Ok(table) = OutboxTable::new(schema, "outbox_events") {
        // The table's slot in this database, under this release's name and an older one's.
        let database: String = sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(pool)
            .await
            .unwrap_or_default();
        let slots = vec![
            crate::store::postgres::wal::slot_name(&database, &table),
            crate::store::postgres::wal::legacy_slot_name(&table),
        ];
        // A stream still open on it (a relay a test aborted) is ended first; the server may
        // take a moment to release the slot.
        let mut tries = 0;
        loop {
            let _ = sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = ANY($1) AND database = current_database() \
                   AND active_pid IS NOT NULL",
            )
            .bind(&slots)
            .execute(pool)
            .await;
            let dropped = sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = ANY($1) AND database = current_database()",
            )
            .bind(&slots)
            .execute(pool)
            .await;
            match dropped {
                Ok(_) => break,
                Err(e) if tries >= 50 => {
                    eprintln!("cleanup of replication slots {slots:?} failed: {e}");
                    break;
                }
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
        let publication = crate::store::postgres::wal::publication_name(&table);
        let sql = format!("DROP PUBLICATION IF EXISTS \"{publication}\"");
        if let Err(e) = sqlx::query(&sql).execute(pool).await {
            eprintln!("cleanup of publication {publication} failed: {e}");
        }
    }
    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let first = sqlx::query(&sql).execute(pool).await;
    let locked =
        matches!(&first, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03"));
    let outcome = if locked {
        // After a panic (the drop then runs under a lock timeout: 55P03), a session of the
        // test's own pool may still hold locks in the schema: a transaction the test left
        // open, which its runtime, being torn down, never rolled back. The schema is the
        // test's own, so are its sessions: they are ended, and the drop tried again.
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
             JOIN pg_class c ON c.oid = l.relation \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND l.pid <> pg_backend_pid() \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind(schema)
        .execute(pool)
        .await;
        sqlx::query(&sql)
            .execute(pool)
            .await
            .map_err(|e| format!("{e} (after ending the sessions that held its locks)"))
    } else {
        first.map_err(|e| e.to_string())
    };
    if let Err(e) = outcome {
        eprintln!("cleanup of schema {schema} failed: {e}");
    }
}

/// What the PostgreSQL-only tests need beyond [`Harness`]: a schema not migrated yet, a store
/// on the harness's own pool, plain SQL, and counts of the outbox's rows by condition.
impl PgHarness {
    /// A schema name reserved for this test (`txo_conf_<random>`), neither created nor
    /// migrated; dropped like that of [`Harness::new`] if something created it.
    pub async fn unmigrated() -> Self {
        let schema = format!("txo_conf_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let table = OutboxTable::new(&schema, "outbox_events").unwrap();
        Self {
            pool: pool(10).await,
            schema,
            table,
            cleaned: false,
        }
    }

    /// The name of the test table's replication slot in the test database (what a WAL relay
    /// reads without `--slot`).
    #[cfg(feature = "wal")]
    pub async fn slot(&self) -> String {
        crate::store::postgres::wal::default_slot(&self.pool, &self.table)
            .await
            .expect("the default slot's name")
    }

    /// The write side on the test's table.
    pub fn outbox(&self) -> Outbox {
        Outbox::new(self.table.clone())
    }

    /// A store on the harness's own pool (where [`Harness::store`] opens a pool of its own).
    /// A WAL relay on it streams the slot over a replication connection to
    /// [`database_url`].
    pub fn pool_store(&self) -> PgStore {
        self.pool_store_with(Retention::Mark)
    }

    /// [`PgHarness::pool_store`] with the given retention.
    pub fn pool_store_with(&self, retention: Retention) -> PgStore {
        let store = self.pool_store_sql(retention);
        #[cfg(feature = "wal")]
        let store = store.with_replication(
            crate::store::postgres::wal::stream::ReplicationConfig::from_url(&database_url())
                .expect("DATABASE_URL is a valid replication URL"),
        );
        store
    }

    /// [`PgHarness::pool_store_with`] without replication settings: a WAL relay on it reads
    /// the slot through SQL.
    pub fn pool_store_sql(&self, retention: Retention) -> PgStore {
        PgStore::with_retention(self.pool.clone(), self.table.clone(), retention)
    }

    /// Run `sql` (one or more statements, no parameters) on the harness's pool.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn count_in(&self, table: &str, cond: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table} WHERE {cond}");
        sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `SELECT count(*) FROM <outbox> WHERE <cond>`.
    pub async fn count_where(&self, cond: &str) -> i64 {
        self.count_in(&self.table.qualified(), cond).await
    }

    /// `SELECT count(*) FROM <relays> WHERE <cond>` (the relay registry).
    pub async fn count_relays(&self, cond: &str) -> i64 {
        self.count_in(&self.table.derived("relays"), cond).await
    }

    /// `SELECT count(*) FROM <partitions> WHERE <cond>` (the ordered mode's partitions).
    pub async fn count_partitions(&self, cond: &str) -> i64 {
        self.count_in(&self.table.derived("partitions"), cond).await
    }

    /// The rows of the waiters table (relays waiting for a commit's notification).
    pub async fn waiter_count(&self) -> i64 {
        self.count_in(&self.table.derived("waiters"), "true").await
    }

    /// Every row of the outbox.
    pub async fn total(&self) -> i64 {
        self.count_where("true").await
    }

    /// The published rows.
    pub async fn processed(&self) -> i64 {
        self.count_where("processed_at IS NOT NULL").await
    }

    /// The rows neither published nor dead-lettered.
    pub async fn pending(&self) -> i64 {
        self.count_where("processed_at IS NULL AND dead_at IS NULL")
            .await
    }

    /// The dead letters.
    pub async fn dead(&self) -> i64 {
        self.count_where("dead_at IS NOT NULL AND processed_at IS NULL")
            .await
    }

    /// The rows with any column of a row lease set.
    pub async fn locked(&self) -> i64 {
        self.count_where(
            "locked_by IS NOT NULL OR locked_until IS NOT NULL OR lock_token IS NOT NULL",
        )
        .await
    }
}

#[async_trait::async_trait(?Send)]
impl Harness for PgHarness {
    type Store = PgStore;

    async fn new() -> Self {
        let h = Self::unmigrated().await;
        let report = migrate(&h.pool, &h.table)
            .await
            .unwrap_or_else(|e| panic!("migrate {}: {e}", h.table.display()));
        assert_eq!(
            report.applied,
            (1..=crate::SCHEMA_VERSION).collect::<Vec<_>>(),
            "a fresh schema gets every migration"
        );
        h
    }

    async fn store(&self, retention: Retention) -> PgStore {
        PgStore::with_retention(pool(5).await, self.table.clone(), retention)
    }

    async fn enqueue(&self, events: &[NewEvent]) -> Vec<Uuid> {
        let mut tx = self.pool.begin().await.unwrap();
        let ids = Outbox::new(self.table.clone())
            .enqueue_many(&mut *tx, events)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        ids
    }

    async fn enqueue_rolled_back(&self, events: &[NewEvent]) {
        let outbox = Outbox::new(self.table.clone());
        let mut tx = self.pool.begin().await.unwrap();
        outbox
            .enqueue(&mut *tx, &events[0].clone().with_id(Uuid::new_v4()))
            .await
            .unwrap();
        outbox.enqueue_many(&mut *tx, events).await.unwrap();
        tx.rollback().await.unwrap();
        let mut tx = self.pool.begin().await.unwrap();
        outbox.enqueue(&mut *tx, &events[0]).await.unwrap();
        drop(tx); // dropped without a commit: rolled back as well
    }

    async fn rows(&self) -> Vec<RowState> {
        let sql = format!(
            "SELECT id, seq, event_type, attempts, attempts_unavailable, available_at, locked_by, \
             locked_until, lock_token, last_error, processed_at, dead_at, now() AS db_now \
             FROM {} ORDER BY seq",
            self.table.qualified()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| RowState {
                id: r.get("id"),
                seq: r.get("seq"),
                event_type: r.get("event_type"),
                attempts: r.get("attempts"),
                attempts_unavailable: r.get("attempts_unavailable"),
                available_at: r.get("available_at"),
                locked_by: r.get("locked_by"),
                locked_until: r.get("locked_until"),
                lock_token: r.get("lock_token"),
                last_error: r.get("last_error"),
                processed_at: r.get("processed_at"),
                dead_at: r.get("dead_at"),
                db_now: r.get("db_now"),
            })
            .collect()
    }

    async fn make_available(&self) {
        sqlx::query(&format!(
            "UPDATE {} SET available_at = now()",
            self.table.qualified()
        ))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn insert_malformed(&self, aggregate_id: &str) -> Vec<Malformed> {
        // (what, the columns and values set, what last_error must say)
        let kinds: &[(&str, &str, &str, &str)] = &[
            (
                "created_at infinity",
                "created_at",
                "'infinity'",
                "created_at is infinity",
            ),
            (
                "created_at -infinity",
                "created_at",
                "'-infinity'",
                "created_at is -infinity",
            ),
            (
                "available_at -infinity",
                "available_at",
                "'-infinity'",
                "available_at is -infinity",
            ),
            (
                "created_at past chrono's range",
                "created_at",
                "'290000-01-01 00:00:00+00'",
                "created_at is out of range",
            ),
            (
                "headers an array",
                "headers",
                "'[1, 2]'",
                "headers is a JSON array, not an object",
            ),
            (
                "headers a string",
                "headers",
                "'\"x\"'",
                "headers is a JSON string, not an object",
            ),
        ];
        let mut out = Vec::new();
        for &(what, col, value, expect) in kinds {
            let sql = format!(
                "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, {col}) \
                 VALUES ('bad', $1, 'bad.row', '{{}}', {value}) RETURNING seq",
                self.table.qualified()
            );
            let seq: i64 = sqlx::query_scalar(&sql)
                .bind(aggregate_id)
                .fetch_one(&self.pool)
                .await
                .unwrap();
            out.push(Malformed {
                seq,
                what,
                expect,
                retry_resets: col == "available_at",
            });
        }
        out
    }

    async fn insert_never_due(&self) -> i64 {
        let sql = format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, available_at) \
             VALUES ('later', 'never', 'later.row', '{{}}', 'infinity') RETURNING seq",
            self.table.qualified()
        );
        sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn raw_rows(&self) -> Vec<RawRow> {
        let sql = format!(
            "SELECT seq, id::text AS id, dead_at IS NOT NULL AS dead, processed_at IS NOT NULL AS processed, \
             coalesce(locked_until > now(), false) AS leased, last_error FROM {} ORDER BY seq",
            self.table.qualified()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| RawRow {
                seq: r.get("seq"),
                id: r.get("id"),
                dead: r.get("dead"),
                processed: r.get("processed"),
                leased: r.get("leased"),
                last_error: r.get("last_error"),
            })
            .collect()
    }

    fn url(&self) -> String {
        database_url()
    }

    fn table(&self) -> &OutboxTable {
        &self.table
    }

    async fn cleanup(mut self) {
        self.cleaned = true;
        drop_schema(&self.pool, &self.schema).await;
        self.pool.close().await;
    }
}

impl Drop for PgHarness {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // The check panicked before `cleanup`: drop the schema from a thread of our own (the
        // test's runtime cannot be blocked on).
        let schema = self.schema.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(pool) = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&database_url())
                    .await
                {
                    let _ = sqlx::query("SET lock_timeout = '5s'").execute(&pool).await;
                    drop_schema(&pool, &schema).await;
                    pool.close().await;
                }
            });
        })
        .join();
    }
}

/// A relay over a PostgreSQL store from its table or, when `config.source` says
/// [`Source::Wal`](crate::relay::Source::Wal), from its WAL
/// ([`Relay::with_wal`](crate::relay::Relay::with_wal) of [`PgStore::wal`]): what the tests
/// that run one scenario on both sources build their relays with.
pub fn relay(
    store: PgStore,
    publisher: Box<dyn crate::publish::Publisher>,
    config: crate::relay::RelayConfig,
) -> crate::relay::Relay {
    #[cfg(feature = "wal")]
    if config.source == crate::relay::Source::Wal {
        let wal = store.wal();
        return crate::relay::Relay::new(store, publisher, config).with_wal(wal);
    }
    crate::relay::Relay::new(store, publisher, config)
}
