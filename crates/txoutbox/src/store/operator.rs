//! What operators do, on every database: list and show events with filters and keyset
//! paging, retry or discard a filtered set of dead letters, purge published rows in bounded
//! batches, and read the relays. One trait, [`Operator`]; each store implements it in its own
//! `operator` module (PostgreSQL in `store/admin.rs`).
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

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{RelayInfo, Store};
use crate::error::Error;
use crate::{EventState, OutboxEvent};

/// Most events one page may hold.
pub const MAX_PAGE: i64 = 1000;
/// Page size when none is asked for.
pub const DEFAULT_PAGE: i64 = 100;

/// Which events an operator query acts on. Every field narrows the set; none means "all".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    pub state: Option<EventState>,
    pub id: Option<Uuid>,
    pub event_type: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// `created_at >= created_after`
    pub created_after: Option<DateTime<Utc>>,
    /// `created_at < created_before`
    pub created_before: Option<DateTime<Utc>>,
}

/// Keyset pagination on `seq`: events with `seq > after_seq`, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub after_seq: Option<i64>,
    pub limit: i64,
}

impl Default for Page {
    fn default() -> Self {
        Self {
            after_seq: None,
            limit: DEFAULT_PAGE,
        }
    }
}

/// One page of events, in `seq` order, and the cursor for the next page.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventPage {
    pub events: Vec<OutboxEvent>,
    /// Pass as `after_seq` to get the next page; `None` when this page is the last.
    pub next_after_seq: Option<i64>,
}

/// A filter or page parameter that cannot be used. The message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    #[error("filter `{name}`: {reason}")]
    Invalid { name: String, reason: String },
    #[error("unknown filter `{name}` (known: {known})")]
    Unknown { name: String, known: &'static str },
}

impl FilterError {
    fn invalid(name: &str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}

/// The parameter names [`EventFilter::from_params`] knows.
pub const FILTER_PARAMS: &str = "state, id, event_type, aggregate_type, aggregate_id, \
     created_after, created_before, after_seq, limit";

impl EventFilter {
    /// Build a filter and a page from `name=value` pairs (a query string, a JSON body),
    /// rejecting unknown names, bad values and contradictions with a message naming the filter.
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(Self, Page), FilterError> {
        let mut f = Self::default();
        let mut page = Page::default();
        for (name, value) in params {
            let text = || non_empty(name, value);
            match name {
                "state" => f.state = Some(parse_state(value)?),
                "id" => {
                    f.id = Some(Uuid::parse_str(value.trim()).map_err(|e| {
                        FilterError::invalid(name, format!("{value:?} is not a UUID ({e})"))
                    })?)
                }
                "event_type" => f.event_type = Some(text()?),
                "aggregate_type" => f.aggregate_type = Some(text()?),
                "aggregate_id" => f.aggregate_id = Some(text()?),
                "created_after" => f.created_after = Some(parse_time(name, value)?),
                "created_before" => f.created_before = Some(parse_time(name, value)?),
                "after_seq" => {
                    page.after_seq = Some(value.trim().parse::<i64>().map_err(|_| {
                        FilterError::invalid(name, format!("{value:?} is not an integer"))
                    })?)
                }
                "limit" => page.limit = parse_limit(value)?,
                _ => {
                    return Err(FilterError::Unknown {
                        name: name.to_string(),
                        known: FILTER_PARAMS,
                    })
                }
            }
        }
        f.check()?;
        Ok((f, page))
    }

    /// Contradictions between filters.
    pub fn check(&self) -> Result<(), FilterError> {
        if let (Some(a), Some(b)) = (self.created_after, self.created_before) {
            if a >= b {
                return Err(FilterError::invalid(
                    "created_before",
                    "must be later than created_after",
                ));
            }
        }
        Ok(())
    }

    /// Does it narrow anything down (besides the state)?
    pub fn is_narrowed(&self) -> bool {
        self.id.is_some()
            || self.event_type.is_some()
            || self.aggregate_type.is_some()
            || self.aggregate_id.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
    }
}

/// `pending`, `leased`, `published` or `dead`.
pub fn parse_state(s: &str) -> Result<EventState, FilterError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "pending" => Ok(EventState::Pending),
        "leased" => Ok(EventState::Leased),
        "published" | "processed" => Ok(EventState::Published),
        "dead" => Ok(EventState::Dead),
        _ => Err(FilterError::invalid(
            "state",
            format!("{s:?} is not one of pending, leased, published, dead"),
        )),
    }
}

/// An RFC 3339 time, e.g. `2024-05-01T12:00:00Z`.
pub fn parse_time(name: &str, s: &str) -> Result<DateTime<Utc>, FilterError> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            FilterError::invalid(
                name,
                format!("{s:?} is not an RFC 3339 time like 2024-05-01T12:00:00Z ({e})"),
            )
        })
}

/// 1..=[`MAX_PAGE`].
pub fn parse_limit(s: &str) -> Result<i64, FilterError> {
    match s.trim().parse::<i64>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(FilterError::invalid(
            "limit",
            format!("{s:?} is not a whole number from 1 to {MAX_PAGE}"),
        )),
    }
}

fn non_empty(name: &str, v: &str) -> Result<String, FilterError> {
    if v.is_empty() {
        Err(FilterError::invalid(name, "must not be empty"))
    } else {
        Ok(v.to_string())
    }
}

/// How a database writes its bind parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marks {
    /// `$1`, `$2`, ... (PostgreSQL): a number may be used twice.
    #[cfg(feature = "postgres")]
    Dollar,
    /// `?` (MySQL, SQLite), bound in order.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    Question,
}

/// What a store needs to say in its own SQL dialect: placeholders and the current time in
/// the unit its timestamp columns hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
    pub marks: Marks,
    /// An SQL expression for "now", comparable with `locked_until` (`now()`, or milliseconds).
    pub now: &'static str,
}

/// A value of a filter, for the store to bind in its own column types (a UUID or its text,
/// a `timestamptz` or epoch milliseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FilterValue<'a> {
    Id(Uuid),
    Text(&'a str),
    Time(DateTime<Utc>),
    Int(i64),
}

/// An SQL condition and the values its placeholders stand for, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Condition<'a> {
    pub sql: String,
    pub values: Vec<FilterValue<'a>>,
    marks: Marks,
}

impl<'a> Condition<'a> {
    fn new(d: Dialect, first: &str) -> Self {
        Self {
            sql: first.to_string(),
            values: Vec::new(),
            marks: d.marks,
        }
    }

    /// The placeholder for the next value, which is recorded.
    pub fn mark(&mut self, v: FilterValue<'a>) -> String {
        self.values.push(v);
        match self.marks {
            #[cfg(feature = "postgres")]
            Marks::Dollar => format!("${}", self.values.len()),
            #[cfg(any(feature = "mysql", feature = "sqlite"))]
            Marks::Question => "?".to_string(),
        }
    }

    /// `AND <column> <op> <placeholder>`.
    fn and(&mut self, column: &'static str, op: &'static str, v: FilterValue<'a>) {
        let m = self.mark(v);
        self.sql.push_str(&format!(" AND {column} {op} {m}"));
    }
}

/// The condition of a state, with `now` the database's clock. A fixed text per state.
pub(crate) fn state_sql(state: Option<EventState>, now: &str) -> String {
    match state {
        None => "1 = 1".into(),
        Some(EventState::Pending) => {
            format!("{UNFINISHED} AND (locked_until IS NULL OR locked_until <= {now})")
        }
        Some(EventState::Leased) => format!("{UNFINISHED} AND locked_until > {now}"),
        Some(EventState::Published) => PUBLISHED.into(),
        Some(EventState::Dead) => DEAD.into(),
    }
}

/// Dead letters.
pub(crate) const DEAD: &str = "dead_at IS NOT NULL AND processed_at IS NULL";
/// Published (and still kept).
pub(crate) const PUBLISHED: &str = "processed_at IS NOT NULL";
/// Pending or leased.
pub(crate) const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

impl EventFilter {
    /// The condition this filter stands for, starting with `state` (`f.state` is not used:
    /// the caller picks the state's condition, e.g. [`DEAD`] for the dead-letter commands).
    pub(crate) fn to_sql(&self, d: Dialect, state: &str) -> Condition<'_> {
        let mut c = Condition::new(d, state);
        if let Some(id) = self.id {
            c.and("id", "=", FilterValue::Id(id));
        }
        for (column, v) in [
            ("event_type", &self.event_type),
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
        ] {
            if let Some(v) = v {
                c.and(column, "=", FilterValue::Text(v));
            }
        }
        if let Some(t) = self.created_after {
            c.and("created_at", ">=", FilterValue::Time(t));
        }
        if let Some(t) = self.created_before {
            c.and("created_at", "<", FilterValue::Time(t));
        }
        c
    }

    /// `<filter> AND seq > <cursor>`: the rows of one page, before its `ORDER BY seq LIMIT`.
    pub(crate) fn page_sql(&self, d: Dialect, state: &str, page: Page) -> Condition<'_> {
        let mut c = self.to_sql(d, state);
        c.and("seq", ">", FilterValue::Int(page.after()));
        c
    }
}

impl Page {
    /// The limit, within 1..=[`MAX_PAGE`].
    pub fn size(&self) -> i64 {
        self.limit.clamp(1, MAX_PAGE)
    }
    /// The cursor: the first page starts below every `seq`.
    pub(crate) fn after(&self) -> i64 {
        self.after_seq.unwrap_or(i64::MIN)
    }
    /// Rows to fetch: one more than the page holds tells whether there is a next page.
    pub(crate) fn fetch(&self) -> i64 {
        self.size() + 1
    }
}

impl EventPage {
    /// A page from up to [`Page::fetch`] events in `seq` order: the extra one, if there,
    /// is dropped and makes the last kept event's `seq` the cursor for the next page.
    pub(crate) fn assemble(mut events: Vec<OutboxEvent>, page: Page) -> Self {
        let limit = page.size() as usize;
        let more = events.len() > limit;
        events.truncate(limit);
        let next_after_seq = if more {
            events.last().map(|e| e.seq)
        } else {
            None
        };
        Self {
            events,
            next_after_seq,
        }
    }
}

/// Milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(p: &[(&str, &str)]) -> Result<(EventFilter, Page), FilterError> {
        EventFilter::from_params(p.iter().copied())
    }

    #[test]
    fn filters_parse_and_errors_name_the_filter() {
        let (f, page) = parse(&[
            ("state", "dead"),
            ("event_type", "order.created"),
            ("created_after", "2024-05-01T12:00:00Z"),
            ("after_seq", "42"),
            ("limit", "10"),
        ])
        .unwrap();
        assert_eq!(f.state, Some(EventState::Dead));
        assert_eq!(f.event_type.as_deref(), Some("order.created"));
        assert!(f.created_after.is_some());
        assert_eq!(
            page,
            Page {
                after_seq: Some(42),
                limit: 10
            }
        );
        for (p, needle) in [
            (("created_after", "yesterday"), "created_after"),
            (("limit", "0"), "limit"),
            (("limit", "5000"), "limit"),
            (("state", "gone"), "state"),
            (("id", "x"), "id"),
            (("after_seq", "1.5"), "after_seq"),
            (("colour", "red"), "unknown filter `colour`"),
            (("event_type", ""), "event_type"),
        ] {
            let e = parse(&[p]).unwrap_err().to_string();
            assert!(e.contains(needle), "{p:?}: {e}");
        }
        let e = parse(&[
            ("created_after", "2024-05-02T00:00:00Z"),
            ("created_before", "2024-05-01T00:00:00Z"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("created_before"), "{e}");
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn filters_become_placeholders_in_each_dialect() {
        let t = DateTime::parse_from_rfc3339("2024-05-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let f = EventFilter {
            event_type: Some("x'; DROP TABLE t; --".into()),
            aggregate_id: Some("a".into()),
            created_before: Some(t),
            ..EventFilter::default()
        };
        let page = Page {
            after_seq: Some(7),
            limit: 5,
        };
        let pg = Dialect {
            marks: Marks::Dollar,
            now: "now()",
        };
        let c = f.page_sql(pg, DEAD, page);
        assert_eq!(
            c.sql,
            format!(
                "{DEAD} AND event_type = $1 AND aggregate_id = $2 AND created_at < $3 AND seq > $4"
            )
        );
        assert_eq!(
            c.values,
            vec![
                FilterValue::Text("x'; DROP TABLE t; --"),
                FilterValue::Text("a"),
                FilterValue::Time(t),
                FilterValue::Int(7)
            ]
        );
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        {
            let q = Dialect {
                marks: Marks::Question,
                now: "NOW_MS",
            };
            let none = EventFilter::default();
            let c = none.to_sql(q, &state_sql(Some(EventState::Leased), q.now));
            assert_eq!(c.sql, format!("{UNFINISHED} AND locked_until > NOW_MS"));
            assert!(c.values.is_empty());
            let c = f.to_sql(q, "1 = 1");
            assert_eq!(c.sql.matches('?').count(), 3, "{}", c.sql);
        }
    }

    #[test]
    fn a_page_keeps_its_limit_and_points_past_its_last_event() {
        let ev = |seq| OutboxEvent {
            id: Uuid::nil(),
            seq,
            aggregate_type: "a".into(),
            aggregate_id: "1".into(),
            event_type: "e".into(),
            payload: serde_json::Value::Null,
            headers: Default::default(),
            attempts: 0,
            attempts_unavailable: 0,
            available_at: DateTime::<Utc>::MIN_UTC,
            created_at: DateTime::<Utc>::MIN_UTC,
            processed_at: None,
            dead_at: None,
            locked_by: None,
            locked_until: None,
            last_error: None,
        };
        let page = Page {
            after_seq: None,
            limit: 2,
        };
        assert_eq!((page.fetch(), page.after()), (3, i64::MIN));
        let full = EventPage::assemble(vec![ev(1), ev(4), ev(9)], page);
        assert_eq!(full.events.len(), 2);
        assert_eq!(full.next_after_seq, Some(4));
        let last = EventPage::assemble(vec![ev(1), ev(4)], page);
        assert_eq!(last.next_after_seq, None);
        let clamped = Page {
            after_seq: None,
            limit: 0,
        };
        assert_eq!(clamped.size(), 1);
    }
}
