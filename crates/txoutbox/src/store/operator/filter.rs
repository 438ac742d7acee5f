//! Operator filters and pages as they arrive from HTTP query strings and CLI flags, validated
//! once; errors name the filter that is wrong.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{EventState, OutboxEvent};

/// Most events one page may hold.
pub const MAX_PAGE: i64 = 1000;
/// Page size when none is asked for.
pub const DEFAULT_PAGE: i64 = 100;

/// Which events an operator query acts on. Every field narrows the set; none means "all".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    /// Only events in this state (as [`OutboxEvent::state`] computes it).
    pub state: Option<EventState>,
    /// Only the event with this id.
    pub id: Option<Uuid>,
    /// Only events of this `event_type` (exact match).
    pub event_type: Option<String>,
    /// Only events of this `aggregate_type` (exact match).
    pub aggregate_type: Option<String>,
    /// Only events of this `aggregate_id` (exact match).
    pub aggregate_id: Option<String>,
    /// `created_at >= created_after`
    pub created_after: Option<DateTime<Utc>>,
    /// `created_at < created_before`
    pub created_before: Option<DateTime<Utc>>,
}

/// Keyset pagination on `seq`: events with `seq > after_seq`, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Start after this `seq` (the previous page's `next_after_seq`); `None`: from the start.
    pub after_seq: Option<i64>,
    /// At most this many events: 1 to [`MAX_PAGE`] when parsed; default [`DEFAULT_PAGE`].
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
    /// At most `limit` events, in `seq` order.
    pub events: Vec<OutboxEvent>,
    /// Pass as `after_seq` to get the next page; `None` when this page is the last.
    pub next_after_seq: Option<i64>,
}

/// A filter or page parameter that cannot be used. The message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// A known filter or page parameter with a value that cannot be used.
    #[error("filter `{name}`: {reason}")]
    Invalid {
        /// The parameter's name.
        name: String,
        /// What is wrong with the value, and what is accepted.
        reason: String,
    },
    /// A parameter name that is not a filter (a typo must not widen the query to every event).
    #[error("unknown filter `{name}` (known: {known})")]
    Unknown {
        /// The parameter's name, as given.
        name: String,
        /// The names accepted: [`FILTER_PARAMS`].
        known: &'static str,
    },
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
