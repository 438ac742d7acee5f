//! A relay's membership: its heartbeat, and the rebalance that renews what it owns and moves
//! it towards a fair share of the partitions.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::RelayConfig;
use crate::error::Error;
use crate::store::{Membership, RebalanceParams, Store};

/// Renew and rebalance this relay's membership once (`may_release`: it may give partitions
/// up), logging what moved and setting the owned-partitions gauge.
pub(super) async fn rebalance(
    store: &dyn Store,
    cfg: &RelayConfig,
    instance: uuid::Uuid,
    may_release: bool,
) -> Result<Membership, Error> {
    let m = store
        .rebalance(RebalanceParams {
            relay_id: &cfg.relay_id,
            instance,
            ordering: cfg.ordering,
            lease: cfg.partition_lease,
            may_release,
        })
        .await?;
    if !m.acquired.is_empty() || !m.released.is_empty() {
        tracing::info!(relay_id = %cfg.relay_id, owned = m.owned.len(), target = m.target,
            live_relays = m.live_relays, acquired = ?m.acquired, released = ?m.released,
            "partitions rebalanced");
    }
    ::metrics::gauge!(crate::metrics::PARTITIONS_OWNED, cfg.metric_labels.labels())
        .set(m.owned.len() as f64);
    Ok(m)
}

/// Heartbeats three times per partition lease; every 500 ms while this relay is not at its
/// fair share, and during its first lease (relays that start together find each other and
/// hand partitions over within a second, not a whole heartbeat later). A heartbeat that finds
/// this relay must not run ([`Error::is_membership_conflict`]) stops the relay (`fatal`) and
/// returns the error.
#[allow(clippy::too_many_arguments)]
pub(super) async fn heartbeat_loop(
    store: Arc<dyn Store>,
    claim_lock: Arc<tokio::sync::RwLock<()>>,
    release_wanted: Arc<AtomicBool>,
    cfg: RelayConfig,
    instance: uuid::Uuid,
    mut membership: Membership,
    stop: CancellationToken,
    fatal: CancellationToken,
) -> Option<Error> {
    let steady = cfg.partition_lease / 3;
    let fast = steady.min(Duration::from_millis(500));
    let warm_until = tokio::time::Instant::now() + cfg.partition_lease;
    loop {
        // At its share, or just under it: with ceil-shares the last relay may get a couple
        // fewer (64 over 3: 22, 22, 20) and must not poll fast forever for them.
        let owned = membership.owned.len();
        let settled = owned <= membership.target && owned + 2 >= membership.target;
        let wait = if !settled || tokio::time::Instant::now() < warm_until {
            fast
        } else {
            steady
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        // Never wait for a claim or a batch to finish: a slow one must not cost the relay
        // its partitions. While one is in flight, renew and take, but do not give up; if
        // partitions should go, ask the main loop to pause claiming (it then rebalances).
        let result = match claim_lock.clone().try_write_owned() {
            Ok(_guard) => rebalance(store.as_ref(), &cfg, instance, true).await,
            Err(_) => rebalance(store.as_ref(), &cfg, instance, false).await,
        };
        match result {
            Ok(m) => {
                release_wanted.store(m.owned.len() > m.target, AtomicOrdering::SeqCst);
                membership = m;
            }
            Err(e) if e.is_membership_conflict() => {
                tracing::error!(error = %e, "this relay must not run any more; stopping");
                fatal.cancel();
                return Some(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed; partitions expire unless it recovers")
            }
        }
    }
}
