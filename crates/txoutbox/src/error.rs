//! The library's database-side error.

use crate::ident::IdentError;

/// An error from the outbox's database side (migrations, enqueue, store, inbox).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The outbox table (or its schema) is missing.
    #[error("the outbox table {table} does not exist: run `txoutbox migrate` (or `txoutbox::migrate`) first")]
    NotMigrated {
        /// The outbox table as `schema.table`.
        table: String,
    },
    /// The schema is older than this build expects.
    #[error("the outbox table {table} is at schema version {found}, this build needs {expected}: run `txoutbox migrate`")]
    SchemaTooOld {
        /// The outbox table as `schema.table`.
        table: String,
        /// The version recorded in the database.
        found: i32,
        /// The newest version this build's migrations reach.
        expected: i32,
    },
    /// The schema is newer than this build knows: an older binary against a newer database.
    #[error("the outbox table {table} is at schema version {found}, newer than this build knows ({expected}): upgrade txoutbox")]
    SchemaTooNew {
        /// The outbox table as `schema.table`.
        table: String,
        /// The version recorded in the database.
        found: i32,
        /// The newest version this build's migrations reach.
        expected: i32,
    },
    /// Relays of both modes on one table would break the ordering guarantee.
    #[error("relay {other} runs in {other_mode} mode on {table}; all relays of one table must use the same --mode (stop it, or start this one with --mode {other_mode})")]
    ModeConflict {
        /// The outbox table as `schema.table`.
        table: String,
        /// The relay id of a live relay of the other mode.
        other: String,
        /// That relay's mode: `ordered` or `unordered`.
        other_mode: String,
    },
    /// One table, one source: a relay of the other source (a WAL relay beside a table relay,
    /// or the reverse), or a WAL relay of another slot, reads the table; both would deliver
    /// every event.
    #[error("relay {other} already reads {table} ({other_reads}): one source per table, or every event goes out twice; stop it first (if it died, its registration runs out after its --partition-lease)")]
    SourceConflict {
        /// The outbox table as `schema.table`.
        table: String,
        /// The relay id of the live relay that reads it.
        other: String,
        /// How it reads it: `--source table, ordered mode`, `--source wal, slot <name>`.
        other_reads: String,
    },
    /// SQLite: another relay holds the database file's relay lease.
    #[error("relay {other} already runs on {table} (SQLite: one relay per database file); stop it, or wait until its lease runs out ({remaining_secs:.0}s) if it died")]
    RelayRunning {
        /// The outbox table as `schema.table`.
        table: String,
        /// The relay id that holds the lease.
        other: String,
        /// Seconds until that lease runs out if it is not renewed.
        remaining_secs: f64,
    },
    /// Another live process already runs a relay with this id.
    #[error("relay id {relay_id} is held by another live process on {table}; give each relay process its own --relay-id (or leave it unset), or wait until the other one's lease runs out ({remaining_secs:.0}s) if it died")]
    RelayIdInUse {
        /// The outbox table as `schema.table`.
        table: String,
        /// The relay id asked for.
        relay_id: String,
        /// Seconds until the other process's lease on the id runs out if it is not renewed.
        remaining_secs: f64,
    },
    /// A claim given back to a store that did not make it (its fence is of another kind).
    #[error("this claim was not made by this store (its fence is of another kind); settle and release a claim with the store that claimed it")]
    ForeignClaim,
    /// Something this database does not do (e.g. schemas on SQLite).
    #[error("{0}")]
    Unsupported(String),
    /// A schema or table name from configuration is not a valid identifier.
    #[error(transparent)]
    Ident(#[from] IdentError),
    /// An event's payload or headers could not be serialised to JSON text (MySQL and SQLite
    /// store them as text).
    #[error("event payload is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A relay task panicked or was aborted.
    #[error("relay task failed: {0}")]
    Task(String),
    /// Anything else the database said.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The WAL source (`relay --source wal`): the server is not set up for it (the message
    /// names the fix), or its stream did not decode.
    #[cfg(feature = "wal")]
    #[error(transparent)]
    Wal(#[from] crate::store::postgres::wal::WalError),
}

impl Error {
    /// Does this say the relay must not run (another mode on the table, another relay on an
    /// SQLite file, its relay id held by another process)? Found by a heartbeat, it stops the
    /// relay with this error.
    pub fn is_membership_conflict(&self) -> bool {
        matches!(
            self,
            Error::ModeConflict { .. }
                | Error::SourceConflict { .. }
                | Error::RelayRunning { .. }
                | Error::RelayIdInUse { .. }
        )
    }

    /// Is this worth retrying (connection lost, server restarting, pool timeout)?
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(e) => is_transient_sqlx(e),
            #[cfg(feature = "wal")]
            Error::Wal(e) => e.is_transient(),
            _ => false,
        }
    }
}

impl Error {
    /// The SQLSTATE of a database error, if this is one.
    pub fn sql_state(&self) -> Option<String> {
        let e = match self {
            Error::Database(e) => e,
            #[cfg(feature = "wal")]
            Error::Wal(crate::store::postgres::wal::WalError::Database(e)) => e,
            #[cfg(feature = "wal")]
            Error::Wal(crate::store::postgres::wal::WalError::Server { code, .. }) => {
                return Some(code.clone())
            }
            _ => return None,
        };
        match e {
            sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
            _ => None,
        }
    }
}

pub(crate) fn is_transient_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        // SQLite: SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        #[cfg(feature = "sqlite")]
        sqlx::Error::Database(db)
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() =>
        {
            db.code()
                .and_then(|c| c.parse::<i32>().ok())
                .is_some_and(|c| matches!(c & 0xff, 5 | 6))
        }
        sqlx::Error::Database(db) => {
            // Class 08 (connection), 40 (serialization/deadlock), 53 (resources),
            // 57P0x (admin shutdown, crash shutdown, cannot connect now).
            db.code().is_some_and(|c| {
                c.starts_with("08")
                    || c.starts_with("40")
                    || c.starts_with("53")
                    || c.starts_with("57P")
            })
        }
        _ => false,
    }
}

/// Map a sqlx error, turning "relation does not exist" into [`Error::NotMigrated`].
pub(crate) fn db_error(table: &crate::OutboxTable, e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e {
        // 42P01 undefined_table, 3F000 invalid_schema_name; SQLite says "no such table".
        // MySQL: 42S02 no such table.
        if matches!(
            db.code().as_deref(),
            Some("42P01") | Some("3F000") | Some("42S02")
        ) || db.message().starts_with("no such table")
        {
            return Error::NotMigrated {
                table: table.display(),
            };
        }
    }
    Error::Database(e)
}
