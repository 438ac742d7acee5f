//! The SQL of the SQLite store, one `.sql` file per statement under `sql/`, named for what it
//! does, filled once per table with validated names (`{{table}}`, `{{relays}}`), the clock
//! (`{{now_ms}}`) and the shared fragments (`{{unfinished}}`, `{{fenced_ids}}`, ...).

use super::schema::{derived, table, NOW_MS};
use crate::store::rows::{COLUMNS, INSERT_COLUMNS};
use crate::store::sql::{sql_file, Fill};
use crate::store::Retention;
use crate::OutboxTable;

/// The validated names of `t`, the clock and the column lists, for every statement of the
/// store, the write path and the migrations.
pub(super) fn names(t: &OutboxTable) -> Fill {
    Fill::new()
        .fragment("{{unfinished}}", sql_file!("sqlite", "unfinished"))
        .fragment("{{lease_cleared}}", sql_file!("sqlite", "lease_cleared"))
        .fragment("{{fenced_ids}}", sql_file!("sqlite", "fenced_ids"))
        .name("{{table}}", table(t))
        .name("{{relays}}", derived(t, "relays"))
        .name("{{now_ms}}", NOW_MS)
        .name("{{columns}}", COLUMNS)
        .name("{{insert_columns}}", INSERT_COLUMNS)
}

/// The store's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) claim: String,
    pub(super) claim_ordered: String,
    pub(super) bury: String,
    pub(super) published: String,
    pub(super) settle_failed: String,
    pub(super) release: String,
    pub(super) has_unfinished: String,
    pub(super) has_unfinished_hold: String,
    pub(super) due_in: String,
    pub(super) relay_other: String,
    pub(super) relay_upsert: String,
    pub(super) relay_held: String,
    pub(super) relay_gc: String,
    pub(super) deregister_relay: String,
    pub(super) deregister_events: String,
    pub(super) counts: String,
    pub(super) relays: String,
    pub(super) event: String,
    pub(super) purge: String,
    pub(super) events_page: String,
    pub(super) dead_retry: String,
    pub(super) dead_discard: String,
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let f = names(t);
        let published = match retention {
            Retention::Mark => sql_file!("sqlite", "published_mark"),
            Retention::Delete => sql_file!("sqlite", "published_delete"),
        };
        let claim = sql_file!("sqlite", "claim");
        Self {
            claim: f.fill_with(claim, &[("{{ordered}}", ""), ("{{relay_lease}}", "")]),
            claim_ordered: f.fill_with(
                claim,
                &[
                    ("{{ordered}}", sql_file!("sqlite", "claim_ordered_blocked")),
                    ("{{relay_lease}}", sql_file!("sqlite", "claim_relay_lease")),
                ],
            ),
            bury: f.fill(sql_file!("sqlite", "bury")),
            published: f.fill(published),
            settle_failed: f.fill(sql_file!("sqlite", "settle_failed")),
            release: f.fill(sql_file!("sqlite", "release")),
            has_unfinished: f.fill(sql_file!("sqlite", "has_unfinished")),
            has_unfinished_hold: f.fill(sql_file!("sqlite", "has_unfinished_hold")),
            due_in: f.fill(sql_file!("sqlite", "due_in")),
            relay_other: f.fill(sql_file!("sqlite", "relay_other")),
            relay_upsert: f.fill(sql_file!("sqlite", "relay_upsert")),
            relay_held: f.fill(sql_file!("sqlite", "relay_held")),
            relay_gc: f.fill(sql_file!("sqlite", "relay_gc")),
            deregister_relay: f.fill(sql_file!("sqlite", "deregister_relay")),
            deregister_events: f.fill(sql_file!("sqlite", "deregister_events")),
            counts: f.fill(sql_file!("sqlite", "counts")),
            relays: f.fill(sql_file!("sqlite", "relays")),
            event: f.fill(sql_file!("sqlite", "event")),
            purge: f.fill(sql_file!("sqlite", "purge")),
            events_page: f.fill(sql_file!("sqlite", "events_page")),
            dead_retry: f.fill(sql_file!("sqlite", "dead_retry")),
            dead_discard: f.fill(sql_file!("sqlite", "dead_discard")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_in_both_retentions() {
        let t = OutboxTable::new("main", "events").unwrap();
        for retention in [Retention::Mark, Retention::Delete] {
            let q = Queries::new(&t, retention);
            let all = format!("{q:?}").replace("{{condition}}", "");
            assert!(!all.contains("{{"), "unfilled placeholder: {all}");
            assert!(
                q.claim_ordered.contains("\"events_relays\""),
                "{}",
                q.claim_ordered
            );
            assert!(!q.claim.contains("events_relays"), "{}", q.claim);
        }
    }
}
