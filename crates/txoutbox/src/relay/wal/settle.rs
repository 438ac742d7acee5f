//! The settle of published stream batches as a group commit ([`Settler`]), and what may be
//! confirmed after each group.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::committed::until_visible;
use super::HELD;
use crate::error::Error;
use crate::metrics as m;
use crate::relay::wal::reader::StreamReader;
use crate::relay::AbortOnDrop;
use crate::store::postgres::wal::{Lsn, StreamSettle, TablelessHandoff, WalStore};
use crate::store::Failure;

/// A published stream batch (or several, merged), to settle: then its position may be
/// confirmed.
pub(super) struct Published {
    pub(super) published: Vec<Uuid>,
    pub(super) failed: Vec<Failure>,
    pub(super) held: Vec<Uuid>,
    /// The stream position of each of `held` (see [`StreamSettle::held_pos`]).
    pub(super) held_pos: Vec<i64>,
    /// Tableless events to write into the table, handed off (failed, held back, undecodable).
    pub(super) tableless: Vec<TablelessHandoff>,
    /// Tableless events published: nothing to write for them, counted at the settle.
    pub(super) tableless_published: u64,
    /// Stream positions used (each of its events took one): a batch merged after it
    /// numbers on from here.
    pub(super) positions: i64,
    /// Its transactions: their rows must be visible before the settle can find them.
    pub(super) xids: Vec<u32>,
    /// The end of the longest prefix of its transactions whose every event this settles.
    pub(super) confirm: Option<Lsn>,
    /// Every one of its transactions is settled by it (`confirm` is the end of the last):
    /// a batch merged after it may move the position on.
    pub(super) whole: bool,
    /// The relay's metric labels, for the counts of the settle.
    pub(super) labels: crate::metrics::MetricLabels,
}

impl Published {
    /// Events (and handoffs) it settles.
    pub(super) fn len(&self) -> usize {
        self.published.len()
            + self.failed.len()
            + self.held.len()
            + self.tableless.len()
            + self.tableless_published as usize
    }

    /// Add `next`, published after it, to be settled in the same statement.
    pub(super) fn merge(&mut self, next: Published) {
        self.published.extend(next.published);
        self.failed.extend(next.failed);
        self.held.extend(next.held);
        let offset = self.positions;
        self.held_pos
            .extend(next.held_pos.into_iter().map(|p| p + offset));
        self.tableless
            .extend(next.tableless.into_iter().map(|mut h| {
                h.pos += offset;
                h
            }));
        self.tableless_published += next.tableless_published;
        self.positions += next.positions;
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
    pub(super) async fn settle(
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
            let p = StreamSettle {
                published: &self.published,
                failed: &self.failed,
                held: &self.held,
                held_pos: &self.held_pos,
                why: HELD,
                xids: &self.xids,
                tableless: &self.tableless,
            };
            if let Some(s) = wal.settle_stream_with(p).await? {
                break s;
            }
            invisible = true;
        };
        ::metrics::counter!(m::WAL_HANDED_OFF_TOTAL, self.labels.labels())
            .increment(settled.failed + settled.held + settled.tableless);
        ::metrics::counter!(m::PUBLISHED_TOTAL, self.labels.labels())
            .increment(settled.published + self.tableless_published);
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
pub(super) struct SettleDone {
    /// The position to confirm after it.
    pub(super) confirm: Option<Lsn>,
    /// It found a transaction not yet visible: the next group asks first.
    pub(super) ask_first: bool,
    /// It gave up waiting for its transactions' visibility (stopping): nothing after it may be
    /// confirmed.
    pub(super) gave_up: bool,
}

/// How many batches' worth of published events may wait for their settle before the stream
/// stops publishing more (and so how far the confirmed position may trail what is published).
pub(super) const MAX_QUEUED_BATCHES: usize = 16;

/// The settles of published stream batches, as a group commit: one settle runs at a time,
/// beside the publishing of the next batches; the batches published meanwhile queue up and
/// are settled together by the next one (one statement for all of them, which checks that
/// their transactions are visible; after a group that found one not yet visible, a cheap
/// query asks first). Each settle's position is confirmed once it is done, in order.
pub(super) struct Settler {
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
    pub(super) fn new(max_queued: usize, stop: CancellationToken) -> Self {
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
    pub(super) fn push(&mut self, mut p: Published) {
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
    pub(super) fn kick(&mut self, wal: &Arc<WalStore>) {
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
    pub(super) fn next_group(&mut self) -> Option<Published> {
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
    pub(super) fn is_full(&self) -> bool {
        self.queued
            .as_ref()
            .is_some_and(|q| q.len() >= self.max_queued)
    }

    /// The end of the running settle: the position to confirm. Never ends while none runs.
    /// Cancel-safe: dropped before it ends, the settle runs on.
    pub(super) async fn settled(&mut self) -> Result<Option<Lsn>, Error> {
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
    pub(super) async fn finish(
        &mut self,
        wal: &Arc<WalStore>,
        reader: &StreamReader,
    ) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u128, confirm: Option<u64>, whole: bool) -> Published {
        Published {
            published: vec![Uuid::from_u128(n)],
            failed: Vec::new(),
            held: Vec::new(),
            held_pos: Vec::new(),
            tableless: Vec::new(),
            tableless_published: 0,
            positions: 1,
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
