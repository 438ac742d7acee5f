//! The store conformance suite (cargo feature `testing`): the same checks — claim, settle,
//! lease expiry, fencing, release, dead letters, ordering, `has_unfinished`, counts, and the
//! operator surface (paging, filters, purge; [`operator`]) — run
//! against every backend on a real database. A backend provides a [`Harness`] (a fresh,
//! migrated outbox per test, and a way to read its rows); [`store_conformance!`](crate::store_conformance) turns the
//! checks of [`store`] into one `#[tokio::test]` each:
//!
//! ```ignore
//! txoutbox::store_conformance!(txoutbox::testing::sqlite::SqliteHarness);
//! ```
//!
//! Test support: it panics on failure, by design.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "mysql")]
pub mod mysql;
pub mod operator;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
#[cfg(feature = "wal")]
pub mod table_path;

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::store::{Operator, Retention};
use crate::NewEvent;

/// How long a wait on observable state may take before the check fails.
pub const DEADLINE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);

/// One outbox row as the checks look at it, whatever the database stores it as.
#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    /// The event's id.
    pub id: Uuid,
    /// Its insert order.
    pub seq: i64,
    /// Its event type.
    pub event_type: String,
    /// Failed attempts so far.
    pub attempts: i32,
    /// Of those, failures because the broker was unavailable.
    pub attempts_unavailable: i32,
    /// Not claimable before this.
    pub available_at: DateTime<Utc>,
    /// The relay id of the row lease, if any.
    pub locked_by: Option<String>,
    /// The row lease's end, if any.
    pub locked_until: Option<DateTime<Utc>>,
    /// The row lease's fencing token, if any.
    pub lock_token: Option<Uuid>,
    /// The last failure's error, if any.
    pub last_error: Option<String>,
    /// When it was published, if it was.
    pub processed_at: Option<DateTime<Utc>>,
    /// When it was dead-lettered, if it was.
    pub dead_at: Option<DateTime<Utc>>,
    /// The database's clock when the row was read.
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

/// A row written by [`Harness::insert_malformed`].
#[derive(Debug, Clone)]
pub struct Malformed {
    /// The row's `seq`.
    pub seq: i64,
    /// What was done to it, for assertion messages.
    pub what: &'static str,
    /// What its `last_error` must say once the relay has dead-lettered it.
    pub expect: &'static str,
    /// `dlq retry` repairs it (the damage is in `attempts` or `available_at`, which a retry
    /// resets).
    pub retry_resets: bool,
}

/// A row read without decoding anything that a malformed row could break.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRow {
    /// The row's `seq`.
    pub seq: i64,
    /// The id as text (it may not be a UUID).
    pub id: String,
    /// `dead_at` is set.
    pub dead: bool,
    /// `processed_at` is set.
    pub processed: bool,
    /// `locked_until` is in the future (by the database's clock).
    pub leased: bool,
    /// The row's `last_error`.
    pub last_error: Option<String>,
}

/// One backend's side of the suite: a fresh, migrated outbox of the test's own (a schema, a
/// database or a file), removed by [`Harness::cleanup`].
#[async_trait::async_trait(?Send)]
pub trait Harness: Send + Sync + Sized + 'static {
    /// The backend's store, with its operator side.
    type Store: Operator;
    /// A new outbox, migrated.
    async fn new() -> Self;
    /// A store on it (each call may open its own pool: a second relay process).
    async fn store(&self, retention: Retention) -> Self::Store;
    /// `Outbox::enqueue_many` in a committed transaction of the backend's pool.
    async fn enqueue(&self, events: &[NewEvent]) -> Vec<Uuid>;
    /// `Outbox::enqueue` and `enqueue_many` in one transaction that is rolled back, then
    /// `enqueue` in one that is dropped without a commit.
    async fn enqueue_rolled_back(&self, events: &[NewEvent]);
    /// Every row, in `seq` order.
    async fn rows(&self) -> Vec<RowState>;
    /// The row of event `id`; panics if there is none.
    async fn row(&self, id: Uuid) -> RowState {
        self.rows()
            .await
            .into_iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    }
    /// Make every row available now (ends backoffs).
    async fn make_available(&self);
    /// Write, by plain SQL, rows of aggregate `("bad", aggregate_id)` that the schema allows
    /// but the store cannot decode: one per kind of damage this database lets through. (Not
    /// a bad `locked_until`: a claim that leases the row overwrites it.)
    async fn insert_malformed(&self, aggregate_id: &str) -> Vec<Malformed>;
    /// Write, by plain SQL, a row that is never due (its `available_at` as far in the future
    /// as the column allows); returns its `seq`.
    async fn insert_never_due(&self) -> i64;
    /// Every row as raw as the database has it (no decoding that could fail), in `seq` order.
    async fn raw_rows(&self) -> Vec<RawRow>;
    /// A URL that reaches this outbox's database (for tools that open their own pools).
    fn url(&self) -> String;
    /// The outbox table.
    fn table(&self) -> &crate::OutboxTable;
    /// Remove what [`Harness::new`] created.
    async fn cleanup(self);
}

/// Poll `check` until it returns `Some`; panic naming `what` after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Instantiate the store conformance suite for a [`Harness`]: one `#[tokio::test]` per
/// check of [`store`], each on a fresh outbox.
#[macro_export]
macro_rules! store_conformance {
    ($harness:ty) => {
        $crate::store_conformance!(@tests $harness,
            enqueue_keeps_slice_order_and_rollback_leaves_nothing,
            claims_are_leased_fenced_and_expire,
            release_gives_rows_back_unattempted,
            retry_now_makes_only_backing_off_events_due,
            settle_marks_published_and_backs_off_or_buries_failures,
            delete_retention_deletes_on_settle,
            a_settle_with_its_claim_changes_exactly_its_rows,
            a_deleting_settle_with_its_claim_changes_exactly_its_rows,
            dead_letters_list_retry_and_discard,
            counts_reflect_every_state,
            ordered_claim_never_passes_a_blocked_aggregate,
            hold_mode_keeps_an_aggregate_behind_its_dead_letter,
            a_claim_is_a_value_any_handle_of_the_store_settles,
            deregister_releases_and_forgets_the_relay,
            a_relay_id_held_by_a_live_process_is_refused,
            undecodable_rows_are_dead_lettered_and_the_rest_flow,
            hold_mode_keeps_an_aggregate_behind_an_undecodable_row,
            relay_keeps_running_past_undecodable_rows,
            operator_pages_through_events_with_a_cursor,
            operator_filters_by_every_field_and_state,
            operator_gets_one_event_by_id,
            purge_deletes_published_rows_in_batches,
            byte_payloads_round_trip_beside_json_ones,
            json_payloads_keep_every_digit,
            claims_stop_at_the_byte_budget,
            an_event_over_the_ceiling_is_dead_lettered_unread,
        );
    };
    (@tests $harness:ty, $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let h = <$harness as $crate::testing::Harness>::new().await;
                $crate::testing::store::$name(&h).await;
                $crate::testing::Harness::cleanup(h).await;
            }
        )*
    };
}
