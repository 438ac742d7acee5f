//! The SQL of the SQLite store, one `.sql` file per statement under `sql/`, named for what it
//! does, filled once per table with validated names (`{{table}}`, `{{relays}}`), the clock
//! (`{{now_ms}}`) and the shared fragments (`{{unfinished}}`, `{{fenced_ids}}`, ...).

use super::schema::{derived, table, NOW_MS};
use crate::store::sql::{sql_file, Fill};
use crate::store::text::{text_names, TextBackend, TextQueries};
use crate::store::Retention;
use crate::OutboxTable;

/// The validated names of `t`, the clock and the column lists, for every statement of the
/// store, the write path and the migrations.
pub(super) fn names(t: &OutboxTable) -> Fill {
    let f = Fill::new()
        .fragment("{{unfinished}}", sql_file!("sqlite", "unfinished"))
        .fragment("{{lease_cleared}}", sql_file!("sqlite", "lease_cleared"))
        .fragment("{{fenced_ids}}", sql_file!("sqlite", "fenced_ids"));
    text_names(f, table(t), derived(t, "relays"), NOW_MS)
}

/// The store's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub struct Queries {
    pub(super) text: TextQueries,
    pub(super) claim: String,
    pub(super) claim_ordered: String,
    pub(super) bury: String,
    pub(super) relay_other: String,
    pub(super) relay_upsert: String,
    pub(super) relay_held: String,
    pub(super) relay_gc: String,
}

/// The claim's `RETURNING` list: the event's columns, but no payload for an event over the
/// per-event ceiling (?7), and every payload's size.
fn capped_columns() -> String {
    const SIZE: &str =
        "(coalesce(octet_length(payload), 0) + coalesce(octet_length(payload_bytes), 0))";
    crate::store::rows::COLUMNS.replace(
        "payload, payload_bytes,",
        &format!(
            "CASE WHEN {SIZE} > ?7 THEN NULL ELSE payload END AS payload, \
             CASE WHEN {SIZE} > ?7 THEN NULL ELSE payload_bytes END AS payload_bytes,"
        ),
    ) + &format!(", {SIZE} AS payload_size")
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let f = names(t)
            .fragment("{{payload_size}}", sql_file!("sqlite", "payload_size"))
            .name("{{capped_columns}}", capped_columns());
        let claim = sql_file!("sqlite", "claim");
        Self {
            text: sqlx::Sqlite::FILES.fill(&f, retention),
            claim: f.fill_with(claim, &[("{{ordered}}", ""), ("{{relay_lease}}", "")]),
            claim_ordered: f.fill_with(
                claim,
                &[
                    ("{{ordered}}", sql_file!("sqlite", "claim_ordered_blocked")),
                    ("{{relay_lease}}", sql_file!("sqlite", "claim_relay_lease")),
                ],
            ),
            bury: f.fill(sql_file!("sqlite", "bury")),
            relay_other: f.fill(sql_file!("sqlite", "relay_other")),
            relay_upsert: f.fill(sql_file!("sqlite", "relay_upsert")),
            relay_held: f.fill(sql_file!("sqlite", "relay_held")),
            relay_gc: f.fill(sql_file!("sqlite", "relay_gc")),
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
