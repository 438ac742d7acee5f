//! The WAL relay's stream reader: a task that owns the replication connection, turns the
//! slot's `pgoutput` messages into committed transactions, and hands them to the relay loop
//! through a bounded channel; the loop's confirmations go back to it through a watch.
//!
//! The task serves the connection the whole time, also while the channel is full (the relay
//! is behind, or waits out a broker): it answers keepalives and sends a status update at least
//! every few seconds, so the server never drops a slow reader for a missing reply.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::relay::AbortOnDrop;
use crate::store::postgres::wal::stream::{ReplicationConfig, ReplicationStream};
use crate::store::postgres::wal::{Lsn, Transactions, WalStore, WalTx};
use crate::OutboxTable;

/// While nothing is outstanding, confirm up to the server's position at most this often
/// (the slot keeps the WAL of other tables' transactions too until confirmed past them).
const IDLE_CONFIRM: Duration = Duration::from_secs(1);

/// While the channel is full, a status update this often keeps the connection alive.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long [`StreamReader::close`] waits for the task to confirm and end the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(8);

/// One replication stream from the slot, read by a task of its own.
pub(super) struct StreamReader {
    rx: mpsc::UnboundedReceiver<Result<WalTx, Error>>,
    /// What bounds the channel: permits for the events and the payload bytes waiting in it
    /// (see [`permits`]; a transaction larger than the bound takes all, and waits alone).
    room: Arc<Semaphore>,
    capacity: usize,
    bytes: u64,
    confirm: watch::Sender<Lsn>,
    position: watch::Receiver<Lsn>,
    close: CancellationToken,
    task: AbortOnDrop<()>,
    /// What was received but not taken into the last batch: a transaction that did not
    /// fit, or the error after the batch's last one.
    next: Option<Result<WalTx, Error>>,
}

impl StreamReader {
    /// Start streaming `wal`'s slot from its confirmed position; about `capacity` events and
    /// `bytes` payload bytes wait in the channel at most (memory stays bounded however large
    /// the backlog or its rows; a transaction of more than `bytes` is kept as its `seq`s
    /// only, see [`Transactions::with_byte_bound`]). A failure to connect comes out of
    /// [`StreamReader::batch`].
    pub(super) fn start(
        wal: &WalStore,
        cfg: ReplicationConfig,
        capacity: usize,
        bytes: u64,
    ) -> Self {
        let capacity = capacity.max(1);
        let bytes = bytes.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(room_units(capacity)));
        let (confirm, confirm_rx) = watch::channel(Lsn(0));
        let (position_tx, position) = watch::channel(Lsn(0));
        let close = CancellationToken::new();
        let task = Task {
            cfg,
            slot: wal.slot().to_owned(),
            publication: wal.publication(),
            table: wal.table().clone(),
            tx,
            room: room.clone(),
            capacity,
            bytes,
            confirm: confirm_rx,
            position: position_tx,
            close: close.clone(),
        };
        Self {
            rx,
            room,
            capacity,
            bytes,
            confirm,
            position,
            close,
            task: AbortOnDrop(crate::relay::spawn_here(task.run())),
            next: None,
        }
    }

    /// The next batch: whole transactions, at least one, about `max_events` events and
    /// `max_bytes` payload bytes in all (a transaction larger than that comes alone). Waits
    /// for the first. An error (the stream broke, or never started) ends this reader: start
    /// another. Cancel-safe.
    pub(super) async fn batch(
        &mut self,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<Vec<WalTx>, Error> {
        let first = match self.next.take() {
            Some(r) => r?,
            None => match self.rx.recv().await {
                Some(r) => self.taken(r)?,
                None => {
                    return Err(Error::Task(
                        "the WAL relay's stream reader stopped without saying why".into(),
                    ))
                }
            },
        };
        // A large transaction (handed to the table path whole) comes alone.
        if first.large.is_some() {
            return Ok(vec![first]);
        }
        let mut events = first.events.len();
        let mut bytes = payload_bytes(&first);
        let mut batch = vec![first];
        while events < max_events && bytes < max_bytes {
            match self.rx.try_recv().map(|r| self.taken(r)) {
                Ok(Ok(t))
                    if events + t.events.len() > max_events
                        || bytes + payload_bytes(&t) > max_bytes
                        || t.large.is_some() =>
                {
                    self.next = Some(Ok(t));
                    break;
                }
                Ok(Ok(t)) => {
                    events += t.events.len();
                    bytes += payload_bytes(&t);
                    batch.push(t);
                }
                // The error waits for the next call: this batch is good.
                Ok(Err(e)) => {
                    self.next = Some(Err(e));
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(batch)
    }

    /// A message out of the channel: its room is free again.
    fn taken(&self, r: Result<WalTx, Error>) -> Result<WalTx, Error> {
        if let Ok(t) = &r {
            self.room
                .add_permits(permits(t, self.capacity, self.bytes) as usize);
        }
        r
    }

    /// Is nothing waiting to be taken?
    pub(super) fn is_idle(&self) -> bool {
        self.next.is_none() && self.rx.is_empty()
    }

    /// The end of the last transaction the stream delivered whole (with outbox events or
    /// without): once past a position, everything committed before it has been handed out.
    pub(super) fn position(&self) -> Lsn {
        *self.position.borrow()
    }

    /// Confirm the slot up to `lsn` (sent by the task; a lower position changes nothing).
    pub(super) fn confirm(&self, lsn: Lsn) {
        self.confirm.send_if_modified(|l| {
            let newer = lsn > *l;
            *l = (*l).max(lsn);
            newer
        });
    }

    /// Send the last confirmation, end the stream, and wait (briefly) for the server to
    /// release the slot.
    pub(super) async fn close(self) {
        self.close.cancel();
        if tokio::time::timeout(CLOSE_WAIT, self.task.join())
            .await
            .is_err()
        {
            tracing::warn!("the replication stream did not end in time; dropping it");
        }
    }
}

struct Task {
    cfg: ReplicationConfig,
    slot: String,
    publication: String,
    table: OutboxTable,
    tx: mpsc::UnboundedSender<Result<WalTx, Error>>,
    room: Arc<Semaphore>,
    capacity: usize,
    bytes: u64,
    confirm: watch::Receiver<Lsn>,
    position: watch::Sender<Lsn>,
    close: CancellationToken,
}

/// Why the read loop ended without an error.
enum Ended {
    /// [`StreamReader::close`]: confirm and end the stream.
    Close,
    /// The reader was dropped: nobody listens.
    Dropped,
}

impl Task {
    async fn run(mut self) {
        let mut stream = match ReplicationStream::start(
            &self.cfg,
            &self.slot,
            &self.publication,
            Lsn(0),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = self.tx.send(Err(e.into()));
                return;
            }
        };
        tracing::debug!(slot = %self.slot, "replication stream started");
        match self.read(&mut stream).await {
            Ok(Ended::Close) => {
                let last = *self.confirm.borrow();
                let closed = async {
                    stream.confirm(last).await?;
                    stream.close().await
                };
                if let Err(e) = closed.await {
                    tracing::debug!(error = %e, "the replication stream did not end cleanly");
                }
            }
            Ok(Ended::Dropped) => {}
            Err(e) => {
                let _ = self.tx.send(Err(e));
            }
        }
    }

    async fn read(&mut self, stream: &mut ReplicationStream) -> Result<Ended, Error> {
        let mut asm = Transactions::new(self.table.clone()).with_byte_bound(self.bytes);
        // The end of the last transaction handed to the relay, and the relay's confirmation.
        let mut forwarded = Lsn(0);
        let mut acked = Lsn(0);
        let mut idle = tokio::time::interval(IDLE_CONFIRM);
        idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                biased;
                _ = self.close.cancelled() => return Ok(Ended::Close),
                changed = self.confirm.changed() => {
                    if changed.is_err() {
                        return Ok(Ended::Dropped);
                    }
                    let lsn = *self.confirm.borrow_and_update();
                    acked = acked.max(lsn);
                    stream.confirm(lsn).await?;
                }
                _ = idle.tick() => {
                    // Nothing outstanding: what the server sent since is other tables' WAL.
                    let server = stream.server_position();
                    if acked >= forwarded && !asm.in_transaction() && server > stream.confirmed() {
                        stream.confirm(server).await?;
                    }
                }
                m = stream.next() => {
                    let x = m?;
                    if let Some(t) = asm.feed(&x.data)? {
                        forwarded = t.end_lsn;
                        if let Some(ended) = self.forward(t, stream, &mut acked).await? {
                            return Ok(ended);
                        }
                    }
                    if !asm.in_transaction() {
                        self.position.send_if_modified(|p| {
                            let newer = asm.position() > *p;
                            *p = (*p).max(asm.position());
                            newer
                        });
                    }
                }
            }
        }
    }

    /// Hand `t` to the relay, waiting for room; meanwhile the connection is kept alive and
    /// the relay's confirmations go out.
    async fn forward(
        &mut self,
        t: WalTx,
        stream: &mut ReplicationStream,
        acked: &mut Lsn,
    ) -> Result<Option<Ended>, Error> {
        let n = permits(&t, self.capacity, self.bytes);
        // Room now (the usual case): no wait, and no timer. (A timer due "now" is due at the
        // timer's next millisecond tick: waiting for one per transaction held the stream to
        // about a thousand transactions a second.)
        match self.room.try_acquire_many(n) {
            Ok(p) => {
                p.forget();
                return Ok(self.tx.send(Ok(t)).is_err().then_some(Ended::Dropped));
            }
            Err(tokio::sync::TryAcquireError::Closed) => return Ok(Some(Ended::Dropped)),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        let room = self.room.clone();
        loop {
            tokio::select! {
                biased;
                _ = self.close.cancelled() => return Ok(Some(Ended::Close)),
                permit = room.acquire_many(n) => {
                    // Given back by the reader as it takes the transaction out.
                    match permit {
                        Ok(p) => p.forget(),
                        Err(_) => return Ok(Some(Ended::Dropped)),
                    }
                    return Ok(self.tx.send(Ok(t)).is_err().then_some(Ended::Dropped));
                }
                changed = self.confirm.changed() => {
                    if changed.is_err() {
                        return Ok(Some(Ended::Dropped));
                    }
                    let lsn = *self.confirm.borrow_and_update();
                    *acked = (*acked).max(lsn);
                    stream.confirm(lsn).await?;
                }
                _ = heartbeat.tick() => {
                    let same = stream.confirmed();
                    stream.confirm(same).await?;
                }
            }
        }
    }
}

/// The units of channel room an event takes: its payload takes its share of the rest.
const EVENT_UNITS: u128 = 1024;

/// The channel's room, in units: `capacity` events' worth.
fn room_units(capacity: usize) -> usize {
    usize::try_from(capacity as u128 * EVENT_UNITS)
        .unwrap_or(usize::MAX)
        .min(u32::MAX as usize)
}

/// The payload bytes of a transaction's events held.
fn payload_bytes(t: &WalTx) -> u64 {
    t.events.iter().map(|e| e.event.payload_len() as u64).sum()
}

/// The channel room a transaction takes, in units of [`room_units`]: [`EVENT_UNITS`] per
/// event plus its payload's share of the room (`bytes` of payload fill it all), so that the
/// channel holds at most `capacity` events and at most `bytes` payload bytes; at most all
/// of the room (and at least one unit).
fn permits(t: &WalTx, capacity: usize, bytes: u64) -> u32 {
    let room = room_units(capacity) as u128;
    let by_bytes = (payload_bytes(t) as u128 * room).div_ceil(u128::from(bytes.max(1)));
    let cost = (t.events.len() as u128 * EVENT_UNITS + by_bytes).clamp(1, room);
    u32::try_from(cost).unwrap_or(u32::MAX)
}
