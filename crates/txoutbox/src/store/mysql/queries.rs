//! The SQL of the MySQL store, one `.sql` file per statement under `sql/`, named for what it
//! does, filled once per table with validated names (`{{table}}`, `{{relays}}`, ...), the
//! clock (`{{now_ms}}`) and the shared fragments (`{{unfinished}}`, `{{claimable}}`, ...).
//! Statements with a `{{list}}` get their `IN (...)` list per call (`store::sql::with_list`).

use super::partitions::{heartbeat, Then};
use super::schema::{derived, plain, table, NOW_MS};
use crate::store::partitions::HeartbeatSql;
use crate::store::rows::{COLUMNS, INSERT_COLUMNS};
use crate::store::sql::{sql_file, Fill};
use crate::store::Retention;
use crate::OutboxTable;

/// The validated names of `t`, the clock and the column lists, for every statement of the
/// store, the write path and the migrations.
pub(super) fn names(t: &OutboxTable) -> Fill {
    Fill::new()
        .fragment("{{claimable}}", sql_file!("mysql", "claimable"))
        .fragment("{{unfinished}}", sql_file!("mysql", "unfinished"))
        .fragment("{{lease_cleared}}", sql_file!("mysql", "lease_cleared"))
        .name("{{table}}", table(t))
        .name("{{relays}}", derived(t, "relays"))
        .name("{{partitions}}", derived(t, "partitions"))
        .name("{{processed_events}}", plain(t, "processed_events"))
        .name("{{migrations}}", plain(t, "txoutbox_migrations"))
        .name("{{database}}", format!("`{}`", t.schema().as_str()))
        .name("{{now_ms}}", NOW_MS)
        .name("{{columns}}", COLUMNS)
        .name("{{insert_columns}}", INSERT_COLUMNS)
}

/// The store's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) claim_pick: String,
    pub(super) claim_pick_ordered: String,
    /// `{{list}}`: the picked seqs.
    pub(super) claim_lock: String,
    /// `{{list}}`: the claimed seqs.
    pub(super) claim_lease: String,
    /// `{{list}}`: the claimed seqs.
    pub(super) claim_read: String,
    pub(super) bury: String,
    /// `{{list}}`: the held seqs.
    pub(super) bury_held: String,
    /// `{{list}}`: a mark per id.
    pub(super) published: String,
    pub(super) settle_failed: String,
    /// `{{list}}`: a mark per id.
    pub(super) release: String,
    pub(super) has_unfinished: String,
    pub(super) has_unfinished_hold: String,
    pub(super) due_in: String,
    pub(super) deregister_held: String,
    pub(super) deregister_relay: String,
    pub(super) deregister_partitions: String,
    pub(super) deregister_events: String,
    pub(super) counts: String,
    pub(super) partition_count: String,
    pub(super) heartbeat: HeartbeatSql<Then>,
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
            Retention::Mark => sql_file!("mysql", "published_mark"),
            Retention::Delete => sql_file!("mysql", "published_delete"),
        };
        Self {
            claim_pick: f.fill(sql_file!("mysql", "claim_pick")),
            claim_pick_ordered: f.fill(sql_file!("mysql", "claim_pick_ordered")),
            claim_lock: f.fill(sql_file!("mysql", "claim_lock")),
            claim_lease: f.fill(sql_file!("mysql", "claim_lease")),
            claim_read: f.fill(sql_file!("mysql", "claim_read")),
            bury: f.fill(sql_file!("mysql", "bury")),
            bury_held: f.fill(sql_file!("mysql", "bury_held")),
            published: f.fill(published),
            settle_failed: f.fill(sql_file!("mysql", "settle_failed")),
            release: f.fill(sql_file!("mysql", "release")),
            has_unfinished: f.fill(sql_file!("mysql", "has_unfinished")),
            has_unfinished_hold: f.fill(sql_file!("mysql", "has_unfinished_hold")),
            due_in: f.fill(sql_file!("mysql", "due_in")),
            deregister_held: f.fill(sql_file!("mysql", "deregister_held")),
            deregister_relay: f.fill(sql_file!("mysql", "deregister_relay")),
            deregister_partitions: f.fill(sql_file!("mysql", "deregister_partitions")),
            deregister_events: f.fill(sql_file!("mysql", "deregister_events")),
            counts: f.fill(sql_file!("mysql", "counts")),
            partition_count: f.fill(sql_file!("mysql", "partition_count")),
            heartbeat: heartbeat(&f),
            relays: f.fill(sql_file!("mysql", "relays")),
            event: f.fill(sql_file!("mysql", "event")),
            purge: f.fill(sql_file!("mysql", "purge")),
            events_page: f.fill(sql_file!("mysql", "events_page")),
            dead_retry: f.fill(sql_file!("mysql", "dead_retry")),
            dead_discard: f.fill(sql_file!("mysql", "dead_discard")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_but_the_per_call_ones_is_filled() {
        let t = OutboxTable::new("app", "events").unwrap();
        for retention in [Retention::Mark, Retention::Delete] {
            let q = Queries::new(&t, retention);
            let all = format!("{q:?}")
                .replace("{{list}}", "")
                .replace("{{condition}}", "");
            assert!(!all.contains("{{"), "unfilled placeholder: {all}");
            assert!(q.claim_pick.contains("`app`.`events`"), "{}", q.claim_pick);
            assert!(q.relays.contains("`app`.`"), "{}", q.relays);
        }
    }
}
