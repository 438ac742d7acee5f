//! The connection pool a relay's store runs on.

use std::time::Duration;

use sqlx::pool::{PoolConnectionMetadata, PoolOptions};
use sqlx::{Connection, Database};

/// A pooled connection idle for at least this long is pinged before it is handed out.
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Pool options for a relay's store (and any pool that runs short statements back to back):
/// sqlx's defaults, except that only a connection idle for [`PING_IDLE_AFTER`] or longer is
/// pinged before it is handed out.
///
/// By default sqlx pings every connection it hands out (`test_before_acquire`): a round trip
/// to the server before each statement. A relay runs a claim and a settle per batch (the WAL
/// source a read-back and a settle), so that was one round trip in two, on the path of every
/// event's latency (`txoutbox-bench drain --statements` counts the messages). A connection
/// used within the last second is not checked; one that sat idle is, as before, so one that
/// died idle (a server restart, a proxy's idle timeout) is replaced before a statement meets
/// it. The CLI's pools use these options; build the pool you give a store with them too:
///
/// ```no_run
/// # async fn f() -> Result<(), sqlx::Error> {
/// # #[cfg(feature = "postgres")] {
/// use std::str::FromStr;
/// let opts = sqlx::postgres::PgConnectOptions::from_str("postgres://app@db/app")?;
/// let pool = txoutbox::store::relay_pool_options::<sqlx::Postgres>()
///     .max_connections(8)
///     .connect_with(txoutbox::store::postgres::relay_connect_options(opts))
///     .await?;
/// # }
/// # Ok(()) }
/// ```
pub fn relay_pool_options<DB: Database>() -> PoolOptions<DB> {
    PoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn: &mut DB::Connection, meta: PoolConnectionMetadata| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE_AFTER {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}
