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

mod committed;
mod poll;
mod publish;
mod reader;
mod settle;
mod slot;

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::source::{log_started, until_up, EventSource};
use super::{AbortOnDrop, Relay, RelayError, RelayStats};
use crate::error::Error;
use crate::metrics as m;
use crate::retry::Backoff;
use crate::store::postgres::wal::stream::ReplicationConfig;
use crate::store::postgres::wal::{AggregateKey, Lsn, WalStore, WalTx};
use crate::store::{Membership, Ordering, Store};
use crate::OutboxEvent;
use committed::AskTable;
use reader::StreamReader;
use settle::{Settler, MAX_QUEUED_BATCHES};
use slot::{report_gap, sample_slot, watch_lock};

/// While idle, confirm the slot up to the server's flush position at most this often (the
/// slot keeps WAL of other tables' transactions too until confirmed past them).
const IDLE_CONFIRM: Duration = Duration::from_secs(1);

/// With `exit_when_drained`, how often an idle stream looks whether it is done.
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// Why events held back by the stream were handed over.
const HELD: &str = "handed to the table by the WAL source: not due yet, or an earlier event \
                    of its aggregate waits there (failed, not due, or not acknowledged in time)";

/// The WAL source: its slot named and the server checked; registered as the slot's reader
/// on the table path (`wal:<slot>`, no partitions), which a table relay of the same table or
/// a WAL relay of another slot conflicts with.
pub(super) struct WalSource {
    wal: Arc<WalStore>,
}

impl WalSource {
    /// Name the slot (the table's own in this database unless `--slot` chose one) and check
    /// that the server can serve it, riding out a database outage. `None`: `cancel` fired
    /// meanwhile.
    pub(super) async fn open(
        relay: &Relay,
        cancel: &CancellationToken,
    ) -> Result<Option<Self>, RelayError> {
        let Some(wal) = relay.wal.clone() else {
            return Err(RelayError::Config(super::InvalidSetting {
                field: "source",
                rule: "wal needs the WAL reader of a PostgreSQL store: build the relay with \
                       Relay::with_wal(PgStore::wal()), or use the table source",
            }));
        };
        let wal = match &relay.config.slot {
            Some(slot) => wal.with_slot(slot).map_err(Error::from)?,
            None => wal,
        };
        let Some(slot) = until_up(cancel, "naming the slot", || wal.default_slot()).await? else {
            return Ok(None);
        };
        let wal = Arc::new(wal.with_slot(&slot).map_err(Error::from)?);
        let Some(warnings) = until_up(cancel, "checking the server", || wal.preflight()).await?
        else {
            return Ok(None);
        };
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        Ok(Some(Self { wal }))
    }
}

#[async_trait::async_trait]
impl EventSource for WalSource {
    fn name(&self) -> &'static str {
        "wal"
    }

    fn registry(&self) -> Arc<dyn Store> {
        Arc::new(self.wal.table_path())
    }

    fn waits_out_outages(&self) -> bool {
        true
    }

    /// Wait for the slot's lock (a standby), open the slot, and read it with the table path
    /// beside, until `stop`.
    async fn read(
        &self,
        relay: &Relay,
        _membership: &Membership,
        stop: &CancellationToken,
        stats: &mut RelayStats,
    ) -> Result<(), Error> {
        let (wal, cfg) = (&self.wal, &relay.config);
        // Sampled from the start: a standby reports the slot (and whether anyone reads it) too.
        let sampler = AbortOnDrop(crate::relay::spawn_here(sample_slot(
            wal.clone(),
            cfg.metric_labels.clone(),
        )));
        let Some(lock) = wal.lock(stop).await? else {
            return Ok(());
        };
        let Some(opened) = until_up(stop, "opening the slot", || wal.open_slot()).await? else {
            return Ok(());
        };
        log_started(
            relay,
            self.name(),
            None,
            Some((wal.slot(), opened.created, opened.handed_off)),
        );

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
        report_gap(&opened, &cfg.metric_labels);

        // The table path: the ordinary loop over the handed-off events.
        let table = relay.table_path(Arc::new(wal.table_path()));
        let retry = relay.retry();
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
            Some(rcfg) => relay.stream(wal, rcfg, &stop, stats, &retry).await,
            None => {
                tracing::info!(
                    slot = wal.slot(),
                    "no replication connection settings (PgStore::with_replication): reading \
                     the slot through SQL, polling"
                );
                relay.read_by_sql(wal, &stop, stats, &retry).await
            }
        };
        // The table path stops with the stream: on shutdown it settles what it has in flight.
        table_stop.cancel();
        let table_result = match table_task.join().await {
            Some((s, r)) => {
                *stats += s;
                r
            }
            None => Err(Error::Task("the WAL relay's table path panicked".into())),
        };
        drop(watcher);
        drop(sampler);
        if let Err(e) = wal.clear_waiting(&cfg.relay_id).await {
            tracing::debug!(error = %e, "could not clear the wait flag; it expires by itself");
        }
        if lock_lost.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unsupported(format!(
                "lost the connection that holds slot {}'s lock: stopped reading (a standby may \
                 read it now)",
                wal.slot()
            )));
        }
        result.and(table_result)
    }
}

impl Relay {
    /// Stream the slot over a replication connection: each transaction arrives as it
    /// commits; publish, settle and confirm batch after batch until `stop` (or, with
    /// `exit_when_drained`, until everything committed before the start is settled). A stream
    /// that breaks, or a batch that cannot be settled, starts a new stream from the confirmed
    /// position (what was not confirmed comes again: duplicates, nothing lost).
    async fn stream(
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
                wal.stream_config(&rcfg),
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
                report_gap(&opened, labels);
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
