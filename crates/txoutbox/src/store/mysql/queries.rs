//! The SQL of the MySQL store, one `.sql` file per statement under `sql/`, named for what it
//! does, filled once per table with validated names (`{{table}}`, `{{relays}}`, ...), the
//! clock (`{{now_ms}}`) and the shared fragments (`{{unfinished}}`, `{{claimable}}`, ...).
//! Statements with a `{{list}}` get their `IN (...)` list per call (`store::sql::with_list`).

use super::partitions::{heartbeat, Then};
use super::schema::{derived, plain, table, NOW_MS};
use crate::store::partitions::HeartbeatSql;
use crate::store::sql::{sql_file, Fill};
use crate::store::text::{text_names, TextBackend, TextQueries};
use crate::store::Retention;
use crate::OutboxTable;

/// The validated names of `t`, the clock and the column lists, for every statement of the
/// store, the write path and the migrations.
pub(super) fn names(t: &OutboxTable) -> Fill {
    let f = Fill::new()
        .fragment("{{claimable}}", sql_file!("mysql", "claimable"))
        .fragment("{{payload_size}}", sql_file!("mysql", "payload_size"))
        .fragment("{{unfinished}}", sql_file!("mysql", "unfinished"))
        .fragment("{{lease_cleared}}", sql_file!("mysql", "lease_cleared"))
        .name("{{partitions}}", derived(t, "partitions"))
        .name("{{processed_events}}", plain(t, "processed_events"))
        .name("{{migrations}}", plain(t, "txoutbox_migrations"))
        .name("{{database}}", format!("`{}`", t.schema().as_str()));
    text_names(f, table(t), derived(t, "relays"), NOW_MS)
}

/// The store's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub struct Queries {
    pub(super) text: TextQueries,
    pub(super) claim_pick: String,
    pub(super) claim_pick_ordered: String,
    /// `{{list}}`: the picked seqs.
    pub(super) claim_lock: String,
    /// `{{list}}`: the claimed seqs.
    pub(super) claim_lease: String,
    /// `{{list}}`: the claimed seqs.
    pub(super) claim_read: String,
    /// `{{list}}`: the claimed seqs over the per-event ceiling, read without their payloads.
    pub(super) claim_read_unsent: String,
    pub(super) bury: String,
    /// `{{list}}`: the held seqs.
    pub(super) bury_held: String,
    pub(super) deregister_held: String,
    pub(super) deregister_partitions: String,
    pub(super) partition_count: String,
    pub(super) heartbeat: HeartbeatSql<Then>,
}

/// The event's columns without its payload: a claimed event too large to send.
fn unsent_columns() -> String {
    crate::store::rows::COLUMNS.replace(
        "payload, payload_bytes,",
        "NULL AS payload, NULL AS payload_bytes,",
    )
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let f = names(t);
        Self {
            text: sqlx::MySql::FILES.fill(&f, retention),
            claim_pick: f.fill(sql_file!("mysql", "claim_pick")),
            claim_pick_ordered: f.fill(sql_file!("mysql", "claim_pick_ordered")),
            claim_lock: f.fill(sql_file!("mysql", "claim_lock")),
            claim_lease: f.fill(sql_file!("mysql", "claim_lease")),
            claim_read: f.fill(sql_file!("mysql", "claim_read")),
            claim_read_unsent: f.fill_with(
                sql_file!("mysql", "claim_read"),
                &[("{{columns}}", &unsent_columns())],
            ),
            bury: f.fill(sql_file!("mysql", "bury")),
            bury_held: f.fill(sql_file!("mysql", "bury_held")),
            deregister_held: f.fill(sql_file!("mysql", "deregister_held")),
            deregister_partitions: f.fill(sql_file!("mysql", "deregister_partitions")),
            partition_count: f.fill(sql_file!("mysql", "partition_count")),
            heartbeat: heartbeat(&f),
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
            assert!(q.text.relays.contains("`app`.`"), "{}", q.text.relays);
        }
    }
}
