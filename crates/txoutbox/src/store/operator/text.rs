//! The operator implementation of the text-row stores ([`TextStore`]: MySQL and SQLite):
//! both keep ids as hyphenated text and times as epoch milliseconds, so their queries and
//! bindings are the same text.

use std::time::Duration;

use uuid::Uuid;

use super::{
    millis, state_sql, Dialect, EventFilter, EventPage, FilterValue, Marks, Operator, Page, DEAD,
};
use crate::error::Error;
use crate::store::sql::with_condition;
use crate::store::text::db::Bind;
use crate::store::text::{TextBackend, TextStore};
use crate::store::RelayInfo;
use crate::OutboxEvent;

/// Filter values as a text-keyed store binds them: ids as hyphenated text, times as epoch
/// milliseconds.
fn text_binds(values: &[FilterValue<'_>]) -> Vec<Bind> {
    values
        .iter()
        .map(|v| match *v {
            FilterValue::Id(id) => Bind::Text(id.hyphenated().to_string()),
            FilterValue::Text(t) => Bind::Text(t.to_owned()),
            FilterValue::Time(t) => Bind::Int(t.timestamp_millis()),
            FilterValue::Int(n) => Bind::Int(n),
        })
        .collect()
}

impl<DB: TextBackend> TextStore<DB> {
    /// `?` placeholders and the epoch-millisecond clock.
    const DIALECT: Dialect = Dialect {
        marks: Marks::Question,
        now: DB::NOW_MS,
    };

    /// Run `sql` (a statement over dead letters) with the condition of `f` in it.
    async fn on_dead(&self, sql: &str, f: &EventFilter) -> Result<u64, Error> {
        let c = f.to_sql(Self::DIALECT, DEAD);
        let sql = with_condition(sql, &c.sql);
        let done = DB::execute(DB::on_pool(&self.pool), &sql, text_binds(&c.values)).await;
        done.map_err(|e| self.err(e))
    }
}

#[async_trait::async_trait]
impl<DB: TextBackend> Operator for TextStore<DB> {
    async fn check_schema(&self) -> Result<(), Error> {
        TextStore::check_schema(self).await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        TextStore::relays(self).await
    }

    async fn ping(&self) -> Result<(), Error> {
        DB::execute(DB::on_pool(&self.pool), "SELECT 1", Vec::new())
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    async fn list_events(&self, f: &EventFilter, page: Page) -> Result<EventPage, Error> {
        let state = state_sql(f.state, Self::DIALECT.now);
        let mut c = f.page_sql(Self::DIALECT, &state, page);
        // The limit's mark is the last of the statement's.
        c.mark(FilterValue::Int(page.fetch()));
        let sql = with_condition(&self.text().events_page, &c.sql);
        let rows = DB::fetch_all(DB::on_pool(&self.pool), &sql, text_binds(&c.values))
            .await
            .map_err(|e| self.err(e))?;
        let events = rows.iter().map(DB::event).collect::<Result<Vec<_>, _>>()?;
        Ok(EventPage::assemble(events, page))
    }

    async fn get_event(&self, id: Uuid) -> Result<Option<OutboxEvent>, Error> {
        let id = vec![Bind::Text(id.hyphenated().to_string())];
        let row = DB::fetch_optional(DB::on_pool(&self.pool), &self.text().event, id)
            .await
            .map_err(|e| self.err(e))?;
        row.as_ref().map(DB::event).transpose()
    }

    async fn retry_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        let n = self.on_dead(&self.text().dead_retry, f).await?;
        if n > 0 {
            self.wakeup.fire();
        }
        Ok(n)
    }

    async fn discard_dead(&self, f: &EventFilter) -> Result<u64, Error> {
        self.on_dead(&self.text().dead_discard, f).await
    }

    /// One statement (`sql/purge.sql`), its locks bounded by the batch.
    async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error> {
        let binds = vec![Bind::Int(millis(older_than)), Bind::Int(batch.max(1))];
        let done = DB::execute(DB::on_pool(&self.pool), &self.text().purge, binds).await;
        done.map_err(|e| self.err(e))
    }
}
