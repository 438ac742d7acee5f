//! What the stream's transactions committed, as the table holds it: the stream says which rows
//! a transaction inserted, in commit order; before publishing, the relay reads those rows back
//! by id in one statement (once their transactions are visible) and publishes what the table
//! holds now. So a row deleted before its commit is not published, one updated before it (or
//! by an upsert, a trigger, an operator, before it went out) goes out as it is now, and one
//! inserted published, dead or not yet due keeps its state, as with the table source.
//!
//! A transaction past [`super::LARGE_TX_EVENTS`] is not held at all: its rows are handed to the
//! table path by `seq` once it committed ([`WalStore::hand_over`]).

use std::collections::HashMap;

use sqlx::Row;
use uuid::Uuid;

use super::WalStore;
use crate::error::Error;
use crate::store::postgres::decode::decode_row;
use crate::store::undecodable::Decoded;

/// At most this many `seq`s per hand-over statement: a transaction of millions of rows is
/// handed over in steps (each idempotent), not in one statement that holds them all.
const HAND_OVER_STEP: i64 = 50_000;

/// An event's row as the table holds it now.
#[derive(Debug)]
pub(crate) struct RowNow {
    /// The row (what did not decode, noted).
    pub decoded: Decoded,
    /// It is the table path's already (handed over).
    pub handed_off: bool,
    /// Its `available_at` is still to come.
    pub not_due: bool,
}

/// Rows read back, by id and `seq` (an insert whose row now has another `seq` is not that
/// row's: it was deleted and inserted again, and the later insert is the one to publish).
pub(crate) type RowsNow = HashMap<(Uuid, i64), RowNow>;

impl WalStore {
    /// The rows `ids` as the table holds them now, in one statement, if every one of their
    /// transactions (`xids`, as the stream gives them) is visible to it; `None` if one is not
    /// yet ([`WalStore::wait_visible`], then again). A row that is gone is not in the map.
    pub(crate) async fn read_back(
        &self,
        ids: &[Uuid],
        xids: &[u32],
    ) -> Result<Option<RowsNow>, Error> {
        let xids: Vec<i64> = xids.iter().map(|&x| i64::from(x)).collect();
        let rows = sqlx::query(&self.q.read_back)
            .bind(ids)
            .bind(&xids)
            .fetch_all(self.pool())
            .await
            .map_err(Error::Database)?;
        let mut out = RowsNow::with_capacity(rows.len());
        for r in &rows {
            if !r.try_get::<bool, _>("visible").map_err(Error::Database)? {
                return Ok(None);
            }
            if r.try_get::<Option<Uuid>, _>("id")
                .map_err(Error::Database)?
                .is_none()
            {
                continue;
            }
            let decoded = decode_row(r)?;
            let handed_off = r.try_get("handed_off").map_err(Error::Database)?;
            let not_due = r
                .try_get::<Option<bool>, _>("not_due")
                .map_err(Error::Database)?
                .unwrap_or(false);
            out.insert(
                (decoded.event.id, decoded.event.seq),
                RowNow {
                    decoded,
                    handed_off,
                    not_due,
                },
            );
        }
        Ok(Some(out))
    }

    /// Hand the rows of transaction `xid`, by their `seq` ranges (inclusive), to the table
    /// path, with `why` as their last error: those still pending and not handed over yet. The
    /// stream must have settled everything committed before it (see `wal_hand_over.sql`).
    /// `None`: the transaction is not visible yet, nothing was changed. How many rows, else.
    pub(crate) async fn hand_over(
        &self,
        ranges: &[(i64, i64)],
        xid: u32,
        why: &str,
    ) -> Result<Option<u64>, Error> {
        let xids = [i64::from(xid)];
        let mut handed = 0u64;
        for &(lo, hi) in ranges {
            let mut from = lo;
            loop {
                let to = from.saturating_add(HAND_OVER_STEP - 1).min(hi);
                let row = sqlx::query(&self.q.hand_over)
                    .bind(vec![from])
                    .bind(vec![to])
                    .bind(why)
                    .bind(xids.to_vec())
                    .fetch_one(self.pool())
                    .await
                    .map_err(Error::Database)?;
                if !row.try_get::<bool, _>(1).map_err(Error::Database)? {
                    return Ok(None);
                }
                handed += row.try_get::<i64, _>(0).map_err(Error::Database)? as u64;
                if to >= hi {
                    break;
                }
                from = to + 1;
            }
        }
        if handed > 0 {
            self.handed_off.notify_one();
        }
        Ok(Some(handed))
    }
}
