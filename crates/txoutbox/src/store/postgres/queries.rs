//! The SQL of the PostgreSQL store, one `.sql` file per statement under `sql/`, named for
//! what it does, filled once per table with validated names (`{{table}}`, `{{partitions}}`,
//! ...) and with the shared fragments (`{{unfinished}}`, `{{blocking}}`, `{{due}}`, ...).

use super::partitions::heartbeat;
use crate::store::partitions::HeartbeatSql;
use crate::store::sql::{sql_file, strip, Fill};
use crate::store::Retention;
use crate::OutboxTable;

/// The columns of an event, for the select lists.
const COLUMNS: &str =
    "id, seq, aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type, \
     headers, attempts, attempts_unavailable, available_at, created_at, processed_at, dead_at, \
     locked_by, locked_until, last_error";

/// The validated names of `t` (and the column lists), for every statement of the store, the
/// write path and the migrations.
pub(super) fn names(t: &OutboxTable) -> Fill {
    Fill::new()
        .name("{{table}}", t.qualified())
        .name("{{partitions}}", t.derived("partitions"))
        .name("{{relays}}", t.derived("relays"))
        .name("{{waiters}}", t.derived("waiters"))
        .name("{{processed_events}}", t.processed_events())
        .name("{{schema}}", t.schema().quoted())
        .name("{{emit_event}}", t.derived("emit_event"))
        .name("{{columns}}", COLUMNS)
        .fragment("{{stored_size}}", sql_file!("postgres", "stored_size"))
        .fragment("{{within_bytes}}", sql_file!("postgres", "within_bytes"))
        .name("{{insert_columns}}", crate::store::rows::INSERT_COLUMNS)
        .name(
            "{{insert_columns_bytes}}",
            crate::store::rows::INSERT_COLUMNS_BYTES,
        )
}

/// The store's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub(super) struct Queries {
    /// The unordered row-lease claim (a relay that owns no partition).
    pub(super) claim: String,
    /// The unordered read-only claim (a relay that owns partitions).
    pub(super) claim_owned: String,
    pub(super) claim_ordered: String,
    /// The fast forms of the two read-only claims (sql/claim_fast.sql).
    pub(super) claim_owned_fast: String,
    pub(super) claim_ordered_fast: String,
    pub(super) has_unfinished_hold: String,
    pub(super) partition_count: String,
    /// The settles, the published rows found by seq ($8; ordered: $11), or by id
    /// (`*_by_id`: for a claim that does not carry the events' seqs).
    pub(super) settle: String,
    pub(super) settle_ordered: String,
    pub(super) settle_by_id: String,
    pub(super) settle_ordered_by_id: String,
    pub(super) release: String,
    pub(super) retry_now: String,
    pub(super) has_unfinished: String,
    pub(super) wait_prepare: String,
    pub(super) due_now: String,
    pub(super) wait_clear: String,
    pub(super) deregister: String,
    pub(super) counts: String,
    pub(super) bury: String,
    pub(super) bury_ordered: String,
    pub(super) heartbeat: HeartbeatSql<()>,
    pub(super) relays: String,
    pub(super) event: String,
    pub(super) purge: String,
    pub(super) events_branch: String,
    pub(super) events_merged: String,
    pub(super) dead_retry: String,
    pub(super) dead_discard: String,
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let (published, published_ordered) = match retention {
            Retention::Mark => (
                sql_file!("postgres", "published_mark"),
                sql_file!("postgres", "published_ordered_mark"),
            ),
            Retention::Delete => (
                sql_file!("postgres", "published_delete"),
                sql_file!("postgres", "published_ordered_delete"),
            ),
        };
        // Fragments first (they hold names and other fragments), then the names.
        let f = names(t)
            .fragment("{{due}}", sql_file!("postgres", "due"))
            .fragment("{{failed}}", sql_file!("postgres", "failed"))
            .fragment("{{failures}}", sql_file!("postgres", "failures"))
            .fragment("{{blocking}}", sql_file!("postgres", "blocking"))
            .fragment("{{unfinished}}", sql_file!("postgres", "unfinished"));
        let by_seq =
            |seqs: &str| sql_file!("postgres", "published_by_seq").replace("{{seqs}}", seqs);
        let by_id = sql_file!("postgres", "published_by_id");
        // A settle statement (`settle` or `settle_ordered`) with its published fragment
        // (`tag`), which finds its rows as `rows` says.
        let settle = |statement: &str, tag: &str, published: &str, rows: &str| {
            let published = published.replace("{{published_rows}}", &strip(rows));
            f.fill_with(statement, &[(tag, &published)])
        };
        // A read-only claim's fast form: its candidates (everything before the byte budget's
        // walk), then claim_fast.sql, with the ordered claim's partition key (`key`).
        let fast = |full: &str, key: &str, key_null: &str| {
            let candidates = full.split("{{within_bytes}}").next().unwrap_or(full);
            let tail = sql_file!("postgres", "claim_fast")
                .replace("{{key_null}}", key_null)
                .replace("{{key}}", key);
            f.fill(&format!("{candidates}{tail}"))
        };
        let (unordered, ordered) = (
            sql_file!("postgres", "settle"),
            sql_file!("postgres", "settle_ordered"),
        );
        Self {
            claim: f.fill(sql_file!("postgres", "claim")),
            claim_owned: f.fill(sql_file!("postgres", "claim_owned")),
            claim_ordered: f.fill(sql_file!("postgres", "claim_ordered")),
            claim_owned_fast: fast(sql_file!("postgres", "claim_owned"), "", ""),
            claim_ordered_fast: fast(
                sql_file!("postgres", "claim_ordered"),
                ", c.partition_key",
                ", NULL::int4",
            ),
            has_unfinished_hold: f.fill(sql_file!("postgres", "has_unfinished_hold")),
            partition_count: f.fill(sql_file!("postgres", "partition_count")),
            settle: settle(unordered, "{{published}}", published, &by_seq("$8")),
            settle_ordered: settle(
                ordered,
                "{{published_ordered}}",
                published_ordered,
                &by_seq("$11"),
            ),
            settle_by_id: settle(unordered, "{{published}}", published, by_id),
            settle_ordered_by_id: settle(
                ordered,
                "{{published_ordered}}",
                published_ordered,
                by_id,
            ),
            release: f.fill(sql_file!("postgres", "release")),
            retry_now: f.fill(sql_file!("postgres", "retry_now")),
            has_unfinished: f.fill(sql_file!("postgres", "has_unfinished")),
            wait_prepare: f.fill(sql_file!("postgres", "wait_prepare")),
            due_now: f.fill(sql_file!("postgres", "due_now")),
            wait_clear: f.fill(sql_file!("postgres", "wait_clear")),
            deregister: f.fill(sql_file!("postgres", "deregister")),
            counts: f.fill(sql_file!("postgres", "counts")),
            bury: f.fill(sql_file!("postgres", "bury")),
            bury_ordered: f.fill(sql_file!("postgres", "bury_ordered")),
            heartbeat: heartbeat(&f),
            relays: f.fill(sql_file!("postgres", "relays")),
            event: f.fill(sql_file!("postgres", "event")),
            purge: f.fill(sql_file!("postgres", "purge")),
            events_branch: f.fill(sql_file!("postgres", "events_branch")),
            events_merged: f.fill(sql_file!("postgres", "events_merged")),
            dead_retry: f.fill(sql_file!("postgres", "dead_retry")),
            dead_discard: f.fill(sql_file!("postgres", "dead_discard")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_in_both_retentions() {
        let t = OutboxTable::new("app", "events").unwrap();
        for retention in [Retention::Mark, Retention::Delete] {
            let q = Queries::new(&t, retention);
            let mut all = format!("{q:?}");
            for per_call in ["state", "condition", "limit", "channel"] {
                all = all.replace(&format!("{{{{{per_call}}}}}"), "");
            }
            for page in ["unfinished", "dead", "published"] {
                all = all.replace(&format!("{{{{{page}_page}}}}"), "");
            }
            assert!(!all.contains("{{"), "unfilled placeholder: {all}");
            assert!(q.claim.contains("\"app\".\"events\""), "{}", q.claim);
            // The fast forms read the candidates once: no byte budget's walk.
            for fast in [&q.claim_ordered_fast, &q.claim_owned_fast] {
                assert!(fast.contains("cap AS ("), "{fast}");
                assert!(!fast.contains("fast AS ("), "{fast}");
            }
            assert!(q.claim_ordered_fast.contains("c.partition_key"));
            assert!(
                q.deregister.contains("\"app\".\"events_relays\""),
                "{}",
                q.deregister
            );
        }
    }
}
