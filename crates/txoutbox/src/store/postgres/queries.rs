//! The relay's SQL on PostgreSQL, one `.sql` file per statement under `sql/`, named for what
//! it does, filled once per table with validated names (`{{table}}`, `{{partitions}}`, ...)
//! and with the shared fragments (`{{unfinished}}`, `{{blocking}}`, `{{due}}`, ...).

use super::CLAIM_MARGIN_MS;
use crate::store::Retention;
use crate::OutboxTable;

/// The text of `sql/<name>.sql`.
macro_rules! sql {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/postgres/sql/",
            $name,
            ".sql"
        ))
    };
}

/// The relay's statements for one outbox table, built once from validated names.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) claim: String,
    pub(super) claim_ordered: String,
    pub(super) has_unfinished_hold: String,
    pub(super) partition_count: String,
    pub(super) settle: String,
    pub(super) settle_ordered: String,
    pub(super) release: String,
    pub(super) has_unfinished: String,
    pub(super) wait_prepare: String,
    pub(super) due_now: String,
    pub(super) wait_clear: String,
    pub(super) deregister: String,
    pub(super) counts: String,
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let (published, published_ordered) = match retention {
            Retention::Mark => (sql!("published_mark"), sql!("published_ordered_mark")),
            Retention::Delete => (sql!("published_delete"), sql!("published_ordered_delete")),
        };
        // Fragments first (they hold names and other fragments), then the names.
        let fragments = [
            ("{{due}}", sql!("due")),
            ("{{published}}", published),
            ("{{published_ordered}}", published_ordered),
            ("{{failed}}", sql!("failed")),
            ("{{failures}}", sql!("failures")),
            ("{{blocking}}", sql!("blocking")),
            ("{{unfinished}}", sql!("unfinished")),
        ];
        let names = [
            ("{{table}}", t.qualified()),
            ("{{partitions}}", t.derived("partitions")),
            ("{{relays}}", t.derived("relays")),
            ("{{waiters}}", t.derived("waiters")),
            ("{{claim_margin_ms}}", CLAIM_MARGIN_MS.to_string()),
        ];
        let fill = |sql: &str| {
            let mut out = sql.to_string();
            for (tag, fragment) in &fragments {
                out = out.replace(tag, fragment.trim_end());
            }
            for (tag, name) in &names {
                out = out.replace(tag, name);
            }
            out
        };
        Self {
            claim: fill(sql!("claim")),
            claim_ordered: fill(sql!("claim_ordered")),
            has_unfinished_hold: fill(sql!("has_unfinished_hold")),
            partition_count: fill(sql!("partition_count")),
            settle: fill(sql!("settle")),
            settle_ordered: fill(sql!("settle_ordered")),
            release: fill(sql!("release")),
            has_unfinished: fill(sql!("has_unfinished")),
            wait_prepare: fill(sql!("wait_prepare")),
            due_now: fill(sql!("due_now")),
            wait_clear: fill(sql!("wait_clear")),
            deregister: fill(sql!("deregister")),
            counts: fill(sql!("counts")),
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
            let all = format!("{q:?}");
            assert!(!all.contains("{{"), "unfilled placeholder: {all}");
            assert!(q.claim.contains("\"app\".\"events\""), "{}", q.claim);
            assert!(
                q.deregister.contains("\"app\".\"events_relays\""),
                "{}",
                q.deregister
            );
        }
    }
}
