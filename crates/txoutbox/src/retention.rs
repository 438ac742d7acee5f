//! Retention: published events are deleted once they are older than a retention period, by a
//! background task, in bounded batches of short autocommit statements (no long locks, no
//! long transactions), through [`Operator::purge_processed`] on any store. Dead letters are
//! never purged: they wait for an operator.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(store: txoutbox::store::postgres::PgStore) {
//! use std::time::Duration;
//! use txoutbox::retention::Purger;
//! let cancel = tokio_util::sync::CancellationToken::new();
//! let purger = Purger { keep: Duration::from_secs(7 * 24 * 3600), ..Purger::default() };
//! tokio::spawn(async move { purger.run(&store, cancel).await });
//! # }
//! ```

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::metrics as m;
use crate::store::Operator;

/// How and how often published rows are purged.
#[derive(Debug, Clone)]
pub struct Purger {
    /// Keep published rows this long after `processed_at`.
    pub keep: Duration,
    /// Rows per DELETE statement.
    pub batch: i64,
    /// How often to look for rows to purge.
    pub every: Duration,
    /// Pause between two batches of one round, so the purge yields to the relay and writers.
    pub pause: Duration,
    /// Labels on its metric (as the relay's [`RelayConfig::metric_labels`](crate::relay::RelayConfig)).
    pub metric_labels: crate::metrics::MetricLabels,
}

impl Default for Purger {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(7 * 24 * 3600),
            batch: 5000,
            every: Duration::from_secs(60),
            pause: Duration::from_millis(20),
            metric_labels: crate::metrics::MetricLabels::default(),
        }
    }
}

impl Purger {
    /// How long a relay of `source` keeps published rows unless told otherwise (the daemon's
    /// `--retention-period` default). The table relay keeps them ([`Purger::default`]'s
    /// `keep`, 7 days: the seed's `processed_at` history). The WAL source deletes each event
    /// as it settles it (zero, [`Retention::Delete`](crate::store::Retention::Delete)): the
    /// UPDATE that marks a row costs its drain about 40% of its rate (docs/performance.md,
    /// "The hot path's write"), and a delete costs next to nothing; set a period to keep them.
    pub fn default_keep(source: crate::relay::Source) -> Duration {
        match source {
            crate::relay::Source::Table => Self::default().keep,
            crate::relay::Source::Wal => Duration::ZERO,
        }
    }

    /// Purge every `every` until `cancel` fires. Database errors are logged and retried on
    /// the next round; they never stop the task.
    pub async fn run<S: Operator + ?Sized>(&self, store: &S, cancel: CancellationToken) {
        loop {
            match self.round(store, &cancel).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, keep = ?self.keep, "purged published events"),
                Err(e) => tracing::warn!(error = %e, "retention purge failed; retrying later"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// One round: batches until a short one (or `cancel`). Returns how many rows went.
    pub async fn round<S: Operator + ?Sized>(
        &self,
        store: &S,
        cancel: &CancellationToken,
    ) -> Result<u64, Error> {
        let mut total = 0;
        while !cancel.is_cancelled() {
            let n = store.purge_processed(self.keep, self.batch).await?;
            total += n;
            ::metrics::counter!(m::PURGED_TOTAL, self.metric_labels.labels()).increment(n);
            if (n as i64) < self.batch {
                break;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(self.pause) => {}
            }
        }
        Ok(total)
    }
}
