//! Where a relay's events come from: the [`EventSource`] seam. One lifecycle,
//! [`Relay::run`] (start-up, membership and heartbeat, reading until stopped or drained,
//! shutdown, stats, the start and stop lines), runs either source:
//! - the table ([`TableSource`]): claim -> publish -> settle over the outbox table;
//! - the WAL (`wal::WalSource`, feature `wal`): stream -> publish -> settle -> confirm, with
//!   the table path beside it for the events the stream hands to the table.
//!
//! ([`Source`](super::Source) is the setting that picks one.)

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Relay, RelayStats};
use crate::error::Error;
use crate::retry::Backoff;
use crate::store::{Membership, Store};

/// A source of events for [`Relay::run`].
#[async_trait::async_trait]
pub(super) trait EventSource: Send + Sync {
    /// `table` or `wal`, for the logs.
    fn name(&self) -> &'static str;

    /// The store the relay registers with, heartbeats on and deregisters from: the outbox
    /// table's store, or for the WAL source its table path (registered as `wal:<slot>`, no
    /// partitions). Membership covers both sources, so one conflicts with the other.
    fn registry(&self) -> Arc<dyn Store>;

    /// Registering rides a database outage out (the WAL source, which has waited for the
    /// server already to name its slot) instead of stopping with the error (the table source).
    fn waits_out_outages(&self) -> bool;

    /// Read, publish and settle until `stop` fires, or until drained with
    /// `exit_when_drained`. Says "relay started" (see [`log_started`]) once it reads: a WAL
    /// standby does not until it holds its slot.
    async fn read(
        &self,
        relay: &Relay,
        membership: &Membership,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<(), Error>;
}

/// The table source: claim -> publish -> settle over the outbox table, several batches in
/// flight (see [`Relay::pipeline`]).
pub(super) struct TableSource {
    pub(super) store: Arc<dyn Store>,
}

#[async_trait::async_trait]
impl EventSource for TableSource {
    fn name(&self) -> &'static str {
        "table"
    }

    fn registry(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn waits_out_outages(&self) -> bool {
        false
    }

    async fn read(
        &self,
        relay: &Relay,
        membership: &Membership,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<(), Error> {
        log_started(relay, self.name(), Some(membership.owned.len()), None);
        relay.pipeline(stop, stats, &relay.retry()).await
    }
}

/// The one "relay started" line: the relay, its publisher, mode and source, and the table
/// source's partitions or the WAL source's slot (its name, whether it was just created, how
/// many events were handed to the table on opening it).
pub(super) fn log_started(
    relay: &Relay,
    source: &'static str,
    partitions: Option<usize>,
    slot: Option<(&str, bool, u64)>,
) {
    let cfg = &relay.config;
    tracing::info!(relay_id = %cfg.relay_id, publisher = relay.publisher.kind(),
        mode = cfg.ordering.mode_name(), source, partitions, slot = slot.map(|s| s.0),
        created = slot.map(|s| s.1), handed_to_table = slot.map(|s| s.2), "relay started");
}

/// Run `step` until it succeeds or fails for good: a transient error (the database
/// restarting, a connection reset) is retried with backoff, as a table relay rides an outage
/// out. `None`: `cancel` fired meanwhile.
pub(super) async fn until_up<T, F, Fut>(
    cancel: &CancellationToken,
    what: &str,
    mut step: F,
) -> Result<Option<T>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let retry = Backoff {
        base: Duration::from_millis(250),
        max: Duration::from_secs(5),
        jitter: true,
    };
    let mut failures = 0u32;
    loop {
        match step().await {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_transient() => {
                failures += 1;
                let delay = retry.delay(failures, &mut rand::thread_rng());
                tracing::warn!(error = %e, retry_in = ?delay, "{what}: database unavailable; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}
