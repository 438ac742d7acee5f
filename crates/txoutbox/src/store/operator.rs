//! What operators do, on every database: list and show events with filters and keyset
//! paging, retry or discard a filtered set of dead letters, purge published rows in bounded
//! batches, and read the relays. One trait, [`Operator`]: PostgreSQL implements it in
//! `store/postgres/operator.rs`, MySQL and SQLite once, for `TextStore` (`operator/text.rs`).
//!
//! Filters arrive as strings from HTTP query strings and CLI flags; [`EventFilter::from_params`]
//! validates them once, and its errors name the filter that is wrong. The SQL condition a
//! filter stands for is built here once (`EventFilter::to_sql`), with each database's
//! placeholders and clock, from fixed column names: no filter value is ever pasted into SQL.
//!
//! The states, on every database:
//! - pending: not published, not dead, no live lease (`locked_until` unset or past);
//! - leased: not published, not dead, `locked_until` in the future;
//! - published: `processed_at` set;
//! - dead: `dead_at` set and not published.

mod filter;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod text;

use std::time::Duration;

use uuid::Uuid;

pub use filter::{
    parse_limit, parse_state, parse_time, EventFilter, EventPage, FilterError, Page, DEFAULT_PAGE,
    FILTER_PARAMS, MAX_PAGE,
};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use sql::{millis, state_sql, Dialect, FilterValue, Marks, DEAD};
#[cfg(feature = "postgres")]
pub(crate) use sql::{PUBLISHED, UNFINISHED};

use super::{RelayInfo, Store};
use crate::error::Error;
use crate::OutboxEvent;

/// What operators do besides relaying (`txoutbox events`, `dlq`, `status`, the admin API),
/// the same on every store. Counts are [`Store::counts`].
#[async_trait::async_trait]
pub trait Operator: Store {
    /// Fail with "run `txoutbox migrate`" unless the schema is in place.
    async fn check_schema(&self) -> Result<(), Error>;
    /// One trivial query on the store's pool (readiness).
    async fn ping(&self) -> Result<(), Error>;
    /// Events matching `f` (its state included), in `seq` order, one page at a time.
    async fn list_events(&self, f: &EventFilter, page: Page) -> Result<EventPage, Error>;
    /// One event by id, in whatever state.
    async fn get_event(&self, id: Uuid) -> Result<Option<OutboxEvent>, Error>;
    /// Put the dead letters matching `f` back in line (attempts reset, available now) and
    /// wake the relays. `f.state` is ignored: only dead letters are touched.
    async fn retry_dead(&self, f: &EventFilter) -> Result<u64, Error>;
    /// Delete the dead letters matching `f` for good. `f.state` is ignored.
    async fn discard_dead(&self, f: &EventFilter) -> Result<u64, Error>;
    /// Delete at most `batch` published events whose `processed_at` is older than
    /// `older_than`, in one short statement; returns how many went. Dead letters and
    /// unpublished events are never touched. Call it until it returns less than `batch`
    /// ([`crate::retention::Purger`] does).
    async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error>;
    /// The relays registered on the table, with the partitions each owns.
    async fn relays(&self) -> Result<Vec<RelayInfo>, Error>;
}
