//! The WAL source (`--source wal`): committed events read from PostgreSQL's logical
//! replication stream (or, without replication settings, through SQL), in commit order,
//! published, settled (streamed: several batches in one statement, as a group commit) and the
//! slot confirmed past them. Beside it runs the table path (the ordinary claim -> publish ->
//! settle loop over the events the stream handed to the table: failed ones retrying with
//! backoff, those held behind them, those committed before the slot existed).
//!
//! Guarantees, and what gives them:
//! - never a rolled-back event: logical decoding decodes committed transactions only;
//! - at least once: the slot is confirmed only past transactions whose every event is settled
//!   (published, or handed to the table in the same statement); after a crash the stream hands
//!   out again everything after the confirmed position;
//! - per-aggregate commit order: transactions come in commit order, an aggregate's events go
//!   one after the other, and an aggregate that has an event waiting in the table has its later
//!   events handed over behind it;
//! - one reader: a session advisory lock per slot; a standby waits on it and takes over when
//!   the reader's connection ends;
//! - a lost slot (dropped, `wal_status = lost`) is created again, and every event not yet
//!   published is handed to the table: duplicates possible, nothing lost.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::batch::cancel_deadline;
use super::wal_committed::{rows_now, until_visible, AskTable, Fate};
use super::wal_reader::StreamReader;
use super::{in_flight, AbortOnDrop, Relay, RelayError, RelayStats};
use crate::error::Error;
use crate::metrics as m;
use crate::retry::Backoff;
use crate::store::postgres::wal::stream::ReplicationConfig;
use crate::store::postgres::wal::{self, AggregateKey, Lsn, SlotLock, WalStore, WalTx};
use crate::store::{DeregisterParams, Failure, Ordering, Store};
use crate::OutboxEvent;

/// How often the reader checks that its slot lock's connection is up.
const LOCK_CHECK: Duration = Duration::from_secs(1);

/// While idle, confirm the slot up to the server's flush position at most this often (the
/// slot keeps WAL of other tables' transactions too until confirmed past them).
const IDLE_CONFIRM: Duration = Duration::from_secs(1);

/// How often the slot's lag, status and safe size are sampled into the metrics.
const SLOT_SAMPLE: Duration = Duration::from_secs(5);

/// With `exit_when_drained`, how often an idle stream looks whether it is done.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// Why events held back by the stream were handed over.
const HELD: &str = "handed to the table by the WAL source: not due yet, or an earlier event \
                    of its aggregate waits there (failed, not due, or not acknowledged in time)";

impl Relay {
    /// [`Relay::run`] with [`Source::Wal`](super::Source::Wal).
    pub(super) async fn run_wal(
        &self,
        cancel: CancellationToken,
    ) -> Result<RelayStats, RelayError> {
        let cfg = &self.config;
        let Some(wal) = self.store.wal() else {
            return Err(RelayError::Config(super::InvalidSetting {
                field: "source",
                rule: "wal needs PostgreSQL (15 or later); use --source table with this database",
            }));
        };
        let wal = match &cfg.slot {
            Some(slot) => wal.with_slot(slot).map_err(Error::from)?,
            None => wal,
        };
        // The slot's name: the table's own in this database unless --slot chose one.
        let Some(slot) = until_up(&cancel, "naming the slot", || wal.default_slot()).await? else {
            return Ok(RelayStats::default());
        };
        let wal = Arc::new(wal.with_slot(&slot).map_err(Error::from)?);
        let Some(warnings) = until_up(&cancel, "checking the server", || wal.preflight()).await?
        else {
            return Ok(RelayStats::default());
        };
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        // One source per table: registered as this slot's reader before anything is read (a
        // table relay of the table, or a WAL relay of another slot, refuses this relay now,
        // or itself later), and kept registered by a heartbeat, standbys too.
        let registry: Arc<dyn Store> = Arc::new(wal.table_path());
        let Some(membership) = until_up(&cancel, "registering the relay", || {
            super::rebalance(registry.as_ref(), cfg, self.instance, true)
        })
        .await?
        else {
            return Ok(RelayStats::default());
        };
        let heartbeat_stop = CancellationToken::new();
        // Stops on the caller's cancel, and when the heartbeat finds this relay must not run.
        let stop = cancel.child_token();
        let heartbeat = AbortOnDrop(crate::relay::spawn_here(super::heartbeat_loop(
            registry.clone(),
            Arc::default(),
            Arc::default(),
            cfg.clone(),
            self.instance,
            membership,
            heartbeat_stop.clone(),
            stop.clone(),
        )));
        let result = self.run_wal_registered(&wal, &stop).await;
        heartbeat_stop.cancel();
        let conflict = heartbeat.join().await.flatten();
        let leaving = DeregisterParams {
            relay_id: &cfg.relay_id,
            instance: self.instance,
        };
        if let Err(e) = registry.deregister(leaving).await {
            tracing::warn!(error = %e, "could not release leases on exit; they expire by themselves");
        }
        match conflict {
            Some(e) => Err(RelayError::Store(e)),
            None => result,
        }
    }

    /// [`Relay::run_wal`] once registered: wait for the slot's lock (a standby), open the
    /// slot, and read it with the table path beside, until `stop`.
    async fn run_wal_registered(
        &self,
        wal: &Arc<WalStore>,
        stop: &CancellationToken,
    ) -> Result<RelayStats, RelayError> {
        let cfg = &self.config;
        let mut stats = RelayStats::default();
        // Sampled from the start: a standby reports the slot (and whether anyone reads it) too.
        let sampler = AbortOnDrop(crate::relay::spawn_here(sample_slot(
            wal.clone(),
            cfg.metric_labels.clone(),
        )));
        let Some(lock) = wal.lock(stop).await? else {
            return Ok(stats);
        };
        let Some(opened) = until_up(stop, "opening the slot", || wal.open_slot()).await? else {
            return Ok(stats);
        };
        tracing::info!(relay_id = %cfg.relay_id, publisher = self.publisher.kind(),
            mode = cfg.ordering.mode_name(), source = "wal", slot = wal.slot(),
            created = opened.created, handed_to_table = opened.handed_off, "relay started");

        let stop = stop.child_token();
        let lock_lost = Arc::new(AtomicBool::new(false));
        let watcher = AbortOnDrop(crate::relay::spawn_here(watch_lock(
            lock,
            stop.clone(),
            lock_lost.clone(),
        )));
        ::metrics::counter!(m::WAL_HANDED_OFF_TOTAL, cfg.metric_labels.labels())
            .increment(opened.handed_off);
        if opened.recreated {
            ::metrics::counter!(m::WAL_SLOT_RECREATED_TOTAL, cfg.metric_labels.labels())
                .increment(1);
        }

        // The table path: the ordinary loop over the handed-off events.
        let table = Relay {
            store: Arc::new(wal.table_path()),
            publisher: self.publisher.clone(),
            config: super::RelayConfig {
                exit_when_drained: false,
                ..cfg.clone()
            },
            claim_lock: Arc::new(tokio::sync::RwLock::new(())),
            release_wanted: Arc::new(AtomicBool::new(false)),
            instance: self.instance,
            in_flight: Arc::<in_flight::InFlight>::default(),
            outage: self.outage.clone(),
        };
        let retry = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10).min(cfg.poll_interval.max(Duration::from_secs(1)) * 5),
            jitter: true,
        };
        let table_stop = CancellationToken::new();
        let table_task = {
            let (stop, retry) = (table_stop.clone(), retry);
            AbortOnDrop(crate::relay::spawn_here(async move {
                let mut s = RelayStats::default();
                let r = table.pipeline(&stop, &mut s, &retry).await;
                (s, r)
            }))
        };

        let result = match wal.replication().cloned() {
            Some(rcfg) => self.stream_live(wal, rcfg, &stop, &mut stats, &retry).await,
            None => {
                tracing::info!(
                    slot = wal.slot(),
                    "no replication connection settings (PgStore::with_replication): reading \
                     the slot through SQL, polling"
                );
                self.stream(wal, &stop, &mut stats, &retry).await
            }
        };
        // The table path stops with the stream: on shutdown it settles what it has in flight.
        table_stop.cancel();
        let table_result = match table_task.join().await {
            Some((s, r)) => {
                stats.batches += s.batches;
                stats.published += s.published;
                stats.failed += s.failed;
                stats.dead += s.dead;
                stats.released += s.released;
                r
            }
            None => Err(Error::Task("the WAL relay's table path panicked".into())),
        };
        drop(watcher);
        drop(sampler);
        if let Err(e) = wal.clear_waiting(&cfg.relay_id).await {
            tracing::debug!(error = %e, "could not clear the wait flag; it expires by itself");
        }
        if let Err(e) = self.publisher.close().await {
            tracing::warn!(error = %e, "publisher did not close cleanly");
        }
        tracing::info!(relay_id = %cfg.relay_id, published = stats.published, failed = stats.failed,
            dead = stats.dead, "relay stopped");
        if lock_lost.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RelayError::Store(Error::Unsupported(format!(
                "lost the connection that holds slot {}'s lock: stopped reading (a standby may \
                 read it now)",
                wal.slot()
            ))));
        }
        result
            .and(table_result)
            .map(|_| stats)
            .map_err(RelayError::Store)
    }

    /// Stream the slot over a replication connection: each transaction arrives as it
    /// commits; publish, settle and confirm batch after batch until `stop` (or, with
    /// `exit_when_drained`, until everything committed before the start is settled). A stream
    /// that breaks, or a batch that cannot be settled, starts a new stream from the confirmed
    /// position (what was not confirmed comes again: duplicates, nothing lost).
    async fn stream_live(
        &self,
        wal: &Arc<WalStore>,
        rcfg: ReplicationConfig,
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
        // With `exit_when_drained`: a marker written at the start; drained once the stream is
        // past it and the table path has nothing left.
        let mut target: Option<Lsn> = None;
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let prepared = async {
                if load_blocked {
                    blocked = wal.blocked(hold, None).await?;
                    load_blocked = false;
                }
                if cfg.exit_when_drained && target.is_none() {
                    target = Some(wal.mark_position().await?);
                }
                Ok::<_, Error>(())
            };
            if let Err(e) = prepared.await {
                self.backoff_after(e, &mut errors, retry, stop).await?;
                continue;
            }
            let mut reader = StreamReader::start(
                wal,
                rcfg.clone(),
                cfg.batch_size.max(16) * 2,
                cfg.max_in_flight_bytes,
            );
            let session = Session {
                wal,
                blocked: &mut blocked,
                ask: &mut ask,
                ordered,
                hold,
                target,
                errors: &mut errors,
            };
            match self.stream_session(session, &mut reader, stop, stats).await {
                Ok(()) => {
                    reader.close().await;
                    return Ok(());
                }
                Err(e) => {
                    drop(reader);
                    match self.after_read_error(wal, e).await {
                        // The slot was created again: what waits in the table changed.
                        Ok(recreated) => load_blocked |= recreated && ordered,
                        Err(e) => self.backoff_after(e, &mut errors, retry, stop).await?,
                    }
                }
            }
        }
    }

    /// One replication stream's life: batches until `stop`, drained (`Ok`), or an error
    /// (the stream broke, or a batch could not be settled).
    async fn stream_session(
        &self,
        s: Session<'_>,
        reader: &mut StreamReader,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<(), Error> {
        let cfg = &self.config;
        let mut settler = Settler::new(cfg.batch_size.max(64) * MAX_QUEUED_BATCHES, stop.clone());
        loop {
            let got = tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    // Bounded: a settle statement can wait for ever (its commit waiting for
                    // a synchronous standby that does not answer). What is not settled by
                    // then is not confirmed; dropping the settler aborts its settle, and the
                    // next stream delivers those transactions again.
                    let finished = tokio::time::timeout(
                        cfg.shutdown_timeout,
                        settler.finish(s.wal, reader),
                    )
                    .await;
                    match finished {
                        Ok(done) => done?,
                        Err(_) => tracing::warn!(timeout = ?cfg.shutdown_timeout,
                            "stopping: the last settles did not end in time; what they held \
                             is not confirmed, and the next stream delivers it again"),
                    }
                    return Ok(());
                }
                done = settler.settled() => {
                    if let Some(lsn) = done? {
                        reader.confirm(lsn);
                    }
                    // Published and settled: the stream works (a settle that keeps failing
                    // backs off further each time).
                    *s.errors = 0;
                    settler.kick(s.wal);
                    continue;
                }
                b = reader.batch(cfg.batch_size, cfg.max_batch_bytes), if !settler.is_full() => Some(b),
                _ = tokio::time::sleep(DRAIN_CHECK), if s.target.is_some() => None,
            };
            let txs = match got {
                Some(b) => b?,
                None => {
                    if drained(&s, &mut settler, reader, cfg.ordering).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            let started = Instant::now();
            if s.ordered {
                s.ask.check(s.wal, s.blocked, cfg.ordering).await?;
            }
            // A large transaction comes alone: everything before it settled, it goes to the
            // table path whole, and is confirmed.
            if let [large @ WalTx { large: Some(_), .. }] = txs.as_slice() {
                settler.finish(s.wal, reader).await?;
                if self.hand_over_large(s.wal, large, stop).await? {
                    reader.confirm(large.end_lsn);
                    if s.ordered {
                        s.ask.set();
                    }
                }
                continue;
            }
            // Whether an aggregate that waits in the table has caught up is asked of the
            // table: the handoffs before must be in it.
            if s.ordered && touches(s.blocked, &txs) {
                settler.finish(s.wal, reader).await?;
            }
            let published = self
                .publish_stream(
                    s.wal,
                    txs,
                    s.blocked,
                    s.ask.is_on(),
                    s.ordered,
                    s.hold,
                    stop,
                    stats,
                )
                .await?;
            // Settled at once if no settle runs (so a caught-up stream is confirmed while
            // idle), else with whatever else is published before that one ends.
            settler.push(published);
            settler.kick(s.wal);
            if reader.is_idle() {
                ::metrics::gauge!(m::WAL_LAG_SECONDS, cfg.metric_labels.labels()).set(0.0);
            }
            ::metrics::histogram!(m::BATCH_DURATION_SECONDS, cfg.metric_labels.labels())
                .record(started.elapsed().as_secs_f64());
            // Draining, and the stream is past the marker: done once it is all settled (asked
            // now, not after an idle DRAIN_CHECK).
            if s.target.is_some_and(|t| reader.position() >= t)
                && reader.is_idle()
                && drained(&s, &mut settler, reader, cfg.ordering).await?
            {
                return Ok(());
            }
        }
    }

    /// Read, publish, settle and confirm through SQL, batch after batch, until `stop` (or,
    /// with `exit_when_drained`, until the stream and the table path have nothing left).
    async fn stream(
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

    /// A read or confirm failed: if the slot is gone (dropped, or its WAL lost), create it again and
    /// hand what it did not deliver to the table (`Ok(true)`). `Ok(false)`: read again now.
    async fn after_read_error(&self, wal: &WalStore, e: Error) -> Result<bool, Error> {
        if e.sql_state().as_deref() == Some("55006") && wal.replication().is_some() {
            // object_in_use while this relay holds the slot's lock: the server still serves
            // this relay's own earlier stream (a half-open connection it has not noticed, for
            // up to its wal_sender_timeout). End it and stream again.
            match wal.end_stale_reader().await {
                Ok(true) => {
                    tracing::warn!(slot = wal.slot(), error = %e,
                        "ended this relay's own earlier stream, which the server still served; \
                         streaming again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Ok(false);
                }
                Ok(false) => {}
                Err(end) => tracing::warn!(error = %end, "could not end the earlier stream"),
            }
        }
        if e.is_transient() {
            return Err(e);
        }
        if e.sql_state().as_deref() == Some("55006") {
            // object_in_use: the slot is still held by a reader that just died (its last
            // statement runs on until the server notices), or by something else for a moment.
            tracing::info!(slot = wal.slot(), error = %e, "replication slot is in use; reading again shortly");
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Ok(false);
        }
        match wal.slot_lost().await {
            Ok(true) => {
                tracing::error!(slot = wal.slot(), error = %e,
                    "replication slot is gone; creating it again and delivering from the table \
                     what it did not");
                let opened = wal.open_slot().await?;
                tracing::info!(
                    slot = wal.slot(),
                    handed_to_table = opened.handed_off,
                    "replication slot created again"
                );
                let labels = &self.config.metric_labels;
                ::metrics::counter!(m::WAL_SLOT_RECREATED_TOTAL, labels.labels()).increment(1);
                ::metrics::counter!(m::WAL_HANDED_OFF_TOTAL, labels.labels())
                    .increment(opened.handed_off);
                Ok(true)
            }
            Ok(false) => Err(e),
            Err(check) => {
                tracing::warn!(error = %check, "could not look at the replication slot");
                Err(e)
            }
        }
    }

    /// Publish one batch of transactions and settle it (a large transaction in it goes to the
    /// table path whole, after what came before it is settled). Returns the position to
    /// confirm: the end of the last transaction of the longest prefix whose every event is
    /// settled (`None`: not even the first one, e.g. shutdown before its acknowledgements).
    #[allow(clippy::too_many_arguments)]
    async fn stream_batch(
        &self,
        wal: &WalStore,
        mut txs: Vec<WalTx>,
        blocked: &mut HashSet<AggregateKey>,
        ask: &mut AskTable,
        ordered: bool,
        hold: bool,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<Option<Lsn>, Error> {
        let mut confirm = None;
        while !txs.is_empty() {
            let large = txs.iter().position(|t| t.large.is_some());
            if large == Some(0) {
                let tx = txs.remove(0);
                if !self.hand_over_large(wal, &tx, stop).await? {
                    return Ok(confirm);
                }
                if ordered {
                    ask.set();
                }
                confirm = Some(tx.end_lsn);
                continue;
            }
            let rest = txs.split_off(large.unwrap_or(txs.len()));
            let end = txs.last().map(|t| t.end_lsn);
            let done = self
                .publish_stream(wal, txs, blocked, ask.is_on(), ordered, hold, stop, stats)
                .await?;
            // Read through SQL, a transaction is seldom this fresh: settle in one statement.
            let settled = done.settle(wal, false, stop).await?.confirm;
            confirm = settled.or(confirm);
            if settled != end {
                return Ok(confirm);
            }
            txs = rest;
        }
        Ok(confirm)
    }

    /// The first half of [`Relay::stream_batch`]: publish, and say how to settle. An
    /// aggregate in `blocked` whose handed-off events may have been published is looked up
    /// in the table: every earlier batch that touched it must be settled before this runs
    /// (the stream settles everything queued first when a batch touches `blocked`). The events are
    /// moved out of `txs` to be sent, not copied.
    #[allow(clippy::too_many_arguments)]
    async fn publish_stream(
        &self,
        wal: &WalStore,
        txs: Vec<WalTx>,
        blocked: &mut HashSet<AggregateKey>,
        ask_table: bool,
        ordered: bool,
        hold: bool,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<Published, Error> {
        let cfg = &self.config;
        // Aggregates that waited in the table may have caught up: ask for those of this batch
        // (all of them, with `ask_table`: the table may hold events of aggregates not known
        // here).
        if ordered && (ask_table || !blocked.is_empty()) {
            let mut keys: Vec<AggregateKey> = txs
                .iter()
                .flat_map(|t| &t.events)
                .map(|e| key(&e.event))
                .filter(|k| ask_table || blocked.contains(k))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            if !keys.is_empty() {
                let still = wal.blocked(hold, Some(&keys)).await?;
                for k in keys {
                    if still.contains(&k) {
                        blocked.insert(k);
                    } else {
                        blocked.remove(&k);
                    }
                }
            }
        }
        // What the settle and the confirmation need of the transactions, before their events
        // are moved out.
        let ends: Vec<Lsn> = txs.iter().map(|t| t.end_lsn).collect();
        let last_commit = txs.last().map(|t| t.commit_time);
        let mut xids: Vec<u32> = txs.iter().map(|t| t.xid).collect();
        xids.sort_unstable();
        xids.dedup();
        // What committed: the rows as the table holds them now.
        let Some(mut now) = rows_now(wal, &txs, &xids, stop).await? else {
            return Ok(Published {
                published: Vec::new(),
                failed: Vec::new(),
                held: Vec::new(),
                xids,
                confirm: None,
                whole: false,
                labels: cfg.metric_labels.clone(),
            });
        };
        let mut send: Vec<OutboxEvent> = Vec::new();
        // Per send: its transaction.
        let mut tx_of: Vec<usize> = Vec::new();
        let mut held: Vec<Uuid> = Vec::new();
        let mut failed: Vec<Failure> = Vec::new();
        let mut dead = 0usize;
        let mut claimed = 0usize;
        for (t, tx) in txs.into_iter().enumerate() {
            for we in tx.events {
                claimed += 1;
                let event = match Fate::of(&mut now, we.event.id, we.event.seq) {
                    Fate::Send(event) => event,
                    Fate::Skip { waits_in_table } => {
                        if let Some(k) = waits_in_table.filter(|_| ordered) {
                            blocked.insert(k);
                        }
                        continue;
                    }
                    Fate::NotDue(event) => {
                        // The table path publishes it when due. Its aggregate does not wait
                        // behind it, as with the table source (only a failed, leased or
                        // dead event holds its aggregate back).
                        held.push(event.id);
                        continue;
                    }
                    Fate::Undecodable(event, error) => {
                        // A value the relay cannot read: a dead letter, as a claimed row
                        // would be.
                        tracing::warn!(event_id = %event.id, error = %error,
                        "dead-lettering an event that does not decode");
                        ::metrics::counter!(
                            m::DEAD_LETTERED_TOTAL,
                            cfg.metric_labels
                                .and("event_type", event.event_type.clone())
                        )
                        .increment(1);
                        if hold {
                            blocked.insert(key(&event));
                        }
                        dead += 1;
                        failed.push(Failure {
                            id: event.id,
                            error,
                            retry_in: Duration::ZERO,
                            dead: true,
                            unavailable: false,
                        });
                        continue;
                    }
                };
                if ordered && !blocked.is_empty() && blocked.contains(&key(&event)) {
                    held.push(event.id);
                    continue;
                }
                send.push(event);
                tx_of.push(t);
            }
        }
        let deadline = Instant::now() + cfg.lease;
        let shutdown = cancel_deadline(stop, cfg.shutdown_timeout);
        let outcome = self.publish(&send, deadline, stop, shutdown).await;
        let stopping = stop.is_cancelled();
        // The first transaction that is not settled: it and those after are not confirmed.
        let mut unsettled = ends.len();
        let mut published = Vec::new();
        {
            let mut rng = rand::thread_rng();
            for ((event, result), &t) in send.iter().zip(outcome).zip(&tx_of) {
                match result {
                    Some(Ok(())) => {
                        self.count_published(event);
                        published.push(event.id);
                    }
                    Some(Err(e)) => {
                        let f = self.failure(event, &e, &mut rng);
                        dead += usize::from(f.dead);
                        if ordered && !(f.dead && cfg.ordering == Ordering::Ordered) {
                            blocked.insert(key(event));
                        }
                        failed.push(f);
                    }
                    // Not sent, or not acknowledged in time: while stopping, left to the
                    // stream (not confirmed); otherwise handed to the table path, which tries
                    // again (ordered: behind its aggregate's failed event).
                    None if stopping => unsettled = unsettled.min(t),
                    None => {
                        if ordered {
                            blocked.insert(key(event));
                        }
                        held.push(event.id);
                    }
                }
            }
        }
        if let Some(last) = last_commit {
            let behind = (chrono::Utc::now() - last).to_std().unwrap_or_default();
            ::metrics::gauge!(m::WAL_LAG_SECONDS, cfg.metric_labels.labels())
                .set(behind.as_secs_f64());
        }
        ::metrics::counter!(m::CLAIMED_TOTAL, cfg.metric_labels.labels()).increment(claimed as u64);
        stats.batches += 1;
        stats.published += published.len() as u64;
        stats.failed += failed.len() as u64;
        stats.dead += dead as u64;
        Ok(Published {
            published,
            failed,
            held,
            xids,
            confirm: match unsettled {
                0 => None,
                n => Some(ends[n - 1]),
            },
            whole: unsettled == ends.len(),
            labels: cfg.metric_labels.clone(),
        })
    }
}

/// A published stream batch (or several, merged), to settle: then its position may be
/// confirmed.
struct Published {
    published: Vec<Uuid>,
    failed: Vec<Failure>,
    held: Vec<Uuid>,
    /// Its transactions: their rows must be visible before the settle can find them.
    xids: Vec<u32>,
    /// The end of the longest prefix of its transactions whose every event this settles.
    confirm: Option<Lsn>,
    /// Every one of its transactions is settled by it (`confirm` is the end of the last):
    /// a batch merged after it may move the position on.
    whole: bool,
    /// The relay's metric labels, for the counts of the settle.
    labels: crate::metrics::MetricLabels,
}

impl Published {
    /// Events (and handoffs) it settles.
    fn len(&self) -> usize {
        self.published.len() + self.failed.len() + self.held.len()
    }

    /// Add `next`, published after it, to be settled in the same statement.
    fn merge(&mut self, next: Published) {
        self.published.extend(next.published);
        self.failed.extend(next.failed);
        self.held.extend(next.held);
        self.xids.extend(next.xids);
        self.xids.sort_unstable();
        self.xids.dedup();
        if self.whole {
            self.confirm = next.confirm.or(self.confirm);
            self.whole = next.whole;
        }
    }

    /// Settle in one statement, once its transactions are visible (the statement checks, and
    /// changes nothing if one is not yet); the position to confirm after. `ask_first`: the
    /// last group found a transaction not yet visible, so ask with a cheap query before the
    /// settle, and keep asking first while that happens (a stream that has caught up hands a
    /// transaction over within a moment of its commit, often before other sessions see it;
    /// one that catches up finds everything visible, and settles in one statement).
    /// While stopping, a group whose transactions do not become visible is left unsettled
    /// and unconfirmed (the next stream delivers it again), and says it gave up.
    async fn settle(
        self,
        wal: &WalStore,
        ask_first: bool,
        stop: &CancellationToken,
    ) -> Result<SettleDone, Error> {
        // Set once a transaction of the group was found not yet visible: wait, then settle.
        let mut invisible = ask_first && !wal.visible(&self.xids).await?;
        let settled = loop {
            if invisible && !self.until_visible(wal, stop).await? {
                return Ok(SettleDone {
                    confirm: None,
                    ask_first: true,
                    gave_up: true,
                });
            }
            if let Some(s) = wal
                .settle_stream(&self.published, &self.failed, &self.held, HELD, &self.xids)
                .await?
            {
                break s;
            }
            invisible = true;
        };
        ::metrics::counter!(m::WAL_HANDED_OFF_TOTAL, self.labels.labels())
            .increment(settled.failed + settled.held);
        ::metrics::counter!(m::PUBLISHED_TOTAL, self.labels.labels()).increment(settled.published);
        Ok(SettleDone {
            confirm: self.confirm,
            ask_first: invisible,
            gave_up: false,
        })
    }

    /// Wait until new snapshots see every transaction of the group (see
    /// [`until_visible`]). False: `stop` fired and they are still not visible.
    async fn until_visible(&self, wal: &WalStore, stop: &CancellationToken) -> Result<bool, Error> {
        until_visible(wal, &self.xids, stop).await
    }
}

/// What a settle of a group reports.
#[derive(Debug)]
struct SettleDone {
    /// The position to confirm after it.
    confirm: Option<Lsn>,
    /// It found a transaction not yet visible: the next group asks first.
    ask_first: bool,
    /// It gave up waiting for its transactions' visibility (stopping): nothing after it may be
    /// confirmed.
    gave_up: bool,
}

/// How many batches' worth of published events may wait for their settle before the stream
/// stops publishing more (and so how far the confirmed position may trail what is published).
const MAX_QUEUED_BATCHES: usize = 16;

/// The settles of published stream batches, as a group commit: one settle runs at a time,
/// beside the publishing of the next batches; the batches published meanwhile queue up and
/// are settled together by the next one (one statement for all of them, which checks that
/// their transactions are visible; after a group that found one not yet visible, a cheap
/// query asks first). Each settle's position is confirmed once it is done, in order.
struct Settler {
    running: Option<AbortOnDrop<Result<SettleDone, Error>>>,
    queued: Option<Published>,
    /// Past this many queued events the stream waits for the running settle.
    max_queued: usize,
    /// A group that settles only part of its transactions was started: nothing after it may
    /// be confirmed (its unsettled transactions come again on the next stream).
    stalled: bool,
    /// The last settle found a transaction not yet visible ([`Published::settle`]).
    ask_first: bool,
    /// The relay is stopping: a settle may give up waiting for visibility.
    stop: CancellationToken,
    /// A settle gave up (stopping): nothing after it may be confirmed.
    gave_up: bool,
}

impl Settler {
    fn new(max_queued: usize, stop: CancellationToken) -> Self {
        Self {
            running: None,
            queued: None,
            max_queued,
            stalled: false,
            ask_first: false,
            stop,
            gave_up: false,
        }
    }

    /// Queue `p` behind what is already queued.
    fn push(&mut self, mut p: Published) {
        if self.stalled {
            p.confirm = None;
            p.whole = false;
        }
        match &mut self.queued {
            Some(q) => q.merge(p),
            None => self.queued = Some(p),
        }
    }

    /// Start settling what is queued, unless a settle runs.
    fn kick(&mut self, wal: &Arc<WalStore>) {
        if self.running.is_some() {
            return;
        }
        if let Some(p) = self.next_group() {
            let wal = wal.clone();
            let (ask_first, stop) = (self.ask_first, self.stop.clone());
            self.running = Some(AbortOnDrop(crate::relay::spawn_here(async move {
                p.settle(&wal, ask_first, &stop).await
            })));
        }
    }

    /// What is queued, as the next group to settle.
    fn next_group(&mut self) -> Option<Published> {
        let mut p = self.queued.take()?;
        if self.gave_up {
            self.stalled = true;
            p.confirm = None;
            p.whole = false;
        }
        self.stalled |= !p.whole;
        Some(p)
    }

    /// Enough is queued: publish no more until the running settle ends.
    fn is_full(&self) -> bool {
        self.queued
            .as_ref()
            .is_some_and(|q| q.len() >= self.max_queued)
    }

    /// The end of the running settle: the position to confirm. Never ends while none runs.
    /// Cancel-safe: dropped before it ends, the settle runs on.
    async fn settled(&mut self) -> Result<Option<Lsn>, Error> {
        let Some(task) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let ended = (&mut task.0).await;
        self.running = None;
        let done = ended.map_err(|_| Error::Task("a WAL batch's settle panicked".into()))??;
        self.ask_first = done.ask_first;
        self.gave_up |= done.gave_up;
        Ok(done.confirm)
    }

    /// Settle everything published so far, and confirm it.
    async fn finish(&mut self, wal: &Arc<WalStore>, reader: &StreamReader) -> Result<(), Error> {
        loop {
            self.kick(wal);
            if self.running.is_none() {
                return Ok(());
            }
            if let Some(lsn) = self.settled().await? {
                reader.confirm(lsn);
            }
        }
    }
}

/// Run `step` until it succeeds or fails for good: a transient error (the database
/// restarting, a connection reset) is retried with backoff, as a table relay rides an outage
/// out. `None`: `cancel` fired meanwhile.
async fn until_up<T, F, Fut>(
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

/// What one replication stream's loop works with.
struct Session<'a> {
    wal: &'a Arc<WalStore>,
    blocked: &'a mut HashSet<AggregateKey>,
    /// Each batch asks the table which of its aggregates wait there (a large transaction
    /// was handed over).
    ask: &'a mut AskTable,
    ordered: bool,
    hold: bool,
    target: Option<Lsn>,
    errors: &'a mut u32,
}

/// Has one of `txs`' events an aggregate in `blocked`?
fn touches(blocked: &HashSet<AggregateKey>, txs: &[WalTx]) -> bool {
    !blocked.is_empty()
        && txs
            .iter()
            .flat_map(|t| &t.events)
            .any(|e| blocked.contains(&key(&e.event)))
}

/// With `exit_when_drained`: settle and confirm what was published, then say whether
/// everything committed before the drain began is settled: the stream is past the marker
/// and nothing is waiting, and the table path has nothing left.
async fn drained(
    s: &Session<'_>,
    settler: &mut Settler,
    reader: &StreamReader,
    ordering: Ordering,
) -> Result<bool, Error> {
    settler.finish(s.wal, reader).await?;
    Ok(s.target.is_some_and(|t| reader.position() >= t)
        && reader.is_idle()
        && !wal_unfinished(s.wal, ordering).await?)
}

/// Does the table path have events left (handed-off ones not yet settled)?
async fn wal_unfinished(wal: &Arc<WalStore>, ordering: Ordering) -> Result<bool, Error> {
    wal.table_path().has_unfinished(ordering).await
}

fn key(e: &OutboxEvent) -> AggregateKey {
    (e.aggregate_type.clone(), e.aggregate_id.clone())
}

/// Every few seconds: the slot's lag, status, confirmed position and safe size as gauges.
async fn sample_slot(wal: Arc<WalStore>, labels: crate::metrics::MetricLabels) {
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

/// Check the slot lock's connection every second; when it is gone, stop the relay (another
/// relay may take the slot over now).
async fn watch_lock(mut lock: SlotLock, stop: CancellationToken, lost: Arc<AtomicBool>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u128, confirm: Option<u64>, whole: bool) -> Published {
        Published {
            published: vec![Uuid::from_u128(n)],
            failed: Vec::new(),
            held: Vec::new(),
            xids: vec![n as u32, 1],
            confirm: confirm.map(Lsn),
            whole,
            labels: crate::metrics::MetricLabels::default(),
        }
    }

    #[test]
    fn a_group_of_whole_batches_confirms_the_last_ones_end() {
        let mut g = batch(1, Some(10), true);
        g.merge(batch(2, Some(20), true));
        g.merge(batch(3, Some(30), true));
        assert_eq!(g.confirm, Some(Lsn(30)));
        assert!(g.whole);
        assert_eq!(g.len(), 3);
        assert_eq!(
            g.xids,
            vec![1, 2, 3],
            "one visibility check per transaction"
        );
    }

    #[test]
    fn a_group_never_confirms_past_a_batch_settled_only_in_part() {
        // The second batch settles only its first transactions (shutdown before the rest
        // were acknowledged): nothing after it may be confirmed, whatever it settles.
        let mut g = batch(1, Some(10), true);
        g.merge(batch(2, Some(15), false));
        g.merge(batch(3, Some(30), true));
        assert_eq!(g.confirm, Some(Lsn(15)));
        assert!(!g.whole);

        let mut g = batch(1, Some(10), true);
        g.merge(batch(2, None, false));
        g.merge(batch(3, Some(30), true));
        assert_eq!(
            g.confirm,
            Some(Lsn(10)),
            "a batch with nothing settled keeps the position"
        );
    }

    #[test]
    fn nothing_after_a_group_settled_only_in_part_is_confirmed() {
        let mut s = Settler::new(100, CancellationToken::new());
        s.push(batch(1, Some(15), false));
        let first = s.next_group().expect("queued");
        assert_eq!(first.confirm, Some(Lsn(15)));
        // Pushed while that group settles: it would start a whole group of its own.
        s.push(batch(2, Some(30), true));
        let second = s.next_group().expect("queued");
        assert_eq!(second.confirm, None);
        assert!(!second.whole);
    }

    #[test]
    fn nothing_is_confirmed_after_a_settle_that_gave_up_waiting() {
        let mut s = Settler::new(100, CancellationToken::new());
        s.push(batch(1, Some(15), true));
        // Queued while a settle gives up on its transactions' visibility (stopping).
        s.gave_up = true;
        let next = s.next_group().expect("queued");
        assert_eq!(next.confirm, None);
        s.push(batch(2, Some(30), true));
        assert_eq!(s.next_group().expect("queued").confirm, None);
    }

    #[test]
    fn the_stream_waits_once_enough_is_queued() {
        let mut s = Settler::new(2, CancellationToken::new());
        s.push(batch(1, Some(10), true));
        assert!(!s.is_full());
        s.push(batch(2, Some(20), true));
        assert!(s.is_full());
        assert!(s.next_group().is_some());
        assert!(!s.is_full());
    }
}
