//! The PostgreSQL store: set-based claim and settle, fenced leases, LISTEN/NOTIFY wake-ups.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgRow, PgValueFormat, PgValueRef};
use sqlx::{Row, ValueRef};
use tokio::sync::Mutex;
use uuid::Uuid;

mod operator;
mod partitions;
mod queries;
pub(crate) mod schema;
pub(crate) mod write;

use super::undecodable::{self, Decoded, Reader};
use super::{
    Claim, ClaimParams, Counts, DeregisterParams, Fence, Membership, Ordering, PartitionFence,
    RebalanceParams, RelayInfo, ReleaseParams, Retention, SettleOutcome, SettleParams, Store,
    WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::{OutboxEvent, OutboxTable};
use queries::Queries;

pub(crate) const COLUMNS: &str =
    "id, seq, aggregate_type, aggregate_id, event_type, payload, headers, attempts, attempts_unavailable, \
     available_at, created_at, processed_at, dead_at, locked_by, locked_until, last_error";

/// An ordered claim takes events only from partitions whose lease has at least this much
/// left, so that it never overlaps another relay taking the partition over.
const CLAIM_MARGIN_MS: u64 = 1000;

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
    listener: Mutex<Option<PgListener>>,
    partitions: std::sync::OnceLock<i32>,
    scan: std::sync::Mutex<ScanState>,
    /// The last wake-up's "no longer waiting" statement, still running (see `wait_for_work`).
    pending_clear: std::sync::Mutex<Option<tokio::task::JoinHandle<Result<(), sqlx::Error>>>>,
}

/// Where the next claim starts reading the pending index.
///
/// Every published or claimed row leaves a dead entry at the front of the `pending` index
/// until VACUUM removes it, so a claim that scans from the start gets slower the more was
/// drained since the last vacuum (in a 100k backlog, from about 1 ms to tens of ms per
/// claim). While claims come back full (a backlog), the next claim starts past the highest
/// `seq` claimed so far and skips that dead prefix (unordered mode only). Events below the cursor (committed late
/// with a lower `seq`, released, or due for a retry) are found by a full scan, made after
/// any claim that was not full, after this store released events, and at least every
/// [`FULL_SCAN_EVERY`]; a claim past the cursor that comes back short looks behind it at once.
#[derive(Debug)]
struct ScanState {
    cursor: i64,
    last_full: std::time::Instant,
    backlog: bool,
}

impl ScanState {
    /// The `seq` floor for the next claim: 0 for a full scan.
    fn floor(&self) -> i64 {
        if self.backlog && self.last_full.elapsed() < FULL_SCAN_EVERY {
            self.cursor
        } else {
            0
        }
    }

    fn record(&mut self, floor: i64, limit: usize, rows: &[PgRow]) {
        if floor == 0 {
            self.last_full = std::time::Instant::now();
        }
        self.backlog = rows.len() >= limit;
        if let Some(last) = rows
            .iter()
            .filter_map(|r| r.try_get::<i64, _>("seq").ok())
            .max()
        {
            self.cursor = self.cursor.max(last);
        }
    }

    /// Events were given back: the next claim looks behind the cursor.
    fn rewind(&mut self) {
        self.backlog = false;
    }
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
        }
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
        crate::migrate::check_schema(&self.pool, &self.table).await
    }

    /// How many partitions the aggregate-hash space has (fixed by the migrations; read once).
    async fn partition_count(&self) -> Result<i32, Error> {
        if let Some(n) = self.partitions.get() {
            return Ok(*n);
        }
        let n: i64 = sqlx::query_scalar(&self.q.partition_count)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let n = i32::try_from(n).unwrap_or(i32::MAX).max(1);
        Ok(*self.partitions.get_or_init(|| n))
    }

    /// The relays registered on this table, with the partitions each owns.
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        partitions::relays(&self.pool, &self.table).await
    }

    fn err(&self, e: sqlx::Error) -> Error {
        db_error(&self.table, e)
    }

    /// One unordered claim of up to `limit` rows with `seq > floor` (0: from the start).
    async fn claim_unordered(
        &self,
        p: &ClaimParams<'_>,
        floor: i64,
        limit: usize,
    ) -> Result<Vec<PgRow>, Error> {
        let rows = sqlx::query(&self.q.claim)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(millis(p.lease) as f64)
            .bind(p.relay_id)
            .bind(p.token)
            .bind(floor)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if let Ok(mut scan) = self.scan.lock() {
            scan.record(floor, limit, &rows);
        }
        Ok(rows)
    }

    /// An ordered claim: read-only. It writes nothing to the table: the relay holds the
    /// events because it owns their partitions (the claim's [`PartitionFence`]). What a row
    /// lease did besides, keep this relay's next claim off the aggregates it is still
    /// publishing, the claim params do: the relay passes its claims in flight, and this claim
    /// skips their aggregate hashes, and reads at most [`CLAIM_AHEAD_WINDOW`] batches' worth of
    /// `seq` past the last of them.
    async fn claim_ordered(&self, p: &ClaimParams<'_>) -> Result<Claim, Error> {
        let partitions = self.partition_count().await?;
        let started = Instant::now();
        let empty = || Claim::leased(p.token, Vec::new(), started + p.lease);
        let (mut busy, mut upto) = (Vec::new(), i64::MAX);
        // A claim whose partition lease ran out holds nothing back: the relay does not send
        // it any more.
        let live = p.in_flight.iter().filter(|c| c.expires > started);
        let mut last = None;
        for c in live {
            if let Fence::Partitions(f) = &c.fence {
                busy.extend(f.keys.iter().copied());
                last = last.max(c.events.iter().map(|e| e.seq).max());
            }
        }
        if let Some(last) = last {
            let window =
                i64::try_from(p.limit.saturating_mul(CLAIM_AHEAD_WINDOW)).unwrap_or(i64::MAX);
            upto = last.saturating_add(window);
        }
        busy.sort_unstable();
        busy.dedup();
        let rows = sqlx::query(&self.q.claim_ordered)
            .bind(i64::try_from(p.limit).unwrap_or(i64::MAX))
            .bind(p.relay_id)
            .bind(partitions)
            .bind(p.ordering == Ordering::OrderedHold)
            .bind(&busy)
            .bind(upto)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if rows.is_empty() {
            return Ok(empty());
        }
        let g = |e| Error::Database(e);
        let left: Option<f64> = rows[0].try_get("lease_left").map_err(g)?;
        let fence_partitions: Vec<i32> = rows[0].try_get("fence_partitions").map_err(g)?;
        let fence_epochs: Vec<i64> = rows[0].try_get("fence_epochs").map_err(g)?;
        let mut keys = rows
            .iter()
            .map(|r| r.try_get::<i32, _>("partition_key"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(g)?;
        keys.sort_unstable();
        keys.dedup();
        let rows = rows.iter().map(decode_row).collect::<Result<Vec<_>, _>>()?;
        // Events held behind an undecodable row (`hold`) are simply not handed out: an
        // ordered claim leases nothing.
        let (events, bad, _held) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(p, &bad, Some(partitions)).await;
        }
        if events.is_empty() {
            return Ok(empty());
        }
        let left = Duration::try_from_secs_f64(left.unwrap_or(0.0).max(0.0)).unwrap_or_default();
        Ok(Claim {
            events,
            fence: Fence::Partitions(PartitionFence {
                relay_id: p.relay_id.to_owned(),
                partitions: fence_partitions,
                epochs: fence_epochs,
                keys,
            }),
            expires: started + left,
        })
    }

    /// One settle statement: fenced by the claim token, or for an ordered claim by partition
    /// ownership at the claim's epochs.
    async fn settle_inner(&self, p: &SettleParams<'_>) -> Result<SettleOutcome, Error> {
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(SettleOutcome::default());
        }
        let ids: Vec<Uuid> = p.failed.iter().map(|f| f.id).collect();
        let errs: Vec<&str> = p.failed.iter().map(|f| f.error.as_str()).collect();
        let delays: Vec<i64> = p.failed.iter().map(|f| millis(f.retry_in)).collect();
        let dead: Vec<bool> = p.failed.iter().map(|f| f.dead).collect();
        let unavailable: Vec<bool> = p.failed.iter().map(|f| f.unavailable).collect();
        let query = match &p.claim.fence {
            Fence::Partitions(fence) => sqlx::query(&self.q.settle_ordered)
                .bind(p.published)
                .bind(&ids)
                .bind(&errs)
                .bind(&delays)
                .bind(&fence.relay_id)
                .bind(&dead)
                .bind(&unavailable)
                .bind(self.partition_count().await?)
                .bind(&fence.partitions)
                .bind(&fence.epochs),
            Fence::Lease { token } => sqlx::query(&self.q.settle)
                .bind(p.published)
                .bind(&ids)
                .bind(&errs)
                .bind(&delays)
                .bind(token)
                .bind(&dead)
                .bind(&unavailable),
        };
        let row = query.fetch_one(&self.pool).await.map_err(|e| self.err(e))?;
        let ok: i64 = row.try_get(0).map_err(Error::Database)?;
        let bad: i64 = row.try_get(1).map_err(Error::Database)?;
        Ok(SettleOutcome {
            published: ok as u64,
            failed: bad as u64,
        })
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

impl PgStore {
    /// Dead-letter claimed rows that do not decode (by id: a `uuid` column always decodes).
    /// Fenced like a settle: by the claim token, or for an ordered claim (`partitions`: how
    /// many there are) by this relay's partition lease. On failure an unordered claim's rows
    /// stay leased until the lease runs out, and the next claim meets them again.
    async fn bury_undecodable(
        &self,
        p: &ClaimParams<'_>,
        bad: &[Decoded],
        partitions: Option<i32>,
    ) {
        let q = self.table.qualified();
        let ids: Vec<Uuid> = bad.iter().map(|b| b.event.id).collect();
        let errs: Vec<String> = bad
            .iter()
            .map(|b| b.last_error().unwrap_or_default())
            .collect();
        let rows = "unnest($1::uuid[], $2::text[]) AS f(id, err)";
        let result = match partitions {
            None => {
                sqlx::query(&format!(
                    "UPDATE {q} AS e SET dead_at = now(), last_error = f.err,
                        locked_until = NULL, locked_by = NULL, lock_token = NULL
                     FROM {rows} WHERE e.id = f.id AND e.lock_token = $3"
                ))
                .bind(&ids)
                .bind(&errs)
                .bind(p.token)
                .execute(&self.pool)
                .await
            }
            Some(n) => {
                sqlx::query(&format!(
                    "UPDATE {q} AS e SET dead_at = now(), last_error = f.err
                     FROM {rows}
                     WHERE e.id = f.id AND e.processed_at IS NULL AND e.dead_at IS NULL
                       AND e.partition_key % $3 = ANY (ARRAY(
                         SELECT partition FROM {} WHERE owner = $4 AND lease_until > now()))",
                    self.table.derived("partitions")
                ))
                .bind(&ids)
                .bind(&errs)
                .bind(n)
                .bind(p.relay_id)
                .execute(&self.pool)
                .await
            }
        };
        match result {
            Ok(_) => undecodable::count_dead(bad),
            Err(e) => tracing::warn!(error = %self.err(e),
                "could not dead-letter rows that do not decode; the next claims meet them again"),
        }
    }
}

/// The row as an event, with placeholders where a column does not decode (operator listings).
pub(crate) fn event_from_row(r: &PgRow) -> Result<OutboxEvent, Error> {
    Ok(decode_row(r)?.event)
}

/// One row, column by column: what decoded and what did not (see [`undecodable`]).
fn decode_row(r: &PgRow) -> Result<Decoded, Error> {
    let mut c = Reader::new(r);
    let id = c.get::<Uuid>("id")?;
    let seq = c.get::<i64>("seq")?;
    let aggregate_type = c.get::<String>("aggregate_type")?;
    let aggregate_id = c.get::<String>("aggregate_id")?;
    let event_type = c.get::<String>("event_type")?;
    let payload = c.get::<serde_json::Value>("payload")?;
    let headers = c.get::<serde_json::Value>("headers")?;
    let headers = headers.and_then(|v| c.ok(undecodable::headers(v)));
    let attempts = c.get::<i32>("attempts")?;
    let attempts_unavailable = c.get::<i32>("attempts_unavailable")?;
    let available_at = c.with("available_at", |v| pg_time("available_at", v))?;
    let created_at = c.with("created_at", |v| pg_time("created_at", v))?;
    let processed_at = c.with("processed_at", |v| pg_time("processed_at", v))?;
    let dead_at = c.with("dead_at", |v| pg_time("dead_at", v))?;
    let locked_by = c.get::<Option<String>>("locked_by")?;
    let locked_until = c.with("locked_until", |v| pg_time("locked_until", v))?;
    let last_error = c.get::<Option<String>>("last_error")?;
    let aggregate = aggregate_type.clone().zip(aggregate_id.clone());
    let event = OutboxEvent {
        id: id.unwrap_or_default(),
        seq: seq.unwrap_or_default(),
        aggregate_type: aggregate_type.unwrap_or_default(),
        aggregate_id: aggregate_id.unwrap_or_default(),
        event_type: event_type.clone().unwrap_or_default(),
        payload: payload.unwrap_or_default(),
        headers: headers.unwrap_or_default(),
        attempts: attempts.unwrap_or_default(),
        attempts_unavailable: attempts_unavailable.unwrap_or_default(),
        available_at: available_at.flatten().unwrap_or_default(),
        created_at: created_at.flatten().unwrap_or_default(),
        processed_at: processed_at.flatten(),
        dead_at: dead_at.flatten(),
        locked_by: locked_by.flatten(),
        locked_until: locked_until.flatten(),
        last_error: last_error.flatten(),
    };
    Ok(c.finish(event, event_type, aggregate))
}

/// A `timestamptz` (`None`: NULL), or what is wrong with it. sqlx's own decoding panics on
/// `infinity`, `-infinity` and times past chrono's range (PostgreSQL's reaches further), so
/// the binary value is read here: microseconds since 2000-01-01, `i64::MAX`/`MIN` for the
/// infinities.
fn pg_time(col: &str, v: PgValueRef<'_>) -> Result<Option<DateTime<Utc>>, String> {
    if v.is_null() {
        return Ok(None);
    }
    let at = match v.format() {
        PgValueFormat::Text => <DateTime<Utc> as sqlx::Decode<sqlx::Postgres>>::decode(v)
            .map_err(|e| format!("{col}: {e}"))?,
        PgValueFormat::Binary => {
            let us = <i64 as sqlx::Decode<sqlx::Postgres>>::decode(v)
                .map_err(|e| format!("{col}: {e}"))?;
            match us {
                i64::MAX => return Err(format!("{col} is infinity")),
                i64::MIN => return Err(format!("{col} is -infinity")),
                us => DateTime::from_timestamp(946_684_800, 0)
                    .and_then(|epoch| epoch.checked_add_signed(chrono::TimeDelta::microseconds(us)))
                    .ok_or_else(|| format!("{col} is out of range ({us} µs from 2000-01-01)"))?,
            }
        }
    };
    Ok(Some(at))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
        let started = Instant::now();
        let floor = self.scan.lock().map(|s| s.floor()).unwrap_or(0);
        let mut rows = self.claim_unordered(&p, floor, p.limit).await?;
        if floor > 0 && rows.len() < p.limit {
            // The backlog past the cursor ran out: look behind it too, so that a short
            // claim always means "nothing more is claimable now".
            rows.extend(self.claim_unordered(&p, 0, p.limit - rows.len()).await?);
        }
        let rows = rows.iter().map(decode_row).collect::<Result<Vec<_>, _>>()?;
        let (events, bad, _) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(&p, &bad, None).await;
        }
        Ok(Claim::leased(p.token, events, started + p.lease))
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        self.settle_inner(&p).await
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        let token = match &p.claim.fence {
            // An ordered claim holds nothing in the table: once the relay forgets it (no
            // longer passes it in flight), its events are free to go again.
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
        if let Ok(mut scan) = self.scan.lock() {
            scan.rewind();
        }
        Ok(done.rows_affected())
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
        let ordered = p.ordering.is_ordered();
        let hold = p.ordering == Ordering::OrderedHold;
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
            .bind(ordered)
            .bind(hold)
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
                                .bind(ordered)
                                .bind(hold)
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
        partitions::rebalance(&self.pool, &self.table, p).await
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
        let g = |e| Error::Database(e);
        Ok(Counts {
            pending: r.try_get(0).map_err(g)?,
            leased: r.try_get(1).map_err(g)?,
            dead: r.try_get(2).map_err(g)?,
            processed: r.try_get(3).map_err(g)?,
            oldest_pending_age_secs: r.try_get(4).map_err(g)?,
        })
    }
}
