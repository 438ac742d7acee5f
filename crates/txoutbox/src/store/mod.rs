//! Where the relay gets events from and reports back to. One trait, [`Store`], with a params
//! struct per operation so a new field does not break every backend; [`Operator`] adds what
//! operators do (events, dead letters, purge, the relays list; [`operator`]). One module per
//! database, each behind its cargo feature: [`postgres`], [`sqlite`], [`mysql`]. Each keeps its
//! SQL in `store/<db>/sql/*.sql`, one file per statement, filled once per store with the
//! validated names of its table (`store/sql.rs`).

pub(crate) mod migrations;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
pub mod operator;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod partitions;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod pool;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod rows;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod text;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) mod undecodable;
pub mod wakeup;

/// The last error of an event whose payload no claim may read.
pub(crate) fn too_large(size: u64, limit: u64) -> String {
    format!(
        "payload of {size} bytes is over the relay's max_event_bytes ({limit} bytes): \
         dead-lettered unsent (raise --max-event-bytes if the broker takes it)"
    )
}

pub use operator::{EventFilter, EventPage, FilterError, Operator, Page};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use pool::{relay_pool_options, PING_IDLE_AFTER};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "mysql"))))]
pub use text::{TextBackend, TextStore};

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;
use crate::OutboxEvent;

/// Claim up to `limit` available events, leasing them to `relay_id` under `token`.
#[derive(Debug, Clone)]
pub struct ClaimParams<'a> {
    /// The claiming relay's id, written to `locked_by` (row leases) or checked against partition
    /// ownership (ordered PostgreSQL claims).
    pub relay_id: &'a str,
    /// Per-claim fencing token for row leases: only a settle that presents it takes effect.
    pub token: Uuid,
    /// At most this many events.
    pub limit: usize,
    /// At most this many payload bytes, and no event larger than a ceiling.
    pub bytes: ClaimBytes,
    /// How long the claimed events stay leased; after it another relay may claim them.
    pub lease: Duration,
    /// The relay's mode: which events are claimable.
    pub ordering: Ordering,
    /// This relay's claims not yet settled or released. A claim that leases no rows
    /// (PostgreSQL's: it holds events by partition ownership) skips them: ordered, their
    /// aggregates, so the relay's own later events of an aggregate never overtake the ones it
    /// is still sending; unordered, their events, so none is claimed twice. The relay keeps
    /// this list, not the store: a store holds no per-claim state.
    pub in_flight: &'a [Arc<Claim>],
    /// The relay's metric labels, on what the claim counts itself (rows dead-lettered because
    /// they did not decode).
    pub metric_labels: &'a crate::metrics::MetricLabels,
}

/// The byte limits of one claim, so that what a relay holds is bounded by its settings
/// whatever the rows hold.
///
/// Sizes are of `payload` and `payload_bytes` as stored, uncompressed (on PostgreSQL, a
/// compressed `jsonb` value is measured as its text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBytes {
    /// Payload bytes in all, at most: the claim stops before the event that would pass this.
    /// The first event is taken whatever its size (up to [`event`](Self::event)), so a
    /// large event still goes, alone.
    pub batch: u64,
    /// An event whose payload is larger is not read: the claim dead-letters it at once, with
    /// its size in the last error (no broker would take it).
    pub event: u64,
}

impl ClaimBytes {
    /// No byte limit (the claim is bounded by its event count alone).
    pub const UNLIMITED: ClaimBytes = ClaimBytes {
        batch: u64::MAX,
        event: u64::MAX,
    };

    /// [`batch`](Self::batch) as an SQL parameter.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn batch_param(&self) -> i64 {
        i64::try_from(self.batch).unwrap_or(i64::MAX)
    }

    /// [`event`](Self::event) as an SQL parameter.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn event_param(&self) -> i64 {
        i64::try_from(self.event).unwrap_or(i64::MAX)
    }
}

impl Default for ClaimBytes {
    fn default() -> Self {
        Self::UNLIMITED
    }
}

/// A claimed batch: its events, what fences its settle, and how long it may be published.
///
/// [`Store::claim`] makes it; [`Store::settle`] and [`Store::release`] take it back. It is a
/// plain value: the store remembers nothing of it, so a claim may be settled by any handle of
/// the same store, and a source of events other than a table plugs in with a fence of its own.
#[derive(Debug, Clone)]
pub struct Claim {
    /// In claim order (`seq`); empty when nothing was claimable.
    pub events: Vec<OutboxEvent>,
    /// What the settle and release of this claim must present.
    pub fence: Fence,
    /// Publishing must stop before this instant (this process's clock, taken before the claim
    /// was sent, so never later than the database's): after it another relay may hold these
    /// events. The relay stops a safety margin earlier.
    pub expires: Instant,
}

/// What makes a settle take effect only while the claim still holds its events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fence {
    /// The rows are leased under this token (`lock_token`); a settle presenting another token,
    /// or after the lease passed to another relay, changes nothing.
    Lease {
        /// The token the claim wrote to `lock_token`.
        token: Uuid,
    },
    /// PostgreSQL's claims (ordered, and unordered of a relay that owns partitions) lease no
    /// rows: the relay holds the events because it owns their partitions, and a settle takes
    /// effect only while it still owns each of them at the epoch it owned it at when claiming.
    Partitions(PartitionFence),
}

/// The fence of a claim held by partition ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFence {
    /// The claiming relay.
    pub relay_id: String,
    /// The partitions the claim came from, ascending, and their ownership epochs.
    pub partitions: Vec<i32>,
    /// The ownership epoch of each partition in `partitions`, index for index.
    pub epochs: Vec<i64>,
    /// The aggregate hash (`partition_key`) of each of the claim's events, index for index:
    /// the next ordered claim skips these aggregates while this one is in flight. Empty for an
    /// unordered claim, whose successor skips its events instead.
    pub keys: Vec<i32>,
    /// Events the broker acknowledged, by `seq`, in a claim that stands for another one while
    /// that one settles ([`Claim::acknowledged`]): the next claim skips these events but does
    /// not hold their aggregates back. Empty in a claim as the store made it.
    pub acknowledged: Vec<i64>,
}

impl Claim {
    /// A claim of rows leased under `token` (MySQL, SQLite, and PostgreSQL's unordered claim
    /// of a relay that owns no partition).
    pub fn leased(token: Uuid, events: Vec<OutboxEvent>, expires: Instant) -> Self {
        Self {
            events,
            fence: Fence::Lease { token },
            expires,
        }
    }

    /// The row-lease token, or [`Error::ForeignClaim`] for a claim fenced otherwise (a claim
    /// made by another kind of store).
    pub fn lease_token(&self) -> Result<Uuid, Error> {
        match &self.fence {
            Fence::Lease { token } => Ok(*token),
            Fence::Partitions(_) => Err(Error::ForeignClaim),
        }
    }

    /// The ids of its events, in claim order.
    pub fn ids(&self) -> Vec<Uuid> {
        self.events.iter().map(|e| e.id).collect()
    }

    /// This ordered claim as the relay's next claim must see it once the broker acknowledged
    /// the events whose index in [`events`](Self::events) `acked` holds: a claim that holds
    /// back only the aggregates of the events still unacknowledged (failed, or not sent), and
    /// names the acknowledged ones, which the next claim skips until the settle has marked them.
    /// An aggregate's next event may then go while its previous one is being settled: it
    /// follows an acknowledged event, so its first delivery is still in `seq` order. (Should
    /// that settle not take effect, a relay crash or a lost partition, the previous event is
    /// delivered again after it: a redelivery, which at-least-once allows.)
    ///
    /// `None` for any other claim (row leases, an unordered claim: nothing to hold back), and
    /// when nothing was acknowledged.
    pub fn acknowledged(&self, acked: &[bool]) -> Option<Claim> {
        let Fence::Partitions(f) = &self.fence else {
            return None;
        };
        if f.keys.len() != self.events.len() || !acked.iter().any(|a| *a) {
            return None;
        }
        let mut keys = Vec::new();
        let mut seqs = f.acknowledged.clone();
        for ((event, key), acked) in self.events.iter().zip(&f.keys).zip(acked) {
            if *acked {
                seqs.push(event.seq);
            } else {
                keys.push(*key);
            }
        }
        Some(Claim {
            events: Vec::new(),
            fence: Fence::Partitions(PartitionFence {
                keys,
                acknowledged: seqs,
                ..f.clone()
            }),
            expires: self.expires,
        })
    }
}

/// How events are handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Ordering {
    /// Per-aggregate order: only from partitions this relay owns, and an event only when no
    /// earlier event of its aggregate is leased, backing off (or, with `hold`, dead).
    #[default]
    Ordered,
    /// Like `Ordered`, and a dead letter holds back the later events of its aggregate until an
    /// operator retries or discards it.
    OrderedHold,
    /// Any available event, whatever its aggregate: throughput without order. On PostgreSQL,
    /// only from partitions this relay owns (a relay that owns none leases rows of partitions
    /// no live relay owns); elsewhere, to any relay.
    Unordered,
}

impl Ordering {
    /// Is this one of the per-aggregate modes (`Ordered`, `OrderedHold`)?
    pub fn is_ordered(self) -> bool {
        !matches!(self, Ordering::Unordered)
    }
    /// The mode's name in the relays table and in `txoutbox status`.
    pub fn mode_name(self) -> &'static str {
        if self.is_ordered() {
            "ordered"
        } else {
            "unordered"
        }
    }
}

/// A relay's heartbeat: keep its partitions, and take or give up some to share them fairly.
#[derive(Debug, Clone)]
pub struct RebalanceParams<'a> {
    /// The relay sending the heartbeat.
    pub relay_id: &'a str,
    /// This process's own random id (one per [`crate::relay::Relay`]): a relay id that a live
    /// process with another instance holds is refused ([`Error::RelayIdInUse`]).
    pub instance: Uuid,
    /// The relay's mode; relays of another mode on the table make this fail with
    /// [`Error::ModeConflict`].
    pub ordering: Ordering,
    /// How long partitions (and the relay's liveness) last without a heartbeat.
    pub lease: Duration,
    /// May partitions be given up now? Only while no claim of this relay is running (a claim
    /// must never overlap another relay's claim on the same partition).
    pub may_release: bool,
}

/// What a heartbeat found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    /// Partitions in all.
    pub partitions: usize,
    /// Live relays of this relay's mode (itself included).
    pub live_relays: usize,
    /// Partitions this relay owns now, ascending.
    pub owned: Vec<i32>,
    /// The fair share it aims at.
    pub target: usize,
    /// Partitions taken by this heartbeat, ascending.
    pub acquired: Vec<i32>,
    /// Partitions given up by this heartbeat.
    pub released: Vec<i32>,
}

/// A relay as `txoutbox status` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RelayInfo {
    /// The relay's id (`--relay-id`).
    pub relay_id: String,
    /// `ordered` or `unordered` (see [`Ordering::mode_name`]).
    pub mode: String,
    /// When the relay registered (the database's clock).
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: chrono::DateTime<chrono::Utc>,
    /// Has it sent a heartbeat within its lease? A dead relay stays listed for a while, then is
    /// removed.
    pub alive: bool,
    /// Partitions it owns, ascending (empty for an unordered relay on MySQL, and always on
    /// SQLite).
    pub partitions: Vec<i32>,
}

/// One failed event and what to do with it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The event that failed.
    pub id: Uuid,
    /// The error chain, secrets redacted; stored as the event's `last_error`.
    pub error: String,
    /// When it may be claimed again.
    pub retry_in: Duration,
    /// Dead-letter it now (permanent error, or out of attempts).
    pub dead: bool,
    /// The broker was unavailable: the attempt does not count towards `max_attempts`.
    pub unavailable: bool,
}

/// Report the outcome of a claim: published ids and failures.
#[derive(Debug, Clone)]
pub struct SettleParams<'a> {
    /// The claim being settled; its fence decides whether the settle takes effect.
    pub claim: &'a Claim,
    /// Events of the claim that the broker acknowledged: marked published (or deleted, with
    /// `Retention::Delete`). An id that is not one of the claim's events changes nothing.
    pub published: &'a [Uuid],
    /// Events that failed: backed off or dead-lettered.
    pub failed: &'a [Failure],
}

/// How many rows a settle changed (fewer than asked: the lease was lost to another relay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettleOutcome {
    /// Published events that were marked (or deleted).
    pub published: u64,
    /// Failed events that were backed off or dead-lettered.
    pub failed: u64,
}

/// Wait for work a relay can take.
#[derive(Debug, Clone, Copy)]
pub struct WaitParams<'a> {
    /// The waiting relay.
    pub relay_id: &'a str,
    /// The relay's mode: an ordered relay waits only for events in its own partitions that
    /// no earlier event of their aggregate holds back; on PostgreSQL an unordered relay that
    /// owns partitions, for any event in them.
    pub ordering: Ordering,
    /// Sleep at most this long (the poll interval).
    pub max: Duration,
}

/// A relay is leaving: fenced by its instance, so the exit of a process that was refused (or
/// found another process holding its relay id) never strips the holder.
#[derive(Debug, Clone, Copy)]
pub struct DeregisterParams<'a> {
    /// The leaving relay.
    pub relay_id: &'a str,
    /// The leaving process's instance (as in [`RebalanceParams::instance`]); a relay id held by
    /// another instance is left alone.
    pub instance: Uuid,
}

/// Give events back unattempted (shutdown, or lease about to run out before sending).
#[derive(Debug, Clone)]
pub struct ReleaseParams<'a> {
    /// The claim the events came from; its fence decides whether the release takes effect.
    pub claim: &'a Claim,
    /// The events to give back (a subset of the claim's).
    pub ids: &'a [Uuid],
}

/// Make events due now that were backing off for a publisher outage which has ended.
#[derive(Debug, Clone, Copy)]
pub struct RetryNowParams<'a> {
    /// The events (pending ones only are touched: not leased, published or dead).
    pub ids: &'a [Uuid],
}

/// What happens to published events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Retention {
    /// Keep them, with `processed_at` set (the seed's behaviour).
    #[default]
    Mark,
    /// Delete them on settle (cheapest: the table stays small).
    Delete,
}

/// Counts for `txoutbox status`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Counts {
    /// Not yet published and not leased (includes events backing off).
    pub pending: i64,
    /// Leased by a relay right now.
    pub leased: i64,
    /// Dead letters waiting for an operator.
    pub dead: i64,
    /// Published and still kept.
    pub processed: i64,
    /// Age of the oldest unpublished, not-dead event, in seconds.
    pub oldest_pending_age_secs: Option<f64>,
}

/// The relay's view of a database.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Claim a batch in one short statement; returned in `seq` order. A claimed row that does
    /// not decode (plain SQL wrote a value the relay cannot read) is not returned: the claim
    /// dead-letters it, fenced like a settle, with a last error that says what is wrong.
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error>;
    /// Settle a batch in one statement; fenced by the claim's [`Fence`].
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error>;
    /// Release claimed events without counting an attempt; fenced by the claim's [`Fence`].
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error>;
    /// Make the given events due now (`available_at = now`) and wake the relays: their
    /// publisher was unavailable and answers again, so their backoff has nothing left to wait
    /// for. Only pending events not leased are touched; returns how many. A store that cannot
    /// leaves them to their backoff (the default).
    async fn retry_now(&self, p: RetryNowParams<'_>) -> Result<u64, Error> {
        let _ = p;
        Ok(0)
    }
    /// Is anything unpublished and not dead (pending, backing off or leased)? With
    /// [`Ordering::OrderedHold`], events held behind a dead letter do not count.
    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error>;
    /// Heartbeat, renew owned partitions, and move towards a fair share of them.
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error>;
    /// Sleep until new work may be there: a wake-up from a writer, the earliest time an
    /// event *this relay can claim* (ordered: in its partitions, not held back by an earlier
    /// event of its aggregate) becomes claimable, or `max`, whichever comes first.
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error>;
    /// Forget the relay: release its events and partitions, remove it from the live relays,
    /// and stop writers notifying for it. Does nothing while another instance holds the id.
    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error>;
    /// How many events are in each state, and the oldest pending one's age.
    async fn counts(&self) -> Result<Counts, Error>;
}

/// A boxed store is a store: a store picked at run time (`Box<dyn Operator>`) can drive a
/// relay.
#[async_trait::async_trait]
impl<S: Store + ?Sized> Store for Box<S> {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        (**self).claim(p).await
    }
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        (**self).settle(p).await
    }
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        (**self).release(p).await
    }
    async fn retry_now(&self, p: RetryNowParams<'_>) -> Result<u64, Error> {
        (**self).retry_now(p).await
    }
    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        (**self).has_unfinished(ordering).await
    }
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        (**self).rebalance(p).await
    }
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        (**self).wait_for_work(p).await
    }
    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        (**self).deregister(p).await
    }
    async fn counts(&self) -> Result<Counts, Error> {
        (**self).counts().await
    }
}

/// Why [`Store::wait_for_work`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Work was already claimable; no sleep.
    Ready,
    /// A writer's wake-up arrived (LISTEN/NOTIFY on PostgreSQL; an in-process wake-up on MySQL
    /// and SQLite).
    Notified,
    /// `max` passed, or the earliest backed-off event this relay can claim became due.
    Timeout,
}
