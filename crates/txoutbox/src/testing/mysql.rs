//! The conformance harness for MySQL / MariaDB: a database of its own per test
//! (`txo_conf_<random>`) on the server of `MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`), dropped at the end.

use std::time::Duration;

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::Row;
use uuid::Uuid;

use super::{Harness, Malformed, RawRow, RowState};
use crate::store::mysql::schema::NOW_MS;
use crate::store::mysql::{MySqlStore, Wakeup};
use crate::store::Retention;
use crate::{migrate, NewEvent, Outbox, OutboxTable};

/// The server the MySQL harness uses: `MYSQL_URL`, or `mysql://root@127.0.0.1:3306/test`.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The server's URL with `database` as its path.
pub fn url_for(database: &str) -> String {
    let mut u = url::Url::parse(&mysql_url()).unwrap();
    u.set_path(&format!("/{database}"));
    u.to_string()
}

async fn pool(url: &str, max: u32) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

async fn drop_database(database: &str) {
    let admin = pool(&url_for(""), 1).await;
    if let Err(e) = sqlx::query(&format!("DROP DATABASE IF EXISTS `{database}`"))
        .execute(&admin)
        .await
    {
        eprintln!("cleanup of database {database} failed: {e}");
    }
    admin.close().await;
}

/// A fresh MySQL/MariaDB database per test (`txo_conf_<random>`), migrated; dropped by
/// [`Harness::cleanup`], or on drop if the test panicked first.
pub struct MySqlHarness {
    /// A pool on the test's database.
    pub pool: MySqlPool,
    /// The test's database name.
    pub database: String,
    /// The outbox table (the default name, in the test's database).
    pub table: OutboxTable,
    cleaned: bool,
}

impl MySqlHarness {
    /// The test's database, created but not migrated (for tests of `migrate` itself);
    /// dropped like that of [`Harness::new`].
    pub async fn unmigrated() -> Self {
        let database = format!("txo_conf_{}", &Uuid::new_v4().simple().to_string()[..16]);
        let admin = pool(&url_for(""), 1).await;
        sqlx::query(&format!("CREATE DATABASE `{database}`"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        Self {
            pool: pool(&url_for(&database), 10).await,
            database,
            table: OutboxTable::default(),
            cleaned: false,
        }
    }
}

#[async_trait::async_trait(?Send)]
impl Harness for MySqlHarness {
    type Store = MySqlStore;

    async fn new() -> Self {
        let h = Self::unmigrated().await;
        migrate(&h.pool, &h.table).await.unwrap();
        h
    }

    async fn store(&self, retention: Retention) -> MySqlStore {
        MySqlStore::with_retention(
            pool(&url_for(&self.database), 5).await,
            self.table.clone(),
            Wakeup::default(),
            retention,
        )
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
        let ts = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap();
        let sql = format!(
            "SELECT id, seq, event_type, attempts, attempts_unavailable, available_at, locked_by, \
             locked_until, lock_token, last_error, processed_at, dead_at, {NOW_MS} AS db_now \
             FROM `{}` ORDER BY seq",
            self.table.table().as_str()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| RowState {
                id: Uuid::parse_str(r.get("id")).unwrap(),
                seq: r.get("seq"),
                event_type: r.get("event_type"),
                attempts: r.get("attempts"),
                attempts_unavailable: r.get("attempts_unavailable"),
                available_at: ts(r.get("available_at")),
                locked_by: r.get("locked_by"),
                locked_until: r.get::<Option<i64>, _>("locked_until").map(ts),
                lock_token: r
                    .get::<Option<String>, _>("lock_token")
                    .map(|t| Uuid::parse_str(&t).unwrap()),
                last_error: r.get("last_error"),
                processed_at: r.get::<Option<i64>, _>("processed_at").map(ts),
                dead_at: r.get::<Option<i64>, _>("dead_at").map(ts),
                db_now: ts(r.get("db_now")),
            })
            .collect()
    }

    async fn make_available(&self) {
        sqlx::query(&format!(
            "UPDATE `{}` SET available_at = {NOW_MS}",
            self.table.table().as_str()
        ))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn insert_malformed(&self, aggregate_id: &str) -> Vec<Malformed> {
        // (what, the column and value set, what last_error must say)
        let kinds: &[(&str, &str, &str, &str)] = &[
            (
                "id not a UUID",
                "id",
                "'not-a-uuid'",
                "id 'not-a-uuid' is not a UUID",
            ),
            ("id empty", "id", "''", "id '' is not a UUID"),
            (
                "created_at past chrono's range",
                "created_at",
                "9223372036854775807",
                "created_at 9223372036854775807 ms is out of range",
            ),
            (
                "created_at before chrono's range",
                "created_at",
                "-9223372036854775807",
                "created_at -9223372036854775807 ms is out of range",
            ),
            (
                "available_at before chrono's range",
                "available_at",
                "-9223372036854775807",
                "available_at -9223372036854775807 ms is out of range",
            ),
            (
                "headers an array",
                "headers",
                "'[1, 2]'",
                "headers is a JSON array, not an object",
            ),
            (
                "headers a number",
                "headers",
                "'7'",
                "headers is a JSON number, not an object",
            ),
        ];
        let mut out = Vec::new();
        for &(what, col, value, expect) in kinds {
            let sql = format!(
                "INSERT INTO `{}` (aggregate_type, aggregate_id, event_type, payload, {col}) \
                 VALUES ('bad', ?, 'bad.row', '{{}}', {value})",
                self.table.table().as_str()
            );
            let done = sqlx::query(&sql)
                .bind(aggregate_id)
                .execute(&self.pool)
                .await
                .unwrap();
            let seq = i64::try_from(done.last_insert_id()).unwrap();
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
            "INSERT INTO `{}` (aggregate_type, aggregate_id, event_type, payload, available_at) \
             VALUES ('later', 'never', 'later.row', '{{}}', 9223372036854775807)",
            self.table.table().as_str()
        );
        let done = sqlx::query(&sql).execute(&self.pool).await.unwrap();
        i64::try_from(done.last_insert_id()).unwrap()
    }

    async fn raw_rows(&self) -> Vec<RawRow> {
        let sql = format!(
            "SELECT seq, id, CAST(dead_at IS NOT NULL AS SIGNED) AS dead, \
             CAST(processed_at IS NOT NULL AS SIGNED) AS processed, \
             CAST(coalesce(locked_until > {NOW_MS}, 0) AS SIGNED) AS leased, last_error \
             FROM `{}` ORDER BY seq",
            self.table.table().as_str()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| RawRow {
                seq: r.get("seq"),
                id: r.get("id"),
                dead: r.get::<i64, _>("dead") != 0,
                processed: r.get::<i64, _>("processed") != 0,
                leased: r.get::<i64, _>("leased") != 0,
                last_error: r.get("last_error"),
            })
            .collect()
    }

    fn url(&self) -> String {
        url_for(&self.database)
    }

    fn table(&self) -> &OutboxTable {
        &self.table
    }

    async fn cleanup(mut self) {
        self.cleaned = true;
        self.pool.close().await;
        drop_database(&self.database).await;
    }
}

impl Drop for MySqlHarness {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let database = self.database.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(drop_database(&database));
            }
        })
        .join();
    }
}
