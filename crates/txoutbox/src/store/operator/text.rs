//! The operator implementation MySQL and SQLite share: both keep ids as hyphenated text and
//! times as epoch milliseconds, so their queries and bindings are the same text.

/// The operator methods that MySQL and SQLite share word for word: both keep ids as text and
/// times as epoch milliseconds. `$store` must have `pool`, `table`, `wakeup` and `err`, and
/// the invoking module `COLUMNS`, `table(&OutboxTable)`, `event_from_row` and `NOW_MS`; the
/// store's own methods (`check_schema`, `purge_processed`, `relays`) go in the braces.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! text_operator {
    ($store:ty, { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::store::operator::Operator for $store {
            $($own)*

            async fn ping(&self) -> Result<(), $crate::Error> {
                sqlx::query("SELECT 1")
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(())
            }

            async fn list_events(
                &self,
                f: &$crate::store::operator::EventFilter,
                page: $crate::store::operator::Page,
            ) -> Result<$crate::store::operator::EventPage, $crate::Error> {
                use $crate::store::operator::{state_sql, EventPage, FilterValue};
                let state = state_sql(f.state, TEXT_DIALECT.now);
                let mut c = f.page_sql(TEXT_DIALECT, &state, page);
                let limit = c.mark(FilterValue::Int(page.fetch()));
                let sql = format!(
                    "SELECT {COLUMNS} FROM {} WHERE {} ORDER BY seq LIMIT {limit}",
                    table(&self.table),
                    c.sql
                );
                let rows = $crate::store::operator::bind_text!(sqlx::query(&sql), c.values)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                let events = rows
                    .iter()
                    .map(event_from_row)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(EventPage::assemble(events, page))
            }

            async fn get_event(
                &self,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::OutboxEvent>, $crate::Error> {
                let sql = format!("SELECT {COLUMNS} FROM {} WHERE id = ?", table(&self.table));
                let row = sqlx::query(&sql)
                    .bind(id.hyphenated().to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                row.as_ref().map(event_from_row).transpose()
            }

            async fn retry_dead(
                &self,
                f: &$crate::store::operator::EventFilter,
            ) -> Result<u64, $crate::Error> {
                let c = f.to_sql(TEXT_DIALECT, $crate::store::operator::DEAD);
                let sql = format!(
                    "UPDATE {} SET dead_at = NULL, attempts = 0, attempts_unavailable = 0, \
                     available_at = {NOW_MS}, last_error = NULL WHERE {}",
                    table(&self.table),
                    c.sql
                );
                let n = $crate::store::operator::bind_text!(sqlx::query(&sql), c.values)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected();
                if n > 0 {
                    self.wakeup.fire();
                }
                Ok(n)
            }

            async fn discard_dead(
                &self,
                f: &$crate::store::operator::EventFilter,
            ) -> Result<u64, $crate::Error> {
                let c = f.to_sql(TEXT_DIALECT, $crate::store::operator::DEAD);
                let sql = format!("DELETE FROM {} WHERE {}", table(&self.table), c.sql);
                Ok($crate::store::operator::bind_text!(sqlx::query(&sql), c.values)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected())
            }
        }

        /// `?` placeholders and the epoch-millisecond clock.
        const TEXT_DIALECT: $crate::store::operator::Dialect = $crate::store::operator::Dialect {
            marks: $crate::store::operator::Marks::Question,
            now: NOW_MS,
        };
    };
}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use text_operator;

/// Bind filter values as a text-keyed store holds them: ids as hyphenated text, times as
/// epoch milliseconds.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! bind_text {
    ($query:expr, $values:expr) => {{
        use $crate::store::operator::FilterValue;
        let mut q = $query;
        for v in &$values {
            q = match *v {
                FilterValue::Id(id) => q.bind(id.hyphenated().to_string()),
                FilterValue::Text(t) => q.bind(t),
                FilterValue::Time(t) => q.bind(t.timestamp_millis()),
                FilterValue::Int(n) => q.bind(n),
            };
        }
        q
    }};
}
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) use bind_text;
