//! The relay loop: claim -> publish -> settle, wake-ups, shutdown.

mod batch;
mod config;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use batch::BatchReport;
pub use config::{default_relay_id, RelayConfig};

use crate::error::Error;
use crate::publish::Publisher;
use crate::retry::Backoff;
use crate::store::{Store, Wake};

/// Moves committed events from a [`Store`] to a [`Publisher`].
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use txoutbox::{publish, relay::{Relay, RelayConfig}, store::postgres::PgStore, OutboxTable};
/// let store = PgStore::new(pool, OutboxTable::default());
/// let publisher = publish::connect("nats://127.0.0.1:4222?stream=OUTBOX").await?;
/// let handle = Relay::new(store, publisher, RelayConfig::default()).spawn();
/// // ... on shutdown: finish in-flight events, settle them, release leases.
/// let stats = handle.shutdown().await?;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
pub struct Relay {
    store: Arc<dyn Store>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
}

/// Totals over a relay's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    pub batches: u64,
    pub published: u64,
    pub failed: u64,
    pub dead: u64,
    pub released: u64,
}

impl RelayStats {
    fn add(&mut self, r: &BatchReport) {
        self.batches += 1;
        self.published += r.published as u64;
        self.failed += r.failed as u64;
        self.dead += r.dead as u64;
        self.released += r.released as u64;
    }
}

/// Why the relay stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("invalid relay setting: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] Error),
    #[error("relay task panicked or was aborted: {0}")]
    Join(String),
}

impl Relay {
    pub fn new(store: impl Store, publisher: Box<dyn Publisher>, config: RelayConfig) -> Self {
        Self {
            store: Arc::new(store),
            publisher: Arc::from(publisher),
            config,
        }
    }

    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Run until `cancel` fires (or, with `exit_when_drained`, until nothing is left).
    /// On cancel: stop claiming, finish and settle what is in flight, release leases.
    pub async fn run(&self, cancel: CancellationToken) -> Result<RelayStats, RelayError> {
        self.config.validate().map_err(RelayError::Config)?;
        let cfg = &self.config;
        let mut stats = RelayStats::default();
        let retry = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10).min(cfg.poll_interval.max(Duration::from_secs(1)) * 5),
            jitter: true,
        };
        let mut errors = 0u32;
        tracing::info!(relay_id = %cfg.relay_id, publisher = self.publisher.kind(), "relay started");
        let result = loop {
            if cancel.is_cancelled() {
                break Ok(());
            }
            let step = self.step(&cancel, &mut stats).await;
            match step {
                Ok(true) => errors = 0,
                Ok(false) => break Ok(()),
                Err(e) if e.is_transient() => {
                    errors += 1;
                    let delay = retry.delay(errors, &mut rand::thread_rng());
                    tracing::warn!(error = %e, retry_in = ?delay, "database unavailable; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                Err(e) => break Err(e),
            }
        };
        // Whatever happened, give back what we hold and stop asking writers to notify us.
        if let Err(e) = self.store.deregister(&cfg.relay_id).await {
            tracing::warn!(error = %e, "could not release leases on exit; they expire by themselves");
        }
        if let Err(e) = self.publisher.close().await {
            tracing::warn!(error = %e, "publisher did not close cleanly");
        }
        tracing::info!(relay_id = %cfg.relay_id, published = stats.published, failed = stats.failed,
            dead = stats.dead, "relay stopped");
        result.map(|_| stats).map_err(RelayError::Store)
    }

    /// One batch, then (when it was not full) a wait for more work. `Ok(false)`: stop.
    async fn step(
        &self,
        cancel: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<bool, Error> {
        let report = self.run_once(cancel).await?;
        stats.add(&report);
        if report.claimed >= self.config.batch_size || cancel.is_cancelled() {
            return Ok(true);
        }
        if self.config.exit_when_drained && !self.store.has_unfinished().await? {
            return Ok(false);
        }
        let wake = tokio::select! {
            _ = cancel.cancelled() => return Ok(true),
            w = self.store.wait_for_work(&self.config.relay_id, self.config.poll_interval) => w?,
        };
        tracing::trace!(?wake, "woke");
        if wake == Wake::Ready && report.claimed == 0 {
            // Work is due but another relay holds it or it was just settled; yield briefly
            // rather than spin.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(true)
    }

    /// Run on a task of its own. The handle stops it gracefully.
    pub fn spawn(self) -> RelayHandle {
        let cancel = CancellationToken::new();
        let task = {
            let cancel = cancel.clone();
            tokio::spawn(async move { self.run(cancel).await })
        };
        RelayHandle { cancel, task }
    }
}

/// A running relay.
pub struct RelayHandle {
    cancel: CancellationToken,
    task: JoinHandle<Result<RelayStats, RelayError>>,
}

impl RelayHandle {
    /// The token that stops the relay (e.g. to tie it to the service's own shutdown).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stop gracefully and wait for the relay to finish.
    pub async fn shutdown(self) -> Result<RelayStats, RelayError> {
        self.cancel.cancel();
        self.join().await
    }

    /// Wait for the relay to stop by itself (drained, or an error).
    pub async fn join(self) -> Result<RelayStats, RelayError> {
        self.task
            .await
            .map_err(|e| RelayError::Join(e.to_string()))?
    }
}
