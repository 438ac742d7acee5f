//! The write path and the inbox on MySQL / MariaDB, in the caller's own transaction: several
//! events in one statement over a JSON array (`JSON_TABLE`), the inbox by `INSERT IGNORE`.

crate::store::text::text_write!("mysql", sqlx::MySql);
