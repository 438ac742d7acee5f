//! Test support for the PostgreSQL integration tests: a fresh schema per test, a scriptable
//! recording publisher, and helpers that wait on observable state with a deadline.
//!
//! Database: `DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;
use txoutbox::publish::{ready_ack, Ack, Message, PublishError, Publisher};
use txoutbox::store::postgres::PgStore;
use txoutbox::store::Retention;
use txoutbox::{migrate, Outbox, OutboxTable};
use uuid::Uuid;

/// How long a wait on observable state may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(15);
/// How often waits poll.
pub const POLL: Duration = Duration::from_millis(20);

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub async fn connect_pool(max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&database_url())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", database_url()))
}

/// A unique schema name for one test.
pub fn unique_schema() -> String {
    format!("txo_test_{}", &Uuid::new_v4().simple().to_string()[..16])
}

/// One test's own schema, migrated, in the test database. Dropped by [`TestDb::cleanup`]
/// (and, should a test panic before it, by `Drop`).
pub struct TestDb {
    pub pool: PgPool,
    pub schema: String,
    pub table: OutboxTable,
    cleaned: bool,
}

impl TestDb {
    /// A fresh schema with the outbox migrated into it as `<schema>.outbox_events`.
    pub async fn new() -> Self {
        let db = Self::unmigrated().await;
        let report = migrate(&db.pool, &db.table)
            .await
            .unwrap_or_else(|e| panic!("migrate {}: {e}", db.table.display()));
        assert_eq!(
            report.applied,
            (1..=txoutbox::SCHEMA_VERSION).collect::<Vec<_>>(),
            "a fresh schema gets every migration"
        );
        db
    }

    /// A schema name reserved for this test, not created and not migrated.
    pub async fn unmigrated() -> Self {
        let schema = unique_schema();
        let table = OutboxTable::new(&schema, "outbox_events").expect("valid names");
        Self {
            pool: connect_pool(10).await,
            schema,
            table,
            cleaned: false,
        }
    }

    pub fn outbox(&self) -> Outbox {
        Outbox::new(self.table.clone())
    }

    pub fn store(&self) -> PgStore {
        PgStore::new(self.pool.clone(), self.table.clone())
    }

    pub fn store_with(&self, retention: Retention) -> PgStore {
        PgStore::with_retention(self.pool.clone(), self.table.clone(), retention)
    }

    /// A store on a pool of its own (a second relay process, as far as the database sees).
    pub async fn separate_store(&self) -> PgStore {
        PgStore::new(connect_pool(5).await, self.table.clone())
    }

    /// `"schema"."outbox_events"`.
    pub fn q(&self) -> String {
        self.table.qualified()
    }

    /// `"schema"."outbox_waiters"`.
    pub fn waiters(&self) -> String {
        self.table.derived("waiters")
    }

    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `SELECT count(*) FROM <outbox> WHERE <cond>`.
    pub async fn count_where(&self, cond: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {} WHERE {cond}", self.q());
        sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `SELECT count(*) FROM <relays> WHERE <cond>`.
    pub async fn count_relays(&self, cond: &str) -> i64 {
        self.scalar_count(&self.table.derived("relays"), cond).await
    }

    /// `SELECT count(*) FROM <partitions> WHERE <cond>`.
    pub async fn count_partitions(&self, cond: &str) -> i64 {
        self.scalar_count(&self.table.derived("partitions"), cond)
            .await
    }

    async fn scalar_count(&self, table: &str, cond: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table} WHERE {cond}");
        sqlx::query_scalar(&sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn total(&self) -> i64 {
        self.count_where("true").await
    }
    pub async fn processed(&self) -> i64 {
        self.count_where("processed_at IS NOT NULL").await
    }
    pub async fn pending(&self) -> i64 {
        self.count_where("processed_at IS NULL AND dead_at IS NULL")
            .await
    }
    pub async fn dead(&self) -> i64 {
        self.count_where("dead_at IS NOT NULL AND processed_at IS NULL")
            .await
    }
    pub async fn locked(&self) -> i64 {
        self.count_where(
            "locked_by IS NOT NULL OR locked_until IS NOT NULL OR lock_token IS NOT NULL",
        )
        .await
    }

    pub async fn waiter_count(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.waiters()))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Every row, in `seq` order.
    pub async fn rows(&self) -> Vec<RowState> {
        let sql = format!(
            "SELECT id, seq, event_type, attempts, available_at, locked_by, locked_until, lock_token, \
             last_error, processed_at, dead_at, now() AS db_now FROM {} ORDER BY seq",
            self.q()
        );
        sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|r| RowState {
                id: r.get("id"),
                seq: r.get("seq"),
                event_type: r.get("event_type"),
                attempts: r.get("attempts"),
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

    pub async fn row(&self, id: Uuid) -> RowState {
        self.rows()
            .await
            .into_iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    }

    /// Drop the schema and everything in it. Call at the end of every test.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        drop_schema(&self.pool, &self.schema).await;
        self.pool.close().await;
    }
}

async fn drop_schema(pool: &PgPool, schema: &str) {
    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    if let Err(e) = sqlx::query(&sql).execute(pool).await {
        eprintln!("cleanup of schema {schema} failed: {e}");
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // The test panicked before `cleanup`: drop the schema from a thread of our own (we
        // may be inside the test's runtime, which cannot be blocked on).
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

/// One outbox row as the tests look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    pub id: Uuid,
    pub seq: i64,
    pub event_type: String,
    pub attempts: i32,
    pub available_at: DateTime<Utc>,
    pub locked_by: Option<String>,
    pub locked_until: Option<DateTime<Utc>>,
    pub lock_token: Option<Uuid>,
    pub last_error: Option<String>,
    pub processed_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
    /// The database's `now()` when the row was read.
    pub db_now: DateTime<Utc>,
}

impl RowState {
    /// The row without the read time, for before/after comparisons.
    pub fn without_now(&self) -> RowState {
        RowState {
            db_now: DateTime::<Utc>::MIN_UTC,
            ..self.clone()
        }
    }
}

/// Poll `check` every [`POLL`] until it returns `true`; panic naming `what` after `timeout`.
pub async fn wait_until_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until_for`] with the default [`DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_for(what, DEADLINE, check).await
}

/// Poll `get` until it yields a value; panic naming `what` after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = get().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {DEADLINE:?} waiting for: {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How a scripted publish fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    Transient,
    Unavailable,
    Permanent,
}

impl Fail {
    fn error(self, what: &str) -> PublishError {
        match self {
            Fail::Transient => {
                PublishError::transient(format!("test: transient failure of {what}"))
            }
            Fail::Unavailable => {
                PublishError::unavailable(format!("test: broker unavailable for {what}"))
            }
            Fail::Permanent => PublishError::permanent(format!("test: {what} refused for good")),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Script {
    kind: Fail,
    /// `None`: every time; `Some(n)`: the next `n` times.
    remaining: Option<u32>,
}

impl Script {
    /// Does this attempt fail? Counts down a limited script.
    fn fire(&mut self) -> bool {
        match &mut self.remaining {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

#[derive(Default)]
struct Scripts {
    by_id: HashMap<Uuid, Script>,
    by_type: HashMap<String, Script>,
}

/// A [`Publisher`] for relay-logic tests. It records every message it acknowledged, in
/// acknowledgement order, and every `send` call, in call order; it can be told to fail given
/// event ids or event types (transiently, unavailably or permanently, always or the next `n`
/// times), to fail everything while "down", and to delay acknowledgements.
///
/// Scripted failures come back through the [`Ack`] (the broker refused the message); while
/// down, `send` itself fails (no connection). Clones share all state.
#[derive(Clone, Default)]
pub struct RecordingPublisher {
    /// Acknowledged messages, in the order their acks resolved.
    pub acked: Arc<Mutex<Vec<Message>>>,
    /// Every `send` call, in call order, with when it happened.
    sent: Arc<Mutex<Vec<(Message, Instant)>>>,
    scripts: Arc<Mutex<Scripts>>,
    down: Arc<AtomicBool>,
    ack_delay_ms: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
}

impl RecordingPublisher {
    pub fn new() -> Self {
        Self::default()
    }

    /// A boxed clone to hand to a relay (this handle keeps seeing what it records).
    pub fn boxed(&self) -> Box<dyn Publisher> {
        Box::new(self.clone())
    }

    pub fn fail_id(&self, id: Uuid, kind: Fail) {
        self.fail_id_times(id, kind, None);
    }

    /// Fail `id` the next `times` attempts (`None`: always).
    pub fn fail_id_times(&self, id: Uuid, kind: Fail, times: Option<u32>) {
        self.scripts.lock().unwrap().by_id.insert(
            id,
            Script {
                kind,
                remaining: times,
            },
        );
    }

    pub fn fail_type(&self, event_type: &str, kind: Fail) {
        self.scripts.lock().unwrap().by_type.insert(
            event_type.to_string(),
            Script {
                kind,
                remaining: None,
            },
        );
    }

    pub fn clear_id(&self, id: Uuid) {
        self.scripts.lock().unwrap().by_id.remove(&id);
    }

    pub fn clear_failures(&self) {
        let mut s = self.scripts.lock().unwrap();
        s.by_id.clear();
        s.by_type.clear();
    }

    /// Simulate a broker outage (`true`) or its end (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Acknowledge each message this long after it was sent.
    pub fn set_ack_delay(&self, d: Duration) {
        self.ack_delay_ms
            .store(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
    }

    pub fn acked(&self) -> Vec<Message> {
        self.acked.lock().unwrap().clone()
    }
    pub fn acked_ids(&self) -> Vec<Uuid> {
        self.acked.lock().unwrap().iter().map(|m| m.id).collect()
    }
    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }
    pub fn was_acked(&self, id: Uuid) -> bool {
        self.acked.lock().unwrap().iter().any(|m| m.id == id)
    }

    /// Every message handed to `send`, in call order (including failed ones).
    pub fn sent(&self) -> Vec<Message> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }
    pub fn sent_count(&self) -> usize {
        self.sent.lock().unwrap().len()
    }
    /// When `send` was called for `id`, in order.
    pub fn send_times(&self, id: Uuid) -> Vec<Instant> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m.id == id)
            .map(|(_, t)| *t)
            .collect()
    }
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn scripted_failure(&self, m: &Message) -> Option<PublishError> {
        let mut s = self.scripts.lock().unwrap();
        let what = format!("{} ({})", m.id, m.event_type);
        if let Some(script) = s.by_id.get_mut(&m.id) {
            if script.fire() {
                return Some(script.kind.error(&what));
            }
            return None;
        }
        if let Some(script) = s.by_type.get_mut(&m.event_type) {
            if script.fire() {
                return Some(script.kind.error(&what));
            }
        }
        None
    }
}

#[async_trait::async_trait]
impl Publisher for RecordingPublisher {
    fn kind(&self) -> &'static str {
        "recording"
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.sent
            .lock()
            .unwrap()
            .push((message.clone(), Instant::now()));
        if self.down.load(Ordering::SeqCst) {
            return Err(PublishError::unavailable("test: broker is down"));
        }
        let failure = self.scripted_failure(message);
        let delay = Duration::from_millis(self.ack_delay_ms.load(Ordering::SeqCst));
        if delay.is_zero() {
            return Ok(ready_ack(match failure {
                Some(e) => Err(e),
                None => {
                    self.acked.lock().unwrap().push(message.clone());
                    Ok(())
                }
            }));
        }
        let acked = self.acked.clone();
        let message = message.clone();
        Ok(Box::pin(async move {
            tokio::time::sleep(delay).await;
            match failure {
                Some(e) => Err(e),
                None => {
                    acked.lock().unwrap().push(message);
                    Ok(())
                }
            }
        }))
    }

    async fn close(&self) -> Result<(), PublishError> {
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}
