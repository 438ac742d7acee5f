//! The operator implementation MySQL and SQLite share: both keep ids as hyphenated text and
//! times as epoch milliseconds, so their queries and bindings are the same text.

/// The operator methods of MySQL and SQLite, which they share word for word: both keep ids
/// as text and times as epoch milliseconds. `$store` must have `pool`, `q` (its `Queries`,
/// with the shared `TextQueries` as `text`), `wakeup`, `err`,
/// `check_schema` and `relays`; `$now` is its clock in SQL.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! text_operator {
    ($store:ty, $now:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::operator::Operator for $store {
            async fn check_schema(&self) -> Result<(), $crate::Error> {
                <$store>::check_schema(self).await
            }

            async fn relays(&self) -> Result<Vec<$crate::store::RelayInfo>, $crate::Error> {
                <$store>::relays(self).await
            }

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
                // The limit's mark is the last of the statement's.
                c.mark(FilterValue::Int(page.fetch()));
                let sql = $crate::store::sql::with_condition(&self.q.text.events_page, &c.sql);
                let rows = $crate::store::operator::bind_text!(sqlx::query(&sql), c.values)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                let events = rows
                    .iter()
                    .map(|r| $crate::store::undecodable::decode_text_row(r).map(|d| d.event))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(EventPage::assemble(events, page))
            }

            async fn get_event(
                &self,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::OutboxEvent>, $crate::Error> {
                let row = sqlx::query(&self.q.text.event)
                    .bind(id.hyphenated().to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                let event =
                    row.map(|r| $crate::store::undecodable::decode_text_row(&r).map(|d| d.event));
                event.transpose()
            }

            async fn retry_dead(
                &self,
                f: &$crate::store::operator::EventFilter,
            ) -> Result<u64, $crate::Error> {
                let c = f.to_sql(TEXT_DIALECT, $crate::store::operator::DEAD);
                let sql = $crate::store::sql::with_condition(&self.q.text.dead_retry, &c.sql);
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
                let sql = $crate::store::sql::with_condition(&self.q.text.dead_discard, &c.sql);
                Ok(
                    $crate::store::operator::bind_text!(sqlx::query(&sql), c.values)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| self.err(e))?
                        .rows_affected(),
                )
            }

            /// One statement (`sql/purge.sql`), its locks bounded by the batch.
            async fn purge_processed(
                &self,
                older_than: std::time::Duration,
                batch: i64,
            ) -> Result<u64, $crate::Error> {
                let done = sqlx::query(&self.q.text.purge)
                    .bind($crate::store::operator::millis(older_than))
                    .bind(batch.max(1))
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(done.rows_affected())
            }
        }

        /// `?` placeholders and the epoch-millisecond clock.
        const TEXT_DIALECT: $crate::store::operator::Dialect = $crate::store::operator::Dialect {
            marks: $crate::store::operator::Marks::Question,
            now: $now,
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
