//! The PostgreSQL store: set-based claim and settle, fenced leases, LISTEN/NOTIFY wake-ups.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgRow, PgValueFormat, PgValueRef};
use sqlx::{Row, ValueRef};
use tokio::sync::Mutex;
use uuid::Uuid;

use super::undecodable::{self, Decoded, Reader};
use super::{
    ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::error::{db_error, Error};
use crate::{OutboxEvent, OutboxTable};

pub(crate) const COLUMNS: &str =
    "id, seq, aggregate_type, aggregate_id, event_type, payload, headers, attempts, attempts_unavailable, \
     available_at, created_at, processed_at, dead_at, locked_by, locked_until, last_error";

/// An ordered claim takes events only from partitions whose lease has at least this much
/// left, so that it never overlaps another relay taking the partition over.
const CLAIM_MARGIN_MS: u64 = 1000;

/// While ordered claims are in flight, the next claim reads at most this many batches' worth
/// of `seq` past the last event in flight (see `claim_ordered`).
const CLAIM_AHEAD_WINDOW: usize = 4;

/// The predicate of the `blocking` index (migration 2), repeated so the planner uses it:
/// rows that may hold their aggregate back.
const BLOCKING: &str = "b.processed_at IS NULL \
     AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)";

/// How long after going to sleep the relay looks for work once more (see `wait_for_work`).
const SECOND_LOOK: Duration = Duration::from_millis(50);

/// How often a relay that is claiming full batches past its cursor still scans the pending
/// index from the start (for events committed late with a lower `seq`, and for released or
/// retried ones).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(1);

/// How long after its partition lease ran out an ordered claim that was never settled is
/// kept for a late settle (which needs to know it was an ordered claim, and by whom).
const FORGET_AFTER: Duration = Duration::from_secs(300);

/// A settle's failures, unnested: $2 ids, $3 errors, $4 delays (ms), $6 dead, $7 unavailable.
const FAILURES: &str = "unnest($2::uuid[], $3::text[], $4::bigint[], $6::bool[], $7::bool[]) \
     AS f(id, err, delay_ms, dead, unavailable)";

/// What a failed attempt does to its row (`e`), from [`FAILURES`] (`f`).
const FAILED: &str = "attempts = e.attempts + 1, \
     attempts_unavailable = e.attempts_unavailable + f.unavailable::int, \
     last_error = f.err, \
     available_at = now() + f.delay_ms * interval '1 millisecond', \
     dead_at = CASE WHEN f.dead THEN now() END";

/// "Not yet published and not dead": the rows the partial index covers.
const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

/// SQL for one outbox table, built once from validated names.
#[derive(Debug)]
struct Queries {
    claim: String,
    claim_ordered: String,
    has_unfinished_hold: String,
    partition_count: String,
    settle: String,
    settle_ordered: String,
    release: String,
    has_unfinished: String,
    wait_prepare: String,
    due_now: String,
    wait_clear: String,
    deregister: String,
    counts: String,
}

impl Queries {
    fn new(t: &OutboxTable, retention: Retention) -> Self {
        let q = t.qualified();
        let waiters = t.derived("waiters");
        let partitions = t.derived("partitions");
        let relays = t.derived("relays");
        let published = match retention {
            Retention::Mark => format!(
                "UPDATE {q} SET processed_at = now(), locked_until = NULL, locked_by = NULL, \
                 lock_token = NULL, last_error = NULL \
                 WHERE id = ANY($1) AND lock_token = $5 RETURNING 1"
            ),
            Retention::Delete => {
                format!("DELETE FROM {q} WHERE id = ANY($1) AND lock_token = $5 RETURNING 1")
            }
        };
        let mine = "partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine))";
        let published_ordered = match retention {
            Retention::Mark => format!(
                "UPDATE {q} SET processed_at = now(), last_error = NULL \
                 WHERE id = ANY($1) AND processed_at IS NULL AND {mine} RETURNING 1"
            ),
            Retention::Delete => {
                format!("DELETE FROM {q} WHERE id = ANY($1) AND {mine} RETURNING 1")
            }
        };
        // Seconds until the earliest event this relay can take is due ($1: relay id, $2:
        // ordered, $3: hold). Unordered: any unfinished event. Ordered: only events in the
        // partitions it owns, one probe of the partition index each (an idle relay beside
        // another relay's backlog reads nothing), and only those that no earlier event of
        // their aggregate holds back (backing off or leased: that one's own due time counts;
        // dead, with `hold`: it waits for an operator, whose retry wakes the relay). Rows it
        // could never claim (other relays' partitions, events behind a held one) would make
        // an idle relay's wait return "ready" at once, over and over. As a difference of
        // epochs: a row written with `available_at = 'infinity'` makes it Infinity, where
        // subtracting timestamps fails ("cannot subtract infinite timestamps") and would stop
        // the relay.
        let due = format!(
            "SELECT (extract(epoch FROM min(t)) - extract(epoch FROM now()))::float8 FROM (
               SELECT greatest(e.available_at, coalesce(e.locked_until, e.available_at)) AS t
               FROM {q} e WHERE NOT $2 AND e.processed_at IS NULL AND e.dead_at IS NULL
               UNION ALL
               SELECT d.t FROM {partitions} p CROSS JOIN LATERAL (
                 SELECT greatest(e.available_at, coalesce(e.locked_until, e.available_at)) AS t
                 FROM {q} e
                 WHERE (e.partition_key & 63) = p.partition
                   AND e.processed_at IS NULL AND e.dead_at IS NULL
                   AND NOT EXISTS (
                     SELECT 1 FROM {q} b
                     WHERE b.partition_key = e.partition_key AND b.seq < e.seq
                       AND {BLOCKING}
                       AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                       AND (b.dead_at IS NULL OR $3)
                     OFFSET 0)
               ) d
               WHERE $2 AND p.owner = $1 AND p.lease_until > now()
             ) due"
        );
        Self {
            // One autocommit statement: pick available rows in seq order, skip rows another
            // relay holds, and lease them. No transaction stays open while publishing.
            claim: format!(
                "WITH c AS (
                    SELECT id FROM {q}
                    WHERE {UNFINISHED} AND available_at <= now()
                      AND (locked_until IS NULL OR locked_until <= now())
                      AND seq > $5
                    ORDER BY seq
                    LIMIT $1
                    FOR UPDATE SKIP LOCKED
                 )
                 UPDATE {q} AS e
                 SET locked_until = now() + $2 * interval '1 millisecond', locked_by = $3, lock_token = $4
                 FROM c WHERE e.id = c.id
                 RETURNING e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload,
                   e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at, e.processed_at, e.dead_at,
                   e.locked_by, e.locked_until, e.last_error"
            ),
            // Ordered: only partitions this relay owns under a live lease (with a margin, so a
            // claim never overlaps a takeover), only events of aggregates this relay has no
            // event of in flight ($5: their partition keys, looked up in a hashed subplan: a
            // plain `<> ALL ($5)` compared each candidate with every key, up to a thousand),
            // at most $6 (while batches are in flight, a few batches past the last event in
            // flight: when every aggregate is in flight, a claim ahead would otherwise read the
            // whole backlog to find nothing), and only events with no earlier
            // event of their aggregate backing off, leased (by an unordered relay of old) or
            // (with $4, `hold`) dead. Together with one owner per partition, this keeps each
            // aggregate's events in seq order. It writes nothing: the partition lease is the
            // claim, and the settle is fenced by partition ownership and epoch. `lease_left` is
            // how long the shortest of the partition leases still runs. The walk of the pending
            // index runs only if one of the owned partitions has an event available at all
            // (an InitPlan, one probe of the partition index per partition): the empty claim
            // of an idle relay beside another relay's backlog costs next to nothing.
            claim_ordered: format!(
                "WITH owned AS (
                    SELECT partition, lease_until, epoch FROM {partitions}
                    WHERE owner = $2 AND lease_until > now() + interval '{CLAIM_MARGIN_MS} milliseconds'
                 )
                 SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload,
                   e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at,
                   e.processed_at, e.dead_at, e.locked_by, e.locked_until, e.last_error, e.partition_key,
                   extract(epoch FROM (SELECT min(lease_until) FROM owned) - now())::float8 AS lease_left,
                   (SELECT array_agg(partition ORDER BY partition) FROM owned) AS fence_partitions,
                   (SELECT array_agg(epoch ORDER BY partition) FROM owned) AS fence_epochs
                 FROM {q} e
                 WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now()
                   AND (e.locked_until IS NULL OR e.locked_until <= now())
                   AND e.partition_key % $3 = ANY (ARRAY(SELECT partition FROM owned))
                   AND e.seq <= $6
                   AND e.partition_key NOT IN (SELECT unnest($5::int[]))
                   AND EXISTS (SELECT 1 FROM owned o WHERE EXISTS (
                     SELECT 1 FROM {q} x
                     WHERE (x.partition_key & 63) = o.partition
                       AND x.processed_at IS NULL AND x.dead_at IS NULL AND x.available_at <= now()
                       AND (x.locked_until IS NULL OR x.locked_until <= now())))
                   AND NOT EXISTS (
                     SELECT 1 FROM {q} b
                     WHERE b.partition_key = e.partition_key AND b.seq < e.seq
                       AND {BLOCKING}
                       AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                       AND ((b.dead_at IS NULL AND (b.available_at > now() OR b.locked_until > now()))
                            OR (b.dead_at IS NOT NULL AND $4))
                     OFFSET 0
                   )
                 ORDER BY e.seq
                 LIMIT $1"
            ),
            has_unfinished_hold: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} e WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM {q} b WHERE b.partition_key = e.partition_key
                     AND b.seq < e.seq AND {BLOCKING} AND b.dead_at IS NOT NULL
                     AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                     OFFSET 0))"
            ),
            partition_count: format!("SELECT count(*) FROM {partitions}"),
            // The whole batch in one statement: successes and failures, both fenced by the
            // claim token, so a relay that lost its lease changes nothing.
            settle: format!(
                "WITH ok AS ({published}),
                 bad AS (
                    UPDATE {q} AS e
                    SET {FAILED}, locked_until = NULL, locked_by = NULL, lock_token = NULL
                    FROM {FAILURES}
                    WHERE e.id = f.id AND e.lock_token = $5
                    RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad)"
            ),
            // The settle of an ordered claim: fenced by partition ownership at the epochs the
            // claim saw ($5: relay id, $9/$10: partitions and their epochs), not by a row lease.
            // A relay that lost a partition changes nothing in it, and neither does one whose
            // partition went to another relay and came back (its epoch moved on meanwhile).
            settle_ordered: format!(
                "WITH mine AS (
                    SELECT p.partition FROM {partitions} p
                    JOIN unnest($9::int[], $10::bigint[]) AS c(partition, epoch)
                      ON c.partition = p.partition AND c.epoch = p.epoch
                    WHERE p.owner = $5
                 ),
                 ok AS ({published_ordered}),
                 bad AS (
                    UPDATE {q} AS e
                    SET {FAILED}
                    FROM {FAILURES}
                    WHERE e.id = f.id AND e.processed_at IS NULL
                      AND e.partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine))
                    RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad)"
            ),
            release: format!(
                "UPDATE {q} SET locked_until = NULL, locked_by = NULL, lock_token = NULL \
                 WHERE id = ANY($1) AND lock_token = $2"
            ),
            has_unfinished: format!("SELECT EXISTS (SELECT 1 FROM {q} WHERE {UNFINISHED})"),
            // Say "I am waiting" (writers notify only then) and learn, in the same round trip,
            // how long until the earliest event this relay can take is due ($4: how long the
            // flag lasts; the rest as in `due`). An ordered relay waits for its own
            // partitions only: commits to others' do not notify (see the `wake` trigger).
            wait_prepare: format!(
                "WITH w AS (
                    INSERT INTO {waiters} (relay_id, waiting_until, ordered)
                    VALUES ($1, now() + $4 * interval '1 millisecond', $2)
                    ON CONFLICT (relay_id) DO UPDATE
                      SET waiting_until = EXCLUDED.waiting_until, ordered = EXCLUDED.ordered
                 )
                 {due}"
            ),
            // The second look of a wait: is anything this relay can take due now?
            due_now: format!("SELECT coalesce(({due}) <= 0, false)"),
            wait_clear: format!("DELETE FROM {waiters} WHERE relay_id = $1"),
            // Only while no other instance holds the relay id ($2: this one's): the exit of a
            // process that was refused, or found another holding its id, strips nobody.
            deregister: format!(
                "WITH me AS (
                    SELECT $1::text AS relay_id WHERE NOT EXISTS (
                      SELECT 1 FROM {relays} WHERE relay_id = $1 AND instance IS DISTINCT FROM $2)
                 ),
                 w AS (DELETE FROM {waiters} WHERE relay_id IN (SELECT relay_id FROM me)),
                 p AS (UPDATE {partitions} SET owner = NULL, lease_until = NULL
                       WHERE owner IN (SELECT relay_id FROM me)),
                 r AS (DELETE FROM {relays} WHERE relay_id IN (SELECT relay_id FROM me))
                 UPDATE {q} SET locked_until = NULL, locked_by = NULL, lock_token = NULL
                 WHERE {UNFINISHED} AND locked_by IN (SELECT relay_id FROM me)"
            ),
            counts: format!(
                "SELECT
                    count(*) FILTER (WHERE {UNFINISHED} AND (locked_until IS NULL OR locked_until <= now())),
                    count(*) FILTER (WHERE {UNFINISHED} AND locked_until > now()),
                    count(*) FILTER (WHERE dead_at IS NOT NULL AND processed_at IS NULL),
                    count(*) FILTER (WHERE processed_at IS NOT NULL),
                    extract(epoch FROM now() - min(created_at) FILTER (WHERE {UNFINISHED} AND isfinite(created_at)))::float8
                 FROM {q}"
            ),
        }
    }
}

/// Connection options for a relay's pool: `opts` with PostgreSQL's JIT compiler turned off
/// (`jit = off`), unless its `options` already set `jit`.
///
/// The relay's statements are short OLTP statements run thousands of times a second, but the
/// planner's cost estimate of the ordered claim on a large backlog passes `jit_above_cost`, and
/// JIT-compiling it each time cost PostgreSQL about as much CPU as running it: in a 200k-event
/// drain, half of the server's CPU was in LLVM, and turning JIT off took the drain from about
/// 21.7k to 37–40k events/s (`txoutbox bench drain`, same session). The CLI's pools use this;
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
    /// Ordered claims in flight, by claim token (see [`InFlight`]).
    in_flight: std::sync::Mutex<HashMap<Uuid, InFlight>>,
}

/// An ordered claim that has not been settled or released yet.
///
/// Ordered claims write nothing to the table: the relay holds the events because it owns
/// their partitions. What a row lease did besides (keep this relay's next claim off the
/// aggregates of the events it is still publishing) is done here, in memory: the next ordered
/// claim skips every aggregate hash in `keys`, until the batch is settled or released, or its
/// partition lease (`until`) has run out, after which the relay does not send it any more.
#[derive(Debug)]
struct InFlight {
    relay_id: String,
    /// How many events the claim holds.
    events: usize,
    /// The `partition_key` (aggregate hash) of the claim's events, sorted, without repeats.
    keys: Vec<i32>,
    /// The highest `seq` of the claim.
    max_seq: i64,
    /// The shortest lease of the partitions the claim came from, on this process's clock
    /// (taken before the claim was sent, so never later than the database's).
    until: std::time::Instant,
    /// The partitions the claim came from, with their ownership epochs: the settle's fence.
    fence_partitions: Vec<i32>,
    fence_epochs: Vec<i64>,
}

/// What fences the settle of an ordered claim: the relay and the epochs of its partitions.
#[derive(Debug)]
struct OrderedFence {
    relay_id: String,
    partitions: Vec<i32>,
    epochs: Vec<i64>,
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
    pub fn new(pool: PgPool, table: OutboxTable) -> Self {
        Self::with_retention(pool, table, Retention::Mark)
    }

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
            in_flight: std::sync::Mutex::new(HashMap::new()),
            pending_clear: std::sync::Mutex::new(None),
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
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
        super::partitions::relays(&self.pool, &self.table).await
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

    /// An ordered claim: read-only, see [`InFlight`].
    async fn claim_ordered(&self, p: &ClaimParams<'_>) -> Result<Vec<OutboxEvent>, Error> {
        let partitions = self.partition_count().await?;
        let started = Instant::now();
        let (mut busy, mut upto) = (Vec::new(), i64::MAX);
        if let Ok(mut map) = self.in_flight.lock() {
            // A claim never settled (its settle failed) is forgotten a while after its
            // partition lease ran out; until then its keys no longer hold anything back.
            map.retain(|_, f| f.until + FORGET_AFTER > started);
            let live = || map.values().filter(|f| f.until > started);
            busy.extend(live().flat_map(|f| f.keys.iter().copied()));
            if let Some(last) = live().map(|f| f.max_seq).max() {
                let window =
                    i64::try_from(p.limit.saturating_mul(CLAIM_AHEAD_WINDOW)).unwrap_or(i64::MAX);
                upto = last.saturating_add(window);
            }
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
            return Ok(Vec::new());
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
            return Ok(Vec::new());
        }
        let max_seq = events.iter().map(|e| e.seq).max().unwrap_or(0);
        let left = Duration::try_from_secs_f64(left.unwrap_or(0.0).max(0.0)).unwrap_or_default();
        if let Ok(mut map) = self.in_flight.lock() {
            map.insert(
                p.token,
                InFlight {
                    relay_id: p.relay_id.to_owned(),
                    events: events.len(),
                    keys,
                    max_seq,
                    until: started + left,
                    fence_partitions,
                    fence_epochs,
                },
            );
        }
        Ok(events)
    }

    /// Forget an ordered claim (settled or released); `None` if `token` is not one.
    fn take_in_flight(&self, token: Uuid) -> Option<InFlight> {
        self.in_flight.lock().ok()?.remove(&token)
    }

    /// One settle statement: fenced by the claim token, or for an ordered claim (`fence`) by
    /// partition ownership at the claim's epochs.
    async fn settle_inner(
        &self,
        p: &SettleParams<'_>,
        fence: Option<&OrderedFence>,
    ) -> Result<SettleOutcome, Error> {
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(SettleOutcome::default());
        }
        let ids: Vec<Uuid> = p.failed.iter().map(|f| f.id).collect();
        let errs: Vec<&str> = p.failed.iter().map(|f| f.error.as_str()).collect();
        let delays: Vec<i64> = p.failed.iter().map(|f| millis(f.retry_in)).collect();
        let dead: Vec<bool> = p.failed.iter().map(|f| f.dead).collect();
        let unavailable: Vec<bool> = p.failed.iter().map(|f| f.unavailable).collect();
        let query = match fence {
            Some(fence) => sqlx::query(&self.q.settle_ordered)
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
            None => sqlx::query(&self.q.settle)
                .bind(p.published)
                .bind(&ids)
                .bind(&errs)
                .bind(&delays)
                .bind(p.token)
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
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Vec<OutboxEvent>, Error> {
        if p.ordering.is_ordered() {
            // Ordered claims always scan from the start: an event below a cursor (released,
            // or retried from the dead letters with `hold`) must be found before any later
            // event of its aggregate.
            return self.claim_ordered(&p).await;
        }
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
        Ok(events)
    }

    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        let ordered = self.in_flight.lock().ok().and_then(|m| {
            m.get(&p.token).map(|f| OrderedFence {
                relay_id: f.relay_id.clone(),
                partitions: f.fence_partitions.clone(),
                epochs: f.fence_epochs.clone(),
            })
        });
        let result = self.settle_inner(&p, ordered.as_ref()).await;
        // Only now (the settle committed, or failed and the events are free to go again) may
        // the next ordered claim take these aggregates' next events.
        if ordered.is_some() {
            self.take_in_flight(p.token);
        }
        result
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        if self.take_in_flight(p.token).is_some() {
            // An ordered claim holds nothing in the table: forgetting it is the release.
            return Ok(p.ids.len() as u64);
        }
        if p.ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.q.release)
            .bind(p.ids)
            .bind(p.token)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if let Ok(mut scan) = self.scan.lock() {
            scan.rewind();
        }
        Ok(done.rows_affected())
    }

    fn claim_expires(&self, token: Uuid) -> Option<Instant> {
        self.in_flight.lock().ok()?.get(&token).map(|f| f.until)
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
        super::partitions::rebalance(&self.pool, &self.table, p).await
    }

    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        let relay_id = p.relay_id;
        let done = sqlx::query(&self.q.deregister)
            .bind(relay_id)
            .bind(p.instance.to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        // Its ordered claims in flight are given back with its partitions.
        let mut forgotten = 0;
        if let Ok(mut map) = self.in_flight.lock() {
            map.retain(|_, f| {
                let mine = f.relay_id == relay_id;
                if mine {
                    forgotten += f.events as u64;
                }
                !mine
            });
        }
        Ok(done.rows_affected() + forgotten)
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
