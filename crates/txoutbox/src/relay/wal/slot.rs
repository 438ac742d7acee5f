//! What runs beside a WAL relay's stream: the slot's metrics, and the watch on the connection
//! that holds the slot's lock.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::store::postgres::wal::{self, SlotLock, WalStore};

/// How often the reader checks that its slot lock's connection is up.
const LOCK_CHECK: Duration = Duration::from_secs(1);

/// How often the slot's lag, status and safe size are sampled into the metrics.
const SLOT_SAMPLE: Duration = Duration::from_secs(5);

/// Every few seconds: the slot's lag, status, confirmed position and safe size as gauges.
pub(super) async fn sample_slot(wal: Arc<WalStore>, labels: crate::metrics::MetricLabels) {
    loop {
        match wal::slot_info(wal.pool(), wal.slot()).await {
            Ok(Some(info)) => {
                if let Some(lag) = info.lag_bytes {
                    ::metrics::gauge!(m::WAL_SLOT_LAG_BYTES, labels.labels()).set(lag as f64);
                }
                // A lost slot has no restart_lsn: its WAL is gone.
                ::metrics::gauge!(m::WAL_SLOT_RETAINED_BYTES, labels.labels())
                    .set(info.retained_bytes.unwrap_or(0) as f64);
                if let Some(lsn) = info.confirmed_flush_lsn {
                    wal.note_confirmed(lsn);
                    ::metrics::gauge!(m::WAL_CONFIRMED_LSN, labels.labels()).set(lsn.0 as f64);
                }
                if let Some(safe) = info.safe_wal_size {
                    ::metrics::gauge!(m::WAL_SAFE_WAL_SIZE_BYTES, labels.labels()).set(safe as f64);
                }
                // Active: a relay reads it (a stream holds the slot open; a relay reading
                // through SQL holds it only per read, but holds the reader lock).
                let reading = info.active || wal.reader_present().await.unwrap_or(false);
                ::metrics::gauge!(m::WAL_SLOT_ACTIVE, labels.labels())
                    .set(f64::from(u8::from(reading)));
                let now = info.wal_status.as_deref().unwrap_or_default();
                for status in m::WAL_STATUSES {
                    ::metrics::gauge!(m::WAL_SLOT_STATUS, labels.and("status", status))
                        .set(f64::from(u8::from(status == now)));
                }
            }
            Ok(None) => ::metrics::gauge!(m::WAL_SLOT_ACTIVE, labels.labels()).set(0.0),
            Err(e) => tracing::debug!(error = %e, "could not sample the replication slot"),
        }
        tokio::time::sleep(SLOT_SAMPLE).await;
    }
}

/// Report a slot found lost before its reader confirmed past a stretch of WAL: the
/// tableless events in it are gone. Loudly: an `ERROR` log naming the range and the counter
/// `outbox_wal_tableless_gap_total` (the gap is on record in [`WalStore::gaps`] already).
pub(super) fn report_gap(opened: &wal::Opened, labels: &crate::metrics::MetricLabels) {
    let Some(gap) = &opened.gap else {
        return;
    };
    tracing::error!(slot = %gap.slot, from = %gap.from, to = %gap.to,
        "{gap}; events written as rows are delivered from the table, tableless events in this \
         range are lost");
    ::metrics::counter!(m::WAL_TABLELESS_GAP_TOTAL, labels.labels()).increment(1);
}

/// Check the slot lock's connection every second; when it is gone, stop the relay (another
/// relay may take the slot over now).
pub(super) async fn watch_lock(mut lock: SlotLock, stop: CancellationToken, lost: Arc<AtomicBool>) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOCK_CHECK) => {}
        }
        if let Err(e) = lock.check().await {
            tracing::error!(error = %e, "the slot lock's connection is gone; stopping");
            lost.store(true, std::sync::atomic::Ordering::SeqCst);
            stop.cancel();
            return;
        }
    }
}
