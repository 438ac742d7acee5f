//! The operator surface on PostgreSQL (see [`super::operator`]): list and inspect events with
//! filters and keyset pagination, retry or discard a filtered set of dead letters, and purge
//! published rows in bounded batches (retention).

use std::time::Duration;

use uuid::Uuid;

use super::{event_from_row, PgStore};
use crate::error::{db_error, Error};
use crate::store::operator::{
    Dialect, EventFilter, EventPage, FilterValue, Marks, Operator, Page, DEAD, PUBLISHED,
    UNFINISHED,
};
use crate::store::sql::finish;
use crate::store::RelayInfo;
use crate::OutboxEvent;

const PG: Dialect = Dialect {
    marks: Marks::Dollar,
    now: "now()",
};

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind<'q>(mut q: PgQuery<'q>, values: &[FilterValue<'q>]) -> PgQuery<'q> {
    for v in values {
        q = match *v {
            FilterValue::Id(id) => q.bind(id),
            FilterValue::Text(t) => q.bind(t),
            FilterValue::Time(t) => q.bind(t),
            FilterValue::Int(n) => q.bind(n),
        };
    }
    q
}

impl PgStore {
    fn operator_error(&self, e: sqlx::Error) -> Error {
        db_error(self.table(), e)
    }
}

#[async_trait::async_trait]
impl Operator for PgStore {
    async fn check_schema(&self) -> Result<(), Error> {
        PgStore::check_schema(self).await
    }

    async fn ping(&self) -> Result<(), Error> {
        sqlx::query("SELECT 1")
            .execute(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        Ok(())
    }

    /// The cursor is a plain `seq > $n` (the first page binds the smallest `bigint`), so
    /// even a generic plan walks an index on `seq` from the cursor on. Without a state the
    /// page is the merge of the three disjoint states, each in its own `seq` order: the
    /// unfinished rows (their partial index), dead letters and published rows (each theirs,
    /// where present), so no page sorts the whole table.
    async fn list_events(&self, f: &EventFilter, page: Page) -> Result<EventPage, Error> {
        let mut c = f.page_sql(PG, "TRUE", page);
        let limit = c.mark(FilterValue::Int(page.fetch()));
        let branch = |state: &str| {
            let tags = [
                ("{{state}}", state),
                ("{{condition}}", &c.sql),
                ("{{limit}}", &limit),
            ];
            finish(&self.q.events_branch, &tags)
        };
        let sql = match f.state {
            Some(state) => branch(&crate::store::operator::state_sql(Some(state), PG.now)),
            None => {
                let (unfinished, dead) = (branch(UNFINISHED), branch(DEAD));
                let published = branch(PUBLISHED);
                let tags = [
                    ("{{unfinished_page}}", unfinished.as_str()),
                    ("{{dead_page}}", &dead),
                    ("{{published_page}}", &published),
                    ("{{limit}}", &limit),
                ];
                finish(&self.q.events_merged, &tags)
            }
        };
        let rows = bind(sqlx::query(&sql), &c.values)
            .fetch_all(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        let events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EventPage::assemble(events, page))
    }

    async fn get_event(&self, id: Uuid) -> Result<Option<OutboxEvent>, Error> {
        let row = sqlx::query(&self.q.event)
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        row.as_ref().map(event_from_row).transpose()
    }

    /// One statement, which also notifies the relays' channel.
    async fn retry_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        let channel = self.table().channel();
        let mut c = f.to_sql(PG, DEAD);
        let chan = c.mark(FilterValue::Text(&channel));
        let tags = [("{{condition}}", c.sql.as_str()), ("{{channel}}", &chan)];
        let sql = finish(&self.q.dead_retry, &tags);
        let row = bind(sqlx::query(&sql), &c.values)
            .fetch_one(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        let n: i64 = sqlx::Row::try_get(&row, 0).map_err(Error::Database)?;
        Ok(n as u64)
    }

    async fn discard_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        let c = f.to_sql(PG, DEAD);
        let sql = finish(&self.q.dead_discard, &[("{{condition}}", &c.sql)]);
        let done = bind(sqlx::query(&sql), &c.values)
            .execute(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        Ok(done.rows_affected())
    }

    /// One statement, its locks bounded by the batch (see `sql/purge.sql`).
    async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error> {
        let done = sqlx::query(&self.q.purge)
            .bind(crate::store::operator::millis(older_than) as f64)
            .bind(batch.max(1))
            .execute(self.pool())
            .await
            .map_err(|e| self.operator_error(e))?;
        Ok(done.rows_affected())
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        PgStore::relays(self).await
    }
}
