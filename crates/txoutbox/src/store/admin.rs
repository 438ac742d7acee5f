//! Operator queries on the PostgreSQL store: list and inspect events and dead letters with
//! filters and keyset pagination, retry or discard a filtered set of dead letters, and purge
//! published rows in bounded batches (retention).
//!
//! Filters arrive as strings from HTTP query strings and CLI flags; [`EventFilter::from_params`]
//! validates them once, and its errors name the filter that is wrong.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::postgres::{event_from_row, PgStore, COLUMNS};
use crate::error::{db_error, Error};
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

/// SQL for a state; a fixed string per variant, never built from input.
fn state_sql(state: Option<EventState>) -> &'static str {
    match state {
        None => "TRUE",
        Some(EventState::Pending) => {
            "processed_at IS NULL AND dead_at IS NULL AND (locked_until IS NULL OR locked_until <= now())"
        }
        Some(EventState::Leased) => {
            "processed_at IS NULL AND dead_at IS NULL AND locked_until > now()"
        }
        Some(EventState::Published) => "processed_at IS NOT NULL",
        Some(EventState::Dead) => DEAD,
    }
}

const DEAD: &str = "dead_at IS NOT NULL AND processed_at IS NULL";
/// Pending or leased: the rows the partial `(seq)` index of unfinished events holds.
const UNFINISHED: &str = "processed_at IS NULL AND dead_at IS NULL";

/// $1 id, $2 event_type, $3 aggregate_type, $4 aggregate_id, $5 created_after, $6 created_before.
const FILTER: &str = "($1::uuid IS NULL OR id = $1) AND ($2::text IS NULL OR event_type = $2) \
     AND ($3::text IS NULL OR aggregate_type = $3) AND ($4::text IS NULL OR aggregate_id = $4) \
     AND ($5::timestamptz IS NULL OR created_at >= $5) AND ($6::timestamptz IS NULL OR created_at < $6)";

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

fn bind<'q>(q: PgQuery<'q>, f: &'q EventFilter) -> PgQuery<'q> {
    q.bind(f.id)
        .bind(f.event_type.as_deref())
        .bind(f.aggregate_type.as_deref())
        .bind(f.aggregate_id.as_deref())
        .bind(f.created_after)
        .bind(f.created_before)
}

fn millis(d: Duration) -> f64 {
    d.as_millis().min(i64::MAX as u128) as f64
}

impl PgStore {
    /// Events matching `f`, in `seq` order, one page at a time.
    ///
    /// The cursor is a plain `seq > $7` (the first page binds the smallest `bigint`), so even
    /// a generic plan walks an index on `seq` from the cursor on. Without a state the page is
    /// the merge of the three disjoint states, each in its own `seq` order: the unfinished
    /// rows (their partial index), dead letters and published rows (each theirs, where
    /// present), so no page sorts the whole table.
    pub async fn list_events(&self, f: &EventFilter, page: Page) -> Result<EventPage, Error> {
        let limit = page.limit.clamp(1, MAX_PAGE);
        let table = self.table().qualified();
        let branch = |state: &str| {
            format!(
                "SELECT {COLUMNS} FROM {table} WHERE {state} AND {FILTER} AND seq > $7 \
                 ORDER BY seq LIMIT $8"
            )
        };
        let sql = match f.state {
            Some(state) => branch(state_sql(Some(state))),
            None => format!(
                "SELECT * FROM (({}) UNION ALL ({}) UNION ALL ({})) page ORDER BY seq LIMIT $8",
                branch(UNFINISHED),
                branch(DEAD),
                branch(state_sql(Some(EventState::Published))),
            ),
        };
        let rows = bind(sqlx::query(&sql), f)
            .bind(page.after_seq.unwrap_or(i64::MIN))
            .bind(limit + 1)
            .fetch_all(self.pool())
            .await
            .map_err(|e| db_error(self.table(), e))?;
        let mut events = rows
            .iter()
            .map(event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let more = events.len() as i64 > limit;
        events.truncate(limit as usize);
        let next_after_seq = if more {
            events.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(EventPage {
            events,
            next_after_seq,
        })
    }

    /// One event by id, in whatever state.
    pub async fn get_event(&self, id: Uuid) -> Result<Option<OutboxEvent>, Error> {
        let sql = format!(
            "SELECT {COLUMNS} FROM {} WHERE id = $1",
            self.table().qualified()
        );
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| db_error(self.table(), e))?;
        row.as_ref().map(event_from_row).transpose()
    }

    /// Put the dead letters matching `f` back in line (attempts reset, available now) and
    /// wake the relays. `f.state` is ignored: only dead letters are touched.
    pub async fn retry_dead_matching(&self, f: &EventFilter) -> Result<u64, Error> {
        let sql = format!(
            "WITH r AS (
                UPDATE {} SET dead_at = NULL, attempts = 0, attempts_unavailable = 0,
                    available_at = now(), last_error = NULL
                WHERE {DEAD} AND {FILTER} RETURNING 1
             )
             SELECT count(*), pg_notify($7, '') FROM r",
            self.table().qualified()
        );
        let row = bind(sqlx::query(&sql), f)
            .bind(self.table().channel())
            .fetch_one(self.pool())
            .await
            .map_err(|e| db_error(self.table(), e))?;
        let n: i64 = sqlx::Row::try_get(&row, 0).map_err(Error::Database)?;
        Ok(n as u64)
    }

    /// Delete the dead letters matching `f` for good. `f.state` is ignored.
    pub async fn discard_dead_matching(&self, f: &EventFilter) -> Result<u64, Error> {
        let sql = format!(
            "DELETE FROM {} WHERE {DEAD} AND {FILTER}",
            self.table().qualified()
        );
        let done = bind(sqlx::query(&sql), f)
            .execute(self.pool())
            .await
            .map_err(|e| db_error(self.table(), e))?;
        Ok(done.rows_affected())
    }

    /// Delete at most `batch` published events whose `processed_at` is older than
    /// `older_than`, in one short autocommit statement; returns how many went. Dead letters
    /// and unpublished events are never touched. Rows another transaction holds are skipped.
    ///
    /// Call it in a loop until it returns less than `batch` ([`crate::retention`] does).
    pub async fn purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64, Error> {
        // ctid = ANY(ARRAY(...)) is a TID scan: the DELETE touches exactly the rows the
        // sub-select picked, and the sub-select's LIMIT bounds the locks and the WAL of one
        // statement. The condition is repeated so a row changed in between is left alone.
        let q = self.table().qualified();
        let sql = format!(
            "DELETE FROM {q} WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM {q}
                WHERE processed_at < now() - $1 * interval '1 millisecond'
                LIMIT $2 FOR UPDATE SKIP LOCKED
             )) AND processed_at < now() - $1 * interval '1 millisecond'"
        );
        let done = sqlx::query(&sql)
            .bind(millis(older_than))
            .bind(batch.max(1))
            .execute(self.pool())
            .await
            .map_err(|e| db_error(self.table(), e))?;
        Ok(done.rows_affected())
    }
}

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
}
