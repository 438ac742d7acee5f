//! The statements MySQL and SQLite have alike: their files ([`TextFiles`], each database's
//! own `sql/<name>.sql`) and those filled for one table ([`TextQueries`]).

use crate::store::rows::{COLUMNS, INSERT_COLUMNS, INSERT_COLUMNS_BYTES};
use crate::store::sql::Fill;
use crate::store::Retention;

/// `f` with the names both text-row stores fill alike: `{{table}}` and `{{relays}}` (`table`
/// and `relays`, validated names), `{{now_ms}}` (`now`, the clock in SQL), `{{columns}}` and
/// `{{insert_columns}}`.
pub(crate) fn text_names(f: Fill, table: String, relays: String, now: &'static str) -> Fill {
    f.name("{{table}}", table)
        .name("{{relays}}", relays)
        .name("{{now_ms}}", now)
        .name("{{columns}}", COLUMNS)
        .name("{{insert_columns}}", INSERT_COLUMNS)
        .name("{{insert_columns_bytes}}", INSERT_COLUMNS_BYTES)
}

/// The text of the statement files that MySQL and SQLite have alike, as compiled in: one
/// database's are [`text_files!`]`("mysql")`.
#[derive(Debug)]
pub struct TextFiles {
    pub published_mark: &'static str,
    pub published_delete: &'static str,
    pub release: &'static str,
    pub retry_now: &'static str,
    pub settle_failed: &'static str,
    pub has_unfinished: &'static str,
    pub has_unfinished_hold: &'static str,
    pub due_in: &'static str,
    pub deregister_relay: &'static str,
    pub deregister_events: &'static str,
    pub counts: &'static str,
    pub relays: &'static str,
    pub event: &'static str,
    pub purge: &'static str,
    pub events_page: &'static str,
    pub dead_retry: &'static str,
    pub dead_discard: &'static str,
    /// The write path (`text::write`), filled per call.
    pub insert_one: &'static str,
    pub insert_one_bytes: &'static str,
    pub insert_many: &'static str,
    pub insert_many_bytes: &'static str,
    pub inbox_create: &'static str,
    pub inbox_mark: &'static str,
}

/// The [`TextFiles`] of database `$db` (the folder under `store/`). A table of file includes
/// and nothing else: `include_str!` takes a literal path only, so it cannot be a function.
macro_rules! text_files {
    ($db:literal) => {
        $crate::store::text::TextFiles {
            published_mark: $crate::store::sql::sql_file!($db, "published_mark"),
            published_delete: $crate::store::sql::sql_file!($db, "published_delete"),
            release: $crate::store::sql::sql_file!($db, "release"),
            retry_now: $crate::store::sql::sql_file!($db, "retry_now"),
            settle_failed: $crate::store::sql::sql_file!($db, "settle_failed"),
            has_unfinished: $crate::store::sql::sql_file!($db, "has_unfinished"),
            has_unfinished_hold: $crate::store::sql::sql_file!($db, "has_unfinished_hold"),
            due_in: $crate::store::sql::sql_file!($db, "due_in"),
            deregister_relay: $crate::store::sql::sql_file!($db, "deregister_relay"),
            deregister_events: $crate::store::sql::sql_file!($db, "deregister_events"),
            counts: $crate::store::sql::sql_file!($db, "counts"),
            relays: $crate::store::sql::sql_file!($db, "relays"),
            event: $crate::store::sql::sql_file!($db, "event"),
            purge: $crate::store::sql::sql_file!($db, "purge"),
            events_page: $crate::store::sql::sql_file!($db, "events_page"),
            dead_retry: $crate::store::sql::sql_file!($db, "dead_retry"),
            dead_discard: $crate::store::sql::sql_file!($db, "dead_discard"),
            insert_one: $crate::store::sql::sql_file!($db, "insert_one"),
            insert_one_bytes: $crate::store::sql::sql_file!($db, "insert_one_bytes"),
            insert_many: $crate::store::sql::sql_file!($db, "insert_many"),
            insert_many_bytes: $crate::store::sql::sql_file!($db, "insert_many_bytes"),
            inbox_create: $crate::store::sql::sql_file!($db, "inbox_create"),
            inbox_mark: $crate::store::sql::sql_file!($db, "inbox_mark"),
        }
    };
}
pub(crate) use text_files;

/// The statements MySQL and SQLite have alike, filled once per table ([`TextFiles::fill`]).
/// `published` and `release` have, on MySQL, a `{{list}}` (a mark per id); on SQLite they
/// take the ids as one JSON array.
#[derive(Debug)]
pub struct TextQueries {
    /// `published_mark.sql` or `published_delete.sql`, by retention.
    pub published: String,
    pub release: String,
    pub retry_now: String,
    pub settle_failed: String,
    pub has_unfinished: String,
    pub has_unfinished_hold: String,
    pub due_in: String,
    pub deregister_relay: String,
    pub deregister_events: String,
    pub counts: String,
    pub relays: String,
    pub event: String,
    pub purge: String,
    pub events_page: String,
    pub dead_retry: String,
    pub dead_discard: String,
}

impl TextFiles {
    /// The statements of the store, filled by `f`, with published events kept or deleted by
    /// `retention`.
    pub(crate) fn fill(&self, f: &Fill, retention: Retention) -> TextQueries {
        let published = match retention {
            Retention::Mark => self.published_mark,
            Retention::Delete => self.published_delete,
        };
        TextQueries {
            published: f.fill(published),
            settle_failed: f.fill(self.settle_failed),
            release: f.fill(self.release),
            retry_now: f.fill(self.retry_now),
            has_unfinished: f.fill(self.has_unfinished),
            has_unfinished_hold: f.fill(self.has_unfinished_hold),
            due_in: f.fill(self.due_in),
            deregister_relay: f.fill(self.deregister_relay),
            deregister_events: f.fill(self.deregister_events),
            counts: f.fill(self.counts),
            relays: f.fill(self.relays),
            event: f.fill(self.event),
            purge: f.fill(self.purge),
            events_page: f.fill(self.events_page),
            dead_retry: f.fill(self.dead_retry),
            dead_discard: f.fill(self.dead_discard),
        }
    }
}
