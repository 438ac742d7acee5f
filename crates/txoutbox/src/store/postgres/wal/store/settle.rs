//! The settle of a batch read from the stream: one statement (`wal_settle.sql`) that marks
//! (or deletes) the published rows, records the failed ones and hands them to the table path,
//! hands over those held back, and writes into the table, handed off, the tableless events
//! that could not go out now (they have no row to hand over).

use sqlx::types::Json;
use sqlx::Row;
use uuid::Uuid;

use super::{StreamSettled, WalStore};
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::Failure;
use crate::OutboxEvent;

/// A tableless event the stream could not deliver now, to be written into the table as a
/// handed-off row (from which point it is retried, backed off, dead-lettered and ordered like
/// any handed-off event).
#[derive(Debug, Clone)]
pub struct TablelessHandoff {
    /// The event, as the message carried it.
    pub event: OutboxEvent,
    /// Its failed attempt (`dead` for content that does not decode); `None`: held back
    /// unattempted, with the settle's `why` as its last error.
    pub failure: Option<Failure>,
    /// Its position in the stream among the batch's handoffs (see [`StreamSettle::held_pos`]).
    pub pos: i64,
}

/// What one stream settle writes.
#[derive(Debug, Clone, Copy)]
pub struct StreamSettle<'a> {
    /// Events published: their rows marked published (or deleted).
    pub published: &'a [Uuid],
    /// Failed events with rows: recorded and handed to the table path.
    pub failed: &'a [Failure],
    /// Events with rows held back unattempted: handed over.
    pub held: &'a [Uuid],
    /// The stream position of each of `held` (increasing in stream order, shared with
    /// [`TablelessHandoff::pos`]): a held row that must go behind an earlier event of its
    /// aggregate is written again in this order.
    pub held_pos: &'a [i64],
    /// The last error of the events held back.
    pub why: &'a str,
    /// The batch's transactions (32-bit ids, as the stream gives them): nothing is written
    /// unless all are visible.
    pub xids: &'a [u32],
    /// Tableless events to write into the table, handed off.
    pub tableless: &'a [TablelessHandoff],
}

impl WalStore {
    /// Settle a batch read from the stream, in one statement: `published` marked published
    /// (or deleted), `failed` recorded and handed to the table path, `held` handed over
    /// unattempted with `why` as their last error; if every one of the batch's transactions
    /// (`xids`, as the stream gives them) is visible to the statement. `None` if one is not
    /// yet: nothing was written ([`WalStore::wait_visible`], then again). Empty `xids`
    /// settle without the check. ([`WalStore::settle_stream_with`] with no tableless events.)
    pub async fn settle_stream(
        &self,
        published: &[Uuid],
        failed: &[Failure],
        held: &[Uuid],
        why: &str,
        xids: &[u32],
    ) -> Result<Option<StreamSettled>, Error> {
        let held_pos: Vec<i64> = (0..held.len() as i64).collect();
        self.settle_stream_with(StreamSettle {
            published,
            failed,
            held,
            held_pos: &held_pos,
            why,
            xids,
            tableless: &[],
        })
        .await
    }

    /// Settle a batch read from the stream, tableless events and all (see [`StreamSettle`]).
    /// `None` if one of its transactions is not visible yet: nothing was written.
    pub async fn settle_stream_with(
        &self,
        p: StreamSettle<'_>,
    ) -> Result<Option<StreamSettled>, Error> {
        if p.published.is_empty()
            && p.failed.is_empty()
            && p.held.is_empty()
            && p.tableless.is_empty()
        {
            return Ok(Some(StreamSettled::default()));
        }
        let xids: Vec<i64> = p.xids.iter().map(|&x| i64::from(x)).collect();
        let ids: Vec<Uuid> = p.failed.iter().map(|f| f.id).collect();
        let errs: Vec<&str> = p.failed.iter().map(|f| f.error.as_str()).collect();
        let delays: Vec<i64> = p.failed.iter().map(|f| millis(f.retry_in)).collect();
        let dead: Vec<bool> = p.failed.iter().map(|f| f.dead).collect();
        let unavailable: Vec<bool> = p.failed.iter().map(|f| f.unavailable).collect();
        let t = Tableless::of(p.tableless, p.why);
        let row = sqlx::query(&self.q.settle)
            .bind(p.published)
            .bind(&ids)
            .bind(&errs)
            .bind(&delays)
            .bind(p.held)
            .bind(&dead)
            .bind(&unavailable)
            .bind(p.why)
            .bind(&xids)
            .bind(p.held_pos)
            .bind(&t.ids)
            .bind(&t.aggregate_types)
            .bind(&t.aggregate_ids)
            .bind(&t.event_types)
            .bind(&t.payloads)
            .bind(&t.payload_bytes)
            .bind(&t.content_types)
            .bind(&t.headers)
            .bind(&t.created_at)
            .bind(&t.attempts)
            .bind(&t.attempts_unavailable)
            .bind(&t.delays)
            .bind(&t.errors)
            .bind(&t.dead)
            .bind(&t.pos)
            .fetch_one(self.pool())
            .await
            .map_err(Error::Database)?;
        if !row.try_get::<bool, _>(3).map_err(Error::Database)? {
            return Ok(None);
        }
        let get = |i: usize| {
            row.try_get::<i64, _>(i)
                .map(|n| n.max(0) as u64)
                .map_err(Error::Database)
        };
        let settled = StreamSettled {
            published: get(0)?,
            failed: get(1)?,
            held: get(2)?,
            tableless: get(4)?,
        };
        if settled.failed + settled.held + settled.tableless > 0 {
            self.handed_off.notify_one();
        }
        Ok(Some(settled))
    }
}

/// The tableless handoffs as the statement's arrays.
struct Tableless<'a> {
    ids: Vec<Uuid>,
    aggregate_types: Vec<&'a str>,
    aggregate_ids: Vec<&'a str>,
    event_types: Vec<&'a str>,
    payloads: Vec<Json<&'a crate::JsonPayload>>,
    payload_bytes: Vec<Option<&'a [u8]>>,
    content_types: Vec<Option<&'a str>>,
    headers: Vec<Json<&'a std::collections::BTreeMap<String, String>>>,
    created_at: Vec<chrono::DateTime<chrono::Utc>>,
    attempts: Vec<i32>,
    attempts_unavailable: Vec<i32>,
    delays: Vec<i64>,
    errors: Vec<&'a str>,
    dead: Vec<bool>,
    pos: Vec<i64>,
}

impl<'a> Tableless<'a> {
    fn of(handoffs: &'a [TablelessHandoff], why: &'a str) -> Self {
        let n = handoffs.len();
        let mut t = Tableless {
            ids: Vec::with_capacity(n),
            aggregate_types: Vec::with_capacity(n),
            aggregate_ids: Vec::with_capacity(n),
            event_types: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            payload_bytes: Vec::with_capacity(n),
            content_types: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            created_at: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            attempts_unavailable: Vec::with_capacity(n),
            delays: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            dead: Vec::with_capacity(n),
            pos: Vec::with_capacity(n),
        };
        for h in handoffs {
            let e = &h.event;
            t.ids.push(e.id);
            t.aggregate_types.push(&e.aggregate_type);
            t.aggregate_ids.push(&e.aggregate_id);
            t.event_types.push(&e.event_type);
            t.payloads.push(Json(&e.payload));
            t.payload_bytes.push(e.payload_bytes.as_deref());
            t.content_types.push(e.content_type.as_deref());
            t.headers.push(Json(&e.headers));
            t.created_at.push(e.created_at);
            t.pos.push(h.pos);
            match &h.failure {
                Some(f) => {
                    t.attempts.push(1);
                    t.attempts_unavailable.push(i32::from(f.unavailable));
                    t.delays.push(millis(f.retry_in));
                    t.errors.push(&f.error);
                    t.dead.push(f.dead);
                }
                None => {
                    t.attempts.push(0);
                    t.attempts_unavailable.push(0);
                    t.delays.push(0);
                    t.errors.push(why);
                    t.dead.push(false);
                }
            }
        }
        t
    }
}
