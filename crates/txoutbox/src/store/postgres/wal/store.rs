//! The database side of a WAL relay (`relay --source wal`): the slot it reads, the lock that
//! lets one relay read it at a time, the settle of a batch read from the stream, and the
//! table path, a [`Store`](crate::store::Store) over the events the stream handed to the table.
//!
//! The stream never claims a row: it reads committed inserts from the slot, publishes them,
//! and settles each batch in one statement before confirming the slot past it. An event it
//! cannot deliver now (its publish failed, or an earlier event of its aggregate waits in the
//! table) is handed to the table path (`handed_off_at`, migration 4), which retries it with
//! backoff and dead-letters it like the table relay, so a failing event never pins the slot's
//! WAL. While an aggregate has a handed-off event not yet published, the stream hands that
//! aggregate's later events over too, behind it: order holds across the two paths.

mod preflight;
mod settle;
mod slot;
mod table_path;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::Row;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use self::settle::{StreamSettle, TablelessHandoff};
use self::slot::drop_lost_slot;
pub use self::slot::SlotLock;
pub use self::table_path::TablePath;
use super::stream::ReplicationConfig;
use super::{
    advance, check_slot_name, default_slot, ensure_slot, peek, publication_name, slot_info, Lsn,
    TablelessGaps, WalError, WalTx,
};
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::postgres::queries::names;
use crate::store::postgres::PgStore;
use crate::store::sql::sql_file;
use crate::store::Retention;
use crate::OutboxTable;

/// How many times [`WalStore::wait_visible`] asks again at once before it sleeps between
/// tries.
const IMMEDIATE_TRIES: u32 = 3;

/// The oldest server the WAL source runs on (`server_version_num`): 14 brought the `binary` and
/// `messages` options of `pgoutput` that it reads the slot with.
const MIN_SERVER_VERSION: i32 = 140_000;

/// An aggregate: its type and id.
pub type AggregateKey = (String, String);

/// The statements of a WAL relay for one outbox table.
#[derive(Debug)]
pub(super) struct WalQueries {
    pub(super) settle: String,
    visible: String,
    pub(super) read_back: String,
    pub(super) hand_over: String,
    claim: String,
    due: String,
    unfinished: String,
    blocked: String,
    handoff_all: String,
    wait: String,
    wait_clear: String,
}

impl WalQueries {
    fn new(t: &OutboxTable, retention: Retention) -> Self {
        let published = match retention {
            Retention::Mark => sql_file!("postgres", "wal_published_mark"),
            Retention::Delete => sql_file!("postgres", "wal_published_delete"),
        };
        let f = names(t)
            .fragment("{{wal_published}}", published)
            .fragment("{{failed}}", sql_file!("postgres", "failed"))
            .fragment("{{failures}}", sql_file!("postgres", "failures"))
            .fragment("{{blocking}}", sql_file!("postgres", "blocking"));
        Self {
            settle: f.fill_with(
                sql_file!("postgres", "wal_settle"),
                &[
                    ("{{visible}}", sql_file!("postgres", "wal_visible")),
                    ("{{xids}}", "$9"),
                ],
            ),
            visible: f.fill_with(sql_file!("postgres", "wal_visible"), &[("{{xids}}", "$1")]),
            read_back: f.fill_with(
                sql_file!("postgres", "wal_read_back"),
                &[
                    ("{{visible}}", sql_file!("postgres", "wal_visible")),
                    ("{{xids}}", "$2"),
                ],
            ),
            hand_over: f.fill_with(
                sql_file!("postgres", "wal_hand_over"),
                &[
                    ("{{visible}}", sql_file!("postgres", "wal_visible")),
                    ("{{xids}}", "$4"),
                ],
            ),
            claim: f.fill(sql_file!("postgres", "wal_claim")),
            due: f.fill(sql_file!("postgres", "wal_due")),
            unfinished: f.fill(sql_file!("postgres", "wal_unfinished")),
            blocked: f.fill(sql_file!("postgres", "wal_blocked")),
            handoff_all: f.fill(sql_file!("postgres", "wal_handoff_all")),
            wait: f.fill(sql_file!("postgres", "wal_wait")),
            wait_clear: f.fill(sql_file!("postgres", "wait_clear")),
        }
    }
}

/// What opening the slot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The slot did not exist (first start, or it was dropped) and was created.
    pub created: bool,
    /// It existed but its WAL was gone (`wal_status = lost`): dropped and created again.
    pub recreated: bool,
    /// Events committed before the slot existed, handed to the table path.
    pub handed_off: u64,
    /// The slot was lost (while this store read it, or invalidated) before its reader
    /// confirmed past this stretch of WAL: its tableless events are gone (also recorded in
    /// [`WalStore::gaps`]).
    pub gap: Option<super::TablelessGap>,
}

/// What settling a stream batch changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSettled {
    /// Rows marked published (or deleted).
    pub published: u64,
    /// Failed events recorded and handed to the table path.
    pub failed: u64,
    /// Events handed over unattempted.
    pub held: u64,
    /// Tableless events written into the table (failed, held back, or undecodable).
    pub tableless: u64,
}

/// The WAL relay's database side for one outbox table and slot. Get it from
/// [`PgStore::wal`], and give it to the relay with
/// [`Relay::with_wal`](crate::relay::Relay::with_wal).
#[derive(Debug)]
pub struct WalStore {
    pub(super) store: PgStore,
    pub(super) q: WalQueries,
    /// The slot: chosen with [`WalStore::with_slot`], or named by [`WalStore::named`].
    slot: Option<String>,
    /// The replication connection's settings: `None` reads the slot through SQL.
    replication: Option<ReplicationConfig>,
    /// Fired when the stream hands events to the table path, which then looks at once.
    pub(super) handed_off: Arc<Notify>,
    /// The last position the slot was seen confirmed at (0: not seen): where a gap starts
    /// if the slot is lost.
    confirmed: AtomicU64,
    /// The gaps found: tableless events lost with a slot.
    gaps: TablelessGaps,
}

/// A copy on the same pool, table, retention, slot and replication settings (the store's
/// per-run state starts afresh).
impl Clone for WalStore {
    fn clone(&self) -> Self {
        let mut copy = Self::new(
            self.store.pool.clone(),
            self.store.table.clone(),
            self.store.retention,
            self.replication.clone(),
        );
        copy.slot.clone_from(&self.slot);
        copy.gaps = self.gaps.clone();
        copy
    }
}

impl WalStore {
    pub(crate) fn new(
        pool: sqlx::PgPool,
        table: OutboxTable,
        retention: Retention,
        replication: Option<ReplicationConfig>,
    ) -> Self {
        Self {
            q: WalQueries::new(&table, retention),
            slot: None,
            replication,
            store: PgStore::with_retention(pool, table, retention),
            handed_off: Arc::default(),
            confirmed: AtomicU64::new(0),
            gaps: TablelessGaps::default(),
        }
    }

    /// Read slot `slot` instead of the table's own ([`default_slot`]).
    pub fn with_slot(mut self, slot: &str) -> Result<Self, WalError> {
        check_slot_name(slot)?;
        self.slot = Some(slot.to_owned());
        Ok(self)
    }

    /// The slot's name, unless [`WalStore::with_slot`] chose one: the table's own in this
    /// database ([`default_slot`]: `txoutbox_<database>_<schema>_<table>`, or an older
    /// release's slot that exists in this database). Asks the server.
    pub async fn default_slot(&self) -> Result<String, Error> {
        match &self.slot {
            Some(s) => Ok(s.clone()),
            None => Ok(default_slot(self.pool(), self.table()).await?),
        }
    }

    /// The same store with its slot named ([`WalStore::default_slot`]): call it (or
    /// [`WalStore::with_slot`]) before anything that uses the slot.
    pub async fn named(self) -> Result<Self, Error> {
        let slot = self.default_slot().await?;
        Ok(self.with_slot(&slot)?)
    }

    /// The slot this relay reads (empty until named: [`WalStore::with_slot`],
    /// [`WalStore::named`]).
    pub fn slot(&self) -> &str {
        self.slot.as_deref().unwrap_or_default()
    }

    /// The replication connection's settings, if the slot is streamed (see
    /// [`PgStore::with_replication`]); `None`: read through SQL.
    pub fn replication(&self) -> Option<&ReplicationConfig> {
        self.replication.as_ref()
    }

    /// The settings of the next stream: `cfg`, at the pool's host now when it follows the
    /// pool ([`ReplicationConfig::follow_pool`]).
    pub fn stream_config(&self, cfg: &ReplicationConfig) -> ReplicationConfig {
        if cfg.follows_pool() {
            cfg.at_host_of(&self.pool().connect_options())
        } else {
            cfg.clone()
        }
    }

    /// The gaps this store's relay found (tableless events lost with a slot): a handle that
    /// sees every gap found later too, for readiness (see [`TablelessGaps`]).
    pub fn gaps(&self) -> TablelessGaps {
        self.gaps.clone()
    }

    /// Record the gaps this store's relay finds in `gaps` (shared with a readiness check that
    /// outlives the store, e.g. across the relay's restarts) instead of a record of its own.
    pub fn with_gaps(mut self, gaps: TablelessGaps) -> Self {
        self.gaps = gaps;
        self
    }

    /// Note that the slot was seen confirmed at `lsn` (by the relay's sampling, or its own
    /// confirmation): a gap, if the slot is lost, starts there.
    pub fn note_confirmed(&self, lsn: Lsn) {
        self.confirmed.fetch_max(lsn.0, AtomicOrdering::Relaxed);
    }

    /// The outbox table's publication, which the slot is read for.
    pub fn publication(&self) -> String {
        publication_name(self.table())
    }

    /// Write a marker into the WAL (a transactional logical message, in a transaction of its
    /// own) and return its position: once the stream has delivered a commit past it,
    /// everything committed before this call has been read.
    pub async fn mark_position(&self) -> Result<Lsn, Error> {
        let s: String =
            sqlx::query_scalar("SELECT pg_logical_emit_message(true, 'txoutbox', 'drain')::text")
                .fetch_one(self.pool())
                .await
                .map_err(Error::Database)?;
        Ok(s.parse().map_err(WalError::from)?)
    }

    /// The outbox table.
    pub fn table(&self) -> &OutboxTable {
        self.store.table()
    }

    /// The pool the statements run on.
    pub fn pool(&self) -> &sqlx::PgPool {
        self.store.pool()
    }

    /// Become the one relay that reads the slot: a session advisory lock on a connection of
    /// its own, held until the returned [`SlotLock`] is dropped. While another relay holds it,
    /// wait (a standby) and take over within about a second of its end. `None`: `cancel`
    /// fired while waiting.
    pub async fn lock(&self, cancel: &CancellationToken) -> Result<Option<SlotLock>, Error> {
        let key = self.lock_key();
        let mut conn: Option<PgConnection> = None;
        let mut said = false;
        let mut broken = 0u32;
        loop {
            // A connection that breaks while waiting (the server restarted, the link was
            // reset) is replaced: a standby waits on, as a table relay rides an outage out.
            let tried = async {
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => conn.insert(self.pool().acquire().await?.detach()),
                };
                sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
                    .bind(key)
                    .fetch_one(c)
                    .await
            };
            let got = match tried.await {
                Ok(got) => {
                    broken = 0;
                    got
                }
                Err(e) if crate::error::is_transient_sqlx(&e) => {
                    conn = None;
                    broken += 1;
                    let pause = Duration::from_millis(250 * u64::from(broken.min(8)));
                    tracing::warn!(slot = %self.slot(), error = %e, retry_in = ?pause,
                        "the slot lock's connection failed; trying again");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
                Err(e) => return Err(Error::Database(e)),
            };
            if got {
                let Some(conn) = conn else {
                    return Err(Error::Task("the slot lock's connection vanished".into()));
                };
                if said {
                    tracing::info!(slot = %self.slot(), "the other relay is gone; taking over the slot");
                }
                return Ok(Some(SlotLock { conn }));
            }
            if !said {
                tracing::info!(slot = %self.slot(),
                    "another relay reads this slot; waiting as a standby to take over when it stops");
                said = true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return Ok(None),
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// The advisory lock key of this slot's reader.
    fn lock_key(&self) -> i64 {
        super::reader_lock_key(self.slot())
    }

    /// The transaction advisory lock that ordered claims of the table path take turns on (one
    /// per table: every WAL relay of the table claims there, whichever slot it reads).
    pub(crate) fn table_path_lock_key(&self) -> i64 {
        crate::table::stable_hash(&format!(
            "txoutbox wal table path {}",
            self.table().qualified()
        )) as i64
    }

    /// Does a relay read the slot now (hold its reader lock, see [`WalStore::lock`])? Asked
    /// by any relay, standbys included.
    pub async fn reader_present(&self) -> Result<bool, Error> {
        Ok(super::reader_pid(self.pool(), self.slot()).await?.is_some())
    }

    /// Make sure the slot exists and can be read: create it when missing, drop and create it
    /// again when its WAL is gone. Whenever it is created, every unpublished event committed
    /// before is handed to the table path: nothing committed is left behind.
    pub async fn open_slot(&self) -> Result<Opened, Error> {
        let pool = self.pool();
        let mut opened = Opened {
            created: false,
            recreated: false,
            handed_off: 0,
            gap: None,
        };
        // Where the stretch of WAL a lost slot takes with it starts.
        let mut lost_from = None;
        match slot_info(pool, self.slot()).await? {
            Some(info) if info.wal_status.as_deref() == Some("lost") => {
                tracing::error!(slot = %self.slot(),
                    "replication slot lost its WAL (wal_status = lost, max_slot_wal_keep_size \
                     passed); creating it again and delivering from the table what it did not");
                lost_from = info.confirmed_flush_lsn.or(Some(self.confirmed_at()));
                drop_lost_slot(pool, self.slot()).await?;
                opened.recreated = true;
            }
            Some(info) if info.plugin.as_deref() != Some("pgoutput") => {
                return Err(WalError::Setup(format!(
                    "replication slot {} exists with output plugin {:?}, not pgoutput: drop it \
                     (txoutbox slot drop) or choose another with --slot",
                    self.slot(),
                    info.plugin.unwrap_or_default()
                ))
                .into());
            }
            Some(info) => {
                if let Some(lsn) = info.confirmed_flush_lsn {
                    self.note_confirmed(lsn);
                }
                return Ok(opened);
            }
            // Gone while this store read it (dropped under the relay): a gap from where it
            // was last seen confirmed. (A slot dropped while no relay ran looks like a first
            // start: see docs/wal.md.)
            None => {
                let seen = self.confirmed_at();
                if seen.0 > 0 {
                    lost_from = Some(seen);
                }
            }
        }
        opened.created = ensure_slot(pool, self.slot()).await? || opened.recreated;
        // After the slot exists: what commits from now on the stream delivers (a row both
        // streamed and handed over is delivered twice, never lost).
        let why = if opened.recreated {
            "the WAL source's slot lost its WAL and was created again: delivered from the table"
        } else {
            "committed before the WAL source's slot existed: delivered from the table"
        };
        let n: i64 = sqlx::query_scalar(&self.q.handoff_all)
            .bind(why)
            .fetch_one(pool)
            .await
            .map_err(Error::Database)?;
        opened.handed_off = n as u64;
        if n > 0 {
            self.handed_off.notify_one();
        }
        let start = slot_info(pool, self.slot())
            .await?
            .and_then(|i| i.confirmed_flush_lsn)
            .unwrap_or_default();
        self.confirmed.store(start.0, AtomicOrdering::Relaxed);
        if let Some(from) = lost_from {
            let gap = super::TablelessGap {
                slot: self.slot().to_owned(),
                from,
                to: start,
                found_at: chrono::Utc::now(),
            };
            self.gaps.push(gap.clone());
            opened.gap = Some(gap);
        }
        Ok(opened)
    }

    /// The server's WAL flush position now. Read before [`WalStore::read`]: once a read
    /// returns nothing new, everything committed before this position has been seen.
    pub async fn flush_lsn(&self) -> Result<Lsn, Error> {
        let s: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
            .fetch_one(self.pool())
            .await
            .map_err(Error::Database)?;
        Ok(s.parse().map_err(WalError::from)?)
    }

    /// The committed transactions after the slot's confirmed position, up to about
    /// `max_changes` changes (whole transactions).
    pub async fn read(&self, max_changes: usize) -> Result<Vec<WalTx>, Error> {
        let max = i32::try_from(max_changes).unwrap_or(i32::MAX);
        Ok(peek(self.pool(), self.table(), self.slot(), max).await?)
    }

    /// Confirm everything up to `lsn`.
    pub async fn confirm(&self, lsn: Lsn) -> Result<(), Error> {
        advance(self.pool(), self.slot(), lsn).await?;
        self.note_confirmed(lsn);
        Ok(())
    }

    /// The last position the slot was seen confirmed at (0/0: not seen).
    fn confirmed_at(&self) -> Lsn {
        Lsn(self.confirmed.load(AtomicOrdering::Relaxed))
    }

    /// End the server process that streams the slot now, if any: called by the relay that
    /// holds the slot's lock, for which any such process is its own earlier stream (a
    /// half-open connection the server has not noticed yet). True if one was ended.
    pub async fn end_stale_reader(&self) -> Result<bool, Error> {
        let ended: Option<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND database = current_database() \
               AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()",
        )
        .bind(self.slot())
        .fetch_optional(self.pool())
        .await
        .map_err(Error::Database)?;
        Ok(ended.unwrap_or(false))
    }

    /// Is the slot gone or unreadable (dropped, or `wal_status = lost`)? Asked after a read
    /// failed, to tell a lost slot from a passing error.
    pub async fn slot_lost(&self) -> Result<bool, Error> {
        Ok(match slot_info(self.pool(), self.slot()).await? {
            None => true,
            Some(info) => info.wal_status.as_deref() == Some("lost"),
        })
    }

    /// The aggregates among `keys` (all, with `None`) that wait in the table: a handed-off
    /// event of theirs is not yet published (with `hold`, a dead one counts).
    pub async fn blocked(
        &self,
        hold: bool,
        keys: Option<&[AggregateKey]>,
    ) -> Result<HashSet<AggregateKey>, Error> {
        let (types, ids): (Option<Vec<&str>>, Option<Vec<&str>>) = match keys {
            None => (None, None),
            Some(k) => (
                Some(k.iter().map(|(t, _)| t.as_str()).collect()),
                Some(k.iter().map(|(_, i)| i.as_str()).collect()),
            ),
        };
        let rows = sqlx::query(&self.q.blocked)
            .bind(hold)
            .bind(types)
            .bind(ids)
            .fetch_all(self.pool())
            .await
            .map_err(Error::Database)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::Database)
    }

    /// Are these transactions (32-bit ids, as the stream gives them) visible to a new
    /// snapshot now? One statement.
    pub async fn visible(&self, xids: &[u32]) -> Result<bool, Error> {
        if xids.is_empty() {
            return Ok(true);
        }
        let xids: Vec<i64> = xids.iter().map(|&x| i64::from(x)).collect();
        sqlx::query_scalar(&self.q.visible)
            .bind(&xids)
            .fetch_one(self.pool())
            .await
            .map_err(Error::Database)
    }

    /// Wait until the transactions `xids` (top-level ids, as the stream gives them) are
    /// visible to new snapshots. The server writes a commit to the WAL, where the stream can
    /// read it, a moment before other sessions see its rows: a settle that ran in that moment
    /// would find none of them and leave them pending for ever. Gives up after `max` (the
    /// rows may be gone for another reason, e.g. a batch delivered again after they were
    /// deleted): true if they became visible.
    pub async fn wait_visible(&self, xids: &[u32], max: Duration) -> Result<bool, Error> {
        if xids.is_empty() {
            return Ok(true);
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut tries = 0u32;
        loop {
            if self.visible(xids).await? {
                return Ok(true);
            }
            if started.elapsed() >= max {
                return Ok(false);
            }
            tries += 1;
            if tries <= IMMEDIATE_TRIES {
                // The moment is usually shorter than a round trip: ask again at once (a timer
                // would wait for its next millisecond tick).
                tokio::task::yield_now().await;
                continue;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Ask writers to notify this relay's channel on their next commit (for `ttl`), then
    /// [`WalStore::wait_notified`]; [`WalStore::clear_waiting`] after.
    pub async fn flag_waiting(&self, relay_id: &str, ttl: Duration) -> Result<(), Error> {
        let mut slot = self.store.listener.lock().await;
        self.store.listen(&mut slot).await?;
        if let Some(l) = slot.as_mut() {
            // Notifications from before the flag are stale: the read after it sees their rows.
            while l.next_buffered().is_some() {}
        }
        sqlx::query(&self.q.wait)
            .bind(relay_id)
            .bind(millis(ttl))
            .execute(self.pool())
            .await
            .map_err(Error::Database)?;
        Ok(())
    }

    /// Sleep until a writer's commit notifies, or `max`. True if notified.
    pub async fn wait_notified(&self, max: Duration) -> bool {
        let mut slot = self.store.listener.lock().await;
        let Some(l) = slot.as_mut() else {
            tokio::time::sleep(max).await;
            return false;
        };
        match tokio::time::timeout(max, l.recv()).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                *slot = None;
                false
            }
            Err(_) => false,
        }
    }

    /// Stop writers notifying for this relay.
    pub async fn clear_waiting(&self, relay_id: &str) -> Result<(), Error> {
        sqlx::query(&self.q.wait_clear)
            .bind(relay_id)
            .execute(self.pool())
            .await
            .map_err(Error::Database)?;
        Ok(())
    }

    /// The table path: a [`Store`](crate::store::Store) over the handed-off events, for the relay's claim ->
    /// publish -> settle loop.
    pub fn table_path(self: &Arc<Self>) -> TablePath {
        TablePath(self.clone())
    }
}
