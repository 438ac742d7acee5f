//! In-process wake-ups on SQLite, which has no LISTEN/NOTIFY: every connection of a pool
//! opened by [`connect`] watches its own commits, and a commit that inserted into the outbox
//! table wakes the relay of the same process at once. Writers in other processes are found
//! by adaptive polling (see `SqliteStore::wait_for_work`).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::wakeup::Wakeup;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqliteOperation, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::error::Error;
use crate::OutboxTable;

/// How long a writer waits for the database file's write lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Open (creating it when missing) the SQLite database at `url` (`sqlite://path/to/file.db`,
/// `sqlite::memory:` is refused: a relay needs a file other connections share) in WAL mode
/// with a busy timeout, and fire `wakeup` after every commit that inserted into `table`.
pub async fn connect(
    url: &str,
    table: &OutboxTable,
    max_connections: u32,
    wakeup: &Wakeup,
) -> Result<SqlitePool, Error> {
    super::schema::check_names(table)?;
    let opts = SqliteConnectOptions::from_str(url)
        .map_err(Error::Database)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT);
    if opts.get_filename().as_os_str() == ":memory:" {
        return Err(Error::Unsupported(
            "an in-memory SQLite database cannot be shared by a relay and writers: give a file (sqlite://path/to/outbox.db)".into(),
        ));
    }
    let name = table.table().as_str().to_string();
    let wakeup = wakeup.clone();
    let pool = SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
        .after_connect(move |conn, _meta| {
            let (name, wakeup) = (name.clone(), wakeup.clone());
            Box::pin(async move {
                let mut handle = conn.lock_handle().await?;
                let inserted = Arc::new(AtomicBool::new(false));
                let seen = inserted.clone();
                handle.set_update_hook(move |u| {
                    if u.operation == SqliteOperation::Insert && u.table == name {
                        seen.store(true, Ordering::Relaxed);
                    }
                });
                let committed = inserted.clone();
                handle.set_commit_hook(move || {
                    if committed.swap(false, Ordering::Relaxed) {
                        wakeup.fire();
                    }
                    true
                });
                handle.set_rollback_hook(move || inserted.store(false, Ordering::Relaxed));
                Ok(())
            })
        })
        .connect_with(opts)
        .await
        .map_err(Error::Database)?;
    Ok(pool)
}
