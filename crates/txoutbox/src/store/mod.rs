//! Where the relay gets events from and reports back to. One trait, [`Store`], with a params
//! struct per operation so a new field does not break every backend. PostgreSQL first.

#[cfg(feature = "postgres")]
pub mod postgres;

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;
use crate::OutboxEvent;

/// Claim up to `limit` available events, leasing them to `relay_id` under `token`.
#[derive(Debug, Clone)]
pub struct ClaimParams<'a> {
    pub relay_id: &'a str,
    /// Per-claim fencing token: only a settle that presents it takes effect.
    pub token: Uuid,
    pub limit: usize,
    pub lease: Duration,
}

/// One failed event and what to do with it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub id: Uuid,
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
    pub token: Uuid,
    pub published: &'a [Uuid],
    pub failed: &'a [Failure],
}

/// How many rows a settle changed (fewer than asked: the lease was lost to another relay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettleOutcome {
    pub published: u64,
    pub failed: u64,
}

/// Give events back unattempted (shutdown, or lease about to run out before sending).
#[derive(Debug, Clone)]
pub struct ReleaseParams<'a> {
    pub token: Uuid,
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

/// Which events an operator command acts on.
#[derive(Debug, Clone, Default)]
pub struct DeadFilter {
    pub id: Option<Uuid>,
    pub event_type: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub limit: Option<i64>,
}

/// The relay's view of a database.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Claim a batch in one short statement; returned in `seq` order.
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Vec<OutboxEvent>, Error>;
    /// Settle a batch in one statement; fenced by the claim token.
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error>;
    /// Release leased events without counting an attempt; fenced by the claim token.
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error>;
    /// Is anything unpublished and not dead (pending, backing off or leased)?
    async fn has_unfinished(&self) -> Result<bool, Error>;
    /// Sleep until new work may be there: a wake-up from a writer, the earliest time a
    /// backing-off or leased event becomes claimable, or `max`, whichever comes first.
    async fn wait_for_work(&self, relay_id: &str, max: Duration) -> Result<Wake, Error>;
    /// Forget `relay_id`: release whatever it still holds and stop writers notifying for it.
    async fn deregister(&self, relay_id: &str) -> Result<u64, Error>;
    async fn counts(&self) -> Result<Counts, Error>;
}

/// Why [`Store::wait_for_work`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Work was already claimable; no sleep.
    Ready,
    Notified,
    Timeout,
}
