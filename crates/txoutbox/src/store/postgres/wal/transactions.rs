//! [`Transactions`]: a slot's `pgoutput` messages, fed in stream order, assembled into
//! committed transactions ([`WalTx`]) of the outbox table's events ([`WalEvent`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::pgoutput::{self, DecodeError, Lsn, Message, Relation};
use super::row::Layout;
use super::{tableless, SeqRanges, WalError, LARGE_TX_EVENTS};
use crate::{OutboxEvent, OutboxTable};

/// One committed transaction's outbox events, in the order it inserted them.
#[derive(Debug, Clone)]
pub struct WalTx {
    /// Its transaction id.
    pub xid: u32,
    /// The LSN of its commit record.
    pub commit_lsn: Lsn,
    /// The position just past it: confirm this once every one of its events is settled.
    pub end_lsn: Lsn,
    /// When it committed.
    pub commit_time: DateTime<Utc>,
    /// Its inserts into the outbox table and its tableless events, in the order it wrote
    /// them, each decoded or with what did not decode (only the tableless ones when it is
    /// [`large`](WalTx::large)).
    pub events: Vec<WalEvent>,
    /// Past the assembler's bound ([`LARGE_TX_EVENTS`]): the events of its rows were not
    /// kept, only the `seq`s of its inserts; it goes to the table path whole (its tableless
    /// events, which have no row, are kept in `events` and written into the table then).
    pub large: Option<SeqRanges>,
}

/// An insert, decoded.
#[derive(Debug, Clone)]
pub struct WalEvent {
    /// The event (placeholders where a column did not decode).
    pub event: OutboxEvent,
    /// One entry per column that did not decode, naming it; empty if the row decoded.
    pub problems: Vec<String>,
    /// A tableless event (a logical message, [`super::tableless`]): there is no row behind
    /// it, and its `seq` is 0.
    pub tableless: bool,
}

/// Turns a slot's `pgoutput` messages, fed in stream order, into committed transactions of
/// the outbox table's events. Inserts into other tables of the publication are skipped. It
/// holds at most [`LARGE_TX_EVENTS`] events of one transaction (see [`WalTx::large`]).
#[derive(Debug)]
pub struct Transactions {
    table: OutboxTable,
    /// The prefix of this outbox's tableless events.
    prefix: String,
    /// Events of one transaction held at most.
    bound: usize,
    /// Payload bytes of one transaction held at most.
    byte_bound: u64,
    /// Payload bytes of the open transaction's events held.
    open_bytes: u64,
    /// Per relation OID: how to read its rows (`None`: a table that is not the outbox).
    relations: HashMap<u32, Option<Layout>>,
    open: Option<WalTx>,
    /// The end of the last transaction that committed, outbox events or not.
    position: Lsn,
}

impl Transactions {
    /// An assembler for `table`'s events.
    pub fn new(table: OutboxTable) -> Self {
        Self {
            prefix: table.tableless_prefix(),
            table,
            bound: LARGE_TX_EVENTS,
            byte_bound: u64::MAX,
            open_bytes: 0,
            relations: HashMap::new(),
            open: None,
            position: Lsn(0),
        }
    }

    /// Hold at most `events` events of one transaction (instead of [`LARGE_TX_EVENTS`]).
    pub fn with_bound(mut self, events: usize) -> Self {
        self.bound = events.max(1);
        self
    }

    /// Hold at most `bytes` payload bytes of one transaction: past them, as past the event
    /// bound, only its `seq`s are kept (the relay's byte budget, so that a transaction of a
    /// few huge rows is bounded like one of many small ones).
    pub fn with_byte_bound(mut self, bytes: u64) -> Self {
        self.byte_bound = bytes.max(1);
        self
    }

    /// The end of the last transaction fed whole, whether it inserted outbox events or not
    /// (0/0 before the first).
    pub fn position(&self) -> Lsn {
        self.position
    }

    /// Is a transaction open: its Begin fed, its Commit not yet?
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Feed one message; at a Commit, the transaction it ends (`None` for a transaction that
    /// inserted no outbox events, and for every other message).
    pub fn feed(&mut self, data: &[u8]) -> Result<Option<WalTx>, WalError> {
        match pgoutput::decode(data)? {
            Message::Begin {
                final_lsn,
                commit_time,
                xid,
            } => {
                if let Some(open) = &self.open {
                    return Err(DecodeError(format!(
                        "Begin of xid {xid} inside xid {}, which did not commit",
                        open.xid
                    ))
                    .into());
                }
                self.open_bytes = 0;
                self.open = Some(WalTx {
                    xid,
                    commit_lsn: final_lsn,
                    end_lsn: final_lsn,
                    commit_time,
                    events: Vec::new(),
                    large: None,
                });
            }
            Message::Commit {
                commit_lsn,
                end_lsn,
                commit_time,
            } => {
                let Some(mut tx) = self.open.take() else {
                    return Err(DecodeError("Commit without a Begin".into()).into());
                };
                tx.commit_lsn = commit_lsn;
                tx.end_lsn = end_lsn;
                self.position = self.position.max(end_lsn);
                tx.commit_time = commit_time;
                return Ok((!tx.events.is_empty() || tx.large.is_some()).then_some(tx));
            }
            Message::Relation(rel) => {
                let layout = self.is_outbox(&rel).then(|| Layout::of(&rel));
                self.relations.insert(rel.oid, layout);
            }
            Message::Insert { oid, values } => {
                let layout = self.relations.get(&oid).ok_or_else(|| {
                    DecodeError(format!("Insert into relation {oid} before its Relation"))
                })?;
                if let Some(layout) = layout {
                    if self.open.is_none() {
                        return Err(DecodeError("Insert outside a transaction".into()).into());
                    }
                    let event = layout.read(&values)?;
                    self.add(event);
                }
            }
            Message::Message {
                transactional,
                lsn,
                prefix,
                content,
            } if prefix == self.prefix => {
                let Some(open) = self.open.as_ref().filter(|_| transactional) else {
                    // Emitted outside a transaction (`pg_logical_emit_message(false, ...)`):
                    // not an event, since it would not commit with a writer's rows.
                    tracing::warn!(%lsn, transactional, prefix,
                        "a non-transactional logical message with this outbox's prefix is not an \
                         event and is skipped: emit tableless events with <table>_emit or \
                         Outbox::emit (pg_logical_emit_message(true, ...))");
                    return Ok(None);
                };
                let commit_time = open.commit_time;
                let event = tableless::decode(content, lsn, commit_time);
                self.add(event);
            }
            Message::Message { .. } | Message::Skipped(_) => {}
        }
        Ok(None)
    }

    /// Add an event to the open transaction (fed inside one: checked by the caller). Past the
    /// bounds only the `seq`s of the table's rows are kept; a tableless event has no row to
    /// come back to, so it is kept whatever the bound (see [`WalTx::large`]).
    fn add(&mut self, event: WalEvent) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        match &mut open.large {
            Some(seqs) if !event.tableless => seqs.add(event.event.seq),
            Some(_) => open.events.push(event),
            None => {
                self.open_bytes += event.event.payload_len() as u64;
                open.events.push(event);
                if open.events.len() > self.bound || self.open_bytes > self.byte_bound {
                    let mut seqs = SeqRanges::default();
                    let (tableless, rows): (Vec<WalEvent>, Vec<WalEvent>) =
                        std::mem::take(&mut open.events)
                            .into_iter()
                            .partition(|e| e.tableless);
                    for e in rows {
                        seqs.add(e.event.seq);
                    }
                    open.events = tableless;
                    open.large = Some(seqs);
                }
            }
        }
    }

    fn is_outbox(&self, rel: &Relation) -> bool {
        rel.schema == self.table.schema().as_str() && rel.name == self.table.table().as_str()
    }
}
