//! The checks of the server before a WAL relay reads: version, `wal_level`, schema,
//! publication, and what would cost WAL or lose the slot in a failover.

use super::super::{check_wal_level, ensure_publication, slot_info, WalError};
use super::{WalStore, MIN_SERVER_VERSION};
use crate::error::Error;

impl WalStore {
    /// Check the server before reading: PostgreSQL 14 or later, `wal_level = logical`, the
    /// schema migrated, the publication there (created if missing). Returns warnings to log
    /// (e.g. `max_slot_wal_keep_size` unlimited).
    pub async fn preflight(&self) -> Result<Vec<String>, Error> {
        let pool = self.pool();
        let version: String = sqlx::query_scalar("SHOW server_version_num")
            .fetch_one(pool)
            .await
            .map_err(Error::Database)?;
        if version.trim().parse::<i32>().unwrap_or(0) < MIN_SERVER_VERSION {
            return Err(WalError::Setup(format!(
                "the WAL source needs PostgreSQL 14 or later (server_version_num {version}); \
                 use --source table"
            ))
            .into());
        }
        check_wal_level(pool).await?;
        self.store.check_schema().await?;
        ensure_publication(pool, self.table()).await?;
        let mut warnings = Vec::new();
        let keep: String = sqlx::query_scalar("SHOW max_slot_wal_keep_size")
            .fetch_one(pool)
            .await
            .map_err(Error::Database)?;
        if keep.trim() == "-1" {
            warnings.push(format!(
                "max_slot_wal_keep_size is unlimited (-1): while this relay is stopped, slot {} \
                 keeps all WAL written since and can fill the server's disk; set a limit (the \
                 slot is then invalidated instead, and the relay recovers from the table)",
                self.slot()
            ));
        }
        warnings.extend(self.failover_warnings().await?);
        Ok(warnings)
    }

    /// PostgreSQL 17+: what stands in the way of the slot surviving a failover. A slot made
    /// before failover slots (or by hand) without `failover` is not copied to standbys; a
    /// primary with an empty `synchronized_standby_slots` lets the relay read (and publish)
    /// changes that no standby has received yet.
    async fn failover_warnings(&self) -> Result<Vec<String>, Error> {
        let pool = self.pool();
        let Some(standby_slots) = super::super::synchronized_standby_slots(pool).await? else {
            return Ok(Vec::new());
        };
        let mut warnings = Vec::new();
        if let Some(info) = slot_info(pool, self.slot()).await? {
            if info.failover == Some(false) {
                warnings.push(format!(
                    "replication slot {} is not a failover slot (created before PostgreSQL 17, \
                     or by hand): standbys do not keep a copy, so after a failover the relay \
                     creates it again on the new primary and delivers what it held from the \
                     table (duplicates, nothing lost); to make it one, stop the relay, run \
                     txoutbox slot drop, and start the relay (it creates the slot with \
                     failover)",
                    self.slot()
                ));
            }
        }
        if standby_slots.is_empty() {
            warnings.push(format!(
                "synchronized_standby_slots is empty on this primary: the relay may read and \
                 publish changes that no standby has received yet, and a standby promoted \
                 after this primary fails lacks them: events the broker has from transactions \
                 the new primary never saw, and slot {} synchronized to a position behind what \
                 this relay confirmed; name the standbys' physical slots there (ALTER SYSTEM \
                 SET synchronized_standby_slots = '<slot>'; SELECT pg_reload_conf();)",
                self.slot()
            ));
        }
        Ok(warnings)
    }
}
