//! Claim and settle on PostgreSQL: the unordered claim's scan cursor, the read-only ordered
//! claim, the fence a read-only claim carries, the fenced settle, and the burial of rows that
//! do not decode. The unordered claim itself is in `unordered.rs`.

use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use super::decode::decode_row;
use super::{millis, PgStore, CLAIM_AHEAD_WINDOW, FULL_SCAN_EVERY};
use crate::error::Error;
use crate::store::undecodable::{self, Decoded};
use crate::store::{
    Claim, ClaimParams, Fence, Ordering, PartitionFence, SettleOutcome, SettleParams,
};

/// Where the next unordered claim starts reading the pending index.
///
/// Every published row leaves a dead entry at the front of the `pending` index until VACUUM
/// removes it, and the events this relay has in flight stay there as live ones, so a claim
/// that scans from the start gets slower the more was drained since the last vacuum (in a
/// 100k backlog, from about 1 ms to tens of ms per claim). While claims come back full (a
/// backlog), the next claim starts past the highest `seq` claimed so far and skips that
/// prefix (unordered mode only). Events below the cursor (committed late with a lower `seq`,
/// released, due for a retry, or in partitions just taken over) are found by a full scan,
/// made after any claim that was not full, after this store released events or took
/// partitions, and at least every [`FULL_SCAN_EVERY`]; a claim past the cursor that comes
/// back short looks behind it at once.
#[derive(Debug)]
pub(super) struct ScanState {
    pub(super) cursor: i64,
    pub(super) last_full: std::time::Instant,
    pub(super) backlog: bool,
}

impl ScanState {
    /// The `seq` floor for the next claim: 0 for a full scan.
    pub(super) fn floor(&self) -> i64 {
        if self.backlog && self.last_full.elapsed() < FULL_SCAN_EVERY {
            self.cursor
        } else {
            0
        }
    }

    /// A claim from `floor` found `found` events (of `limit`), the last of them at `last`.
    pub(super) fn record(&mut self, floor: i64, limit: usize, found: usize, last: Option<i64>) {
        if floor == 0 {
            self.last_full = std::time::Instant::now();
        }
        self.backlog = found >= limit;
        if let Some(last) = last {
            self.cursor = self.cursor.max(last);
        }
    }

    /// Events were given back: the next claim looks behind the cursor.
    pub(super) fn rewind(&mut self) {
        self.backlog = false;
    }
}

/// After a read-only claim's fast form met a candidate too large for it, this many claims run
/// the full statement at once before the fast form is tried again: where payloads are large,
/// most claims would otherwise run twice, the fast form only to learn it does not serve.
const FULL_CLAIMS_AFTER_FALLBACK: u32 = 16;

/// Whether the next read-only claim tries its fast form (sql/claim_fast.sql) or runs the full
/// statement at once ([`FULL_CLAIMS_AFTER_FALLBACK`]).
#[derive(Debug, Default)]
pub(super) struct FastForm {
    full_left: AtomicU32,
}

impl FastForm {
    /// Try the fast form for this claim? No while a run of full claims lasts (this counts it
    /// down).
    pub(super) fn try_fast(&self) -> bool {
        self.full_left
            .fetch_update(AtomicOrdering::Relaxed, AtomicOrdering::Relaxed, |n| {
                n.checked_sub(1)
            })
            .is_err()
    }

    /// The fast form met a candidate too large for it: the next claims run the full statement.
    pub(super) fn fell_back(&self) {
        self.full_left
            .store(FULL_CLAIMS_AFTER_FALLBACK, AtomicOrdering::Relaxed);
    }
}

/// What a read-only claim (ordered, or unordered on owned partitions) says on one row
/// ([`PgStore::fetch_claim`]): the partitions it came from, their epochs, and how long the
/// shortest of their leases runs.
#[derive(Debug, Clone)]
pub(super) struct PartitionHead {
    pub(super) partitions: Vec<i32>,
    pub(super) epochs: Vec<i64>,
    pub(super) left: Duration,
}

impl PartitionHead {
    /// The head on `row`, the row of a read-only claim that carries it
    /// ([`PgStore::fetch_claim`]).
    pub(super) fn read(row: &PgRow) -> Result<Self, Error> {
        let g = Error::Database;
        let left: Option<f64> = row.try_get("lease_left").map_err(g)?;
        Ok(Self {
            partitions: row.try_get("fence_partitions").map_err(g)?,
            epochs: row.try_get("fence_epochs").map_err(g)?,
            left: Duration::try_from_secs_f64(left.unwrap_or(0.0).max(0.0)).unwrap_or_default(),
        })
    }

    /// Whether `other` holds the same partitions at the same epochs (the lease left aside).
    pub(super) fn same_fence(&self, other: &Self) -> bool {
        self.partitions == other.partitions && self.epochs == other.epochs
    }

    /// A claim of `events` held by these partitions (`keys`: each event's aggregate hash, for
    /// an ordered claim), which expires when the shortest of their leases runs out.
    pub(super) fn claim(
        self,
        relay_id: &str,
        events: Vec<crate::OutboxEvent>,
        keys: Vec<i32>,
        started: Instant,
    ) -> Claim {
        Claim {
            events,
            fence: Fence::Partitions(PartitionFence {
                relay_id: relay_id.to_owned(),
                partitions: self.partitions,
                epochs: self.epochs,
                keys,
                acknowledged: Vec::new(),
            }),
            expires: started + self.left,
        }
    }
}

/// A read-only claim's rows, each decoded as it came in (while the database was still sending
/// the next ones), and its head (lease left and fence): `head` is `Some` whenever `rows` is not
/// empty.
pub(super) struct ClaimRows {
    pub(super) rows: Vec<Fetched>,
    pub(super) head: Option<PartitionHead>,
}

/// One claimed row, decoded.
pub(super) struct Fetched {
    pub(super) row: Decoded,
    /// Its aggregate's hash (`partition_key`), where the statement sends it (the ordered
    /// claims).
    pub(super) key: Option<i32>,
    /// Its payload's size as stored, as the claim measured it (`payload_size`).
    pub(super) size: Option<i64>,
}

impl Fetched {
    /// `r` decoded, refused whole if its payload is over the claim's per-event ceiling (it
    /// then came without it).
    /// `keyed`: the statement sends `partition_key`.
    fn read(r: &PgRow, p: &ClaimParams<'_>, size: Option<i64>, keyed: bool) -> Result<Self, Error> {
        let row = decode_within(r, size, p)?;
        let key = if keyed {
            r.try_get("partition_key").map_err(Error::Database)?
        } else {
            None
        };
        Ok(Self { row, key, size })
    }
}

/// Payload bytes of claimed rows, as the claim measured them.
pub(super) fn bytes_of(rows: &[Fetched]) -> u64 {
    rows.iter()
        .filter_map(|f| f.size)
        .map(|s| u64::try_from(s).unwrap_or(0))
        .sum()
}

fn is_null(row: &PgRow, col: &str) -> bool {
    row.try_get_raw(col)
        .is_ok_and(|v| sqlx::ValueRef::is_null(&v))
}

impl PgStore {
    /// A read-only claim: its fast form (`fast`, sql/claim_fast.sql), or, when a candidate is
    /// not small enough for it (it then comes without its payload and size), the full
    /// statement (`full`, with the byte budget's walk), both bound by `bind`; after such a
    /// fallback the next claims run the full statement at once ([`FastForm`]). The fast form
    /// sends the head as a row of its own (`id` NULL), the full one on the lowest seq's row;
    /// the rows come in no particular order ([`undecodable::split`] puts the events in seq
    /// order).
    pub(super) async fn fetch_claim<'q>(
        &self,
        p: &ClaimParams<'_>,
        fast: &'q str,
        full: &'q str,
        bind: impl Fn(&'q str) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<ClaimRows, Error> {
        if self.fast_form.try_fast() {
            if let Some(rows) = self.read_claim(bind(fast), p, true).await? {
                return Ok(rows);
            }
            self.fast_form.fell_back();
        }
        let rows = self.read_claim(bind(full), p, false).await?;
        Ok(rows.unwrap_or(ClaimRows {
            rows: Vec::new(),
            head: None,
        }))
    }

    /// Run one form of a read-only claim (`fast`, or the full statement), decoding each row
    /// as it arrives: the relay's decoding overlaps the database's reading of the rows after
    /// it. `None`: the fast form met a candidate that is not small (the full statement must
    /// run); the rest of its rows are read and dropped.
    async fn read_claim(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        p: &ClaimParams<'_>,
        fast: bool,
    ) -> Result<Option<ClaimRows>, Error> {
        use futures::TryStreamExt;
        let mut stream = query.fetch(&self.pool);
        let mut rows = Vec::with_capacity(p.limit.min(10_000));
        let mut head = None;
        let mut small = true;
        let mut keyed = None;
        while let Some(r) = stream.try_next().await.map_err(|e| self.err(e))? {
            if fast && is_null(&r, "id") {
                // With no partition owned there is no fence, and no rows either.
                if !is_null(&r, "fence_partitions") {
                    head = Some(PartitionHead::read(&r)?);
                }
                continue;
            }
            if !small {
                continue;
            }
            let size: Option<i64> = r.try_get("payload_size").map_err(Error::Database)?;
            if fast && size.is_none() {
                small = false;
                rows.clear();
                continue;
            }
            if !fast && head.is_none() && !is_null(&r, "fence_partitions") {
                head = Some(PartitionHead::read(&r)?);
            }
            // Whether the statement sends `partition_key`, looked up once (a failed lookup by
            // name costs an error's allocation, on every row).
            let keyed = *keyed.get_or_insert_with(|| r.try_get_raw("partition_key").is_ok());
            rows.push(Fetched::read(&r, p, size, keyed)?);
        }
        if !small {
            return Ok(None);
        }
        if rows.is_empty() {
            head = None;
        } else if head.is_none() {
            // A bug: the statements put the head on a row of every claim that finds any.
            // Not transient (a retry would meet it again): the relay stops and says so.
            return Err(Error::Database(sqlx::Error::Decode(
                "a read-only claim found events but sent no head (lease left and fence)".into(),
            )));
        }
        Ok(Some(ClaimRows { rows, head }))
    }
}

/// A claim's rows decoded, each event over the claim's per-event ceiling refused (it came
/// without its payload, with its size in `payload_size`).
pub(super) fn decode_claimed(rows: &[PgRow], p: &ClaimParams<'_>) -> Result<Vec<Decoded>, Error> {
    rows.iter()
        .map(|r| decode_within(r, r.try_get("payload_size").ok(), p))
        .collect()
}

/// `r` decoded, and refused if its payload (`size`, as the claim measured it) is over the
/// claim's per-event ceiling.
fn decode_within(r: &PgRow, size: Option<i64>, p: &ClaimParams<'_>) -> Result<Decoded, Error> {
    let mut d = decode_row(r)?;
    d.refuse_over(size, p.bytes.event);
    Ok(d)
}

/// Ascending `seqs` as runs of consecutive values: their first and last values, index for
/// index (a batch of consecutive seqs is one run, not one value each on the wire).
fn runs(seqs: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let (mut from, mut to): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    for &s in seqs {
        match to.last_mut() {
            Some(last) if s <= last.saturating_add(1) => *last = (*last).max(s),
            _ => {
                from.push(s);
                to.push(s);
            }
        }
    }
    (from, to)
}

impl PgStore {
    /// An ordered claim: read-only. It writes nothing to the table: the relay holds the
    /// events because it owns their partitions (the claim's [`PartitionFence`]). What a row
    /// lease did besides, keep this relay's next claim off the aggregates it is still
    /// publishing, the claim params do: the relay passes its claims in flight, and this claim
    /// skips their aggregate hashes, and reads at most [`CLAIM_AHEAD_WINDOW`] batches' worth of
    /// `seq` past the last of them.
    pub(super) async fn claim_ordered(&self, p: &ClaimParams<'_>) -> Result<Claim, Error> {
        let partitions = self.partition_count().await?;
        let started = Instant::now();
        let empty = || Claim::leased(p.token, Vec::new(), started + p.lease);
        let (mut busy, mut acknowledged, mut upto) = (Vec::new(), Vec::new(), i64::MAX);
        // A claim whose partition lease ran out holds nothing back: the relay does not send
        // it any more.
        let live = p.in_flight.iter().filter(|c| c.expires > started);
        let mut last = None;
        for c in live {
            if let Fence::Partitions(f) = &c.fence {
                busy.extend(f.keys.iter().copied());
                acknowledged.extend(f.acknowledged.iter().copied());
                last = last.max(c.events.iter().map(|e| e.seq).max());
                last = last.max(f.acknowledged.iter().copied().max());
            }
        }
        acknowledged.sort_unstable();
        let (from, to) = runs(&acknowledged);
        if let Some(last) = last {
            let window =
                i64::try_from(p.limit.saturating_mul(CLAIM_AHEAD_WINDOW)).unwrap_or(i64::MAX);
            upto = last.saturating_add(window);
        }
        busy.sort_unstable();
        busy.dedup();
        let bind = |sql| {
            sqlx::query(sql)
                .bind(i64::try_from(p.limit).unwrap_or(i64::MAX))
                .bind(p.relay_id)
                .bind(partitions)
                .bind(p.ordering == Ordering::OrderedHold)
                .bind(&busy)
                .bind(upto)
                .bind(p.bytes.batch_param())
                .bind(p.bytes.event_param())
                .bind(&from)
                .bind(&to)
        };
        let ClaimRows { rows, head } = self
            .fetch_claim(p, &self.q.claim_ordered_fast, &self.q.claim_ordered, bind)
            .await?;
        let Some(head) = head else {
            return Ok(empty());
        };
        let key_of: std::collections::HashMap<i64, i32> = rows
            .iter()
            .map(|f| (f.row.event.seq, f.key.unwrap_or_default()))
            .collect();
        let rows = rows.into_iter().map(|f| f.row).collect();
        // Events held behind an undecodable row (`hold`) are simply not handed out: an
        // ordered claim leases nothing.
        let (events, bad, _held) = undecodable::split(rows, p.ordering);
        if !bad.is_empty() {
            self.bury_undecodable(p, &bad, Some(partitions)).await;
        }
        if events.is_empty() {
            return Ok(empty());
        }
        let keys = events
            .iter()
            .map(|e| key_of.get(&e.seq).copied().unwrap_or_default())
            .collect();
        Ok(head.claim(p.relay_id, events, keys, started))
    }

    /// One settle statement: fenced by the claim token, or for an ordered claim by partition
    /// ownership at the claim's epochs.
    pub(super) async fn settle_inner(&self, p: &SettleParams<'_>) -> Result<SettleOutcome, Error> {
        if p.published.is_empty() && p.failed.is_empty() {
            return Ok(SettleOutcome::default());
        }
        let ids: Vec<Uuid> = p.failed.iter().map(|f| f.id).collect();
        let errs: Vec<&str> = p.failed.iter().map(|f| f.error.as_str()).collect();
        let delays: Vec<i64> = p.failed.iter().map(|f| millis(f.retry_in)).collect();
        let dead: Vec<bool> = p.failed.iter().map(|f| f.dead).collect();
        let unavailable: Vec<bool> = p.failed.iter().map(|f| f.unavailable).collect();
        // The published rows are found by seq (published_by_seq.sql), in the claim's order;
        // by id if the claim does not carry all of them (a caller that settles by token alone).
        let published: std::collections::HashSet<&Uuid> = p.published.iter().collect();
        let seqs: Vec<i64> = p
            .claim
            .events
            .iter()
            .filter(|e| published.contains(&e.id))
            .map(|e| e.seq)
            .collect();
        let by_seq = seqs.len() == published.len();
        // $1, the ids, only serves the by-id statements: a by-seq settle sends none (500 UUIDs
        // a settle, encoded, sent and decoded for nothing).
        let ids_published: &[Uuid] = if by_seq { &[] } else { p.published };
        let (settle, settle_ordered) = if by_seq {
            (&self.q.settle, &self.q.settle_ordered)
        } else {
            (&self.q.settle_by_id, &self.q.settle_ordered_by_id)
        };
        let query = match &p.claim.fence {
            Fence::Partitions(fence) => sqlx::query(settle_ordered)
                .bind(ids_published)
                .bind(&ids)
                .bind(&errs)
                .bind(&delays)
                .bind(&fence.relay_id)
                .bind(&dead)
                .bind(&unavailable)
                .bind(self.partition_count().await?)
                .bind(&fence.partitions)
                .bind(&fence.epochs),
            Fence::Lease { token } => sqlx::query(settle)
                .bind(ids_published)
                .bind(&ids)
                .bind(&errs)
                .bind(&delays)
                .bind(token)
                .bind(&dead)
                .bind(&unavailable),
        };
        // The seqs are the last parameter of both by-seq statements ($11, $8).
        let query = if by_seq { query.bind(&seqs) } else { query };
        let row = query.fetch_one(&self.pool).await.map_err(|e| self.err(e))?;
        let ok: i64 = row.try_get(0).map_err(Error::Database)?;
        let bad: i64 = row.try_get(1).map_err(Error::Database)?;
        Ok(SettleOutcome {
            published: ok as u64,
            failed: bad as u64,
        })
    }
}

impl PgStore {
    /// Dead-letter claimed rows that do not decode (by id: a `uuid` column always decodes).
    /// Fenced like a settle: by the claim token, or for an ordered claim (`partitions`: how
    /// many there are) by this relay's partition lease. On failure an unordered claim's rows
    /// stay leased until the lease runs out, and the next claim meets them again.
    pub(super) async fn bury_undecodable(
        &self,
        p: &ClaimParams<'_>,
        bad: &[Decoded],
        partitions: Option<i32>,
    ) {
        let ids: Vec<Uuid> = bad.iter().map(|b| b.event.id).collect();
        let errs: Vec<String> = bad
            .iter()
            .map(|b| b.last_error().unwrap_or_default())
            .collect();
        let q = match partitions {
            None => sqlx::query(&self.q.bury)
                .bind(&ids)
                .bind(&errs)
                .bind(p.token),
            Some(n) => sqlx::query(&self.q.bury_ordered)
                .bind(&ids)
                .bind(&errs)
                .bind(n)
                .bind(p.relay_id),
        };
        let result = q.execute(&self.pool).await;
        match result {
            Ok(_) => undecodable::count_dead(bad, p.metric_labels),
            Err(e) => tracing::warn!(error = %self.err(e),
                "could not dead-letter rows that do not decode; the next claims meet them again"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{runs, FastForm, FULL_CLAIMS_AFTER_FALLBACK};

    #[test]
    fn after_a_fallback_a_run_of_claims_skips_the_fast_form() {
        let f = FastForm::default();
        assert!(
            f.try_fast() && f.try_fast(),
            "the fast form first, as long as it serves"
        );
        f.fell_back();
        for i in 0..FULL_CLAIMS_AFTER_FALLBACK {
            assert!(
                !f.try_fast(),
                "claim {i} after the fallback runs the full statement"
            );
        }
        assert!(f.try_fast(), "then the fast form again");
        f.fell_back();
        assert!(!f.try_fast());
    }

    #[test]
    fn seqs_go_as_runs_of_consecutive_values() {
        assert_eq!(runs(&[]), (vec![], vec![]));
        assert_eq!(runs(&[5]), (vec![5], vec![5]));
        assert_eq!(
            runs(&[1, 2, 3, 3, 7, 9, 10, i64::MAX]),
            (vec![1, 7, 9, i64::MAX], vec![3, 7, 10, i64::MAX])
        );
    }
}
