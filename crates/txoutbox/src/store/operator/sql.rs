//! The SQL a filter and a page stand for, once for every database: each store gives its
//! placeholders and its clock ([`Dialect`]) and binds the values in its own column types.
//! Column names are fixed here; no filter value is ever pasted into SQL.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{EventFilter, EventPage, Page, MAX_PAGE};
use crate::{EventState, OutboxEvent};

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

#[cfg(test)]
mod tests {
    use super::*;

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
            payload: crate::JsonPayload::null(),
            payload_bytes: None,
            content_type: None,
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
