//! The SQL of the SQLite store, built once per outbox table from validated names.

use super::schema::{derived, table, NOW_MS};
use super::{CLAIM_MARGIN_MS, COLUMNS, UNFINISHED};
use crate::store::{Ordering, Retention};
use crate::OutboxTable;

/// SQL for one outbox table, built once from validated names.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) claim: String,
    pub(super) claim_ordered: String,
    pub(super) settle_ok: String,
    pub(super) settle_failed: String,
    pub(super) release: String,
    has_unfinished: String,
    has_unfinished_hold: String,
    pub(super) due_in_ms: String,
    pub(super) relay_other: String,
    pub(super) relay_upsert: String,
    pub(super) relay_held: String,
    pub(super) relay_gc: String,
    pub(super) deregister_relay: String,
    pub(super) deregister_events: String,
    pub(super) counts: String,
}

impl Queries {
    pub(super) fn new(t: &OutboxTable, retention: Retention) -> Self {
        let q = table(t);
        let relays = derived(t, "relays");
        let lease = "locked_until = NULL, locked_by = NULL, lock_token = NULL";
        let ids = "id IN (SELECT value FROM json_each(?1)) AND lock_token = ?2";
        // A text or blob `available_at` (plain SQL can write one) sorts after every number and
        // would never be due: it is claimed, so that the claim dead-letters it.
        let claimed = |filter: &str, extra: &str| {
            format!(
                "UPDATE {q} SET locked_until = {NOW_MS} + ?2, locked_by = ?3, lock_token = ?4
                 WHERE seq IN (
                    SELECT e.seq FROM {q} e
                    WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                      AND (e.available_at <= {NOW_MS} OR typeof(e.available_at) IN ('text', 'blob'))
                      AND (e.locked_until IS NULL OR e.locked_until <= {NOW_MS}) {filter}
                    ORDER BY e.seq LIMIT ?1
                 ) {extra}
                 RETURNING {COLUMNS}"
            )
        };
        Self {
            claim: claimed("", ""),
            // No earlier event of the aggregate leased, backing off or (with ?5, `hold`)
            // dead; and only while this relay holds the file's relay lease.
            claim_ordered: claimed(
                &format!(
                    "AND NOT EXISTS (
                        SELECT 1 FROM {q} b
                        WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                          AND b.seq < e.seq AND b.processed_at IS NULL
                          AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
                          AND ((b.dead_at IS NULL AND (b.available_at > {NOW_MS} OR b.locked_until > {NOW_MS}))
                               OR (b.dead_at IS NOT NULL AND ?5))
                    )"
                ),
                &format!(
                    "AND EXISTS (SELECT 1 FROM {relays} WHERE relay_id = ?3 \
                     AND alive_until > {NOW_MS} + {CLAIM_MARGIN_MS})"
                ),
            ),
            settle_ok: match retention {
                Retention::Mark => format!(
                    "UPDATE {q} SET processed_at = {NOW_MS}, {lease}, last_error = NULL WHERE {ids}"
                ),
                Retention::Delete => format!("DELETE FROM {q} WHERE {ids}"),
            },
            settle_failed: format!(
                "UPDATE {q} AS e SET
                    attempts = e.attempts + 1,
                    attempts_unavailable = e.attempts_unavailable + f.unavailable,
                    last_error = f.err,
                    available_at = {NOW_MS} + f.delay_ms,
                    dead_at = CASE WHEN f.dead THEN {NOW_MS} END,
                    {lease}
                 FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.err') AS err,
                              json_extract(value, '$.delay_ms') AS delay_ms,
                              json_extract(value, '$.dead') AS dead,
                              json_extract(value, '$.unavailable') AS unavailable
                       FROM json_each(?1)) AS f
                 WHERE e.id = f.id AND e.lock_token = ?2"
            ),
            release: format!("UPDATE {q} SET {lease} WHERE {ids}"),
            has_unfinished: format!("SELECT EXISTS (SELECT 1 FROM {q} WHERE {UNFINISHED})"),
            has_unfinished_hold: format!(
                "SELECT EXISTS (SELECT 1 FROM {q} e WHERE e.processed_at IS NULL AND e.dead_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM {q} b
                     WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
                       AND b.seq < e.seq AND b.processed_at IS NULL AND b.dead_at IS NOT NULL))"
            ),
            due_in_ms: format!(
                "SELECT min(max(available_at, coalesce(locked_until, available_at))) - {NOW_MS}
                 FROM {q} WHERE {UNFINISHED}"
            ),
            // Another live relay, or this relay id held by another process (?2: instance).
            relay_other: format!(
                "SELECT relay_id, alive_until - {NOW_MS} FROM {relays}
                 WHERE (relay_id <> ?1 OR instance IS NOT ?2) AND alive_until > {NOW_MS}
                 ORDER BY relay_id = ?1 DESC LIMIT 1"
            ),
            relay_upsert: format!(
                "INSERT INTO {relays} (relay_id, mode, instance, heartbeat_at, alive_until)
                 VALUES (?1, ?2, ?4, {NOW_MS}, {NOW_MS} + ?3)
                 ON CONFLICT (relay_id) DO UPDATE
                 SET mode = excluded.mode, instance = excluded.instance,
                     heartbeat_at = excluded.heartbeat_at, alive_until = excluded.alive_until"
            ),
            relay_held: format!(
                "SELECT 1 FROM {relays} WHERE relay_id = ?1 AND instance IS NOT ?2"
            ),
            relay_gc: format!("DELETE FROM {relays} WHERE alive_until < {NOW_MS} - 3600000"),
            deregister_relay: format!("DELETE FROM {relays} WHERE relay_id = ?1"),
            deregister_events: format!(
                "UPDATE {q} SET {lease} WHERE {UNFINISHED} AND locked_by = ?1"
            ),
            counts: format!(
                "SELECT
                    coalesce(sum({UNFINISHED} AND (locked_until IS NULL OR locked_until <= {NOW_MS})), 0),
                    coalesce(sum({UNFINISHED} AND locked_until > {NOW_MS}), 0),
                    coalesce(sum(dead_at IS NOT NULL AND processed_at IS NULL), 0),
                    coalesce(sum(processed_at IS NOT NULL), 0),
                    ({NOW_MS} - min(CASE WHEN {UNFINISHED} THEN created_at END)) / 1000.0
                 FROM {q}"
            ),
        }
    }
}

impl Queries {
    /// Is any event left that a relay of `ordering` would send (with `OrderedHold`, one that no
    /// dead letter holds back)?
    pub(super) fn has_unfinished(&self, ordering: Ordering) -> &str {
        if ordering == Ordering::OrderedHold {
            &self.has_unfinished_hold
        } else {
            &self.has_unfinished
        }
    }
}
