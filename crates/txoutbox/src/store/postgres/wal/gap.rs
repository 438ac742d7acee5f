//! The price of tableless events: a logical message has no row to fall back to, so when the
//! slot that held it is lost (dropped, or invalidated past `max_slot_wal_keep_size`) before
//! the relay confirmed past it, it is gone. The relay cannot tell which messages were in the
//! lost stretch of WAL, only where that stretch is: from the last position it knew the slot
//! confirmed to the new slot's start. Each such stretch is a [`TablelessGap`], reported loudly
//! (an `ERROR` log naming the range, `outbox_wal_tableless_gap_total`, and readiness through
//! [`TablelessGaps`]), never silently. Events written as rows are not lost: the table path
//! delivers them.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::Lsn;

/// A stretch of WAL whose tableless events (if it held any) were never delivered and cannot
/// be: the slot that held them is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablelessGap {
    /// The slot that was lost.
    pub slot: String,
    /// The last position the relay knew the slot confirmed (everything before it was
    /// delivered).
    pub from: Lsn,
    /// Where the new slot starts: everything committed after it is delivered.
    pub to: Lsn,
    /// When the relay found it.
    pub found_at: DateTime<Utc>,
}

impl std::fmt::Display for TablelessGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replication slot {} was lost: tableless events committed between WAL positions \
             {} and {} were not delivered and cannot be (found {})",
            self.slot,
            self.from,
            self.to,
            self.found_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }
}

/// The gaps a WAL relay found, shared with whoever reports its readiness (the daemon's
/// `/readyz` is not ready while one is on record, until the process restarts). Cheap to
/// clone; every clone sees the same record.
#[derive(Debug, Clone, Default)]
pub struct TablelessGaps(Arc<Mutex<Vec<TablelessGap>>>);

impl TablelessGaps {
    /// Note a gap.
    pub fn push(&self, gap: TablelessGap) {
        if let Ok(mut g) = self.0.lock() {
            g.push(gap);
        }
    }

    /// The gaps found, oldest first.
    pub fn all(&self) -> Vec<TablelessGap> {
        self.0.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// The last gap found, if any.
    pub fn last(&self) -> Option<TablelessGap> {
        self.0.lock().ok().and_then(|g| g.last().cloned())
    }
}
