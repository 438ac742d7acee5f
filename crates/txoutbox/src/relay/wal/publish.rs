//! One batch of streamed transactions: each event published or held back (handed to the
//! table: not due, undecodable, or behind an earlier event of its aggregate there), then
//! settled with what may be confirmed after it.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::committed::{rows_now, AskTable, Fate};
use super::key;
use super::settle::Published;
use crate::error::Error;
use crate::metrics as m;
use crate::relay::batch::cancel_deadline;
use crate::relay::{Relay, RelayStats};
use crate::store::postgres::wal::{AggregateKey, Lsn, TablelessHandoff, WalStore, WalTx};
use crate::store::undecodable::PREFIX;
use crate::store::{Failure, Ordering};
use crate::OutboxEvent;

impl Relay {
    /// Publish one batch of transactions and settle it (a large transaction in it goes to the
    /// table path whole, after what came before it is settled). Returns the position to
    /// confirm: the end of the last transaction of the longest prefix whose every event is
    /// settled (`None`: not even the first one, e.g. shutdown before its acknowledgements).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stream_batch(
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
    pub(super) async fn publish_stream(
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
                held_pos: Vec::new(),
                tableless: Vec::new(),
                tableless_published: 0,
                positions: 0,
                xids,
                confirm: None,
                whole: false,
                labels: cfg.metric_labels.clone(),
            });
        };
        let mut send: Vec<OutboxEvent> = Vec::new();
        // Per send: its transaction, its position in the stream, and whether it is tableless.
        let mut tx_of: Vec<usize> = Vec::new();
        let mut pos_of: Vec<i64> = Vec::new();
        let mut tableless_of: Vec<bool> = Vec::new();
        let mut held: Vec<Uuid> = Vec::new();
        let mut held_pos: Vec<i64> = Vec::new();
        let mut handoffs: Vec<TablelessHandoff> = Vec::new();
        let mut failed: Vec<Failure> = Vec::new();
        let mut dead = 0usize;
        let mut claimed = 0usize;
        for (t, tx) in txs.into_iter().enumerate() {
            for we in tx.events {
                let pos = claimed as i64;
                claimed += 1;
                let tableless = we.tableless;
                let fate = if tableless {
                    // No row behind it: the message is the event.
                    if we.problems.is_empty() {
                        Fate::Send(we.event)
                    } else {
                        let error = format!("{PREFIX}{}", we.problems.join("; "));
                        Fate::Undecodable(we.event, error)
                    }
                } else {
                    Fate::of(&mut now, we.event.id, we.event.seq)
                };
                let event = match fate {
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
                        held_pos.push(pos);
                        continue;
                    }
                    Fate::Undecodable(event, error) => {
                        // A value the relay cannot read: a dead letter, as a claimed row
                        // would be (a tableless one is written into the table as one).
                        tracing::warn!(event_id = %event.id, error = %error, tableless,
                            "dead-lettering an event that does not decode");
                        self.count_dead(&event);
                        if hold {
                            blocked.insert(key(&event));
                        }
                        dead += 1;
                        let f = Failure {
                            id: event.id,
                            error,
                            retry_in: Duration::ZERO,
                            dead: true,
                            unavailable: false,
                        };
                        if tableless {
                            handoffs.push(TablelessHandoff {
                                event,
                                failure: Some(f),
                                pos,
                            });
                        } else {
                            failed.push(f);
                        }
                        continue;
                    }
                };
                if ordered && !blocked.is_empty() && blocked.contains(&key(&event)) {
                    if tableless {
                        handoffs.push(TablelessHandoff {
                            event,
                            failure: None,
                            pos,
                        });
                    } else {
                        held.push(event.id);
                        held_pos.push(pos);
                    }
                    continue;
                }
                send.push(event);
                tx_of.push(t);
                pos_of.push(pos);
                tableless_of.push(tableless);
            }
        }
        let deadline = Instant::now() + cfg.lease;
        let shutdown = cancel_deadline(stop, cfg.shutdown_timeout);
        let outcome = self.publish(&send, deadline, stop, shutdown).await;
        let stopping = stop.is_cancelled();
        // The first transaction that is not settled: it and those after are not confirmed.
        let mut unsettled = ends.len();
        let mut published = Vec::new();
        let mut tableless_published = 0u64;
        {
            let mut rng = rand::thread_rng();
            let sent = send
                .iter()
                .zip(outcome)
                .zip(tx_of.iter().zip(pos_of).zip(tableless_of));
            for ((event, result), ((&t, pos), tableless)) in sent {
                match result {
                    Some(Ok(())) => {
                        self.count_published(event);
                        if tableless {
                            tableless_published += 1;
                        } else {
                            published.push(event.id);
                        }
                    }
                    Some(Err(e)) => {
                        let f = self.failure(event, &e, &mut rng);
                        dead += usize::from(f.dead);
                        if ordered && !(f.dead && cfg.ordering == Ordering::Ordered) {
                            blocked.insert(key(event));
                        }
                        if tableless {
                            handoffs.push(TablelessHandoff {
                                event: event.clone(),
                                failure: Some(f),
                                pos,
                            });
                        } else {
                            failed.push(f);
                        }
                    }
                    // Not sent, or not acknowledged in time: while stopping, left to the
                    // stream (not confirmed); otherwise handed to the table path, which tries
                    // again (ordered: behind its aggregate's failed event).
                    None if stopping => unsettled = unsettled.min(t),
                    None => {
                        if ordered {
                            blocked.insert(key(event));
                        }
                        if tableless {
                            handoffs.push(TablelessHandoff {
                                event: event.clone(),
                                failure: None,
                                pos,
                            });
                        } else {
                            held.push(event.id);
                            held_pos.push(pos);
                        }
                    }
                }
            }
        }
        // In stream order: the settle writes the handoffs in it.
        handoffs.sort_by_key(|h| h.pos);
        if let Some(last) = last_commit {
            let behind = (chrono::Utc::now() - last).to_std().unwrap_or_default();
            ::metrics::gauge!(m::WAL_LAG_SECONDS, cfg.metric_labels.labels())
                .set(behind.as_secs_f64());
        }
        ::metrics::counter!(m::CLAIMED_TOTAL, cfg.metric_labels.labels()).increment(claimed as u64);
        stats.batches += 1;
        stats.published += published.len() as u64;
        stats.failed +=
            (failed.len() + handoffs.iter().filter(|h| h.failure.is_some()).count()) as u64;
        stats.dead += dead as u64;
        Ok(Published {
            published,
            failed,
            held,
            held_pos,
            tableless: handoffs,
            tableless_published,
            positions: claimed as i64,
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
