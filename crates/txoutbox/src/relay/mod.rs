//! The relay loop: claim -> publish -> settle, wake-ups, shutdown.

mod batch;
mod config;
mod in_flight;
mod membership;
mod outage;
mod send;
mod source;
#[cfg(feature = "wal")]
mod wal;

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

pub use batch::BatchReport;
pub use config::{
    default_relay_id, format_duration, parse_duration, InvalidDuration, InvalidSetting, Mode,
    OnDeadLetter, RelayConfig, Source, BYTES_RANGE,
};

use crate::error::Error;
use crate::publish::Publisher;
use crate::retry::Backoff;
use crate::store::{DeregisterParams, Membership, Store, WaitParams, Wake};
use membership::{heartbeat_loop, rebalance};

/// Moves committed events from a [`Store`] to a [`Publisher`].
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use txoutbox::{publish, relay::{Relay, RelayConfig}, store::postgres::PgStore, OutboxTable};
/// let store = PgStore::new(pool, OutboxTable::default());
/// let publisher = publish::connect("nats://127.0.0.1:4222?stream=OUTBOX").await?;
/// let handle = Relay::new(store, publisher, RelayConfig::default()).spawn();
/// // ... on shutdown: finish in-flight events, settle them, release leases; then close the
/// // publisher, which the relay leaves open (its owner closes it).
/// let publisher = handle.publisher();
/// let stats = handle.shutdown().await?;
/// publisher.close().await?;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
pub struct Relay {
    store: Arc<dyn Store>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    /// Read-held by every claim and batch in flight, write-held while giving partitions up,
    /// so a partition never changes hands while this relay may still publish from it.
    claim_lock: Arc<tokio::sync::RwLock<()>>,
    /// The heartbeat wants to give partitions up (this relay is over its fair share) but
    /// batches are in flight: stop claiming until they are done, then rebalance.
    release_wanted: Arc<AtomicBool>,
    /// This relay's own random id: a second process with the same relay id is refused, and
    /// only this instance's exit deregisters the relay id it holds.
    instance: uuid::Uuid,
    /// Claims not yet settled or released, passed to every claim (see [`in_flight`]).
    in_flight: Arc<in_flight::InFlight>,
    /// Events that failed for their publisher's outage, sent again once it answers.
    outage: Arc<outage::Outage>,
    /// The WAL source's reader ([`Relay::with_wal`]); `None`: the relay claims rows.
    #[cfg(feature = "wal")]
    wal: Option<crate::store::postgres::wal::WalStore>,
}

/// Totals over a relay's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Claim -> publish -> settle cycles finished.
    pub batches: u64,
    /// Events acknowledged by the broker.
    pub published: u64,
    /// Failed publishes (dead letters included).
    pub failed: u64,
    /// Events dead-lettered.
    pub dead: u64,
    /// Events claimed and given back unattempted.
    pub released: u64,
}

impl std::ops::AddAssign for RelayStats {
    /// Totals of two parts of one relay (the WAL source's stream and its table path).
    fn add_assign(&mut self, other: RelayStats) {
        self.batches += other.batches;
        self.published += other.published;
        self.failed += other.failed;
        self.dead += other.dead;
        self.released += other.released;
    }
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
    /// A [`RelayConfig`] value is out of range (checked when the relay starts).
    #[error("invalid relay setting: {0}")]
    Config(#[from] InvalidSetting),
    /// A store error that is not transient (transient ones are retried with backoff), or a
    /// membership conflict a heartbeat found (e.g. another process holds the relay id).
    #[error(transparent)]
    Store(#[from] Error),
    /// A relay task panicked or was aborted.
    #[error("relay task panicked or was aborted: {0}")]
    Join(String),
}

/// `tokio::spawn` in the caller's tracing span, so that a relay's tasks log under the span its
/// embedder runs it in (e.g. the daemon's `outbox{outbox=NAME}`).
pub(crate) fn spawn_here<F>(future: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(tracing::Instrument::in_current_span(future))
}

impl Relay {
    /// A relay over `store` and `publisher`. The config is validated when [`Relay::run`] starts,
    /// not here.
    pub fn new(store: impl Store, publisher: Box<dyn Publisher>, config: RelayConfig) -> Self {
        Self {
            store: Arc::new(store),
            publisher: Arc::from(publisher),
            config,
            claim_lock: Arc::new(tokio::sync::RwLock::new(())),
            release_wanted: Arc::new(AtomicBool::new(false)),
            instance: uuid::Uuid::new_v4(),
            in_flight: Arc::default(),
            outage: Arc::default(),
            #[cfg(feature = "wal")]
            wal: None,
        }
    }

    /// Relay from PostgreSQL's WAL through `wal` ([`PgStore::wal`] of the relay's store)
    /// rather than by claiming rows: sets [`RelayConfig::source`] to [`Source::Wal`]. The
    /// relay's store is still the one events are handed to when they cannot go at once.
    ///
    /// [`PgStore::wal`]: crate::store::postgres::PgStore::wal
    #[cfg(feature = "wal")]
    pub fn with_wal(mut self, wal: crate::store::postgres::wal::WalStore) -> Self {
        self.config.source = Source::Wal;
        self.wal = Some(wal);
        self
    }

    /// The settings this relay was built with.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The publisher this relay publishes to. The relay never closes it: its owner does,
    /// once the relay has stopped (`let p = relay.publisher(); relay.run(..).await; p.close()`),
    /// and a publisher shared by several relays once every one of them has stopped.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    /// Run until `cancel` fires (or, with `exit_when_drained`, until nothing is left).
    /// On cancel: stop reading, finish and settle what is in flight, release leases. The
    /// publisher is left open, however the relay stops: close it with [`Publisher::close`]
    /// once it returns ([`Relay::publisher`]).
    pub async fn run(&self, cancel: CancellationToken) -> Result<RelayStats, RelayError> {
        let cancel = &cancel;
        self.config.validate().map_err(RelayError::Config)?;
        match self.config.source {
            Source::Table => {
                let store = self.store.clone();
                self.run_source(&source::TableSource { store }, cancel)
                    .await
            }
            #[cfg(feature = "wal")]
            Source::Wal => match wal::WalSource::open(self, cancel).await? {
                Some(wal) => self.run_source(&wal, cancel).await,
                None => Ok(RelayStats::default()),
            },
            #[cfg(not(feature = "wal"))]
            Source::Wal => Err(RelayError::Config(InvalidSetting {
                field: "source",
                rule: "wal needs the `wal` feature of txoutbox (PostgreSQL only), which this \
                       build lacks",
            })),
        }
    }

    /// The one lifecycle of both sources: register (and, ordered on the table, take a share of
    /// the partitions) before reading, heartbeat while reading, then deregister and say so.
    async fn run_source(
        &self,
        source: &dyn source::EventSource,
        cancel: &CancellationToken,
    ) -> Result<RelayStats, RelayError> {
        let cfg = &self.config;
        let registry = source.registry();
        let membership = if source.waits_out_outages() {
            let registering = || self.register(registry.as_ref());
            match source::until_up(cancel, "registering the relay", registering).await? {
                Some(m) => m,
                None => return Ok(RelayStats::default()),
            }
        } else {
            self.register(registry.as_ref())
                .await
                .map_err(RelayError::Store)?
        };
        // The heartbeat runs until reading has ended (a shutdown that settles what is in
        // flight keeps its partitions and registration renewed meanwhile).
        let heartbeat_stop = CancellationToken::new();
        // Reading stops on the caller's cancel, and when a heartbeat finds that this relay
        // must not run (another mode or source on the table, its relay id held by another
        // process).
        let stop = cancel.child_token();
        // Aborted when dropped: if this future is dropped (an embedder gives up on it, or the
        // task is aborted), the heartbeat must stop too, or a dead relay's partitions would
        // stay renewed forever.
        let heartbeat = AbortOnDrop(crate::relay::spawn_here(heartbeat_loop(
            registry.clone(),
            self.claim_lock.clone(),
            self.release_wanted.clone(),
            cfg.clone(),
            self.instance,
            membership.clone(),
            heartbeat_stop.clone(),
            stop.clone(),
        )));
        let mut stats = RelayStats::default();
        let result = source.read(self, &membership, &stop, &mut stats).await;
        heartbeat_stop.cancel();
        let conflict = heartbeat.join().await.flatten();
        // Whatever happened, give back what we hold and stop asking writers to notify us.
        let leaving = DeregisterParams {
            relay_id: &cfg.relay_id,
            instance: self.instance,
        };
        if let Err(e) = registry.deregister(leaving).await {
            tracing::warn!(error = %e, "could not release leases on exit; they expire by themselves");
        }
        tracing::info!(relay_id = %cfg.relay_id, source = source.name(),
            published = stats.published, failed = stats.failed, dead = stats.dead,
            "relay stopped");
        if let Some(e) = conflict {
            return Err(RelayError::Store(e));
        }
        result.map(|_| stats).map_err(RelayError::Store)
    }

    /// How the loops back off after a database error.
    fn retry(&self) -> Backoff {
        Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10)
                .min(self.config.poll_interval.max(Duration::from_secs(1)) * 5),
            jitter: true,
        }
    }

    /// The main loop: claim batches and hand each to a task of its own that publishes and
    /// settles it, with up to `pipeline` batches in flight. The next claim overlaps the
    /// publishing and settling of the previous batches, so the database and the broker work
    /// at the same time. In ordered mode this is safe: the claim skips events whose
    /// aggregate has an earlier event still in flight (leased, or on PostgreSQL held by this
    /// relay's own claims in flight).
    async fn pipeline(
        &self,
        cancel: &CancellationToken,
        stats: &mut RelayStats,
        retry: &Backoff,
    ) -> Result<(), Error> {
        let cfg = &self.config;
        // Events that fail for their publisher's outage go again once it answers.
        let _outage_watch = AbortOnDrop(crate::relay::spawn_here(outage::watch(
            self.store.clone(),
            self.publisher.clone(),
            self.outage.clone(),
            cfg.poll_interval.min(Duration::from_secs(1)),
            cancel.clone(),
        )));
        let mut in_flight: JoinSet<Result<BatchReport, Error>> = JoinSet::new();
        let mut errors = 0u32;
        // Claiming ahead pays only while it finds work: in ordered mode with few aggregates,
        // everything claimable may be behind the batch in flight. After a short claim ahead,
        // claim again only once the batches in flight are done, until a claim is full.
        let mut claim_ahead = true;
        // The last wake-up said "work is due" and the claim after it found none.
        let mut ready_without_work = false;
        let result = loop {
            let mut failure = None;
            while let Some(joined) = in_flight.try_join_next() {
                if let Err(e) = absorb(joined, stats) {
                    failure = Some(e);
                }
            }
            if let Some(e) = failure {
                match self.backoff_after(e, &mut errors, retry, cancel).await {
                    Ok(()) => continue,
                    Err(e) => break Err(e),
                }
            }
            if cancel.is_cancelled() {
                break Ok(());
            }
            let busy = in_flight.len();
            if busy == 0 && self.release_wanted.load(AtomicOrdering::SeqCst) {
                // Nothing in flight: give the partitions up now, then go on claiming.
                if let Err(e) = self.rebalance().await {
                    if let Err(e) = self.backoff_after(e, &mut errors, retry, cancel).await {
                        break Err(e);
                    }
                }
                continue;
            }
            let pausing = self.release_wanted.load(AtomicOrdering::SeqCst);
            // The batches in flight hold the in-flight byte budget: claim once one is done.
            let bytes_full = busy > 0 && self.in_flight.bytes() >= cfg.max_in_flight_bytes;
            // Up to `pipeline` batches being published, and as many again settling: a batch
            // held by partitions (PostgreSQL) settles apart once published, and an ordered
            // one frees the aggregates of its acknowledged events for the next claim
            // (in_flight::Held::acknowledged).
            let depth = cfg.pipeline.max(1);
            let publishing = self.in_flight.publishing();
            if publishing >= depth
                || busy >= 2 * depth
                || (busy > 0 && (!claim_ahead || pausing || bytes_full))
            {
                tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    Some(joined) = in_flight.join_next() => {
                        if let Err(e) = absorb(joined, stats) {
                            if let Err(e) = self.backoff_after(e, &mut errors, retry, cancel).await {
                                break Err(e);
                            }
                        }
                    }
                    // A batch started settling; if it freed aggregates, claiming ahead may
                    // find their next events.
                    _ = self.in_flight.acknowledged.notified() => {
                        claim_ahead |= self.in_flight.take_freed();
                    }
                }
                continue;
            }
            let claimed = match self.claim_batch().await {
                Ok(c) => c,
                Err(e) => match self.backoff_after(e, &mut errors, retry, cancel).await {
                    Ok(()) => continue,
                    Err(e) => break Err(e),
                },
            };
            errors = 0;
            let n = claimed.claim.events.len();
            if n > 0 {
                ready_without_work = false;
            }
            let full = n >= cfg.batch_size;
            if busy > 0 {
                claim_ahead = full;
            } else if full {
                claim_ahead = true;
            }
            if n > 0 {
                let relay = self.share();
                let cancel = cancel.clone();
                in_flight.spawn(async move { relay.finish_batch(claimed, &cancel).await });
            }
            if full {
                continue;
            }
            if !in_flight.is_empty() {
                // More may become claimable when a batch in flight is acknowledged or settles
                // (its aggregates' next events), or when a writer commits.
                tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    Some(joined) = in_flight.join_next() => {
                        if let Err(e) = absorb(joined, stats) {
                            if let Err(e) = self.backoff_after(e, &mut errors, retry, cancel).await {
                                break Err(e);
                            }
                        }
                    }
                    _ = self.in_flight.acknowledged.notified() => {
                        claim_ahead |= self.in_flight.take_freed();
                    }
                }
                continue;
            }
            // Nothing in flight and nothing (more) to claim.
            match self.idle(cancel, &mut ready_without_work).await {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => {
                    if let Err(e) = self.backoff_after(e, &mut errors, retry, cancel).await {
                        break Err(e);
                    }
                }
            }
        };
        // Whatever way the loop ended, let the batches in flight finish (they stop sending
        // on cancel and settle within the shutdown timeout).
        while let Some(joined) = in_flight.join_next().await {
            if let Err(e) = absorb(joined, stats) {
                tracing::warn!(error = %e, "a batch in flight failed while stopping");
            }
        }
        result
    }

    /// After a claim that was not full and with nothing in flight: stop when drained (with
    /// `exit_when_drained`), else wait for work. `Ok(false)`: stop.
    async fn idle(
        &self,
        cancel: &CancellationToken,
        ready_without_work: &mut bool,
    ) -> Result<bool, Error> {
        if self.config.exit_when_drained && !self.store.has_unfinished(self.config.ordering).await?
        {
            return Ok(false);
        }
        let wake = tokio::select! {
            _ = cancel.cancelled() => return Ok(true),
            w = self.store.wait_for_work(WaitParams {
                relay_id: &self.config.relay_id,
                ordering: self.config.ordering,
                max: self.config.poll_interval,
            }) => w?,
        };
        tracing::trace!(?wake, "woke");
        if wake == Wake::Ready {
            // Work is due: usually an event committed between our last claim and going to
            // sleep, so claim again at once. If the claim after the previous "due" found
            // nothing (another relay holds it, or its aggregate is held back), yield briefly
            // rather than spin.
            if *ready_without_work {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            *ready_without_work = true;
        } else {
            *ready_without_work = false;
        }
        Ok(true)
    }

    /// A database error: transient ones back off (and the loop goes on), others stop it.
    async fn backoff_after(
        &self,
        e: Error,
        errors: &mut u32,
        retry: &Backoff,
        cancel: &CancellationToken,
    ) -> Result<(), Error> {
        if !e.is_transient() {
            return Err(e);
        }
        *errors += 1;
        let delay = retry.delay(*errors, &mut rand::thread_rng());
        tracing::warn!(error = %e, retry_in = ?delay, "database unavailable; retrying");
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
        Ok(())
    }

    /// A handle on the same store, publisher and settings, for a batch's task.
    fn share(&self) -> Relay {
        Relay {
            store: self.store.clone(),
            publisher: self.publisher.clone(),
            config: self.config.clone(),
            claim_lock: self.claim_lock.clone(),
            release_wanted: self.release_wanted.clone(),
            instance: self.instance,
            in_flight: self.in_flight.clone(),
            outage: self.outage.clone(),
            // A batch's task reads no WAL.
            #[cfg(feature = "wal")]
            wal: None,
        }
    }

    /// One heartbeat: renew, and move towards a fair share of the partitions.
    async fn rebalance(&self) -> Result<Membership, Error> {
        self.register(self.store.as_ref()).await
    }

    /// [`Relay::rebalance`] on `registry` (the store the source registers with), with no
    /// claim in flight.
    async fn register(&self, registry: &dyn Store) -> Result<Membership, Error> {
        let _guard = self.claim_lock.write().await;
        let m = rebalance(registry, &self.config, self.instance, true).await?;
        self.release_wanted.store(false, AtomicOrdering::SeqCst);
        Ok(m)
    }

    /// A relay over `store` with this relay's publisher, instance and outage watch, and
    /// claims of its own: the WAL source's table path. It never stops by itself when drained
    /// (the WAL source decides that).
    #[cfg(feature = "wal")]
    fn table_path(&self, store: Arc<dyn Store>) -> Relay {
        Relay {
            store,
            publisher: self.publisher.clone(),
            config: RelayConfig {
                exit_when_drained: false,
                ..self.config.clone()
            },
            claim_lock: Arc::new(tokio::sync::RwLock::new(())),
            release_wanted: Arc::new(AtomicBool::new(false)),
            instance: self.instance,
            in_flight: Arc::default(),
            outage: self.outage.clone(),
            #[cfg(feature = "wal")]
            wal: None,
        }
    }

    /// Run on a task of its own. The handle stops it gracefully.
    pub fn spawn(self) -> RelayHandle {
        let cancel = CancellationToken::new();
        let publisher = self.publisher();
        let task = {
            let cancel = cancel.clone();
            crate::relay::spawn_here(async move { self.run(cancel).await })
        };
        RelayHandle {
            cancel,
            task,
            publisher,
        }
    }
}

/// A running relay.
pub struct RelayHandle {
    cancel: CancellationToken,
    task: JoinHandle<Result<RelayStats, RelayError>>,
    publisher: Arc<dyn Publisher>,
}

impl RelayHandle {
    /// The relay's publisher, to close once the relay has stopped ([`Relay::publisher`]).
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    /// The token that stops the relay (e.g. to tie it to the service's own shutdown).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stop gracefully and wait for the relay to finish.
    pub async fn shutdown(self) -> Result<RelayStats, RelayError> {
        self.cancel.cancel();
        self.join().await
    }

    /// Stop at once, releasing nothing, as a crash would: its leases and partitions run out by
    /// themselves. For tests and failure drills.
    pub fn abort(self) {
        self.task.abort();
    }

    /// Wait for the relay to stop by itself (drained, or an error).
    pub async fn join(self) -> Result<RelayStats, RelayError> {
        self.task
            .await
            .map_err(|e| RelayError::Join(e.to_string()))?
    }
}

/// Count a finished batch; a failed one (or a panicked task) becomes the loop's error.
fn absorb(
    joined: Result<Result<BatchReport, Error>, tokio::task::JoinError>,
    stats: &mut RelayStats,
) -> Result<(), Error> {
    match joined {
        Ok(Ok(report)) => {
            stats.add(&report);
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(Error::Task(e.to_string())),
    }
}

/// A task handle that aborts the task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// The task's result; `None` if it panicked or was aborted.
    async fn join(mut self) -> Option<T> {
        (&mut self.0).await.ok()
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
