//! The write path and the inbox on SQLite (`store::text::write`), in the caller's own
//! transaction: several events in one statement over a JSON array (`json_each`); SQLite
//! serialises writers, so a second consumer of the same id waits for the first one's
//! transaction (busy timeout), then sees the row.

pub(crate) use crate::store::text::write::{create_inbox, insert, mark_processed};
