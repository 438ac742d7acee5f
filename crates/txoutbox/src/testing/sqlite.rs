//! The conformance harness for SQLite: a database file of its own per test in the temporary
//! directory, removed at the end.

use std::path::PathBuf;

use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use super::{Harness, RowState};
use crate::store::sqlite::schema::NOW_MS;
use crate::store::sqlite::{connect, SqliteStore, Wakeup};
use crate::store::Retention;
use crate::{migrate, NewEvent, Outbox, OutboxTable};

pub struct SqliteHarness {
    pub path: PathBuf,
    pub url: String,
    pub pool: SqlitePool,
    pub table: OutboxTable,
    cleaned: bool,
}

impl SqliteHarness {
    fn remove_files(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

fn ts(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap()
}

#[async_trait::async_trait(?Send)]
impl Harness for SqliteHarness {
    type Store = SqliteStore;

    async fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "txo_conf_{}.db",
            &Uuid::new_v4().simple().to_string()[..16]
        ));
        let url = format!("sqlite://{}", path.display());
        let table = OutboxTable::default();
        let pool = connect(&url, &table, 5, &Wakeup::default()).await.unwrap();
        migrate(&pool, &table).await.unwrap();
        Self {
            path,
            url,
            pool,
            table,
            cleaned: false,
        }
    }

    async fn store(&self, retention: Retention) -> SqliteStore {
        SqliteStore::open(&self.url, self.table.clone(), 5, retention)
            .await
            .unwrap()
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
    }

    async fn rows(&self) -> Vec<RowState> {
        let sql = format!(
            "SELECT id, seq, event_type, attempts, attempts_unavailable, available_at, locked_by, \
             locked_until, lock_token, last_error, processed_at, dead_at, {NOW_MS} AS db_now \
             FROM {} ORDER BY seq",
            self.table.table().quoted()
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
                    .get::<Option<&str>, _>("lock_token")
                    .map(|t| Uuid::parse_str(t).unwrap()),
                last_error: r.get("last_error"),
                processed_at: r.get::<Option<i64>, _>("processed_at").map(ts),
                dead_at: r.get::<Option<i64>, _>("dead_at").map(ts),
                db_now: ts(r.get("db_now")),
            })
            .collect()
    }

    async fn make_available(&self) {
        sqlx::query(&format!(
            "UPDATE {} SET available_at = {NOW_MS}",
            self.table.table().quoted()
        ))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    async fn cleanup(mut self) {
        self.cleaned = true;
        self.pool.close().await;
        self.remove_files();
    }
}

impl Drop for SqliteHarness {
    fn drop(&mut self) {
        if !self.cleaned {
            self.remove_files();
        }
    }
}
