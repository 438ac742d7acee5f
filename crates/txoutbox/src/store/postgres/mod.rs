//! The PostgreSQL store: set-based claim and settle, fenced leases, LISTEN/NOTIFY wake-ups.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use tokio::sync::Mutex;

pub(crate) mod claim;
mod decode;
pub mod hosts;
mod operator;
mod partitions;
mod queries;
pub(crate) mod schema;
mod unordered;
#[cfg(feature = "wal")]
#[cfg_attr(docsrs, doc(cfg(feature = "wal")))]
pub mod wal;
pub(crate) mod write;

use super::operator::millis;
use super::partitions::count_once;
use super::rows;
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Fence, Membership, Ordering, RebalanceParams,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::OutboxTable;
use claim::{FastForm, ScanState};
pub(crate) use decode::event_from_row;
use queries::Queries;

/// While ordered claims are in flight, the next claim reads at most this many batches' worth
/// of `seq` past the last event in flight (see `claim_ordered`).
const CLAIM_AHEAD_WINDOW: usize = 4;

/// How long after going to sleep the relay looks for work once more (see `wait_for_work`).
const SECOND_LOOK: Duration = Duration::from_millis(50);

/// How often a relay that is claiming full batches past its cursor still scans the pending
/// index from the start (for events committed late with a lower `seq`, and for released or
/// retried ones).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);

/// Connection options for a relay's pool: `opts` with PostgreSQL's JIT compiler turned off
/// (`jit = off`), unless its `options` already set `jit`.
///
/// The relay's statements are short OLTP statements run thousands of times a second, but the
/// planner's cost estimate of the ordered claim on a large backlog passes `jit_above_cost`, and
/// JIT-compiling it each time cost PostgreSQL about as much CPU as running it: in a 200k-event
/// drain, half of the server's CPU was in LLVM, and turning JIT off took the drain from about
/// 21.7k to 37–40k events/s (`txoutbox-bench drain`, same session). The CLI's pools use this;
/// build the pool you give [`PgStore::new`] with it too:
///
/// ```no_run
/// # async fn f() -> Result<(), sqlx::Error> {
/// use std::str::FromStr;
/// let opts = sqlx::postgres::PgConnectOptions::from_str("postgres://app@db/app")?;
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .connect_with(txoutbox::store::postgres::relay_connect_options(opts))
///     .await?;
/// # Ok(()) }
/// ```
pub fn relay_connect_options(opts: PgConnectOptions) -> PgConnectOptions {
    // `-c jit=on`, `-cjit=on` or `--jit=on`; not merely a value that contains "jit".
    let sets_jit = |o: &str| {
        o.split_whitespace().any(|t| {
            let t = t.trim_start_matches('-');
            t.strip_prefix('c').unwrap_or(t).starts_with("jit=")
        })
    };
    if opts.get_options().is_some_and(sets_jit) {
        return opts;
    }
    opts.options([("jit", "off")])
}

/// The outbox on PostgreSQL.
///
/// Give it a pool built with [`relay_connect_options`] (JIT off).
#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    table: OutboxTable,
    q: Queries,
    /// What a WAL relay's handoff to the table does with published rows.
    #[cfg(feature = "wal")]
    retention: Retention,
    /// How a WAL relay opens its replication stream (see [`PgStore::with_replication`]).
    #[cfg(feature = "wal")]
    replication: Option<wal::stream::ReplicationConfig>,
    listener: Mutex<Option<PgListener>>,
    partitions: std::sync::OnceLock<i32>,
    scan: std::sync::Mutex<ScanState>,
    /// Whether the next read-only claim tries its fast form (see `claim::FastForm`).
    fast_form: FastForm,
    /// The last wake-up's "no longer waiting" statement, still running (see `wait_for_work`).
    pending_clear: std::sync::Mutex<Option<tokio::task::JoinHandle<Result<(), sqlx::Error>>>>,
}

impl PgStore {
    /// A store on `table` that keeps published events ([`Retention::Mark`]). Nothing is checked
    /// here; see [`PgStore::check_schema`].
    pub fn new(pool: PgPool, table: OutboxTable) -> Self {
        Self::with_retention(pool, table, Retention::Mark)
    }

    /// A store on `table` with the given retention for published events.
    pub fn with_retention(pool: PgPool, table: OutboxTable, retention: Retention) -> Self {
        Self {
            q: Queries::new(&table, retention),
            #[cfg(feature = "wal")]
            retention,
            #[cfg(feature = "wal")]
            replication: None,
            pool,
            table,
            listener: Mutex::new(None),
            partitions: std::sync::OnceLock::new(),
            scan: std::sync::Mutex::new(ScanState {
                cursor: 0,
                last_full: std::time::Instant::now(),
                backlog: false,
            }),
            pending_clear: std::sync::Mutex::new(None),
            fast_form: FastForm::default(),
        }
    }

    #[cfg(feature = "wal")]
    /// Let a WAL relay (`--source wal`) stream its slot over a replication connection made
    /// with `cfg` (usually [`ReplicationConfig::from_url`](wal::stream::ReplicationConfig::from_url)
    /// of the pool's own URL): the server pushes each transaction as it commits. Without
    /// it, a WAL relay reads the slot through SQL on the pool, polling (slower, and more
    /// latency: each read decodes the slot's WAL from its restart position again).
    pub fn with_replication(mut self, cfg: wal::stream::ReplicationConfig) -> Self {
        self.replication = Some(cfg);
        self
    }

    #[cfg(feature = "wal")]
    /// The WAL source's reader of this store's table: what [`Relay::with_wal`] takes to
    /// relay from PostgreSQL's WAL rather than by claiming rows
    /// (`let wal = store.wal(); Relay::new(store, publisher, config).with_wal(wal)`). It shares the
    /// store's pool, retention and [replication settings](Self::with_replication).
    ///
    /// [`Relay::with_wal`]: crate::relay::Relay::with_wal
    pub fn wal(&self) -> wal::WalStore {
        wal::WalStore::new(
            self.pool.clone(),
            self.table.clone(),
            self.retention,
            self.replication.clone(),
        )
    }

    /// The pool the store runs its statements on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
    /// The schema and table the store works on.
    pub fn table(&self) -> &OutboxTable {
        &self.table
    }

    /// Fail with "run `txoutbox migrate`" unless the schema is in place.
    pub async fn check_schema(&self) -> Result<(), Error> {
        schema::check_schema(&self.pool, &self.table).await
    }

    /// How many partitions the aggregate-hash space has (fixed by the migrations; read once).
    async fn partition_count(&self) -> Result<i32, Error> {
        let read = sqlx::query_scalar::<_, i64>(&self.q.partition_count).fetch_one(&self.pool);
        let read = async {
            let n = read.await.map_err(|e| self.err(e))?;
            Ok(i32::try_from(n).unwrap_or(i32::MAX).max(1))
        };
        count_once(&self.partitions, read).await
    }

    fn err(&self, e: sqlx::Error) -> Error {
        db_error(&self.table, e)
    }

    async fn listen(&self, slot: &mut Option<PgListener>) -> Result<(), Error> {
        if slot.is_none() {
            let mut l = PgListener::connect_with(&self.pool)
                .await
                .map_err(Error::Database)?;
            l.listen(&self.table.channel())
                .await
                .map_err(Error::Database)?;
            *slot = Some(l);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        if p.ordering.is_ordered() {
            // Ordered claims always scan from the start: an event below a cursor (released,
            // or retried from the dead letters with `hold`) must be found before any later
            // event of its aggregate.
            return self.claim_ordered(&p).await;
        }
        self.claim_unordered(&p).await
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        self.settle_inner(&p).await
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        // The unordered claim's cursor may be past them.
        if let Ok(mut scan) = self.scan.lock() {
            scan.rewind();
        }
        let token = match &p.claim.fence {
            // A claim held by partition holds nothing in the table: once the relay forgets it
            // (no longer passes it in flight), its events are free to go again.
            Fence::Partitions(_) => return Ok(p.ids.len() as u64),
            Fence::Lease { token } => *token,
        };
        if p.ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.q.release)
            .bind(p.ids)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn retry_now(&self, p: crate::store::RetryNowParams<'_>) -> Result<u64, Error> {
        if p.ids.is_empty() {
            return Ok(0);
        }
        let row = sqlx::query(&self.q.retry_now)
            .bind(p.ids)
            .bind(self.table.channel())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let n: i64 = sqlx::Row::try_get(&row, 0).map_err(Error::Database)?;
        // The unordered claim's cursor may be past them.
        if let Ok(mut scan) = self.scan.lock() {
            scan.rewind();
        }
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        let sql = if ordering == Ordering::OrderedHold {
            &self.q.has_unfinished_hold
        } else {
            &self.q.has_unfinished
        };
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))
    }

    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        let (relay_id, max) = (p.relay_id, p.max);
        // The mode as due.sql takes it.
        let mode: i32 = match p.ordering {
            Ordering::Unordered => 0,
            Ordering::Ordered => 1,
            Ordering::OrderedHold => 2,
        };
        let mut slot = self.listener.lock().await;
        if let Err(e) = self.listen(&mut slot).await {
            // No listener: fall back to polling, but do report the error.
            tracing::warn!(error = %e, "LISTEN failed; polling only");
            tokio::time::sleep(max).await;
            return Ok(Wake::Timeout);
        }
        let Some(listener) = slot.as_mut() else {
            return Ok(Wake::Timeout);
        };
        // The previous wake-up's "no longer waiting" must land before "waiting" is said again.
        let clear = self.pending_clear.lock().ok().and_then(|mut p| p.take());
        if let Some(clear) = clear {
            match clear.await {
                Ok(result) => result.map_err(|e| self.err(e))?,
                Err(e) => return Err(Error::Task(e.to_string())),
            }
        }
        // Notifications that arrived while we were busy are stale: the claim after them saw
        // their rows.
        while listener.next_buffered().is_some() {}
        // Flag first, then look: a commit after this statement either notifies us or was
        // visible to it.
        let until: Option<f64> = sqlx::query_scalar(&self.q.wait_prepare)
            .bind(relay_id)
            .bind(mode)
            .bind((millis(max) + 1000) as f64)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let sleep = match until {
            Some(secs) if secs <= 0.0 => None,
            Some(secs) => Some(Duration::from_secs_f64(secs.min(max.as_secs_f64()))),
            None => Some(max),
        };
        let wake = match sleep {
            None => Wake::Ready,
            Some(d) => {
                let deadline = tokio::time::Instant::now() + d;
                // A writer whose commit-time trigger ran just before our flag committed, but
                // whose commit became visible just after our look, sent no NOTIFY. Such
                // commits are visible a moment later: look once more, then sleep on.
                let second_look = tokio::time::Instant::now() + SECOND_LOOK;
                let mut looked = SECOND_LOOK >= d;
                loop {
                    tokio::select! {
                        n = listener.recv() => break match n {
                            Ok(_) => Wake::Notified,
                            Err(e) => {
                                tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                                *slot = None;
                                Wake::Timeout
                            }
                        },
                        _ = tokio::time::sleep_until(second_look), if !looked => {
                            looked = true;
                            let ready: bool = sqlx::query_scalar(&self.q.due_now)
                                .bind(relay_id)
                                .bind(mode)
                                .fetch_one(&self.pool)
                                .await
                                .map_err(|e| self.err(e))?;
                            if ready {
                                break Wake::Ready;
                            }
                        }
                        _ = tokio::time::sleep_until(deadline) => break Wake::Timeout,
                    }
                }
            }
        };
        drop(slot);
        // Stop writers notifying while we work, off the wake-up's critical path: the claim
        // runs at once, and the next wait first makes sure this has landed (else it could
        // delete the flag that wait sets).
        let (pool, sql, relay) = (
            self.pool.clone(),
            self.q.wait_clear.clone(),
            relay_id.to_owned(),
        );
        let clear =
            tokio::spawn(
                async move { sqlx::query(&sql).bind(relay).execute(&pool).await.map(drop) },
            );
        if let Ok(mut pending) = self.pending_clear.lock() {
            *pending = Some(clear);
        }
        Ok(wake)
    }

    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        let m = self.rebalance_partitions(p).await?;
        // The unordered claim's cursor may be past events of the partitions just taken.
        if !m.acquired.is_empty() {
            if let Ok(mut scan) = self.scan.lock() {
                scan.rewind();
            }
        }
        Ok(m)
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let relay_id = p.relay_id;
        let done = sqlx::query(&self.q.deregister)
            .bind(relay_id)
            .bind(p.instance.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        // Its ordered claims (if any were still in flight) go with its partitions.
        Ok(done.rows_affected())
    }

    async fn counts(&self) -> Result<Counts, Error> {
        let r = sqlx::query(&self.q.counts)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        rows::counts(&r)
    }
}
