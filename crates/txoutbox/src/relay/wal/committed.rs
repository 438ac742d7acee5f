//! The WAL relay publishes what committed, not what was inserted: the stream says which rows
//! each transaction inserted, in commit order; before a batch is published its rows are read
//! back from the table in one statement (its transactions visible) and each event is decided
//! on as the row is now ([`Fate::of`]). A transaction past the stream's bound is handed to the
//! table path whole ([`Relay::hand_over_large`]); while the table path holds events the stream
//! knows no key of, every batch asks the table which of its aggregates wait there
//! ([`AskTable`]), so per-aggregate order holds across the two paths.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::Error;
use crate::metrics as m;
use crate::relay::Relay;
use crate::store::postgres::wal::{
    AggregateKey, RowNow, RowsNow, StreamSettle, TablelessHandoff, WalStore, WalTx,
};
use crate::store::undecodable::PREFIX;
use crate::store::{Failure, Ordering, Store};
use crate::OutboxEvent;

/// How long a wait for transactions' visibility lasts before it warns, and warns again (a few
/// milliseconds at most, normally: the commit is in the WAL before the server has let go of
/// it).
const VISIBLE_WAIT: Duration = Duration::from_secs(5);

/// While the relay stops, how long a wait for visibility still lasts before it leaves the
/// transactions to the next stream.
const STOPPING_VISIBLE_WAIT: Duration = Duration::from_secs(1);

/// While [`AskTable`] is on, how often it asks whether the table path has caught up.
const CAUGHT_UP_CHECK: Duration = Duration::from_secs(1);

/// Why a large transaction's rows were handed over.
const LARGE: &str = "handed to the table by the WAL source: its transaction was larger than \
                     the stream holds (published from the table, in order)";

/// What becomes of one streamed event, given its row now.
#[derive(Debug)]
pub(super) enum Fate {
    /// Publish it, as the row is now.
    Send(OutboxEvent),
    /// Hand it to the table path unattempted: not due yet (the table path publishes it then).
    NotDue(OutboxEvent),
    /// Dead-letter it: the row does not decode (the last error says why).
    Undecodable(OutboxEvent, String),
    /// Leave it: the row is gone (deleted before or after its commit), was inserted again
    /// since, is published or dead already, or is the table path's.
    Skip {
        /// It is the table path's and still pending: its aggregate waits there.
        waits_in_table: Option<AggregateKey>,
    },
}

impl Fate {
    /// The fate of the event `id` inserted with `seq`, taken out of `now`.
    pub(super) fn of(now: &mut RowsNow, id: Uuid, seq: i64) -> Fate {
        let Some(RowNow {
            decoded,
            handed_off,
            not_due,
        }) = now.remove(&(id, seq))
        else {
            return Fate::Skip {
                waits_in_table: None,
            };
        };
        if handed_off {
            // Still pending (or, with `hold`, dead): later events of its aggregate go behind.
            let waits = decoded.event.processed_at.is_none();
            let key = (decoded.event.aggregate_type, decoded.event.aggregate_id);
            return Fate::Skip {
                waits_in_table: waits.then_some(key),
            };
        }
        let done = decoded.event.processed_at.is_some() || decoded.event.dead_at.is_some();
        if let Some(error) = decoded.last_error() {
            return Fate::Undecodable(decoded.event, error);
        }
        if done {
            return Fate::Skip {
                waits_in_table: None,
            };
        }
        if not_due {
            return Fate::NotDue(decoded.event);
        }
        Fate::Send(decoded.event)
    }
}

/// The rows of `txs`' events as the table holds them now, once their transactions are
/// visible. `None`: the relay is stopping and they did not become visible (leave them to the
/// next stream).
pub(super) async fn rows_now(
    wal: &WalStore,
    txs: &[WalTx],
    xids: &[u32],
    stop: &CancellationToken,
) -> Result<Option<RowsNow>, Error> {
    let ids: Vec<Uuid> = txs
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| !e.tableless)
        .map(|e| e.event.id)
        .collect();
    if ids.is_empty() {
        return Ok(Some(RowsNow::new()));
    }
    loop {
        if let Some(rows) = wal.read_back(&ids, xids).await? {
            return Ok(Some(rows));
        }
        if !until_visible(wal, xids, stop).await? {
            return Ok(None);
        }
    }
}

/// Wait until new snapshots see every transaction of `xids`, however long that takes: a
/// committed transaction becomes visible (with synchronous replication, only once the standby
/// has answered), and reading or settling its rows before would miss them. Warns every
/// [`VISIBLE_WAIT`] meanwhile. False: `stop` fired and they are still not visible.
pub(super) async fn until_visible(
    wal: &WalStore,
    xids: &[u32],
    stop: &CancellationToken,
) -> Result<bool, Error> {
    let started = Instant::now();
    loop {
        let stopping = stop.is_cancelled();
        let wait = if stopping {
            STOPPING_VISIBLE_WAIT
        } else {
            VISIBLE_WAIT
        };
        let visible = tokio::select! {
            v = wal.wait_visible(xids, wait) => v?,
            // Told to stop meanwhile: a last, short wait.
            _ = stop.cancelled(), if !stopping => {
                wal.wait_visible(xids, STOPPING_VISIBLE_WAIT).await?
            }
        };
        if visible {
            return Ok(true);
        }
        if stop.is_cancelled() {
            tracing::warn!(
                ?xids,
                "stopping while streamed transactions are still not \
                visible: left unsettled and unconfirmed (the next stream delivers them again)"
            );
            return Ok(false);
        }
        tracing::warn!(?xids, waited = ?started.elapsed(),
            "streamed transactions are committed in the WAL but not yet visible to other \
             sessions (a synchronous standby not answering?); their publishing waits");
    }
}

impl Relay {
    /// Hand `tx`, a transaction past the stream's bound, to the table path whole (every row
    /// of it still pending), once it is visible. Everything streamed before it must be settled
    /// first. False: stopping before it became visible (nothing handed over; do not confirm).
    pub(super) async fn hand_over_large(
        &self,
        wal: &WalStore,
        tx: &WalTx,
        stop: &CancellationToken,
    ) -> Result<bool, Error> {
        let Some(seqs) = &tx.large else {
            return Ok(true);
        };
        loop {
            if let Some(n) = wal.hand_over(seqs.ranges(), tx.xid, LARGE).await? {
                let n = n + self.write_tableless(wal, tx, stop).await?;
                tracing::info!(
                    xid = tx.xid,
                    events = seqs.events(),
                    handed_to_table = n,
                    "a transaction larger than the stream holds was handed to the table path"
                );
                ::metrics::counter!(m::WAL_HANDED_OFF_TOTAL, self.config.metric_labels.labels())
                    .increment(n);
                return Ok(true);
            }
            if !until_visible(wal, &[tx.xid], stop).await? {
                return Ok(false);
            }
        }
    }
}

impl Relay {
    /// Write the tableless events of `tx`, a transaction past the stream's bound, into the
    /// table, handed off (they have no rows to hand over by `seq`): after its rows, whatever
    /// order the transaction wrote them in. How many were written (a settle of the same
    /// transaction before a restart may have written them already).
    async fn write_tableless(
        &self,
        wal: &WalStore,
        tx: &WalTx,
        stop: &CancellationToken,
    ) -> Result<u64, Error> {
        let tableless: Vec<TablelessHandoff> = tx
            .events
            .iter()
            .filter(|e| e.tableless)
            .enumerate()
            .map(|(i, e)| TablelessHandoff {
                event: e.event.clone(),
                failure: (!e.problems.is_empty()).then(|| Failure {
                    id: e.event.id,
                    error: format!("{PREFIX}{}", e.problems.join("; ")),
                    retry_in: Duration::ZERO,
                    dead: true,
                    unavailable: false,
                }),
                pos: i as i64,
            })
            .collect();
        if tableless.is_empty() {
            return Ok(0);
        }
        let p = StreamSettle {
            published: &[],
            failed: &[],
            held: &[],
            held_pos: &[],
            why: LARGE,
            xids: &[tx.xid],
            tableless: &tableless,
        };
        loop {
            if let Some(s) = wal.settle_stream_with(p).await? {
                return Ok(s.tableless);
            }
            if !until_visible(wal, &[tx.xid], stop).await? {
                return Ok(0);
            }
        }
    }
}

/// Whether each batch asks the table which of its aggregates wait there: on while the table
/// path may hold events of aggregates the stream does not know (a large transaction handed
/// over), until the table path has caught up.
#[derive(Debug, Default)]
pub(super) struct AskTable {
    on: bool,
    checked: Option<Instant>,
}

impl AskTable {
    /// Ask from now on, until the table path has caught up.
    pub(super) fn set(&mut self) {
        self.on = true;
        self.checked = Some(Instant::now());
    }

    /// Is it on?
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// At most once a [`CAUGHT_UP_CHECK`] while on: has the table path caught up? Then what
    /// still waits there (with `hold`, behind dead letters) joins `blocked`, and it turns off.
    pub(super) async fn check(
        &mut self,
        wal: &Arc<WalStore>,
        blocked: &mut HashSet<AggregateKey>,
        ordering: Ordering,
    ) -> Result<(), Error> {
        if !self.on || self.checked.is_some_and(|t| t.elapsed() < CAUGHT_UP_CHECK) {
            return Ok(());
        }
        self.checked = Some(Instant::now());
        if !wal.table_path().has_unfinished(ordering).await? {
            blocked.extend(wal.blocked(ordering == Ordering::OrderedHold, None).await?);
            self.on = false;
        }
        Ok(())
    }
}
