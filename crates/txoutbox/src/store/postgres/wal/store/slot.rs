//! The slot's guards: the session lock that makes a relay its one reader, and the drop of a
//! slot that lost its WAL.

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::Connection;

use super::super::{drop_slot, WalError};
use crate::error::Error;

/// Drop a slot that lost its WAL, to create it again. The stream that found it lost may still
/// show as active a moment longer (its walsender ends after the error), and a reader whose
/// connection went silent (cut, frozen) holds it until the server notices: this relay holds
/// the reader lock, so no other reader is on it by right. Wait for it to go inactive for up to
/// [`LOST_SLOT_WAIT`], then end the backend that still holds it.
pub(super) async fn drop_lost_slot(pool: &sqlx::PgPool, slot: &str) -> Result<(), Error> {
    let started = Instant::now();
    loop {
        match drop_slot(pool, slot).await {
            Ok(_) => return Ok(()),
            Err(WalError::Database(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some("55006") =>
            {
                if started.elapsed() >= LOST_SLOT_WAIT {
                    tracing::warn!(slot, error = %e,
                        "the lost slot is still held by a backend; ending it to create the slot again");
                    sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND database = current_database() \
                           AND active_pid IS NOT NULL",
                    )
                    .bind(slot)
                    .execute(pool)
                    .await
                    .map_err(Error::Database)?;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                if started.elapsed() >= LOST_SLOT_WAIT * 3 {
                    return Err(WalError::Setup(format!(
                        "replication slot {slot} lost its WAL and is still held by another \
                         backend after {}s: end it (pg_terminate_backend) or drop the slot",
                        (LOST_SLOT_WAIT * 3).as_secs()
                    ))
                    .into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long a lost slot may stay active (its stream ending) before the relay ends its backend.
const LOST_SLOT_WAIT: Duration = Duration::from_secs(5);

/// How long the check of the slot lock's connection may take ([`SlotLock::check`]).
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The session lock that makes a relay the one reader of a slot; released when dropped (its
/// connection closes) or when the relay's process dies.
#[derive(Debug)]
pub struct SlotLock {
    pub(super) conn: PgConnection,
}

impl SlotLock {
    /// Is the lock's connection still up (and so the lock still held)? A relay whose lock
    /// connection died must stop reading: a standby may hold the slot now.
    pub async fn check(&mut self) -> Result<(), Error> {
        // Bounded: a connection that went silent (half-open) would otherwise never answer,
        // and the reader would read on without knowing whether it still holds the lock.
        match tokio::time::timeout(LOCK_CHECK_TIMEOUT, self.conn.ping()).await {
            Ok(r) => r.map_err(Error::Database),
            Err(_) => Err(Error::Task(format!(
                "the slot lock's connection did not answer within {}s",
                LOCK_CHECK_TIMEOUT.as_secs()
            ))),
        }
    }
}
