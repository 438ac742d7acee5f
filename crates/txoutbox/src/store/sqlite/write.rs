//! The write path and the inbox on SQLite, in the caller's own transaction: several events
//! in one statement over a JSON array (`json_each`); SQLite serialises writers, so a second
//! consumer of the same id waits for the first one's transaction (busy timeout), then sees
//! the row.

crate::store::text::text_write!("sqlite", sqlx::Sqlite);
