//! The write path and the inbox on MySQL / MariaDB (`store::text::write`), in the caller's own
//! transaction: several events in one statement over a JSON array (`JSON_TABLE`), the inbox
//! by `INSERT IGNORE`.

pub(crate) use crate::store::text::write::{create_inbox, insert, mark_processed};
