//! The WAL source's database side: committed outbox inserts read from PostgreSQL's logical
//! decoding (`pgoutput`), in commit order, whole transactions at a time.
//!
//! What is here: the outbox's publication and replication slot (named for the table, created
//! idempotently, listed with their lag, dropped), the `pgoutput` decoder ([`pgoutput`]), and
//! [`Transactions`], which turns the decoded messages into committed transactions of
//! [`OutboxEvent`](crate::OutboxEvent)s. [`peek`] and [`advance`] read and confirm through plain SQL
//! (`pg_logical_slot_peek_binary_changes`, `pg_replication_slot_advance`) on an ordinary
//! connection, TLS and all; [`stream`] reads the same slot over the streaming replication
//! protocol instead, the server pushing each transaction as it commits. The relay's
//! `--source wal` (the confirmed position behind the settled transactions) builds on these.
//!
//! The guarantees come from PostgreSQL: a transaction is decoded only once it committed (a
//! rolled-back one never is), transactions come in commit order, and a slot hands out again
//! everything after the position it last confirmed.
//!
//! Needs `wal_level = logical` (a server restart) and a free replication slot; the role needs
//! the `REPLICATION` attribute (or to be a superuser) for slots.

mod committed;
mod config;
mod gap;
mod large;
pub mod pgoutput;
#[cfg(test)]
mod props;
mod row;
mod store;
pub mod stream;
pub mod tableless;
mod transactions;
mod write_path;

use sqlx::{PgPool, Row};

pub(crate) use self::committed::{RowNow, RowsNow};
pub use self::gap::{TablelessGap, TablelessGaps};
pub use self::large::{SeqRanges, LARGE_TX_EVENTS};
pub use self::pgoutput::{DecodeError, Lsn};
pub use self::store::{
    AggregateKey, Opened, SlotLock, StreamSettle, StreamSettled, TablePath, TablelessHandoff,
    WalStore,
};
pub use self::transactions::{Transactions, WalEvent, WalTx};
pub use self::write_path::{set_write_path, write_path, WritePath, WritePathState};
use crate::OutboxTable;

/// What went wrong reading the WAL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A message that does not follow the `pgoutput` format.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The server is not set up for the WAL source; the message names the fix.
    #[error("{0}")]
    Setup(String),
    /// A statement failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The replication connection's settings (its URL) are wrong; the message names the
    /// parameter, never the password.
    #[error("replication connection settings: {0}")]
    Config(String),
    /// The replication connection failed or broke: the network, TLS, or a server that does
    /// not speak the protocol as expected.
    #[error("replication connection to {peer}: {what}{}", source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Connection {
        /// `host:port`.
        peer: String,
        /// What failed.
        what: String,
        /// The I/O error, if one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A replication slot of that name exists, but not in this database: slot names are the
    /// server's, shared by all its databases.
    #[error("replication slot {slot} belongs to {}, not to this database ({current}): slot names are shared by every database of the server; leave --slot unset (the default slot's name carries the database) or choose a name of this database's own", database.as_deref().map_or_else(|| "no database (a physical slot)".to_owned(), |d| format!("database {d}")))]
    SlotElsewhere {
        /// The slot's name.
        slot: String,
        /// Its database (`None`: a physical slot).
        database: Option<String>,
        /// This connection's database.
        current: String,
    },
    /// The server refused (an ErrorResponse on the replication connection): its SQLSTATE and
    /// message; the error's text adds the usual fix.
    #[error("{}", server_error_text(code, message))]
    Server {
        /// The SQLSTATE, like `42501`.
        code: String,
        /// The server's message (with its detail and hint).
        message: String,
    },
}

impl WalError {
    /// Is this worth retrying: a connection that broke, a server shutting down or starting,
    /// no free connection, a slot still held by a client that went away.
    pub fn is_transient(&self) -> bool {
        match self {
            WalError::Database(e) => crate::error::is_transient_sqlx(e),
            WalError::Connection { .. } => true,
            WalError::Server { code, .. } => {
                matches!(
                    code.as_str(),
                    "53300" | "55006" | "57P01" | "57P02" | "57P03"
                ) || code.starts_with("08")
            }
            _ => false,
        }
    }
}

/// A server error with the fix that usually goes with its SQLSTATE.
fn server_error_text(code: &str, message: &str) -> String {
    let fix = match code {
        // The same SQLSTATE as the wal_level one below, for a slot of another database.
        "55000" if message.contains("was not created in this database") => {
            "slot names are shared by every database of the server and this slot is another \
             database's: leave --slot unset (the default slot's name carries the database) or \
             choose another name"
        }
        "42501" => {
            "the role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION) or to be a \
             superuser"
        }
        "28000" => {
            "check the user name, and that pg_hba.conf has a line for this user, database and \
             address (a host line; a local line for a Unix-domain socket): a logical \
             replication connection is matched by its database name, like any other \
             connection"
        }
        "28P01" => "the password is wrong: check the database URL's password (or PGPASSWORD)",
        "53300" => {
            "no free connection: stop an unused replication client, or raise max_wal_senders \
             (and max_connections) and restart PostgreSQL"
        }
        "3D000" => "the database does not exist: check the database URL",
        "42704" => {
            "the replication slot does not exist: create it (the relay does at start, \
             txoutbox::store::postgres::wal::ensure_slot)"
        }
        "55006" => {
            "another client streams from this slot: stop it, or wait until the server notices \
             it is gone (wal_sender_timeout)"
        }
        "55000" => {
            "the server is not ready for logical decoding: wal_level = logical needs a restart"
        }
        "57P01" | "57P02" | "57P03" => "the server is shutting down or starting up: try again",
        _ => "",
    };
    if fix.is_empty() {
        format!("server error {code}: {message}")
    } else {
        format!("server error {code}: {message} ({fix})")
    }
}

/// The outbox table's publication: `txoutbox_<schema>_<table>` (inserts only). A publication
/// is an object of its database, so the name needs no database in it.
pub fn publication_name(table: &OutboxTable) -> String {
    object_name(table)
}

/// The default replication slot of the outbox table in database `database`:
/// `txoutbox_<database>_<schema>_<table>`, lower-cased. Slot names are the server's, shared by
/// all its databases, so the name carries the database. A slot name is 1 to 63 of `a-z`, `0-9`
/// and `_`: a name with other characters (a database called `shop-eu`), or a longer one, keeps
/// its start with every other character as `_` and ends in `_` and 16 hex digits, a stable
/// hash of the exact three names.
///
/// [`default_slot`] is what a relay reads: this name, unless the slot of an older release
/// ([`legacy_slot_name`]) exists in this database.
pub fn slot_name(database: &str, table: &OutboxTable) -> String {
    let name = format!("txoutbox_{database}_{}_{}", table.schema(), table.table()).to_lowercase();
    if crate::ident::is_slot_name(&name) {
        return name;
    }
    let hash = crate::table::stable_hash(&format!(
        "{database}\0{}\0{}",
        table.schema(),
        table.table()
    ));
    let mut readable: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    // 63 bytes: the readable start, `_`, 16 hex digits (all ASCII by now).
    readable.truncate(63 - 17);
    format!("{readable}_{hash:016x}")
}

/// The default slot name of releases before the database was part of it:
/// `txoutbox_<schema>_<table>`. A relay keeps reading a slot of this name that exists in its
/// own database ([`default_slot`]), so an upgrade neither loses its position nor leaves a
/// slot behind that keeps WAL for ever.
pub fn legacy_slot_name(table: &OutboxTable) -> String {
    object_name(table)
}

/// The slot a relay of `table` reads unless told another (`--slot`): the slot of an older
/// release ([`legacy_slot_name`]) if one exists in this database, else
/// [`slot_name`]`(current_database(), table)`.
pub async fn default_slot(pool: &PgPool, table: &OutboxTable) -> Result<String, WalError> {
    let legacy = legacy_slot_name(table);
    let (database, kept): (String, bool) = sqlx::query_as(
        "SELECT current_database()::text, EXISTS (SELECT 1 FROM pg_replication_slots \
         WHERE slot_name = $1 AND database = current_database())",
    )
    .bind(&legacy)
    .fetch_one(pool)
    .await?;
    Ok(if kept {
        legacy
    } else {
        slot_name(&database, table)
    })
}

fn object_name(table: &OutboxTable) -> String {
    let name = format!("txoutbox_{}_{}", table.schema(), table.table()).to_lowercase();
    if name.len() <= 63 {
        return name;
    }
    format!("txoutbox_{:016x}", crate::table::stable_hash(&name))
}

/// Check that the server can decode logically: `wal_level = logical`.
pub async fn check_wal_level(pool: &PgPool) -> Result<(), WalError> {
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await?;
    if level != "logical" {
        return Err(WalError::Setup(format!(
            "wal_level is {level}, the WAL source needs logical: run \
             `ALTER SYSTEM SET wal_level = logical` as a superuser and restart PostgreSQL \
             (on managed PostgreSQL, turn on its logical replication setting)"
        )));
    }
    Ok(())
}

/// Create the outbox table's publication (inserts only) unless it exists. True if it created
/// it (or gave its table back to it, below).
///
/// The name is made of the schema's and the table's names, lower-cased, so two tables can
/// come to the same one (`a_b.c` and `a.b_c`, `"A".t` and `a.t`): a publication of that name
/// that publishes another table is refused, since its stream would never carry this table's
/// events. One that publishes no table at all is this outbox's own whose table was dropped
/// (and made again since, e.g. `DROP SCHEMA ... CASCADE` then `migrate`): the table is added
/// back to it.
pub async fn ensure_publication(pool: &PgPool, table: &OutboxTable) -> Result<bool, WalError> {
    let name = publication_name(table);
    match publishes(pool, &name, table).await? {
        Some(Publishes::This) => return Ok(false),
        Some(Publishes::Other(others)) => return Err(collision(&name, table, &others)),
        Some(Publishes::Nothing) => {
            // `name` is made of validated identifiers only; the table is quoted.
            let sql = format!(
                "ALTER PUBLICATION \"{name}\" ADD TABLE {}",
                table.qualified()
            );
            return match sqlx::query(&sql).execute(pool).await {
                Ok(_) => Ok(true),
                // Another process added it first.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42710") => Ok(false),
                // insufficient_privilege: the fix is this statement, not a CREATE.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
                    Err(WalError::Setup(format!(
                        "publication {name} publishes no table (its table was dropped and made \
                         again) and this role may not add it back: run {sql} as the owner of \
                         both ({})",
                        e.message()
                    )))
                }
                Err(e) => Err(e.into()),
            };
        }
        None => {}
    }
    // `name` is made of validated identifiers only; the table is quoted.
    let sql = format!(
        "CREATE PUBLICATION \"{name}\" FOR TABLE {} WITH (publish = 'insert')",
        table.qualified()
    );
    match sqlx::query(&sql).execute(pool).await {
        Ok(_) => Ok(true),
        // Another process created it between the check and the statement: for this table?
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42710") => {
            match publishes(pool, &name, table).await? {
                Some(Publishes::Other(others)) => Err(collision(&name, table, &others)),
                _ => Ok(false),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// What an existing publication publishes, as far as an outbox table is concerned.
enum Publishes {
    /// The table (among others, or as one of all tables).
    This,
    /// Other tables only: these.
    Other(String),
    /// No table.
    Nothing,
}

/// What the publication `name` publishes (`None`: there is none).
async fn publishes(
    pool: &PgPool,
    name: &str,
    table: &OutboxTable,
) -> Result<Option<Publishes>, WalError> {
    let found: Option<(bool, Option<String>)> = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_publication_tables
                        WHERE pubname = p.pubname AND schemaname = $2 AND tablename = $3),
                (SELECT string_agg(format('%I.%I', schemaname, tablename), ', ')
                 FROM pg_publication_tables WHERE pubname = p.pubname)
         FROM pg_publication p WHERE p.pubname = $1",
    )
    .bind(name)
    .bind(table.schema().as_str())
    .bind(table.table().as_str())
    .fetch_optional(pool)
    .await?;
    Ok(found.map(|(this, others)| match (this, others) {
        (true, _) => Publishes::This,
        (false, Some(others)) => Publishes::Other(others),
        (false, None) => Publishes::Nothing,
    }))
}

/// The publication `name` publishes `others`, not `table`.
fn collision(name: &str, table: &OutboxTable, others: &str) -> WalError {
    WalError::Setup(format!(
        "publication {name} exists but does not publish {} (it publishes {others}): another \
         table's schema and name give the same publication name (txoutbox_<schema>_<table>, \
         lower-cased, as is the slot's); rename this outbox's schema or table",
        table.qualified()
    ))
}

/// Create a logical replication slot for `pgoutput` unless one of that name exists. True if
/// it created it. The slot keeps the WAL from the moment it is created until its consumer
/// confirms: create it only for a relay that will read it.
pub async fn ensure_slot(pool: &PgPool, slot: &str) -> Result<bool, WalError> {
    check_slot_name(slot)?;
    // A slot of that name in another database is an error (SlotElsewhere).
    if slot_info(pool, slot).await?.is_some() {
        return Ok(false);
    }
    // PostgreSQL 17+: a failover slot, which standbys with `sync_replication_slots` keep a
    // copy of, so that a promoted standby has it.
    let sql = if server_version(pool).await? >= FAILOVER_SLOTS_VERSION {
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
    };
    let created = sqlx::query(sql).bind(slot).execute(pool).await;
    match created {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) => match e.code().as_deref() {
            // duplicate_object: another relay created it first (in this database?).
            Some("42710") => slot_info(pool, slot).await.map(|_| false),
            // insufficient_privilege
            Some("42501") => Err(WalError::Setup(format!(
                "cannot create replication slot {slot}: the role needs the REPLICATION \
                 attribute (ALTER ROLE ... REPLICATION) ({})",
                e.message()
            ))),
            // configuration_limit_exceeded: no free slot.
            Some("53400") => Err(WalError::Setup(format!(
                "cannot create replication slot {slot}: all max_replication_slots are in use; \
                 drop an unused slot (pg_drop_replication_slot) or raise max_replication_slots \
                 and restart ({})",
                e.message()
            ))),
            // object_not_in_prerequisite_state: wal_level is not logical.
            Some("55000") => Err(WalError::Setup(format!(
                "cannot create replication slot {slot}: {} (set wal_level = logical and restart)",
                e.message()
            ))),
            _ => Err(sqlx::Error::Database(e).into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// The first server version (`server_version_num`) with failover slots: 17.
pub const FAILOVER_SLOTS_VERSION: i32 = 170_000;

/// The server's `server_version_num`.
pub async fn server_version(pool: &PgPool) -> Result<i32, WalError> {
    let v: String = sqlx::query_scalar("SHOW server_version_num")
        .fetch_one(pool)
        .await?;
    v.trim()
        .parse()
        .map_err(|_| WalError::Setup(format!("server_version_num {v:?} is not a number")))
}

/// The primary's `synchronized_standby_slots` (PostgreSQL 17+; `None` before): the physical
/// slots of the standbys that logical walsenders wait for before they send a change. Empty:
/// they wait for none.
pub async fn synchronized_standby_slots(pool: &PgPool) -> Result<Option<String>, WalError> {
    if server_version(pool).await? < FAILOVER_SLOTS_VERSION {
        return Ok(None);
    }
    let v: String = sqlx::query_scalar("SHOW synchronized_standby_slots")
        .fetch_one(pool)
        .await?;
    Ok(Some(v.trim().to_owned()))
}

/// Drop the slot of this database (it must not be in use). True if it existed; a slot of
/// that name in another database is an error ([`WalError::SlotElsewhere`]) and stays.
pub async fn drop_slot(pool: &PgPool, slot: &str) -> Result<bool, WalError> {
    check_slot_name(slot)?;
    if slot_info(pool, slot).await?.is_none() {
        return Ok(false);
    }
    let dropped = sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1 AND database = current_database()",
    )
    .bind(slot)
    .execute(pool)
    .await?;
    Ok(dropped.rows_affected() > 0)
}

fn check_slot_name(slot: &str) -> Result<(), WalError> {
    if crate::ident::is_slot_name(slot) {
        Ok(())
    } else {
        Err(WalError::Setup(format!(
            "replication slot name {slot:?} is not valid: 1 to 63 of a-z, 0-9 and _"
        )))
    }
}

/// The session advisory lock a WAL relay holds while it reads `slot` (one reader per slot;
/// standbys wait on it).
pub(crate) fn reader_lock_key(slot: &str) -> i64 {
    crate::table::stable_hash(&format!("txoutbox wal slot {slot}")) as i64
}

/// The server process of the relay that reads `slot` now (holds its reader lock), if any.
pub async fn reader_pid(pool: &PgPool, slot: &str) -> Result<Option<i32>, WalError> {
    // pg_locks shows a bigint advisory key as its high (classid) and low (objid) halves.
    let key = reader_lock_key(slot) as u64;
    Ok(sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND classid::int8 = $1 AND objid::int8 = $2 LIMIT 1",
    )
    .bind((key >> 32) as i64)
    .bind((key & 0xFFFF_FFFF) as i64)
    .fetch_optional(pool)
    .await?)
}

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Its name.
    pub name: String,
    /// Its output plugin (`pgoutput` for the WAL source's).
    pub plugin: Option<String>,
    /// A consumer is streaming from it now.
    pub active: bool,
    /// `reserved`, `extended`, `unreserved` or `lost` (its WAL is gone: it cannot be read
    /// again, the table path must recover).
    pub wal_status: Option<String>,
    /// The position up to which the consumer confirmed.
    pub confirmed_flush_lsn: Option<Lsn>,
    /// WAL the slot keeps that its consumer has not confirmed, in bytes.
    pub lag_bytes: Option<i64>,
    /// Where a stream of the slot starts decoding: the server keeps the WAL from here on.
    pub restart_lsn: Option<Lsn>,
    /// WAL the server keeps for the slot, in bytes (`pg_current_wal_lsn() - restart_lsn`):
    /// more than [`SlotInfo::lag_bytes`], by what a stream decodes again at its start.
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is invalidated
    /// (`max_slot_wal_keep_size`); `None` when unlimited.
    pub safe_wal_size: Option<i64>,
    /// PostgreSQL 17+: the slot is a failover slot, synchronized to standbys that run
    /// `sync_replication_slots`; `None` on older servers.
    pub failover: Option<bool>,
    /// PostgreSQL 17+: the slot is a standby's copy of the primary's (synchronized, not
    /// created here); `None` on older servers.
    pub synced: Option<bool>,
}

/// The slot of that name in this database, if it exists. A slot of that name in another
/// database (or a physical one) is [`WalError::SlotElsewhere`]: never this outbox's.
pub async fn slot_info(pool: &PgPool, slot: &str) -> Result<Option<SlotInfo>, WalError> {
    let row = sqlx::query(
        "SELECT slot_name::text, plugin::text, active, wal_status, \
                confirmed_flush_lsn::text, \
                (pg_current_wal_lsn() - coalesce(confirmed_flush_lsn, restart_lsn))::bigint, \
                safe_wal_size, restart_lsn::text, \
                (pg_current_wal_lsn() - restart_lsn)::bigint, \
                database::text, database IS NOT DISTINCT FROM current_database(), \
                current_database()::text, \
                (to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool \
         FROM pg_replication_slots s WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await?;
    let Some(r) = row else { return Ok(None) };
    if !r.try_get::<bool, _>(10)? {
        return Err(WalError::SlotElsewhere {
            slot: slot.to_owned(),
            database: r.try_get(9)?,
            current: r.try_get(11)?,
        });
    }
    let confirmed: Option<String> = r.try_get(4)?;
    let restart: Option<String> = r.try_get(7)?;
    Ok(Some(SlotInfo {
        name: r.try_get(0)?,
        plugin: r.try_get(1)?,
        active: r.try_get(2)?,
        wal_status: r.try_get(3)?,
        confirmed_flush_lsn: confirmed.map(|s| s.parse()).transpose()?,
        lag_bytes: r.try_get(5)?,
        safe_wal_size: r.try_get(6)?,
        restart_lsn: restart.map(|s| s.parse()).transpose()?,
        retained_bytes: r.try_get(8)?,
        failover: r.try_get(12)?,
        synced: r.try_get(13)?,
    }))
}

/// Read, without confirming, the committed transactions after the slot's confirmed position,
/// up to about `max_changes` changes (whole transactions: PostgreSQL stops after the
/// transaction that reaches the limit). The same call returns the same transactions until
/// [`advance`] moves the slot past them.
pub async fn peek(
    pool: &PgPool,
    table: &OutboxTable,
    slot: &str,
    max_changes: i32,
) -> Result<Vec<WalTx>, WalError> {
    check_slot_name(slot)?;
    let rows = sqlx::query(
        "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, \
         'proto_version', '1', 'publication_names', $3, 'binary', 'true', 'messages', 'true')",
    )
    .bind(slot)
    .bind(max_changes)
    .bind(format!("\"{}\"", publication_name(table)))
    .fetch_all(pool)
    .await?;
    let mut asm = Transactions::new(table.clone());
    let mut out = Vec::new();
    for r in rows {
        let data: Vec<u8> = r.try_get(0)?;
        out.extend(asm.feed(&data)?);
    }
    Ok(out)
}

/// Confirm everything up to `lsn` (a transaction's [`WalTx::end_lsn`]): the slot lets its WAL
/// go and never hands those transactions out again.
pub async fn advance(pool: &PgPool, slot: &str, lsn: Lsn) -> Result<(), WalError> {
    check_slot_name(slot)?;
    sqlx::query("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)")
        .bind(slot)
        .bind(lsn.to_string())
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_slot_names_of_at_most_63_bytes() {
        let t = OutboxTable::new("Shop", "outbox_events").expect("a table");
        assert_eq!(slot_name("app", &t), "txoutbox_app_shop_outbox_events");
        assert_eq!(legacy_slot_name(&t), "txoutbox_shop_outbox_events");
        assert_eq!(publication_name(&t), legacy_slot_name(&t));
        assert_ne!(
            slot_name("a", &t),
            slot_name("b", &t),
            "the database is in it"
        );
        let long = OutboxTable::new(&"s".repeat(40), &"t".repeat(40)).expect("a table");
        let name = slot_name("app", &long);
        assert!(
            name.len() <= 63 && name.starts_with("txoutbox_app_sss"),
            "{name}"
        );
        assert_eq!(name, slot_name("app", &long), "stable");
        assert_ne!(name, slot_name("App", &long), "the exact names are hashed");
        assert!(check_slot_name(&name).is_ok());
        // Characters a slot name may not hold: kept readable, made unique by the hash.
        for db in ["shop-eu", "Shop EU", "магазин", &"d".repeat(70)] {
            let name = slot_name(db, &t);
            assert!(check_slot_name(&name).is_ok(), "{db:?}: {name}");
            assert_eq!(name.len(), name.len().min(63));
        }
        assert_ne!(slot_name("shop-eu", &t), slot_name("shop_eu", &t));
        assert!(slot_name("shop-eu", &t).starts_with("txoutbox_shop_eu_shop_"));
        assert!(check_slot_name(&legacy_slot_name(&long)).is_ok());
        for bad in ["", "Upper", "a-b", "a b", &"x".repeat(64)] {
            assert!(check_slot_name(bad).is_err(), "{bad:?}");
        }
    }
}
