//! The conformance harness for SQLite: a database file of its own per test in the temporary
//! directory, removed at the end.

use std::path::PathBuf;

use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use super::{Harness, Malformed, RawRow, RowState};
use crate::store::sqlite::schema::NOW_MS;
use crate::store::sqlite::{connect, SqliteStore, Wakeup};
use crate::store::Retention;
use crate::{migrate, NewEvent, Outbox, OutboxTable};

/// A fresh SQLite database file per test in the temporary directory, migrated; removed (with
/// its `-wal` and `-shm` files) by [`Harness::cleanup`], or on drop if the test panicked first.
pub struct SqliteHarness {
    /// The database file.
    pub path: PathBuf,
    /// `sqlite://` and the file's path.
    pub url: String,
    /// A pool on the file, opened as the store opens it.
    pub pool: SqlitePool,
    /// The outbox table (the default name).
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
        let mut tx = self.pool.begin().await.unwrap();
        outbox.enqueue(&mut *tx, &events[0]).await.unwrap();
        drop(tx); // dropped without a commit: rolled back as well
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

    async fn insert_malformed(&self, aggregate_id: &str) -> Vec<Malformed> {
        // (what, the column and value set, what last_error must say)
        let kinds: &[(&str, &str, &str, &str)] = &[
            (
                "id not a UUID",
                "id",
                "'not-a-uuid'",
                "id 'not-a-uuid' is not a UUID",
            ),
            ("id a blob", "id", "X'00ff'", "id is BLOB, not TEXT"),
            (
                "event_type a blob",
                "event_type",
                "X'ff'",
                "event_type is BLOB, not TEXT",
            ),
            (
                "available_at text",
                "available_at",
                "'later'",
                "available_at is TEXT, not INTEGER",
            ),
            (
                "created_at text",
                "created_at",
                "'soon'",
                "created_at is TEXT, not INTEGER",
            ),
            (
                "created_at real",
                "created_at",
                "1.5",
                "created_at is REAL, not INTEGER",
            ),
            (
                "created_at past chrono's range",
                "created_at",
                "9000000000000000000",
                "created_at 9000000000000000000 ms is out of range",
            ),
            (
                "attempts past i32",
                "attempts",
                "5000000000",
                "attempts 5000000000",
            ),
            (
                "headers an array",
                "headers",
                "'[1, 2]'",
                "headers is a JSON array, not an object",
            ),
            (
                "headers null",
                "headers",
                "'null'",
                "headers is a JSON null, not an object",
            ),
        ];
        let mut out = Vec::new();
        for &(what, col, value, expect) in kinds {
            // The column named twice would be an error: a kind may replace event_type.
            let (event_col, event_val) = if col == "event_type" {
                ("", "")
            } else {
                (", event_type", ", 'bad.row'")
            };
            let sql = format!(
                "INSERT INTO {} (aggregate_type, aggregate_id, payload{event_col}, {col}) \
                 VALUES ('bad', ?1, '{{}}'{event_val}, {value}) RETURNING seq",
                self.table.table().quoted()
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
                retry_resets: col == "attempts" || col == "available_at",
            });
        }
        out
    }

    async fn insert_never_due(&self) -> i64 {
        let sql = format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, available_at) \
             VALUES ('later', 'never', 'later.row', '{{}}', 9223372036854775807) RETURNING seq",
            self.table.table().quoted()
        );
        sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn raw_rows(&self) -> Vec<RawRow> {
        let sql = format!(
            "SELECT seq, quote(id) AS id, dead_at IS NOT NULL AS dead, processed_at IS NOT NULL AS processed, \
             coalesce(locked_until > {NOW_MS}, 0) AS leased, last_error FROM {} ORDER BY seq",
            self.table.table().quoted()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .iter()
            .map(|r| {
                // quote(): 'text' or X'hex'; a UUID comes back as its text.
                let id: String = r.get("id");
                RawRow {
                    seq: r.get("seq"),
                    id: id.trim_matches('\'').to_string(),
                    dead: r.get("dead"),
                    processed: r.get("processed"),
                    leased: r.get("leased"),
                    last_error: r.get("last_error"),
                }
            })
            .collect()
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn table(&self) -> &OutboxTable {
        &self.table
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
