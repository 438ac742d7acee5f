//! The WAL source without replication settings ([`PgStore::with_replication`] not given):
//! the slot read through SQL (`pg_logical_slot_peek_binary_changes`), polling. Slower than the
//! stream, and each read decodes the slot's WAL from its restart position again; kept for
//! embedders that cannot open a replication connection.
//!
//! [`PgStore::with_replication`]: crate::store::postgres::PgStore::with_replication

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::committed::AskTable;
use super::IDLE_CONFIRM;
use crate::error::Error;
use crate::metrics as m;
use crate::relay::{Relay, RelayStats};
use crate::retry::Backoff;
use crate::store::postgres::wal::{AggregateKey, WalStore};
use crate::store::{Ordering, Store};

impl Relay {
    /// Read, publish, settle and confirm through SQL, batch after batch, until `stop` (or,
    /// with `exit_when_drained`, until the stream and the table path have nothing left).
    pub(super) async fn read_by_sql(
        &self,
        wal: &Arc<WalStore>,
        stop: &CancellationToken,
        stats: &mut RelayStats,
        retry: &Backoff,
    ) -> Result<(), Error> {
        let cfg = &self.config;
        let ordered = cfg.ordering.is_ordered();
        let hold = cfg.ordering == Ordering::OrderedHold;
        let mut blocked: HashSet<AggregateKey> = HashSet::new();
        let mut load_blocked = ordered;
        let mut ask = AskTable::default();
        let mut errors = 0u32;
        let mut confirmed_idle_at: Option<Instant> = None;
        let mut flagged = false;
        // This path waits on the wake-up trigger, which a lean write path has disabled.
        match crate::store::postgres::wal::write_path(wal.pool(), wal.table()).await {
            Ok(s) if !s.wake_trigger => tracing::warn!(
                table = %wal.table().display(),
                "the outbox table's wake-up trigger is disabled (its lean write path, made for \
                 the WAL source's stream): reading the slot through SQL, new events wait up to \
                 the poll interval; give the relay replication settings to stream instead"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "could not read the table's write path"),
        }
        loop {
            if stop.is_cancelled() {
                break Ok(());
            }
            let step = async {
                if load_blocked {
                    blocked = wal.blocked(hold, None).await?;
                    load_blocked = false;
                }
                let flush = wal.flush_lsn().await?;
                let txs = wal.read(cfg.batch_size).await?;
                Ok::<_, Error>((flush, txs))
            };
            let (flush, txs) = match step.await {
                Ok(r) => r,
                Err(e) => {
                    match self.after_read_error(wal, e).await {
                        Ok(true) => {
                            // The slot was created again: what waits in the table changed.
                            load_blocked = ordered;
                            continue;
                        }
                        Ok(false) => continue,
                        Err(e) => match self.backoff_after(e, &mut errors, retry, stop).await {
                            Ok(()) => continue,
                            Err(e) => break Err(e),
                        },
                    }
                }
            };
            errors = 0;
            if !txs.is_empty() {
                if flagged {
                    flagged = false;
                    wal.clear_waiting(&cfg.relay_id).await?;
                }
                let started = Instant::now();
                let done = async {
                    if ordered {
                        ask.check(wal, &mut blocked, cfg.ordering).await?;
                    }
                    self.stream_batch(wal, txs, &mut blocked, &mut ask, ordered, hold, stop, stats)
                        .await
                }
                .await;
                match done {
                    Ok(Some(lsn)) => {
                        if let Err(e) = wal.confirm(lsn).await {
                            // Not confirmed: the batch comes again, unless the slot is gone.
                            match self.after_read_error(wal, e).await {
                                Ok(recreated) => load_blocked |= recreated && ordered,
                                Err(e) => {
                                    if let Err(e) =
                                        self.backoff_after(e, &mut errors, retry, stop).await
                                    {
                                        break Err(e);
                                    }
                                }
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // Nothing is confirmed: the batch comes again (duplicates of what was
                        // published, nothing lost).
                        if let Err(e) = self.backoff_after(e, &mut errors, retry, stop).await {
                            break Err(e);
                        }
                    }
                }
                ::metrics::histogram!(m::BATCH_DURATION_SECONDS, cfg.metric_labels.labels())
                    .record(started.elapsed().as_secs_f64());
                continue;
            }
            // Caught up: everything committed before `flush` has been read.
            ::metrics::gauge!(m::WAL_LAG_SECONDS, cfg.metric_labels.labels()).set(0.0);
            if confirmed_idle_at.is_none_or(|t| t.elapsed() >= IDLE_CONFIRM) {
                if let Err(e) = wal.confirm(flush).await {
                    tracing::debug!(error = %e, "could not confirm the slot while idle");
                }
                confirmed_idle_at = Some(Instant::now());
            }
            if cfg.exit_when_drained && !wal.table_path().has_unfinished(cfg.ordering).await? {
                break Ok(());
            }
            if !flagged {
                // Flag first, then read again: a commit after the flag notifies; one before it
                // is seen by that read.
                if let Err(e) = wal
                    .flag_waiting(&cfg.relay_id, cfg.poll_interval + Duration::from_secs(1))
                    .await
                {
                    tracing::warn!(error = %e, "LISTEN failed; polling only");
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(cfg.poll_interval) => {}
                    }
                    continue;
                }
                flagged = true;
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = wal.wait_notified(cfg.poll_interval) => {}
            }
            // The flag lasts a poll interval and a second: say it again on the next idle turn.
            flagged = false;
        }
    }
}
