//! The conformance harness for the WAL source's table path ([`TablePath`]): the store a WAL
//! relay claims handed-off events from. Each event the suite writes is handed to it as the
//! stream hands events over (`handed_off_at` set in the same way), so the suite checks that
//! the path claims, settles, releases, orders and dead-letters as every store does.

use uuid::Uuid;

use super::postgres::PgHarness;
use super::{Harness, Malformed, RawRow, RowState};
use crate::error::Error;
use crate::store::operator::{EventFilter, EventPage, Operator, Page};
use crate::store::postgres::wal::TablePath;
use crate::store::postgres::PgStore;
use crate::store::{
    Claim, ClaimParams, Counts, DeregisterParams, Membership, Ordering, RebalanceParams, RelayInfo,
    ReleaseParams, Retention, RetryNowParams, SettleOutcome, SettleParams, Store, WaitParams, Wake,
};
use crate::{NewEvent, OutboxEvent, OutboxTable};

/// A fresh schema per test, like [`PgHarness`], whose events are handed to the table path.
pub struct TablePathHarness(PgHarness);

/// The table path for the relay's side, and the PostgreSQL store for the operator's (what
/// the daemon's admin API and commands use beside a WAL relay).
pub struct HandedOffStore {
    path: TablePath,
    pg: PgStore,
}

impl TablePathHarness {
    /// Hand `ids`' rows to the table path, as the stream does.
    async fn hand_over(&self, where_: &str) {
        self.0
            .exec(&format!(
                "UPDATE {} SET handed_off_at = now() WHERE handed_off_at IS NULL AND {where_}",
                self.0.table.qualified()
            ))
            .await;
    }
}

#[async_trait::async_trait(?Send)]
impl Harness for TablePathHarness {
    type Store = HandedOffStore;

    async fn new() -> Self {
        Self(PgHarness::new().await)
    }

    async fn store(&self, retention: Retention) -> HandedOffStore {
        let pg = self.0.store(retention).await;
        let wal = pg
            .wal()
            .with_slot("txoutbox_conformance")
            .expect("a valid slot name");
        HandedOffStore {
            path: std::sync::Arc::new(wal).table_path(),
            pg,
        }
    }

    async fn enqueue(&self, events: &[NewEvent]) -> Vec<Uuid> {
        let ids = self.0.enqueue(events).await;
        let list: Vec<String> = ids.iter().map(|id| format!("'{id}'")).collect();
        if !list.is_empty() {
            self.hand_over(&format!("id IN ({})", list.join(", ")))
                .await;
        }
        ids
    }

    async fn enqueue_rolled_back(&self, events: &[NewEvent]) {
        self.0.enqueue_rolled_back(events).await;
    }

    async fn rows(&self) -> Vec<RowState> {
        self.0.rows().await
    }

    async fn make_available(&self) {
        self.0.make_available().await;
    }

    async fn insert_malformed(&self, aggregate_id: &str) -> Vec<Malformed> {
        let rows = self.0.insert_malformed(aggregate_id).await;
        self.hand_over("true").await;
        rows
    }

    async fn insert_never_due(&self) -> i64 {
        let seq = self.0.insert_never_due().await;
        self.hand_over("true").await;
        seq
    }

    async fn raw_rows(&self) -> Vec<RawRow> {
        self.0.raw_rows().await
    }

    fn url(&self) -> String {
        self.0.url()
    }

    fn table(&self) -> &OutboxTable {
        self.0.table()
    }

    async fn cleanup(self) {
        self.0.cleanup().await;
    }
}

#[async_trait::async_trait]
impl Store for HandedOffStore {
    async fn claim(&self, p: ClaimParams<'_>) -> Result<Claim, Error> {
        self.path.claim(p).await
    }
    async fn settle(&self, p: SettleParams<'_>) -> Result<SettleOutcome, Error> {
        self.path.settle(p).await
    }
    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, Error> {
        self.path.release(p).await
    }
    async fn retry_now(&self, p: RetryNowParams<'_>) -> Result<u64, Error> {
        self.path.retry_now(p).await
    }
    async fn has_unfinished(&self, ordering: Ordering) -> Result<bool, Error> {
        self.path.has_unfinished(ordering).await
    }
    async fn rebalance(&self, p: RebalanceParams<'_>) -> Result<Membership, Error> {
        self.path.rebalance(p).await
    }
    async fn wait_for_work(&self, p: WaitParams<'_>) -> Result<Wake, Error> {
        self.path.wait_for_work(p).await
    }
    async fn deregister(&self, p: DeregisterParams<'_>) -> Result<u64, Error> {
        self.path.deregister(p).await
    }
    async fn counts(&self) -> Result<Counts, Error> {
        self.path.counts().await
    }
}

#[async_trait::async_trait]
impl Operator for HandedOffStore {
    async fn check_schema(&self) -> Result<(), Error> {
        self.pg.check_schema().await
    }
    async fn ping(&self) -> Result<(), Error> {
        self.pg.ping().await
    }
    async fn list_events(&self, f: &EventFilter, page: Page) -> Result<EventPage, Error> {
        self.pg.list_events(f, page).await
    }
    async fn get_event(&self, id: Uuid) -> Result<Option<OutboxEvent>, Error> {
        self.pg.get_event(id).await
    }
    async fn retry_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        self.pg.retry_dead(f).await
    }
    async fn discard_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        self.pg.discard_dead(f).await
    }
    async fn purge_processed(
        &self,
        older_than: std::time::Duration,
        batch: i64,
    ) -> Result<u64, Error> {
        self.pg.purge_processed(older_than, batch).await
    }
    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        self.pg.relays().await
    }
}
